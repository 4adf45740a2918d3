"""What a CacheX save leaves out of the training loop's blocking part, and that it is safe."""

from __future__ import annotations

import os
import threading

import numpy as np

from hexad import cachex
from hexad.cachex import _format


def _state(step: int) -> dict:
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((16, 8)).astype(np.float32), "n": np.int64(step)}


def test_commits_run_on_one_long_lived_thread(tmp_path):
    threads: list[threading.Thread] = []
    hooks = {"local_write": lambda step: threads.append(threading.current_thread())}
    with cachex.CacheXManager(tmp_path, fault_hooks=hooks) as m:
        for step in range(4):
            m.save(step, _state(step))
            m.wait_until_finished()
        assert m.restore(_state(0)).step == 3
    # A thread per save would give 4 distinct thread objects (all kept alive by the list).
    assert len(threads) == 4 and len(set(threads)) == 1
    assert threads[0].name.startswith("cachex-commit")


def test_step_folder_is_made_by_the_commit_not_in_the_blocking_save(tmp_path):
    seen: dict[int, list[str]] = {}
    steps_dir = tmp_path / "steps"

    def staging(step):  # in the handler's async_save: orbax has "created" both folders
        seen[step] = sorted(p.name for p in steps_dir.iterdir())

    with cachex.CacheXManager(tmp_path, fault_hooks={"staging": staging}) as m:
        m.save(0, _state(0))
        m.wait_until_finished()
        m.save(1, _state(1))
        m.wait_until_finished()
        assert m.all_steps() == [0, 1]
        r = m.restore(_state(0))
    # While the save blocks, no folder of the step exists yet (only the committed step 0).
    assert seen == {0: [], 1: ["0"]}
    assert r.step == 1 and np.array_equal(r.state["w"], _state(1)["w"])
    # orbax's step metadata was still written (by the commit, before orbax's finalize).
    assert (steps_dir / "1" / "_CHECKPOINT_METADATA").is_file()


def test_a_failed_save_leaves_no_pending_folder_for_the_next(tmp_path):
    def fail(step):
        if step == 1:
            raise RuntimeError("staging failed")

    with cachex.CacheXManager(tmp_path, fault_hooks={"staging": fail}) as m:
        m.save(0, _state(0))
        m.wait_until_finished()
        try:
            m.save(1, _state(1))
        except RuntimeError:
            pass
        assert m._node.pending_dirs == []
        m.save(2, _state(2))
        m.wait_until_finished()
        assert m.all_steps() == [0, 2]
        assert not [p for p in (tmp_path / "steps").iterdir() if p.name.startswith("1")]


def test_overlapped_crc_writes_the_manifest_only_after_the_data_fsync(tmp_path, monkeypatch):
    monkeypatch.setattr(_format, "_OVERLAP_MIN_BYTES", 0)  # overlap at any size
    events: list[str] = []
    real_fsync, real_open = os.fsync, os.open

    def fsync(fd):
        real_fsync(fd)
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))

    def open_(path, *a, **kw):
        events.append("open " + os.path.basename(os.fspath(path)))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "open", open_)
    slot, snap = _format.StagingPool(1).stage(_state(5))
    n = _format.write_rank_dir(tmp_path, snap, {"step": 5})
    monkeypatch.undo()
    assert n == 16 * 8 * 4 + 8
    data, manifest = _format.DATA_FILE, _format.MANIFEST_FILE
    assert events.index(f"fsync {data}") < events.index(f"open {manifest}")
    assert events.index(f"open {manifest}") < events.index(f"fsync {manifest}")
    _, pieces = _format.read_rank_dir(tmp_path)  # sizes and CRC-32s verify
    got = {leaf: arr for leaf, _, arr in pieces}  # leaves in key order: n, w
    assert int(got[0]) == 5 and np.array_equal(got[1], _state(5)["w"])


def test_orbax_save_call_runs_off_the_callers_thread(tmp_path):
    # The blocking part is the T0 copy and CacheX's checks; orbax's save call (its event
    # loop, its threads) runs on the manager's orbax thread after save() has returned.
    callers: list[threading.Thread] = []
    with cachex.CacheXManager(tmp_path) as m:
        real = m._mngr.save

        def save(*args, **kwargs):
            callers.append(threading.current_thread())
            return real(*args, **kwargs)

        m._mngr.save = save
        for step in range(3):
            m.save(step, _state(step))
        m.wait_until_finished()
        assert m.restore(_state(0)).step == 2
    assert len(callers) == 3 and len(set(callers)) == 1
    assert callers[0] is not threading.main_thread()
    assert callers[0].name.startswith("cachex-orbax")


def test_an_orbax_save_call_error_is_raised_by_the_next_wait_and_frees_its_slot(tmp_path):
    with cachex.CacheXManager(tmp_path) as m:
        m.save(0, _state(0))
        m.wait_until_finished()
        real, calls = m._mngr.save, []

        def save(step, *args, **kwargs):
            calls.append(step)
            if step == 1:
                raise RuntimeError("orbax refused")
            return real(step, *args, **kwargs)

        m._mngr.save = save
        assert m.save(1, _state(1)) is True  # started; orbax's call has not run yet
        try:
            m.wait_until_finished()
        except RuntimeError as e:
            assert "orbax refused" in str(e)
        else:
            raise AssertionError("the failed orbax save call was not raised")
        assert m.pool._free.qsize() == m.pool.n_slots  # the staged slot went back
        assert m._node.staged == {}
        m.save(2, _state(2))
        m.wait_until_finished()
        assert m.all_steps() == [0, 2]
        assert calls == [1, 2]
