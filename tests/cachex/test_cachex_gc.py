"""CacheX PFS-tier GC and the failed-drain policy (pin, bounded retry with backoff, record)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hexad import cachex
from hexad.cachex import _pfs

TOKEN = "gc-test-token-0123456"


def _pfs_committed(pfs):
    return sorted(int(p.name) for p in pfs.iterdir() if p.name.isdigit())


@pytest.fixture
def server(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "neighbour", token=TOKEN, max_lifetime_s=120).start()
    yield srv
    srv.stop()


def test_pfs_gc_keeps_newest_n_committed_steps(tmp_path):
    pfs = tmp_path / "pfs"
    m = cachex.CacheXManager(tmp_path / "n0", pfs_dir=pfs, drainer=False, pfs_max_to_keep=2)
    x = {"x": np.arange(64, dtype=np.float32)}
    for s in range(5):
        m.save(s, {"x": x["x"] + s})
        m.wait_until_finished()
        assert _pfs.drain_once(m.drainer_config) == [s]
        assert _pfs_committed(pfs) == list(range(max(0, s - 1), s + 1))
    assert m.durability(4)["pfs"]["pfs_gc"] == [2]  # the GC is visible in the record
    assert not list(pfs.glob(".gc-*")) and not list(pfs.glob(".tmp-*"))
    # Local and replica tiers gone: the PFS alone restores the newest step, bit-exact.
    m.close()
    m2 = cachex.CacheXManager(tmp_path / "fresh", pfs_dir=pfs, drainer=False)
    r = m2.restore(x)
    assert (r.step, r.tier) == (4, "pfs") and np.array_equal(r.state["x"], x["x"] + 4)
    m2.close()


def test_pfs_gc_never_deletes_newest_durable_step_nor_a_draining_one(tmp_path):
    pfs = tmp_path / "pfs"
    mgrs = [
        cachex.CacheXManager(
            tmp_path / f"node{r}", pfs_dir=pfs, rank=r, n_ranks=2, drainer=False, pfs_max_to_keep=1
        )
        for r in range(2)
    ]
    cfgs = [m.drainer_config for m in mgrs]
    for s in (0, 1):
        for r, m in enumerate(mgrs):
            m.save(s, {"x": np.full(8, 10 * s + r, np.int32)})
            m.wait_until_finished()
    assert _pfs.drain_once(cfgs[0]) == [1] and _pfs.drain_once(cfgs[1]) == [1]
    assert _pfs_committed(pfs) == [1]
    for r, m in enumerate(mgrs):
        m.save(2, {"x": np.full(8, 20 + r, np.int32)})
        m.wait_until_finished()
    assert _pfs.drain_once(cfgs[0]) == [2]  # rank 0 done, rank 1 not yet: step 2 is draining
    assert (pfs / ".tmp-2" / "done_0").exists() and not (pfs / "2").exists()
    # Even keep=1 leaves the newest committed step (1) and the draining one (.tmp-2) alone.
    assert _pfs.gc_pfs(pfs, 1) == []
    assert _pfs_committed(pfs) == [1] and (pfs / ".tmp-2" / "rank_0").is_dir()
    assert _pfs.drain_once(cfgs[1]) == [2]  # the last writer commits 2 and then collects 1
    assert _pfs_committed(pfs) == [2] and not (pfs / ".tmp-2").exists()
    assert mgrs[1].durability(2)["pfs"]["pfs_gc"] == [1]
    assert mgrs[0].durability(2)["pfs_part"]["pfs_gc"] == []  # rank 0 did not commit: no GC
    assert "pfs" not in mgrs[0].durability(2)  # rank 0 has not yet seen the commit ...
    assert _pfs.drain_once(cfgs[0]) == [] and "pfs" in mgrs[0].durability(2)  # ... now it has
    with pytest.raises(ValueError, match="keep"):
        _pfs.gc_pfs(pfs, 0)
    (pfs / ".gc-7").mkdir()  # leftover of a GC that died between rename and delete
    assert _pfs.gc_pfs(pfs, 1) == [] and not (pfs / ".gc-7").exists()
    for m in mgrs:
        m.close()


def test_failed_drain_is_pinned_retried_with_backoff_and_recorded(tmp_path, server):
    pfs = tmp_path / "pfs"
    client = cachex.ReplicaClient(server.address, TOKEN, timeout_s=20)
    m = cachex.CacheXManager(
        tmp_path / "local", neighbour=client, pfs_dir=pfs, drainer=False, max_to_keep=1,
        drain_max_attempts=3, drain_backoff_s=10.0, drain_backoff_max_s=15.0,
    )  # fmt: skip
    cfg = m.drainer_config
    x = {"x": np.arange(256, dtype=np.float32)}

    def save(s):
        m.save(s, {"x": x["x"] + s})
        m.wait_until_finished()

    save(0)
    assert _pfs.drain_once(cfg) == [0]
    # A regular file where the drain's tmp directory goes: every drain of 1 and 2 fails.
    for s in (1, 2):
        (pfs / f".tmp-{s}").write_bytes(b"")
        save(s)
    t = 1000.0
    assert _pfs.drain_once(cfg, now=t) == []  # newest first: 2 fails (attempt 1)
    rec = m.durability(2)["pfs_retry"]
    assert rec["attempts"] == 1 and rec["next_try"] == t + 10.0
    assert "FileExistsError" in rec["errors"][0]
    assert _pfs.drain_once(cfg, now=t) == []  # 2 waits for its retry: 1 is tried instead
    assert m.durability(1)["pfs_retry"]["attempts"] == 1
    assert _pfs.retry_waiting(cfg, now=t + 1) == [1, 2]
    assert _pfs.drain_once(cfg, now=t + 1) == []  # nothing due: nothing attempted
    assert m.durability(2)["pfs_retry"]["attempts"] == 1
    assert _pfs.drain_once(cfg, now=t + 10) == []  # 2 again: backoff doubles, capped at 15
    rec = m.durability(2)["pfs_retry"]
    assert rec["attempts"] == 2 and rec["next_try"] == t + 10 + 15.0
    assert _pfs.drain_once(cfg, now=t + 30) == []  # attempt 3 of 3: final
    assert m.durability(2)["pfs_error"]["attempts"] == 3 and m.tier_done(2, "pfs_error")
    assert len(m.durability(2)["pfs_retry"]["errors"]) == 3
    assert not m.wait_for_pfs(2, timeout_s=1)
    # The PFS recovers; the retry of 1 succeeds and says how many attempts it took.
    (pfs / ".tmp-1").unlink()
    assert _pfs.drain_once(cfg, now=t + 30) == [1]
    assert m.durability(1)["pfs"]["attempts"] == 2
    assert m.durability(1)["pfs_retry"]["attempts"] == 1  # the failure history stays visible
    # The failed step 2 is newer than the newest PFS-durable one (1): it stays pinned, locally
    # and on the neighbour's replica, although max_to_keep = 1; 0 goes.
    save(3)
    assert m.all_steps() == [1, 2, 3]
    assert {1, 2, 3} <= set(client.list_steps(0))
    assert _pfs.drain_once(cfg, now=t + 30) == [3]  # 2 is final and never tried again
    save(4)  # 3 is PFS-durable: the failed 2 is superseded and collected
    assert m.all_steps() == [3, 4]
    save(5)  # the replica's GC follows the local one at the next commit: 2 goes there too
    assert m.all_steps() == [3, 4, 5] and client.list_steps(0) == [3, 4, 5]
    r = m.restore(x)
    assert r.step == 5 and np.array_equal(r.state["x"], x["x"] + 5)
    m.close()


def test_drainer_process_keeps_retrying_after_the_trainer_closes(tmp_path):
    pfs = tmp_path / "pfs"
    m = cachex.CacheXManager(
        tmp_path / "local", pfs_dir=pfs, drain_max_attempts=8, drain_backoff_s=0.2,
        drain_backoff_max_s=0.4,
    )  # fmt: skip
    (pfs.mkdir(parents=True, exist_ok=True), (pfs / ".tmp-0").write_bytes(b""))
    m.save(0, {"x": np.arange(8, dtype=np.int64)})
    m.close()  # the drainer is told to stop when idle; a waiting retry keeps it going
    t_end = time.monotonic() + 30
    while not m.tier_done(0, "pfs_retry") and time.monotonic() < t_end:
        time.sleep(0.05)
    time.sleep(1.5)  # longer than the drainer's idle exit (1 s)
    assert m._drainer.poll() is None
    (pfs / ".tmp-0").unlink()
    assert m.wait_for_pfs(0, timeout_s=30)
    assert m.durability(0)["pfs"]["attempts"] >= 2
    m._drainer.wait(timeout=30)


def test_manager_validates_gc_and_retry_arguments(tmp_path):
    for kw, name in (
        ({"pfs_max_to_keep": 0}, "pfs_max_to_keep"),
        ({"drain_max_attempts": 0}, "drain_max_attempts"),
        ({"drain_backoff_s": -1.0}, "drain_backoff_s"),
        ({"drain_backoff_max_s": float("inf")}, "drain_backoff_max_s"),
    ):
        with pytest.raises(ValueError, match=name):
            cachex.CacheXManager(tmp_path, **kw)


# -- ItemCheckpoint (--resume for studies that loop over independent items) -------------------


def test_item_checkpoint_round_trip_and_refuses_a_different_run(tmp_path):
    m = cachex.CacheXManager(tmp_path / "ckpt")
    arrays = {"h": ((2, 3), "float64")}
    log = cachex.ItemCheckpoint(m, ["a", "b"], arrays, config={"n": 1})
    assert not log.done("a")
    log.arrays["h"][0] = [0.1, 0.2, 1 / 3]
    rec = {"x": 0.1 + 0.2, "k": 3, "s": ["ab", "c"]}
    log.complete("a", rec)
    again = cachex.ItemCheckpoint(m, ["a", "b"], arrays, config={"n": 1})
    assert again.done("a") and not again.done("b")
    assert again.record("a") == rec  # floats round-trip exactly through JSON
    assert again.arrays["h"].tobytes() == log.arrays["h"].tobytes()
    fresh = cachex.ItemCheckpoint(m, ["a", "b"], arrays, config={"n": 1}, enabled=False)
    assert not fresh.done("a")
    fresh.complete("b", {"x": 1})  # starting over in a used directory: saved after step 0
    assert m.all_steps() == [0, 1]
    assert cachex.ItemCheckpoint(m, ["a", "b"], arrays, config={"n": 1}).record("b") == {"x": 1}
    with pytest.raises(ValueError, match="different run"):
        cachex.ItemCheckpoint(m, ["a", "b"], arrays, config={"n": 2})
    with pytest.raises(ValueError, match="capacity"):
        cachex.ItemCheckpoint(m, ["a"], capacity=64, enabled=False).complete("a", {"x": "y" * 80})
    with pytest.raises(ValueError, match="item"):
        log.complete("zz", {})
    with pytest.raises(ValueError, match="unique"):
        cachex.ItemCheckpoint(m, ["a", "a"])
    with pytest.raises(TypeError, match="manager"):
        cachex.ItemCheckpoint(str(tmp_path), ["a"])
    m.close()


def test_an_item_over_capacity_is_not_done(tmp_path):
    m = cachex.CacheXManager(tmp_path / "ckpt")
    log = cachex.ItemCheckpoint(m, ["a", "b"], config={"n": 1}, capacity=128)
    with pytest.raises(ValueError, match="capacity"):
        log.complete("a", {"s": "x" * 200})
    assert not log.done("a") and m.all_steps() == []
    log.complete("b", {"x": 1})  # the refused record takes no room
    assert not log.done("a") and log.done("b")
    again = cachex.ItemCheckpoint(m, ["a", "b"], config={"n": 1}, capacity=128)
    assert not again.done("a") and again.done("b")
    m.close()
