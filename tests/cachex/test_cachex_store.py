"""CacheX storage tiers: format, integrity, replica server, drainer, orbax manager, fallback."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hexad import cachex
from hexad.cachex import _format, _pfs, _replica

TOKEN = "store-test-token-0123"


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


@pytest.fixture(scope="module")
def tree(mesh):
    k1, k2 = jax.random.split(jax.random.key(3))
    w = jax.random.normal(k1, (8, 6), jnp.float32)
    return {
        "params": {
            "w": jax.device_put(w, NamedSharding(mesh, P("data", "model"))),
            "b": jax.device_put(
                jax.random.normal(k2, (6,), jnp.bfloat16), NamedSharding(mesh, P("model"))
            ),
            "r": jax.device_put(jnp.arange(5, dtype=jnp.int32), NamedSharding(mesh, P())),
        },
        "opt": (np.arange(4, dtype=np.uint8), np.float64(2.5)),
        "count": 7,
    }


def _equal(a, b) -> bool:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


@pytest.fixture
def server(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "neighbour", token=TOKEN, max_lifetime_s=120).start()
    yield srv
    srv.stop()


def _manager(tmp_path, server=None, **kw):
    client = cachex.ReplicaClient(server.address, TOKEN, timeout_s=20) if server else None
    return cachex.CacheXManager(tmp_path / "local", neighbour=client, **kw)


def _flip_bit(path: Path, byte: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[byte] ^= 0x10
    path.write_bytes(bytes(data))


# -- names and paths --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, "1/2", "../3", "", "abc", "1.0", True, 2.0, "12\n"])
def test_step_name_rejects_non_integers_and_traversal(bad):
    with pytest.raises((ValueError, TypeError), match="step"):
        cachex.validate_step_name(bad)


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "", "x..y", "a\\b", "data.bin\n"])
def test_file_name_rejects_traversal(bad):
    with pytest.raises(ValueError, match="file name"):
        cachex.validate_file_name(bad)


# -- T0 staging --------------------------------------------------------------------------------


def test_staging_pool_copies_and_reuses_buffers():
    pool = cachex.StagingPool(2)
    src = {"a": np.arange(6, dtype=np.float32)}
    slot, snap = pool.stage(src)
    src["a"][:] = -1.0  # the snapshot is a copy, not a view of the source
    assert snap.shards[0].data.tolist() == list(range(6))
    pool.release(slot)
    allocs = pool.allocations
    for _ in range(4):  # same shapes: steady state allocates nothing
        s, _ = pool.stage(src)
        pool.release(s)
    assert pool.allocations <= allocs + 1  # the second slot's first use


def test_big_endian_leaf_is_saved_little_endian_and_restores(tmp_path):
    x = np.arange(4, dtype=">f4")
    slot, snap = cachex.StagingPool(1).stage({"w": x})
    (tmp_path / "r").mkdir()
    _format.write_rank_dir(tmp_path / "r", snap, {})
    # data.bin holds the documented little-endian bytes
    assert (tmp_path / "r" / "data.bin").read_bytes() == x.astype("<f4").tobytes()
    m = _manager(tmp_path)
    m.save(0, {"w": x})
    m.wait_until_finished()
    for target in (np.zeros(4, np.float32), np.zeros(4, ">f4")):
        assert np.asarray(m.restore({"w": target}).state["w"]).tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="dtype float32 as saved, got shape \\(4,\\) dtype int32"):
        m.restore({"w": np.zeros(4, ">i4")})
    m.close()


def test_staging_pool_blocks_when_both_slots_busy():
    pool = cachex.StagingPool(2)
    pool.stage({"a": np.ones(2)})
    pool.stage({"a": np.ones(2)})
    with pytest.raises(TimeoutError, match="no free slot"):
        pool.stage({"a": np.ones(2)}, timeout=0.05)


# -- orbax manager: round trip, mismatch, integrity --------------------------------------------


def test_round_trip_sharded_bit_exact_and_reshard(tmp_path, tree, mesh):
    m = _manager(tmp_path)
    assert m.save(3, tree)
    m.wait_until_finished()
    r = m.restore(tree)
    assert (r.step, r.tier) == (3, "local")
    assert _equal(r.state, tree)
    assert r.state["params"]["w"].sharding == tree["params"]["w"].sharding
    # Restore into a different sharding: assembled from the saved shards, still bit-exact.
    other = jax.tree.map(lambda x: x, tree)
    other["params"]["w"] = jax.ShapeDtypeStruct(
        (8, 6), jnp.float32, sharding=NamedSharding(mesh, P("model", None))
    )
    r2 = m.restore(other)
    assert r2.state["params"]["w"].sharding.spec == P("model", None)
    assert (
        np.asarray(r2.state["params"]["w"]).tobytes() == np.asarray(tree["params"]["w"]).tobytes()
    )
    rec = m.durability(3)
    assert {"staged", "local"} <= set(rec)
    m.close()


def test_restore_into_mismatched_tree_or_dtype_is_a_clear_error(tmp_path, tree):
    m = _manager(tmp_path)
    m.save(0, tree)
    m.wait_until_finished()
    wrong_structure = {"params": tree["params"], "count": 7}
    with pytest.raises(ValueError, match="tree structure differs"):
        m.restore(wrong_structure)
    wrong_dtype = jax.tree.map(lambda x: x, tree)
    wrong_dtype["opt"] = (np.arange(4, dtype=np.int32), np.float64(2.5))
    with pytest.raises(ValueError, match=r"expected shape \(4,\) dtype uint8"):
        m.restore(wrong_dtype)
    wrong_shape = jax.tree.map(lambda x: x, tree)
    wrong_shape["opt"] = (np.arange(5, dtype=np.uint8), np.float64(2.5))
    with pytest.raises(ValueError, match="expected shape"):
        m.restore(wrong_shape)
    m.close()


@pytest.mark.parametrize("fault", ["flip_data", "flip_manifest", "truncate", "delete"])
def test_corrupt_local_step_is_never_loaded(tmp_path, fault):
    m = _manager(tmp_path)
    good = {"x": np.arange(32, dtype=np.float32)}
    m.save(0, good)
    m.wait_until_finished()
    m.save(1, {"x": good["x"] + 1})
    m.wait_until_finished()
    d = m.steps_dir / "1" / "state"
    data = d / "data.bin"
    if fault == "flip_data":
        _flip_bit(data, byte=17)
    elif fault == "flip_manifest":
        raw = (d / "manifest.json").read_bytes()
        i = raw.index(b'"nbytes": ') + len(b'"nbytes": ')
        (d / "manifest.json").write_bytes(raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1 :])
    elif fault == "truncate":
        data.write_bytes(data.read_bytes()[:-4])
    else:
        data.unlink()
    with pytest.raises(cachex.CorruptCheckpointError):
        _format.read_rank_dir(d)
    r = m.restore(good)  # step 1 is unreadable everywhere: step 0, bit-exact
    assert r.step == 0 and np.array_equal(r.state["x"], good["x"])
    m.close()


# -- T2 replica server -------------------------------------------------------------------------


def test_replica_rejects_wrong_token_oversize_and_traversal(server, tmp_path):
    bad = cachex.ReplicaClient(server.address, "wrong-token-wrong-token", timeout_s=5)
    with pytest.raises(cachex.ReplicaError, match="authentication"):
        bad.list_steps(0)
    assert server.rejected == 1
    # Oversize header: the server drops the connection without reading it.
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(struct.pack(">I", 1 << 30))
        assert s.recv(16) == b""
    good = cachex.ReplicaClient(server.address, TOKEN, timeout_s=5)
    conn = good._connect()
    try:
        for hdr in (
            {"op": "put", "owner": 0, "step": "0", "file": "../evil", "offset": 0, "last": True},
            {"op": "get", "owner": 0, "step": "../..", "file": "x"},
            {"op": "put", "owner": "../0", "step": "0", "file": "a", "offset": 0},
        ):
            with pytest.raises(cachex.ReplicaError):
                good._call(conn, hdr, b"x")
    finally:
        conn[0].close()
    assert not any(p.name == "evil" for p in tmp_path.rglob("*"))


def test_replica_server_stops_itself_after_its_lifetime(tmp_path):
    srv = cachex.ReplicaServer(tmp_path, token=TOKEN, max_lifetime_s=0.2).start()
    assert srv.running
    t_end = time.monotonic() + 10
    while srv.running and time.monotonic() < t_end:
        time.sleep(0.05)
    assert not srv.running
    with pytest.raises(cachex.ReplicaError, match="cannot connect"):
        cachex.ReplicaClient(srv.address, TOKEN, timeout_s=2).list_steps(0)


def test_replica_push_fetch_and_commit_on_neighbour(server, tmp_path):
    m = _manager(tmp_path, server)
    x = {"x": np.arange(10, dtype=np.int16)}
    m.save(5, x)
    m.wait_until_finished()
    assert m.tier_done(5, "replica")
    replica = Path(server.root) / "rank_0" / "5"
    assert (replica / "manifest.json").exists()
    assert not list((Path(server.root) / "rank_0").glob(".tmp-*"))
    _format.read_rank_dir(replica)  # every checksum verifies on the neighbour
    m.close()


# -- restore falls back tier by tier -----------------------------------------------------------


def test_restore_falls_back_local_then_replica_then_pfs(tmp_path, server):
    m = _manager(tmp_path, server, pfs_dir=tmp_path / "pfs", drainer=False)
    x0 = {"x": np.arange(16, dtype=np.float32)}
    m.save(0, x0)
    m.wait_until_finished()
    assert _pfs.drain_once(m.drainer_config) == [0]  # step 0 on the PFS
    x1 = {"x": x0["x"] * 2}
    m.save(1, x1)
    m.wait_until_finished()
    assert m.restore(x0).tier == "local"
    # Whole node's local storage wiped -> the neighbour's replica of step 1.
    for p in (m.steps_dir / "1" / "state").iterdir():
        p.unlink()
    r = m.restore(x0)
    assert (r.step, r.tier) == (1, "replica") and np.array_equal(r.state["x"], x1["x"])
    # The step read from the replica was written locally again (replication and drain resume).
    r = m.restore(x0)
    assert (r.step, r.tier) == (1, "local") and np.array_equal(r.state["x"], x1["x"])
    for p in (m.steps_dir / "1" / "state").iterdir():
        p.unlink()
    # Neighbour dead too -> the PFS, which holds step 0 only.
    server.stop()
    r = m.restore(x0)
    assert (r.step, r.tier) == (0, "local")  # step 0 is still local, first tier wins
    _flip_bit(m.steps_dir / "0" / "state" / "data.bin")
    r = m.restore(x0)
    assert (r.step, r.tier) == (0, "pfs") and np.array_equal(r.state["x"], x0["x"])
    _flip_bit(tmp_path / "pfs" / "0" / "rank_0" / "data.bin")
    with pytest.raises(FileNotFoundError, match="no checkpoint step.*checksum mismatch"):
        m.restore(x0)
    m.close()


# -- GC ----------------------------------------------------------------------------------------


def test_gc_keeps_newest_durable_step_while_newer_save_in_flight(tmp_path, server):
    m = _manager(tmp_path, server, max_to_keep=1, pfs_dir=tmp_path / "pfs", drainer=False)
    x = {"x": np.arange(4096, dtype=np.float32)}
    m.save(0, x)
    m.wait_until_finished()
    assert _pfs.drain_once(m.drainer_config) == [0]
    m.save(1, x)
    m.wait_until_finished()  # 1 committed, not yet PFS-durable: 0 and 1 both kept
    assert m.all_steps() == [0, 1]
    server.delay_s = 0.3  # slow neighbour: step 2 stays in flight for a while
    m.save(2, {"x": x["x"] + 2})
    assert m.all_steps() == [0, 1]  # in flight: nothing newer is durable, nothing deleted
    assert _format.read_manifest(m.steps_dir / "1" / "state")
    m.wait_until_finished()
    server.delay_s = 0.0
    # Newest PFS-durable (0) stays pinned, and so does every newer step not yet drained.
    assert m.all_steps() == [0, 1, 2]
    assert _pfs.drain_once(m.drainer_config) == [2]
    m.save(3, x)
    m.wait_until_finished()
    steps = m.all_steps()
    assert 2 in steps and 3 in steps and 0 not in steps  # 2 = newest PFS-durable, kept
    r = m.restore(x)
    assert r.step == 3
    m.close()


# -- T3 drain protocol ---------------------------------------------------------------------------


def test_pfs_commit_by_last_writer_of_two_ranks(tmp_path):
    pfs = tmp_path / "pfs"
    cfgs = []
    for rank in range(2):
        local = tmp_path / f"node{rank}"
        m = cachex.CacheXManager(local, pfs_dir=pfs, rank=rank, n_ranks=2, drainer=False)
        m.save(4, {"x": np.full(8, rank, np.int32)})
        m.close()
        cfgs.append(m.drainer_config)
    assert _pfs.drain_once(cfgs[0]) == [4]
    assert not (pfs / "4").exists() and (pfs / ".tmp-4" / "done_0").exists()
    assert _pfs.drain_once(cfgs[1]) == [4]
    assert (pfs / "4" / "rank_0" / "manifest.json").exists()
    assert not (pfs / ".tmp-4").exists()
    for rank in range(2):
        _, pieces = _format.read_rank_dir(pfs / "4" / f"rank_{rank}")
        assert pieces[0][2].tolist() == [rank] * 8


def test_drainer_refuses_to_propagate_a_corrupt_local_step(tmp_path):
    m = cachex.CacheXManager(tmp_path / "n", pfs_dir=tmp_path / "pfs", drainer=False)
    m.save(0, {"x": np.arange(100, dtype=np.float32)})
    m.close()
    _flip_bit(m.steps_dir / "0" / "state" / "data.bin", byte=40)
    t = time.time()
    for attempt in range(5):  # retried with backoff (0.5, 1, 2, 4 s), then final
        assert _pfs.drain_once(m.drainer_config, now=t + 60.0 * attempt) == []
        assert (
            "checksum" in m.durability(0)["pfs_retry"]["errors"][-1]
            or "corrupt" in (m.durability(0)["pfs_retry"]["errors"][-1])
        )
        assert m.tier_done(0, "pfs_error") == (attempt == 4)
    assert not (tmp_path / "pfs" / "0").exists()
    assert not (tmp_path / "pfs" / ".tmp-0" / "done_0").exists()


def test_killed_trainer_leaves_no_restorable_partial_step_and_drainer_survives(tmp_path, server):
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    script = Path(__file__).with_name("_trainer.py")
    host, port = server.address
    proc = subprocess.Popen(
        [sys.executable, str(script), str(local), str(pfs), host, str(port), TOKEN, "2"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        server.delay_s = 2.0  # step 2's push crawls; the trainer dies during it
        assert proc.stdout.readline().strip() == "SAVING"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    server.delay_s = 0.0
    # The drainer outlives the trainer and persists the newest committed step (1).
    t_end = time.monotonic() + 60
    while not (pfs / "1").exists() and time.monotonic() < t_end:
        time.sleep(0.1)
    assert (pfs / "1" / "rank_0" / "manifest.json").exists()
    target = {"w": np.zeros((64, 32), np.float32), "step": np.int64(0)}
    client = cachex.ReplicaClient(server.address, TOKEN, timeout_s=10)
    m = cachex.CacheXManager(local, neighbour=client, pfs_dir=pfs, drainer=False)
    readable = m.readable_steps()
    assert 2 not in readable["local"] + readable["replica"] + readable["pfs"]
    r = m.restore(target)
    expect = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    assert r.step == 1 and r.state["w"].tobytes() == expect.tobytes()
    m.close()


# -- orbax integration and resume --------------------------------------------------------------


def test_handler_is_registered_with_orbax_args():
    from orbax.checkpoint import checkpoint_args

    assert checkpoint_args.get_registered_handler_cls(cachex.CacheXSave) is cachex.CacheXHandler
    assert checkpoint_args.get_registered_handler_cls(cachex.CacheXRestore) is cachex.CacheXHandler
    assert isinstance(cachex.CacheXHandler(), ocp.AsyncCheckpointHandler)


def test_resume_helper(tmp_path):
    m = _manager(tmp_path)
    init = {"w": np.zeros(3, np.float32)}
    assert cachex.resume(m, init) == (0, init)
    m.save(9, {"w": np.ones(3, np.float32)})
    step, state = cachex.resume(m, init)
    assert step == 10 and state["w"].tolist() == [1.0, 1.0, 1.0]
    assert cachex.resume(m, init, enabled=False)[0] == 0
    m.close()


def test_manager_validates_arguments(tmp_path):
    with pytest.raises(ValueError, match="max_to_keep"):
        cachex.CacheXManager(tmp_path, max_to_keep=0)
    with pytest.raises(TypeError, match="neighbour"):
        cachex.CacheXManager(tmp_path, neighbour=("127.0.0.1", 1))
    with pytest.raises(ValueError, match="token"):
        cachex.ReplicaServer(tmp_path, token="")
    with pytest.raises(ValueError, match="bandwidth"):
        cachex.PFSModel(bandwidth=0.0)


def test_pfs_model_median_and_lognormal_spread():
    model = cachex.PFSModel(bandwidth=1e8, n_writers=4, contention=0.5, latency_s=0.01, sigma=0.2)
    assert model.median_time(1e8) == pytest.approx((0.01 + 1.0) * 2.5)
    t = model.sample(np.random.default_rng(0), 1e8, size=20000)
    # log T ~ N(log m, 0.2^2): the sample median is within 3 SE (~0.5%) of m.
    assert np.median(t) == pytest.approx(2.525, rel=0.01)
    assert np.std(np.log(t)) == pytest.approx(0.2, rel=0.03)


def test_json_only_no_pickle(tmp_path):
    m = _manager(tmp_path)
    m.save(0, {"x": np.arange(3)})
    m.close()
    manifest = json.loads((m.steps_dir / "0" / "state" / "manifest.json").read_text())
    assert manifest["leaves"][0]["dtype"] == "int64"
    src = "".join(p.read_text() for p in Path(cachex.__file__).parent.glob("*.py"))
    assert "import pickle" not in src and "allow_pickle=True" not in src
    assert _replica.ReplicaServer.__init__.__defaults__[0] == "127.0.0.1"


def test_restore_error_names_each_unreadable_step_once(tmp_path):
    m = cachex.CacheXManager(tmp_path / "local")
    x = {"x": np.arange(16, dtype=np.float32)}
    for s in range(3):
        m.save(s, x)
        m.wait_until_finished()
    kept = m.all_steps()
    assert len(kept) >= 2, kept
    for s in kept:
        _flip_bit(m.steps_dir / str(s) / "state" / "data.bin")
    with pytest.raises(FileNotFoundError) as info:
        m.restore(x)
    # The message lists the last four skipped entries; each skipped step once (a doubled
    # entry per step would show each step twice).
    assert [str(info.value).count(f"step {s}:") for s in kept] == [1] * len(kept), info.value
    m.close()


def test_json_writers_of_one_path_do_not_collide(tmp_path, monkeypatch):
    # A second writer of the same record (another thread, the same object) runs between this
    # writer's file and its rename: each renames its own temporary (a name made of the pid and
    # the object's id was shared, so the first writer's file was removed under it).
    from hexad.cachex import _fsio

    real = _fsio.write_file_durable
    obj, nested = {"tier": "local"}, []

    def durable(path, data, *args):
        n = real(path, data, *args)
        if not nested:
            nested.append(1)
            _fsio.write_json_atomic(tmp_path / "r.json", obj)
        return n

    monkeypatch.setattr(_fsio, "write_file_durable", durable)
    _fsio.write_json_atomic(tmp_path / "r.json", obj)
    assert _fsio.read_json(tmp_path / "r.json") == obj
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
