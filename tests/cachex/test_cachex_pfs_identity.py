"""PFS durability proven by content, exclusive PFS parts, and no leftovers of a full disk
(review cachex-2: D3, D2, D8).

D3: after a rollback, step numbers saved again are not PFS-durable because a folder of that
number holds the abandoned run's bytes; the drainer drains them, and no restore returns the
abandoned bytes. D2: two drainers of one rank on two nodes (two records folders, one PFS)
never commit a step without its part, nor record one as durable. D8: a full disk leaves no
temporary record, orbax step folder or PFS staging folder behind.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hexad import cachex
from hexad.cachex import _faults, _format, _pfs


def _old(step: int) -> dict:
    return {"w": np.full((8,), step, np.float32)}


def _new(step: int) -> dict:
    return {"w": np.full((8,), 100 + step, np.float32)}


def _w(r) -> float:
    return float(r.state["w"][0])


def _drain(m) -> list[int]:
    return cachex.drain_once(m.drainer_config)


def _first_run(root: Path, pfs: Path) -> None:
    """Steps 1-3 saved and drained on node a, which is then lost."""
    with cachex.CacheXManager(root / "a", pfs_dir=pfs, drainer=False, max_to_keep=3) as a:
        for s in (1, 2, 3):
            a.save(s, _old(s))
            a.wait_until_finished()
            assert _drain(a) == [s]


# -- D3 ------------------------------------------------------------------------------------------


def test_steps_saved_again_after_a_rollback_are_drained_and_restored(tmp_path):
    pfs = tmp_path / "pfs"
    _first_run(tmp_path, pfs)
    b = cachex.CacheXManager(tmp_path / "b", pfs_dir=pfs, drainer=False, max_to_keep=1)
    r = b.restore(_old(0), step=1)  # the rollback, on a fresh node
    assert (r.step, r.tier, _w(r)) == (1, "pfs", 1.0)
    for s in (2, 3):
        b.save(s, _new(s))
        b.wait_until_finished()
    # the PFS folders 2 and 3 hold the abandoned run's bytes: no proof for the new steps
    # (the old code said tier_done True, durability lag 0, and never drained them)
    assert not b.tier_done(3, "pfs") and not b.tier_done(2, "pfs")
    h = b.health(ping_neighbour=False)
    assert h["newest_pfs_step"] == -1 and h["durability_lag_steps"] == 3, h
    assert b.all_steps() == [1, 2, 3]  # all pinned until drained, whatever max_to_keep
    # this node's own step 3 is restored, never the PFS folder of the same number
    r = b.restore(_old(0))
    assert (r.step, r.tier, _w(r)) == (3, "local", 103.0)
    assert _drain(b) == [3]
    assert b.tier_done(3, "pfs") and b.wait_for_pfs(3, timeout_s=1)
    b.close()
    # node b and its neighbour lost: the PFS alone gives the new step 3
    with cachex.CacheXManager(tmp_path / "c", pfs_dir=pfs, drainer=False) as c:
        r = c.restore(_old(0))
    assert (r.step, r.tier, _w(r)) == (3, "pfs", 103.0)


def test_a_pfs_step_of_the_abandoned_timeline_is_never_restored_or_left(tmp_path):
    pfs = tmp_path / "pfs"
    _first_run(tmp_path, pfs)
    b = cachex.CacheXManager(tmp_path / "b", pfs_dir=pfs, drainer=False)
    assert b.restore(_old(0), step=1).step == 1
    b.save(2, _new(2))
    b.wait_until_finished()
    # local 2 is this timeline's newest: the old PFS step 3 is not offered
    r = b.restore(_old(0))
    assert (r.step, r.tier, _w(r)) == (2, "local", 102.0)
    assert 3 not in b.readable_steps()["pfs"]
    # (1 too: the rollback saved step 1 again locally, under the new timeline)
    assert [e["steps"] for e in b.events if e["event"] == "abandoned_pfs_steps"][-1] == [1, 2, 3]
    # the drainer retires the abandoned step 3 and replaces step 2 with the new one
    assert _drain(b) == [2]
    assert _pfs.committed_pfs_steps(pfs) == [1, 2]
    b.close()
    with cachex.CacheXManager(tmp_path / "c", pfs_dir=pfs, drainer=False) as c:
        r = c.restore(_old(0))
    assert (r.step, r.tier, _w(r)) == (2, "pfs", 102.0)


def test_only_the_timeline_a_rollback_branched_off_is_retired(tmp_path):
    pfs = tmp_path / "pfs"
    _first_run(tmp_path, pfs)
    with cachex.CacheXManager(tmp_path / "other", pfs_dir=pfs, drainer=False) as other:
        other.save(9, _old(9))  # an unrelated run's step on the same PFS (not an ancestor)
        other.wait_until_finished()
        assert _drain(other) == [9]
    with cachex.CacheXManager(tmp_path / "b", pfs_dir=pfs, drainer=False) as b:
        assert b.restore(_old(0), step=1).step == 1
        b.save(2, _new(2))
        b.wait_until_finished()
        assert _pfs.retire_abandoned(b.drainer_config) == [3]
        assert _pfs.committed_pfs_steps(pfs) == [1, 2, 9]


def test_a_restore_of_the_newest_step_keeps_its_identity_and_durability(tmp_path):
    pfs = tmp_path / "pfs"
    _first_run(tmp_path, pfs)
    with cachex.CacheXManager(tmp_path / "b", pfs_dir=pfs, drainer=False) as b:
        assert b.restore(_old(0)).step == 3  # rewritten locally, the same save
        assert b.tier_done(3, "pfs") and b.newest_pfs_step() == 3
        assert _drain(b) == []  # nothing to drain again
        b.save(4, _old(4))
        b.wait_until_finished()
        assert _drain(b) == [4] and _pfs.committed_pfs_steps(pfs) == [1, 2, 3, 4]


# -- D2 ------------------------------------------------------------------------------------------


def test_two_drainers_of_one_rank_on_two_nodes_commit_a_whole_step_or_none(tmp_path, monkeypatch):
    pfs = tmp_path / "pfs"
    m = cachex.CacheXManager(tmp_path / "local", pfs_dir=pfs, drainer=False)
    m.save(6, _old(6))
    m.wait_until_finished()
    a = m.drainer_config
    b = _pfs.dataclasses.replace(a, records_dir=str(tmp_path / "node2" / "durability"))
    Path(b.records_dir).mkdir(parents=True)
    # Interleaving: A has written its part and is about to mark it done; B then starts on
    # the same rank and step and writes its first file; A marks and commits; B goes on.
    a_at_marker, b_writing, a_done = threading.Event(), threading.Event(), threading.Event()
    real = _pfs._fsio.write_file_durable

    def write(path, data, *args, **kwargs):
        who = threading.current_thread().name
        if who == "drainer-a" and Path(path).name == "done_0" and not a_at_marker.is_set():
            a_at_marker.set()
            assert b_writing.wait(30)
        if who == "drainer-b" and Path(path).name == _format.DATA_FILE and not b_writing.is_set():
            b_writing.set()
            assert a_done.wait(30)
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(_pfs._fsio, "write_file_durable", write)
    out: dict[str, list] = {}

    def run(name, cfg, wait=None):
        if wait is not None:
            assert wait.wait(30)
        try:
            out[name] = cachex.drain_once(cfg)
        finally:
            if name == "a":
                a_done.set()

    ta = threading.Thread(target=run, args=("a", a), name="drainer-a")
    tb = threading.Thread(target=run, args=("b", b, a_at_marker), name="drainer-b")
    ta.start(), tb.start()
    ta.join(60), tb.join(60)
    monkeypatch.setattr(_pfs._fsio, "write_file_durable", real)
    assert not ta.is_alive() and not tb.is_alive()
    claims = [r for r in (a.records_dir, b.records_dir) if (Path(r) / "6" / "pfs.json").exists()]
    verified = cachex.verified_steps(m.directory, pfs_dir=pfs)["pfs"]
    # (the old code: B unlinked A's files, A committed the emptied part and recorded it)
    assert verified == [6] or not claims, f"false durability claims {claims}: PFS {verified}"
    b_retry = cachex.drain_once(b, now=time.time() + 3600)  # B's retry, if it failed
    assert cachex.verified_steps(m.directory, pfs_dir=pfs)["pfs"] == [6]
    _, pieces = _format.read_rank_dir(pfs / "6" / "rank_0")
    assert pieces[0][2].tobytes() == _old(6)["w"].tobytes()
    assert sorted(p.name for p in (pfs / "6").iterdir()) == ["done_0", "rank_0"]
    for rec in (a.records_dir, b.records_dir):  # every claim holds; both nodes end durable
        assert (Path(rec) / "6" / "pfs.json").exists(), (out, b_retry)
    assert not list(pfs.glob(".tmp-*"))
    m.close()


def test_a_committed_step_without_this_ranks_part_is_no_proof_and_is_redrained(tmp_path):
    pfs = tmp_path / "pfs"
    with cachex.CacheXManager(tmp_path / "local", pfs_dir=pfs, drainer=False) as m:
        m.save(0, _old(0))
        m.wait_until_finished()
        (pfs / "0" / "rank_0").mkdir(parents=True)  # a broken commit: the part is empty
        assert not m.tier_done(0, "pfs") and m.newest_pfs_step() == -1
        assert _drain(m) == [0] and m.tier_done(0, "pfs")
        assert cachex.verified_steps(m.directory, pfs_dir=pfs)["pfs"] == [0]


# -- D8 ------------------------------------------------------------------------------------------


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp" in p.name)


def test_a_full_disk_leaves_no_temporary_record(tmp_path):
    with _faults.disk_full(tmp_path), pytest.raises(OSError, match="No space"):
        _pfs.record_tier(tmp_path, 5, "local", seconds=1.0)
    assert (tmp_path / "5").is_dir() and _leftovers(tmp_path) == []


def test_a_save_failed_by_a_full_disk_leaves_no_orbax_folder(tmp_path):
    m = cachex.CacheXManager(tmp_path)
    m.save(0, _old(0))
    m.wait_until_finished()
    with cachex.quiet_failed_saves(), _faults.disk_full(m.steps_dir):
        m.save(1, _old(1))
        with pytest.raises(OSError, match="No space"):
            m.wait_until_finished()
    assert sorted(p.name for p in m.steps_dir.iterdir()) == ["0"]
    m.save(1, _old(1))  # and saving goes on once there is room
    m.wait_until_finished()
    assert m.all_steps() == [0, 1]
    m.close()


def test_a_drain_failed_by_a_full_pfs_leaves_no_staging_folder(tmp_path):
    pfs = tmp_path / "pfs"
    with cachex.CacheXManager(tmp_path / "local", pfs_dir=pfs, drainer=False) as m:
        m.save(0, _old(0))
        m.wait_until_finished()
        with _faults.disk_full(pfs):
            assert _drain(m) == []
        assert "ENOSPC" in str(m.durability(0)["pfs_retry"]["errors"]) or "No space" in str(
            m.durability(0)["pfs_retry"]["errors"]
        )
        assert sorted(p.name for p in pfs.iterdir()) == []
        assert cachex.drain_once(m.drainer_config, now=time.time() + 3600) == [0]


def test_a_starting_drainer_sweeps_its_ranks_leftovers(tmp_path):
    pfs = tmp_path / "pfs"
    cfg = cachex.DrainerConfig(
        steps_dir=str(tmp_path / "steps"),
        item="state",
        records_dir=str(tmp_path / "rec"),
        pfs_dir=str(pfs),
        rank=0,
        n_ranks=2,
    )
    (pfs / ".tmp-3" / "rank_0").mkdir(parents=True)  # a half-written part, never marked
    (pfs / ".tmp-4" / ".part-0-123-abc").mkdir(parents=True)  # a dead writer's private part
    (pfs / ".tmp-5" / "rank_0").mkdir(parents=True)  # complete and marked: another rank's
    (pfs / ".tmp-5" / "done_0").write_bytes(b"1")  # commit may come at any moment
    (pfs / ".tmp-6" / "rank_1").mkdir(parents=True)  # the other rank's
    (pfs / ".tmp-6" / ".part-1-9-x").mkdir()  # the other rank's writer, maybe alive
    removed = _pfs.sweep_own_leftovers(cfg)
    assert sorted(removed) == [".tmp-3", ".tmp-4", ".tmp-4/.part-0-123-abc"]
    assert sorted(p.name for p in pfs.iterdir()) == [".tmp-5", ".tmp-6"]
    assert sorted(p.name for p in (pfs / ".tmp-6").iterdir()) == [".part-1-9-x", "rank_1"]
