"""CacheX listing and GC under bad directory entries and failed saves (review cachex-2: D1, D4,
D7): one unreadable entry or tier never hides the others, ``resume`` never silently restarts
at step 0 over steps it could not read, a failed save leaks no step, and a stray file named
like a step breaks nothing."""

from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest

from hexad import cachex
from hexad.cachex import _format, _fsio

TOKEN = "listing-test-token-0123"


def _state(step: int) -> dict:
    return {"w": np.full((8,), step, np.float32), "n": np.array(step, np.int64)}


@pytest.fixture(scope="module")
def gold(tmp_path_factory):
    """A checkpoint set with intact copies in every tier: steps 0-3 saved and drained."""
    root = tmp_path_factory.mktemp("gold")
    srv = cachex.ReplicaServer(root / "neighbour", token=TOKEN, max_lifetime_s=120).start()
    try:
        client = cachex.ReplicaClient(srv.address, TOKEN, timeout_s=20)
        with cachex.CacheXManager(
            root / "local", neighbour=client, pfs_dir=root / "pfs", drainer=False, max_to_keep=2
        ) as m:
            for s in range(4):
                m.save(s, _state(s))
                m.wait_until_finished()
                assert cachex.drain_once(m.drainer_config) == [s]
            listed = m.readable_steps()
    finally:
        srv.stop()
    assert listed["local"][-1] == 3 and listed["replica"][-1] == 3, listed
    assert listed["pfs"] == [0, 1, 2, 3], listed
    return root


class _Copy:
    """A fresh copy of the gold set, its neighbour served again, and a manager over it."""

    def __init__(self, gold: Path, dest: Path):
        for sub in ("local", "pfs", "neighbour"):
            shutil.copytree(gold / sub, dest / sub)
        self.root = dest
        self.server = cachex.ReplicaServer(
            dest / "neighbour", token=TOKEN, max_lifetime_s=120
        ).start()
        client = cachex.ReplicaClient(self.server.address, TOKEN, timeout_s=20)
        self.m = cachex.CacheXManager(
            dest / "local", neighbour=client, pfs_dir=dest / "pfs", drainer=False, max_to_keep=2
        )

    def close(self):
        self.m.close()
        self.server.stop()


@pytest.fixture
def copy(gold, tmp_path):
    c = _Copy(gold, tmp_path)
    yield c
    c.close()


def _fail_path(monkeypatch, path: Path, err: int) -> None:
    """Makes listing the folder ``path`` fail with ``err`` (both ways Python lists one)."""
    target = os.path.abspath(path)
    real_scandir, real_listdir = os.scandir, os.listdir

    def check(p):
        if isinstance(p, (str, os.PathLike)) and os.path.abspath(os.fspath(p)) == target:
            raise OSError(err, os.strerror(err) + " (injected)", os.fspath(p))

    def scandir(p="."):
        check(p)
        return real_scandir(p)

    def listdir(p="."):
        check(p)
        return real_listdir(p)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(os, "listdir", listdir)


def _fail_read(monkeypatch, path: Path, err: int) -> None:
    """Makes reading the JSON file ``path`` fail with ``err`` (an EIO on one manifest)."""
    real = _fsio.read_json
    target = os.path.abspath(path)

    def read_json(p, *args, **kwargs):
        if os.path.abspath(p) == target:
            raise OSError(err, os.strerror(err) + " (injected)", str(p))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(_fsio, "read_json", read_json)


def _drop_files_key(rank_dir: Path) -> None:
    """Rewrites a manifest without its ``files`` list, its own CRC-32 recomputed (valid)."""
    path = rank_dir / _format.MANIFEST_FILE
    body = json.loads(path.read_bytes())
    del body["manifest_crc32"], body["files"]
    crc = zlib.crc32(json.dumps(body, sort_keys=True).encode()) & 0xFFFFFFFF
    path.unlink()
    path.write_text(json.dumps(dict(body, manifest_crc32=crc), sort_keys=True))


def _eio_local_manifest(c, mp):
    _fail_read(mp, c.m.steps_dir / "3" / "state" / _format.MANIFEST_FILE, errno.EIO)
    return "replica", "local: step 3: OSError"


def _estale_pfs_root(c, mp):
    _fail_path(mp, c.root / "pfs", errno.ESTALE)
    return "local", "pfs: cannot list"


def _pfs_root_not_a_dir(c, mp):
    shutil.rmtree(c.root / "pfs")
    (c.root / "pfs").write_bytes(b"")  # a mount point gone wrong
    return "local", "pfs: cannot list"


def _eio_local_root(c, mp):
    _fail_path(mp, c.m.steps_dir, errno.EIO)
    return "replica", "local: cannot list"


def _stray_file_on_pfs(c, mp):
    (c.root / "pfs" / "7").write_bytes(b"not a step")
    return "local", None


def _manifest_without_files(c, mp):
    _drop_files_key(c.m.steps_dir / "3" / "state")
    return "replica", "local: step 3: CorruptCheckpointError"


def _manifest_without_files_neighbour_down(c, mp):
    _drop_files_key(c.m.steps_dir / "3" / "state")
    c.server.stop()
    return "pfs", "replica: cannot list"


def _eisdir_old_pfs_manifest(c, mp):
    manifest = c.root / "pfs" / "1" / "rank_0" / _format.MANIFEST_FILE
    manifest.unlink()
    manifest.mkdir()
    return "local", "pfs: step 1: IsADirectoryError"


FAULTS = [
    _eio_local_manifest,
    _estale_pfs_root,
    _pfs_root_not_a_dir,
    _eio_local_root,
    _stray_file_on_pfs,
    _manifest_without_files,
    _manifest_without_files_neighbour_down,
    _eisdir_old_pfs_manifest,
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.__name__.strip("_"))
def test_one_bad_entry_or_tier_never_hides_the_others(copy, monkeypatch, fault):
    tier, skipped = fault(copy, monkeypatch)
    with cachex.quiet_failed_saves():  # a rewrite into an unlistable local tier may fail
        r = copy.m.restore(_state(0))
    assert (r.step, r.tier) == (3, tier)
    assert r.state["w"].tobytes() == _state(3)["w"].tobytes() and int(r.state["n"]) == 3
    if skipped is None:
        assert copy.m.listing_skipped == []
    else:
        assert any(s.startswith(skipped) for s in copy.m.listing_skipped), copy.m.listing_skipped
        ev = [e for e in copy.m.events if e["event"] == "restore_skipped"]
        assert ev and any(s.startswith(skipped) for s in ev[-1]["skipped"]), ev


def test_audit_skips_an_unlistable_tier_and_stray_entries(copy, monkeypatch):
    (copy.root / "pfs" / "7").write_bytes(b"")
    kw = dict(pfs_dir=copy.root / "pfs", replica_dir=copy.root / "neighbour")
    assert cachex.verified_steps(copy.root / "local", **kw)["pfs"] == [0, 1, 2, 3]
    _fail_path(monkeypatch, copy.root / "pfs", errno.ESTALE)
    got = cachex.verified_steps(copy.root / "local", **kw)
    assert got["pfs"] == [] and got["local"][-1] == 3 and got["replica"][-1] == 3


def test_stray_file_named_like_a_step_is_reported_once(copy):
    (copy.root / "pfs" / "7").write_bytes(b"")
    for _ in range(2):
        assert copy.m.readable_steps()["pfs"] == [0, 1, 2, 3]
    strays = [e for e in copy.m.events if e["event"] == "stray_entry"]
    assert [(e["tier"], e["entry"]) for e in strays] == [
        ("pfs", f"{copy.root / 'pfs' / '7'}: not a directory")
    ]


def test_read_manifest_rejects_a_structurally_invalid_manifest(tmp_path):
    with cachex.CacheXManager(tmp_path) as m:
        m.save(0, _state(0))
    d = m.steps_dir / "0" / "state"
    _drop_files_key(d)
    with pytest.raises(cachex.CorruptCheckpointError, match="'files'"):
        _format.read_manifest(d)
    assert cachex.verified_steps(tmp_path)["local"] == []


@pytest.mark.parametrize(
    "change",
    [
        {"leaves": [{"path": "['w']", "shape": [8], "dtype": "object"}]},
        {"shards": [{"leaf": 5, "index": [[0, 8]], "file": "data.bin", "offset": 0, "nbytes": 32}]},
        {"shards": [{"leaf": 0, "index": [[0, 9]], "file": "data.bin", "offset": 0, "nbytes": 36}]},
        {"files": [{"file": "../x", "nbytes": 0, "crc32": 0}]},
        {"meta": None},
    ],
    ids=["object_dtype", "leaf_out_of_range", "index_outside_shape", "traversal", "meta"],
)
def test_read_manifest_rejects_wrong_types_with_a_valid_checksum(tmp_path, change):
    with cachex.CacheXManager(tmp_path) as m:
        m.save(0, {"w": np.ones(8, np.float32)})
    d = m.steps_dir / "0" / "state"
    path = d / _format.MANIFEST_FILE
    body = json.loads(path.read_bytes())
    del body["manifest_crc32"]
    body.update(change)
    crc = zlib.crc32(json.dumps(body, sort_keys=True).encode()) & 0xFFFFFFFF
    path.unlink()
    path.write_text(json.dumps(dict(body, manifest_crc32=crc), sort_keys=True))
    with pytest.raises(cachex.CorruptCheckpointError):
        _format.read_manifest(d)


def test_resume_refuses_to_restart_at_zero_over_unreadable_steps(tmp_path):
    m = cachex.CacheXManager(tmp_path, max_to_keep=2)
    for s in range(2):
        m.save(s, _state(s))
        m.wait_until_finished()
    for s in m.all_steps():
        _drop_files_key(m.steps_dir / str(s) / "state")
    # (the old resume returned (0, init_state) here: training silently started over)
    with pytest.raises(FileNotFoundError, match="refusing to restart") as info:
        cachex.resume(m, _state(0))
    assert isinstance(info.value, cachex.UnreadableCheckpointError)
    assert "local: step 0" in str(info.value) and "local: step 1" in str(info.value)
    ev = [e for e in m.events if e["event"] == "restore_skipped"]
    assert ev and len(ev[-1]["skipped"]) == 2
    m.close()


def test_resume_refuses_when_a_tier_cannot_be_listed(tmp_path, monkeypatch):
    m = cachex.CacheXManager(tmp_path)
    m.save(0, _state(0))
    m.wait_until_finished()
    _fail_path(monkeypatch, m.steps_dir, errno.EIO)
    with pytest.raises(FileNotFoundError, match="local: cannot list") as info:
        cachex.resume(m, _state(0))
    assert isinstance(info.value, cachex.UnreadableCheckpointError)
    monkeypatch.undo()
    m.close()


def test_resume_starts_at_zero_only_in_an_empty_directory(tmp_path):
    m = cachex.CacheXManager(tmp_path)
    init = _state(0)
    assert cachex.resume(m, init) == (0, init)
    (m.steps_dir / "4").write_bytes(b"")  # a stray file is no step, nor unreadable state
    assert cachex.resume(m, init) == (0, init)
    with pytest.raises(FileNotFoundError) as info:
        m.restore(init)
    assert not isinstance(info.value, cachex.UnreadableCheckpointError)
    m.close()


# -- D4: GC after a failed save ------------------------------------------------------------------


def _disk_steps(m) -> list[int]:
    return sorted(int(p.name) for p in m.steps_dir.iterdir() if p.name.isdigit() and p.is_dir())


def test_failed_save_leaks_no_step_gc_stays_idempotent(tmp_path):
    hooks = {"commit": cachex.fail_at(3)}
    with cachex.quiet_failed_saves():
        m = cachex.CacheXManager(tmp_path, max_to_keep=2, fault_hooks=hooks)
        for s in range(3):
            m.save(s, _state(s))
            m.wait_until_finished()
        assert _disk_steps(m) == [1, 2]
        m.save(3, _state(3))  # orbax plans to remove step 1 once step 3 commits
        with pytest.raises(OSError, match="No space left"):
            m.wait_until_finished()
        # orbax's list is the disk's again: step 1 is listed (and removable), 3 is not
        assert _disk_steps(m) == m._mngr.all_steps() == [1, 2]
        for s in (4, 5):
            m.save(s, _state(s))
            m.wait_until_finished()
        assert _disk_steps(m) == m._mngr.all_steps() == [4, 5]
        m.close()


def test_failed_save_found_by_the_next_save_also_relists(tmp_path):
    hooks = {"local_write": cachex.fail_at(2)}
    with cachex.quiet_failed_saves():
        m = cachex.CacheXManager(tmp_path, max_to_keep=1, fault_hooks=hooks)
        for s in range(2):
            m.save(s, _state(s))
            m.wait_until_finished()
        m.save(2, _state(2))
        with pytest.raises(OSError, match="No space left"):
            m.save(3, _state(3))  # the previous save's failure surfaces here
        assert _disk_steps(m) == m._mngr.all_steps() == [1]
        m.save(3, _state(3))
        m.wait_until_finished()
        assert _disk_steps(m) == m._mngr.all_steps() == [3]
        m.close()


# -- D7: a stray file named like a step in steps/ -----------------------------------------------


def test_stray_file_in_steps_breaks_no_wait_restore_or_close(tmp_path):
    m = cachex.CacheXManager(tmp_path, max_to_keep=2)
    m.save(0, _state(0))
    m.wait_until_finished()
    (m.steps_dir / "3").write_bytes(b"stray")
    for s in (1, 2):
        m.save(s, _state(s))
        m.wait_until_finished()
    assert m.all_steps() == [1, 2]
    r = m.restore(_state(0))
    assert (r.step, r.tier) == (2, "local") and int(r.state["n"]) == 2
    m.close()
    strays = [e for e in m.events if e["event"] == "stray_entry"]
    assert len(strays) == 1 and strays[0]["entry"].endswith("not a directory")
    assert (m.steps_dir / "3").read_bytes() == b"stray"  # not CacheX's to delete


# -- D3: a step number orbax would refuse, or one reused after its records were left ------------


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def _drained_with_step_3_corrupt(tmp_path):
    """Steps 0-3 saved and drained, then step 3 corrupt in every tier."""
    m = cachex.CacheXManager(tmp_path / "local", pfs_dir=tmp_path / "pfs", drainer=False)
    for s in range(4):
        m.save(s, _state(s))
        m.wait_until_finished()
        assert cachex.drain_once(m.drainer_config) == [s]
    _flip(m.steps_dir / "3" / "state" / _format.DATA_FILE)
    _flip(tmp_path / "pfs" / "3" / "rank_0" / _format.DATA_FILE)
    return m


def test_save_at_or_below_the_latest_step_is_a_clear_error(tmp_path):
    # step 3 corrupt in every tier: the restore falls back to step 2 ...
    m = _drained_with_step_3_corrupt(tmp_path)
    assert m.restore(_state(0)).step == 2
    # ... and resuming at step 3 must not return False while step 3's records say durable
    with pytest.raises(ValueError, match=r"^step: .*latest saved step 3, got 3"):
        m.save(3, _state(30))
    with pytest.raises(ValueError, match=r"^step: .*latest saved step 3, got 1"):
        m.save(1, _state(30))
    m.close()


def test_resume_after_a_fallback_continues_from_the_restored_step(tmp_path):
    # resume() restores the newest step every rank can read; newer local steps (corrupt here;
    # in a job, ones the other ranks never committed) are discarded, so the loop saves again
    # from the next step instead of failing on "not newer than the latest saved step".
    m = _drained_with_step_3_corrupt(tmp_path)
    start, state = cachex.resume(m, _state(0))
    assert start == 3 and int(state["n"]) == 2
    assert max(m.all_steps()) == 2 and not m.tier_done(3, "pfs")
    assert [e["steps"] for e in m.events if e["event"] == "discarded_steps"] == [[3]]
    m.save(3, _state(33))
    m.wait_until_finished()
    assert m.restore(_state(0)).state["w"][0] == 33
    m.close()


def test_discard_after_removes_newer_steps_and_their_records(tmp_path):
    with cachex.CacheXManager(tmp_path, max_to_keep=4) as m:
        for s in range(4):
            m.save(s, _state(s))
        m.wait_until_finished()
        assert m.discard_after(1) == [2, 3] and m.discard_after(1) == []
        assert _disk_steps(m) == [0, 1] and m.all_steps() == [0, 1]
        assert not any(p.name.startswith(".discarded") for p in tmp_path.iterdir())
        assert not (m.records_dir / "3").exists()
        m.save(2, _state(22))
        m.wait_until_finished()
        assert m.restore(_state(0)).step == 2


def test_records_left_under_a_reused_step_number_are_removed(tmp_path):
    m = cachex.CacheXManager(tmp_path / "local", pfs_dir=tmp_path / "pfs", drainer=False)
    m.save(0, _state(0))
    m.wait_until_finished()
    assert cachex.drain_once(m.drainer_config) == [0]
    # records of a step 1 that is not on disk (an abandoned timeline's)
    cachex._pfs.record_tier(m.records_dir, 1, "pfs", committed=True)
    assert m.tier_done(1, "pfs") and m.newest_pfs_step() == 1
    m.save(1, _state(1))
    m.wait_until_finished()
    assert not m.tier_done(1, "pfs") and m.newest_pfs_step() == 0
    assert [e["tiers"] for e in m.events if e["event"] == "stale_records_removed"] == [["pfs"]]
    assert cachex.drain_once(m.drainer_config) == [1]  # the new step 1 is drained
    assert m.wait_for_pfs(1, timeout_s=1)
    m.close()


# -- D6: records pruned with their steps --------------------------------------------------------


def _record_dirs(m) -> list[int]:
    return sorted(int(p.name) for p in m.records_dir.iterdir() if p.name.isdigit())


def test_records_are_pruned_with_their_steps_and_still_answer(tmp_path):
    m = cachex.CacheXManager(
        tmp_path / "local", pfs_dir=tmp_path / "pfs", drainer=False, max_to_keep=2
    )
    for s in range(6):
        m.save(s, _state(s))
        m.wait_until_finished()
        if s != 5:
            assert cachex.drain_once(m.drainer_config) == [s]
    assert m.all_steps() == [4, 5] and m.newest_pfs_step() == 4
    assert _record_dirs(m) == [4, 5]  # the saves scan these only
    # a pruned step's records are still there to read
    assert {"staged", "local", "pfs"} <= set(m.durability(0))
    assert m.tier_done(0, "pfs") and m.wait_for_pfs(0, timeout_s=1)
    lag = m.health(ping_neighbour=False)
    assert lag["durability_lag_steps"] == 1 and lag["durability_lag_s"] >= 0
    m.close()


def test_records_of_a_pruned_step_number_never_vouch_for_its_reuse(tmp_path):
    kw = dict(pfs_dir=tmp_path / "pfs", drainer=False, max_to_keep=1, pfs_max_to_keep=1)
    m = cachex.CacheXManager(tmp_path / "local", **kw)
    for s in range(4):
        m.save(s, _state(s))
        m.wait_until_finished()
        assert cachex.drain_once(m.drainer_config) == [s]
    m.close()
    cachex.wipe_local(tmp_path / "local")
    m2 = cachex.CacheXManager(tmp_path / "local", **kw)
    assert m2.tier_done(1, "pfs")  # the old step 1 was PFS-durable
    m2.save(1, _state(10))  # a new step 1 (e.g. after a rollback): not PFS-durable
    m2.wait_until_finished()
    assert not m2.tier_done(1, "pfs") and "pfs" not in m2.durability(1)
    m2.close()
