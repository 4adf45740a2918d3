"""Glue shared by the CacheX studies (``cachex_bench``, ``cachex_durability``); not a study.

- :func:`state`: the deterministic training state of a step, so a restore can be checked
  bit-exact (also saved by the fault worker, :mod:`experiments._cachex_faultworker`).
- :func:`save_steps`: saves those states to completion (the fault runs' good saves).
- :data:`KILL_POINTS`: the trainer-kill faults and the :class:`hexad.cachex.CacheXManager`
  fault point at which each one strikes.
- :class:`PFSConfig`: the config fields the studies share, and their
  :class:`hexad.cachex.PFSModel`.
- :func:`study_token`: the replica servers' shared secret for one run.
- :class:`PFSDelayHandler` (with :class:`PFSDelaySave` / :class:`PFSDelayRestore`): the
  benchmark baseline, an orbax item that holds a save's commit until a modelled PFS write time
  has passed, so plain orbax writing to the PFS sees the same PFS model as CacheX's drainer.
- :func:`orbax_pfs_manager` / :func:`orbax_pfs_save`: that baseline's manager and save.
- :func:`paced_saves`: the benchmark's training loop, saving at a fixed interval and timing
  each blocking save call and its step's durable point.
- :class:`CommitWatcher`: records when each orbax step directory appears (its finalize).
- :func:`fast_root`, :func:`pctl`, :func:`completion_stats`, :class:`HealthWatch`: the
  benchmark's storage placement, statistics and ``health()`` sampling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import secrets
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
    bandwidth in bytes/s, latency, lognormal sigma, contention). A study's ``Config`` extends
    it (and calls its ``__post_init__``). The replica token is not a field: see
    :func:`study_token`."""

    pfs_bandwidth: float = 1e9
    pfs_latency_s: float = 0.01
    pfs_sigma: float = 0.5
    contention: float = 0.5

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


def study_token() -> str:
    """The replica servers' shared secret for one run: ``$HEXAD_CACHEX_TOKEN`` if set, else
    a fresh random one.

    Never a config field: a config is recorded with the results and a fixed default would
    let any local user authenticate to a running study's servers.
    """
    token = os.environ.get("HEXAD_CACHEX_TOKEN")
    if not token:
        return secrets.token_hex(16)
    if len(token.encode()) < 16:  # the servers would refuse it later, less clearly
        raise ValueError(f"HEXAD_CACHEX_TOKEN: expected >= 16 bytes, got {len(token.encode())}")
    return token


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


def paced_saves(cfg: Any, ctx: Any, w, x, save, path_of, managers, desc: str, on_round=None):
    """The benchmark's training loop: jitted steps on every rank's state ``w`` ``[n, rows,
    hidden]`` between saves ``cfg.save_interval_s`` apart, ``cfg.n_saves`` times.

    Each save calls ``save(s, r, state)`` for each rank ``r`` of ``cfg.n_ranks`` (the call's
    wall time is its stall); its step ``s`` is durable once ``path_of(s, r)`` exists (seen by
    a :class:`CommitWatcher`). ``on_round(s)``, if given, runs after each round of saves
    (outside the timed calls). Then waits for ``managers`` to finish.

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
        if on_round is not None:
            on_round(s)
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


def fast_root(cfg_fast_dir: str, fallback: Path) -> Path:
    """Where the emulation puts the node-local tiers and the replicas: ``cfg_fast_dir`` if set
    (``"shm"``: the tmpfs shared-memory mount when there is one), else ``fallback``."""
    shm = Path("/dev/shm")
    if cfg_fast_dir == "shm":
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    else:
        base = Path(cfg_fast_dir) if cfg_fast_dir else None
    if base is None:
        return fallback
    import tempfile

    return Path(tempfile.mkdtemp(prefix="hexad-cachex-", dir=base))


def pctl(x, q) -> float:
    """The ``q``-th percentile of ``x`` (nan if empty)."""
    return float(np.percentile(np.asarray(x, np.float64), q)) if len(x) else float("nan")


def completion_stats(name: str, stalls, done: dict, starts: dict, n_saves: int, n_ranks: int):
    """The stall and completion-time figures of one system, and its completion times per
    ``(save, rank)`` and per whole save (slowest rank's durable point - first rank's call).

    The figures: mean, median and p99 stall (ms), p99/p50 and the interquartile spread (s) of
    the per-(save, rank) completion times, and p99/p50 of the whole-save ones."""
    write = [done[k] - starts[k] for k in starts if k in done]
    per_save = []
    for s in range(n_saves):
        ends = [done.get((s, r)) for r in range(n_ranks)]
        if all(e is not None for e in ends):
            per_save.append(max(ends) - min(starts[(s, r)] for r in range(n_ranks)))
    out = {
        f"stall_ms_{name}": 1e3 * float(np.mean(stalls)),
        f"stall_ms_median_{name}": 1e3 * pctl(stalls, 50),
        f"stall_ms_p99_{name}": 1e3 * pctl(stalls, 99),
        f"variability_{name}": pctl(write, 99) / pctl(write, 50),
        f"spread_iqr_s_{name}": pctl(write, 75) - pctl(write, 25),
        f"variability_save_{name}": pctl(per_save, 99) / pctl(per_save, 50),
    }
    return out, write, per_save


class HealthWatch:
    """Samples :meth:`hexad.cachex.CacheXManager.health` of every manager after each save
    round (no neighbour ping: the save itself exercises it) and keeps the worst figures."""

    def __init__(self, managers):
        self.managers = managers
        self.lag_steps = 0
        self.lag_s = 0.0
        self.drainers_down = 0

    def __call__(self, _step=None) -> None:
        for m in self.managers:
            h = m.health(ping_neighbour=False)
            self.lag_steps = max(self.lag_steps, h["durability_lag_steps"] or 0)
            self.lag_s = max(self.lag_s, h["durability_lag_s"] or 0.0)
            self.drainers_down += h["drainer_alive"] is False

    def summary(self) -> dict:
        restarts = sum(m.health(ping_neighbour=False)["drainer_restarts"] for m in self.managers)
        return {
            "health_max_durability_lag_steps": self.lag_steps,
            "health_max_durability_lag_s": self.lag_s,
            "health_drainer_down_samples": self.drainers_down,
            "health_drainer_restarts": restarts,
        }


def pfs_commit_times(managers, starts: dict, n_saves: int, n_ranks: int) -> list[float]:
    """Per save whose ``pfs`` record every rank holds: the time from the first rank's
    ``save`` call to the commit (the earliest record: the committing rank writes first)."""
    out = []
    for s in range(n_saves):
        recs = [managers[r].durability(s).get("pfs") for r in range(n_ranks)]
        if all(recs):
            t0 = min(starts[(s, r)] for r in range(n_ranks))
            out.append(min(x["time"] for x in recs) - t0)
    return out


def plot_bench(curves: dict, sigmas, ratios, ctx) -> None:
    """``write_time_cdf.png``: the completion-time CDFs per sigma, and the variability ratio
    over the PFS spread with the published range shaded."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for sigma, (wc, wo) in curves.items():
        for data, name, ls in ((wc, "CacheX (replica-durable)", "-"), (wo, "orbax to PFS", "--")):
            xs = np.sort(np.asarray(data))
            axes[0].plot(xs, np.linspace(0, 1, len(xs)), ls, label=f"{name}, sigma {sigma}")
    axes[0].set(xscale="log", xlabel="save call to durable step (s)", ylabel="CDF")
    axes[0].legend(fontsize=7)
    axes[1].plot(sigmas, ratios, "o-")
    axes[1].axvspan(0.35, 0.8, alpha=0.15, label="published spreads")
    axes[1].set(xlabel="PFS sigma", ylabel="p99/p50 ratio, orbax / CacheX")
    axes[1].legend()
    ctx.save_plot(fig, "write_time_cdf")


def plot_c_star(fit, contention: float, t_stage_p99: float, ctx) -> None:
    """``c_star.png``: the fitted model's C*_p(n) over writer counts for p = 0.5, 0.9, 0.99."""
    import matplotlib.pyplot as plt

    ns = np.unique(np.logspace(np.log10(2), np.log10(4096), 40).astype(int))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for p in (0.5, 0.9, 0.99):
        c_star = cachex.critical_contention(fit.mu, fit.sigma, ns, p, t_stage_p99)
        ax.plot(ns, c_star, label=f"p = {p}")
    ax.axhline(contention, color="k", ls=":", label=f"contention {contention}")
    ax.set(xscale="log", xlabel="writers n", ylabel="C*_p(n)")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0.0)
    ax.set_title(f"stage beats PFS above the curve (t_stage = {t_stage_p99:.3f} s)")
    ax.legend()
    ctx.save_plot(fig, "c_star")
