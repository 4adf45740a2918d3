"""CacheX's fault-hook seam: where each point fires, what a raising hook leaves behind; the
fault injectors (hexad.cachex._faults) and the restore check a fault run ends with."""

from __future__ import annotations

import errno
import logging
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from hexad import cachex

TOKEN = "fault-test-token-01234"


@pytest.fixture
def server(tmp_path):
    srv = cachex.ReplicaServer(tmp_path / "neighbour", token=TOKEN, max_lifetime_s=120).start()
    yield srv
    srv.stop()


@pytest.fixture
def quiet_absl():
    # orbax logs the failed commit thread's traceback; the failure is what the test checks
    with cachex.quiet_failed_saves():
        yield


def _state(step: int) -> dict:
    return {"w": np.full((16,), step, np.float32)}


_raise_at = cachex.fail_at  # a full disk at one step's save


def test_every_point_fires_once_per_save_in_order(tmp_path, server):
    seen: list[tuple[str, int]] = []
    lock = threading.Lock()

    def record(point):
        def hook(step):
            with lock:
                seen.append((point, step))

        return hook

    client = cachex.ReplicaClient(server.address, TOKEN, timeout_s=20)
    hooks = {p: record(p) for p in cachex.CacheXManager.FAULT_POINTS}
    with cachex.CacheXManager(tmp_path / "local", neighbour=client, fault_hooks=hooks) as m:
        for s in range(2):
            m.save(s, _state(s))
            m.wait_until_finished()
    for s in range(2):
        points = [p for p, step in seen if step == s]
        assert sorted(points) == sorted(cachex.CacheXManager.FAULT_POINTS)
        # the replica push runs beside the T1 write, so only these orders are fixed
        assert points[0] == "staging" and points[-1] == "commit"
        assert points.index("local_write") < points.index("local_written")


def test_raise_before_local_write_leaves_no_restorable_partial_step(tmp_path, quiet_absl):
    hooks = {"local_write": _raise_at(1)}
    with cachex.CacheXManager(tmp_path / "local", fault_hooks=hooks) as m:
        m.save(0, _state(0))
        m.wait_until_finished()
        m.save(1, _state(1))
        with pytest.raises(OSError, match="No space left"):
            m.wait_until_finished()
    assert not m.tier_done(1, "local")
    m2 = cachex.CacheXManager(tmp_path / "local")
    assert m2.all_steps() == [0]
    assert 1 not in m2.readable_steps()["local"]
    r = m2.restore(_state(0))
    assert r.step == 0 and r.state["w"].tolist() == _state(0)["w"].tolist()
    m2.close()


def test_raise_at_commit_after_t1_is_never_committed(tmp_path, quiet_absl):
    # T1 has written and fsynced every file, but the step fails before orbax finalizes it:
    # its files sit in orbax's temporary folder and no restore offers them
    with cachex.CacheXManager(tmp_path / "local", fault_hooks={"commit": _raise_at(1)}) as m:
        m.save(0, _state(0))
        m.wait_until_finished()
        m.save(1, _state(1))
        with pytest.raises(OSError):
            m.wait_until_finished()
        assert m.tier_done(1, "local")  # the T1 write itself completed
    m2 = cachex.CacheXManager(tmp_path / "local")
    assert m2.all_steps() == [0] and m2.restore(_state(0)).step == 0
    m2.close()


def test_raise_at_staging_fails_the_save_call(tmp_path):
    with cachex.CacheXManager(tmp_path / "local", fault_hooks={"staging": _raise_at(0)}) as m:
        with pytest.raises(OSError):
            m.save(0, _state(0))
        assert m.all_steps() == []


def test_unknown_point_or_non_callable_is_rejected_at_construction(tmp_path):
    with pytest.raises(ValueError, match="fault_hooks: expected point names .* got \\['t1'\\]"):
        cachex.CacheXManager(tmp_path / "a", fault_hooks={"t1": print})
    with pytest.raises(TypeError, match="fault_hooks\\['commit'\\]: expected a callable"):
        cachex.CacheXManager(tmp_path / "b", fault_hooks={"commit": 3})
    with pytest.raises(TypeError, match="fault_hooks: expected a mapping"):
        cachex.CacheXManager(tmp_path / "c", fault_hooks=print)


def test_verified_steps_audits_every_tier_byte_by_byte(tmp_path, server):
    client = cachex.ReplicaClient(server.address, TOKEN, timeout_s=20)
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    with cachex.CacheXManager(local, neighbour=client, pfs_dir=pfs, drainer=False) as m:
        for s in range(2):
            m.save(s, _state(s))
            m.wait_until_finished()
        assert cachex.drain_once(m.drainer_config) == [1]
    kw = {"pfs_dir": pfs, "replica_dir": server.root}
    assert cachex.verified_steps(local, **kw) == {"local": [0, 1], "replica": [0, 1], "pfs": [1]}
    # a flipped bit in step 1's local data leaves its manifest intact: the manager would still
    # list it as readable, the audit does not
    data = local / "steps" / "1" / "state" / cachex.DATA_FILE
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    assert cachex.verified_steps(local, **kw)["local"] == [0]
    with cachex.CacheXManager(local) as m2:
        assert 1 in m2.readable_steps()["local"]
    assert cachex.verified_steps(local, rank=1, **kw) == {"local": [0], "replica": [], "pfs": []}
    with pytest.raises(ValueError, match="rank"):
        cachex.verified_steps(local, rank=-1)


def test_fail_at_and_kill_at_strike_only_their_step():
    hook = cachex.fail_at(2, RuntimeError("boom"))
    hook(0), hook(3)  # other steps pass
    with pytest.raises(RuntimeError, match="boom"):
        hook(2)
    with pytest.raises(OSError) as e:
        cachex.fail_at(0)(0)
    assert e.value.errno == errno.ENOSPC
    for bad in (-1, True, 1.0):
        with pytest.raises(ValueError, match="step: expected an int >= 0"):
            cachex.fail_at(bad)
    with pytest.raises(TypeError, match="error: expected an Exception instance"):
        cachex.fail_at(0, OSError)
    # kill_at SIGKILLs the process at its step, and only there
    code = "from hexad import cachex; h = cachex.kill_at(1); h(0); print('alive', flush=True); h(1)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL and proc.stdout == "alive\n"


def test_quiet_failed_saves_restores_the_level_on_error():
    logger = logging.getLogger("absl")
    before = logger.level
    with pytest.raises(KeyError), cachex.quiet_failed_saves():
        assert not logger.isEnabledFor(logging.CRITICAL)
        raise KeyError("x")
    assert logger.level == before


def test_storage_faults_are_caught_and_the_check_judges_the_restore(tmp_path):
    # a truncated or bit-flipped newest step, or a wiped node: the restore falls back to the
    # newest intact step (or finds none), never returns the damaged bytes
    ref = _state
    for how in ("truncated_file", "bit_flip", "wiped"):
        local = tmp_path / how
        with cachex.CacheXManager(local) as m:
            for s in range(2):
                m.save(s, ref(s))
                m.wait_until_finished()
        if how == "wiped":
            cachex.wipe_local(local)
        else:
            cachex.corrupt_file(local / "steps" / "1" / "state" / cachex.DATA_FILE, how)
        expected = max(cachex.verified_steps(local)["local"], default=-1)
        assert expected == (-1 if how == "wiped" else 0)
        with cachex.CacheXManager(local) as m2:
            check = cachex.check_restore(m2, ref(0), expected, ref, range(2))
            assert check == cachex.RestoreCheck(expected, expected, True, False)
            # a wrong expectation is not exact; bytes no step saved would be corrupt
            assert not cachex.check_restore(m2, ref(0), 1, ref, range(2)).exact
            unsaved = cachex.check_restore(m2, ref(0), expected, lambda s: ref(s + 10), range(2))
            assert unsaved.corrupt == (how != "wiped")
    with pytest.raises(ValueError, match="how: expected 'truncated_file' or 'bit_flip'"):
        cachex.corrupt_file(tmp_path / "x", "zero")
    with pytest.raises(FileNotFoundError, match="directory: expected a CacheX local root"):
        cachex.wipe_local(tmp_path / "nowhere")


def test_refused_drains_fail_for_good_and_stay_pinned(tmp_path):
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    with cachex.CacheXManager(local, pfs_dir=pfs, drainer=False, max_to_keep=1) as m:
        cachex.refuse_drains(pfs, range(3))
        for s in range(3):
            m.save(s, _state(s))
            m.wait_until_finished()
        cachex.exhaust_drain_retries(m.drainer_config, 3)
        for s in range(3):
            assert m.durability(s)["pfs_error"]["attempts"] == m.drainer_config.retry_max_attempts
        assert m.all_steps() == [0, 1, 2]  # no step is PFS-durable: none is collected


def test_a_drainer_killed_mid_drain_commits_nothing_until_a_restart(tmp_path):
    local, pfs = tmp_path / "local", tmp_path / "pfs"
    with cachex.CacheXManager(local, pfs_dir=pfs, drainer=False) as m:
        m.save(0, _state(0))
        m.wait_until_finished()
        cachex.kill_drainer_mid_drain(m.drainer_config, 0)
        assert (pfs / ".tmp-0" / "rank_0").is_dir() and not (pfs / "0").exists()
        assert cachex.drain_once(m.drainer_config) == [0]  # a restarted drainer finishes
    assert cachex.verified_steps(local, pfs_dir=pfs)["pfs"] == [0]


def test_exhaust_drain_retries_names_n_steps(tmp_path):
    cfg = cachex.DrainerConfig(
        steps_dir=str(tmp_path / "s"),
        item="state",
        records_dir=str(tmp_path / "r"),
        pfs_dir=str(tmp_path / "p"),
    )
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n_steps: expected an int >= 0"):
            cachex.exhaust_drain_retries(cfg, bad)
