"""Glue shared by the CacheX studies (``cachex_bench``, ``cachex_durability``); not a study.

- :func:`state`: the deterministic training state of a step, so a restore can be checked
  bit-exact (also saved by the fault worker, :mod:`experiments._cachex_faultworker`).
- :func:`save_steps`: saves those states to completion (the fault runs' good saves).
- :data:`KILL_POINTS`: the trainer-kill faults and the :class:`hexad.cachex.CacheXManager`
  fault point at which each one strikes.
- :class:`PFSConfig`: the config fields the studies share, and their
  :class:`hexad.cachex.PFSModel`.
- :class:`PFSDelayHandler` (with :class:`PFSDelaySave` / :class:`PFSDelayRestore`): the
  benchmark baseline, an orbax item that holds a save's commit until a modelled PFS write time
  has passed, so plain orbax writing to the PFS sees the same PFS model as CacheX's drainer.
- :func:`orbax_pfs_manager` / :func:`orbax_pfs_save`: that baseline's manager and save.
- :func:`paced_saves`: the benchmark's training loop, saving at a fixed interval and timing
  each blocking save call and its step's durable point.
- :class:`CommitWatcher`: records when each orbax step directory appears (its finalize).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from experiments import _runner
from hexad import cachex

KILL_POINTS = {
    "kill_staging": "staging",
    "kill_after_t1": "local_written",
    "kill_after_replica_ack": "replica_acked",
}


def state(seed: int, step: int) -> dict:
    """The deterministic training state of ``step`` (so a restore can be checked bit-exact)."""
    rng = np.random.default_rng([seed, step])
    return {
        "w": rng.standard_normal((128, 64)).astype(np.float32),
        "b": rng.standard_normal((64,)).astype(np.float32),
        "step": np.int64(step),
    }


def save_steps(m: cachex.CacheXManager, seed: int, steps) -> list[float]:
    """Saves the :func:`state` of each of ``steps`` through ``m``, each to completion; returns
    the T1 + T2 seconds of each save whose replica acknowledgement was recorded."""
    seconds = []
    for s in steps:
        m.save(s, state(seed, s))
        m.wait_until_finished()
        if rec := m.durability(s).get("replica"):
            seconds.append(rec["seconds"])
    return seconds


@dataclasses.dataclass(frozen=True)
class PFSConfig:
    """The config fields both CacheX studies share: the PFS model's parameters (per-node
    bandwidth in bytes/s, latency, lognormal sigma, contention) and the replica token. A
    study's ``Config`` extends it (and calls its ``__post_init__``)."""

    pfs_bandwidth: float = 1e9
    pfs_latency_s: float = 0.01
    pfs_sigma: float = 0.5
    contention: float = 0.5
    token: str = "cachex"

    def __post_init__(self):
        _runner.at_least(self, 0, "pfs_latency_s", "pfs_sigma", "contention")
        _runner.positive(self, "pfs_bandwidth")

    def pfs_model(self, n_writers: int, contention: float) -> cachex.PFSModel:
        """The :class:`hexad.cachex.PFSModel` of these fields for ``n_writers`` writers."""
        return cachex.PFSModel(
            bandwidth=self.pfs_bandwidth,
            n_writers=n_writers,
            contention=contention,
            latency_s=self.pfs_latency_s,
            sigma=self.pfs_sigma,
        )


def _in_thread(fn) -> concurrent.futures.Future:
    # An orbax commit future that waits on no jax.distributed signal (as CacheX's own).
    fut: concurrent.futures.Future = concurrent.futures.Future()

    def target():
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised by fut.result()
            fut.set_exception(e)

    threading.Thread(target=target, name="pfs_delay", daemon=True).start()
    return fut


class PFSDelayHandler(ocp.AsyncCheckpointHandler):
    """An orbax item that holds a save's commit until a modelled PFS write time has passed.

    Composed with ``StandardCheckpointHandler`` in one orbax ``CheckpointManager`` writing to
    the PFS directory, it makes orbax's commit (and hence its next blocking ``save``) wait
    ``max(real write, PFSDelaySave.seconds)`` after the save started: the semantics of the
    CacheX drainer's :class:`hexad.cachex.PFSModel` delay.
    """

    async def async_save(self, directory, args: PFSDelaySave | None = None, **kwargs):
        if args is None:
            raise ValueError("PFSDelayHandler.async_save: expected args=PFSDelaySave(...)")
        t0 = args.t0 if args.t0 is not None else time.monotonic()

        def commit():
            left = float(args.seconds) - (time.monotonic() - t0)
            if left > 0:
                time.sleep(left)  # the commit runs in its own thread: blocking is intended
            d = Path(directory)
            t_end = time.monotonic() + 300.0
            while not d.exists():  # orbax creates the item directory; never race its mkdir
                if time.monotonic() > t_end:
                    raise TimeoutError(f"{d}: not created by orbax within 300 s")
                time.sleep(0.002)
            fd = os.open(d / "pfs_delay.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, b'{"seconds": %f}' % args.seconds)
                os.fsync(fd)
            finally:
                os.close(fd)

        return [_in_thread(commit)]

    def save(self, directory, args: PFSDelaySave | None = None, **kwargs):
        async def run():
            for f in await self.async_save(directory, args=args):
                f.result()

        asyncio.run(run())

    def restore(self, directory, args: PFSDelayRestore | None = None, **kwargs):
        return json.loads((Path(directory) / "pfs_delay.json").read_bytes())

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass


@ocp.args.register_with_handler(PFSDelayHandler, for_save=True)
@dataclasses.dataclass
class PFSDelaySave(ocp.args.CheckpointArgs):
    """Save args: hold the commit until ``seconds`` after ``t0`` (``time.monotonic``)."""

    seconds: float
    t0: float | None = None


@ocp.args.register_with_handler(PFSDelayHandler, for_restore=True)
@dataclasses.dataclass
class PFSDelayRestore(ocp.args.CheckpointArgs):
    """Restore args of :class:`PFSDelayHandler` (reads back the modelled seconds)."""


def orbax_pfs_manager(directory: Path) -> ocp.CheckpointManager:
    """The benchmark baseline: plain orbax async checkpointing straight to the PFS folder
    ``directory``, with a :class:`PFSDelayHandler` item holding each commit for its modelled
    PFS time (:func:`orbax_pfs_save`)."""
    handlers = {"state": ocp.StandardCheckpointHandler(), "pfs": PFSDelayHandler()}
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2)
    return ocp.CheckpointManager(directory, item_handlers=handlers, options=options)


def orbax_pfs_save(m: ocp.CheckpointManager, step: int, state: Any, seconds: float) -> None:
    """Saves ``state`` as ``step`` through a :func:`orbax_pfs_manager`; its commit waits until
    ``seconds`` (a PFS model draw) after this call."""
    delay = PFSDelaySave(seconds, t0=time.monotonic())
    m.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), pfs=delay))


@jax.jit
def _train_step(w, x):
    # One cheap "training" update per rank: w <- w + 1e-3 tanh(w x); w: [n, rows, hidden].
    return w + 1e-3 * jnp.tanh(jnp.einsum("nrh,hk->nrk", w, x))


def paced_saves(cfg: Any, ctx: Any, w, x, save, path_of, managers, desc: str):
    """The benchmark's training loop: jitted steps on every rank's state ``w`` ``[n, rows,
    hidden]`` between saves ``cfg.save_interval_s`` apart, ``cfg.n_saves`` times.

    Each save calls ``save(s, r, state)`` for each rank ``r`` of ``cfg.n_ranks`` (the call's
    wall time is its stall); its step ``s`` is durable once ``path_of(s, r)`` exists (seen by
    a :class:`CommitWatcher`). Then waits for ``managers`` to finish.

    Returns ``(stalls, starts, done)``: each blocking save call's seconds, and per
    ``(save, rank)`` the ``time.time()`` just before the call and when it became durable.
    """
    stalls, starts, watcher = [], {}, CommitWatcher()
    w = _train_step(w, x).block_until_ready()  # compile outside the timed loop
    last = time.perf_counter()
    for s in ctx.progress(range(cfg.n_saves), desc=desc):
        while time.perf_counter() - last < cfg.save_interval_s:
            w = _train_step(w, x).block_until_ready()
        last = time.perf_counter()
        for r in range(cfg.n_ranks):
            state = {"w": w[r]}
            jax.block_until_ready(state)
            watcher.add((s, r), path_of(s, r))
            starts[(s, r)] = time.time()
            t0 = time.perf_counter()
            save(s, r, state)
            stalls.append(time.perf_counter() - t0)
    for m in managers:
        m.wait_until_finished()
    watcher.stop()
    return stalls, starts, watcher.done


class CommitWatcher:
    """Records when each orbax step directory appears (orbax's atomic finalize).

    One thread polls every 2 ms: ``add(key, path)`` starts watching ``path``; ``done[key]``
    is the ``time.time()`` it was first seen; ``stop()`` waits (at most 120 s) for the rest.
    """

    def __init__(self):
        self.pending: dict[Any, Path] = {}
        self.done: dict[Any, float] = {}
        self._lock = threading.Lock()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def add(self, key, path):
        with self._lock:
            self.pending[key] = path

    def _run(self):
        while not self._stop:
            with self._lock:
                items = list(self.pending.items())
            for key, path in items:
                if path.exists():
                    with self._lock:
                        self.done[key] = time.time()
                        self.pending.pop(key, None)
            time.sleep(0.002)

    def stop(self):
        t_end = time.monotonic() + 120
        while self.pending and time.monotonic() < t_end:
            time.sleep(0.01)
        self._stop = True
        self._t.join()
