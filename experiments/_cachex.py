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
import contextlib
import dataclasses
import errno
import functools
import json
import os
import secrets
import shutil
import socket
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


def strike(fault: str, m, server, pfs: Path, n: int, seed: int) -> None:
    """Applies an in-process ``fault`` of ``cachex_durability`` after the ``n`` good saves
    (disk_full: by its hook)."""
    if fault in ("kill_drainer", "kill_before_rename"):  # a drain of step n - 1 cut short
        if fault == "kill_drainer":
            cachex.kill_drainer_mid_drain(m.drainer_config, n - 1)
        else:  # rank 0 done; rank 1 died before its marker + rename
            cachex.drain_once(dataclasses.replace(m.drainer_config, n_ranks=2))
        # PFS alone (local and neighbour gone below) must not offer the half-drained step.
        if (pfs / str(n - 1)).exists():
            raise RuntimeError(f"{fault}: a half-drained step was committed")
        if fault == "kill_drainer":
            cachex.drain_once(m.drainer_config)  # a restarted drainer finishes the job
        cachex.wipe_local(m.directory)  # the node and its neighbour are gone: only the PFS
        server.stop()
    elif fault == "node_wiped":
        cachex.wipe_local(m.directory)
    elif fault in ("neighbour_dead", "disk_full"):  # the save of step n fails
        if fault == "neighbour_dead":
            server.stop()
        with cachex.quiet_failed_saves():
            m.save(n, state(seed, n))
            with contextlib.suppress(Exception):  # the failed save is the fault under test
                m.wait_until_finished()
    elif fault == "neighbour_slow":
        server.delay_s = 0.5
        save_steps(m, seed, [n])
    elif fault in ("truncated_file", "bit_flip"):
        cachex.corrupt_file(m.steps_dir / str(n - 1) / "state" / cachex.DATA_FILE, fault)
    elif fault == "pfs_down":
        cachex.refuse_drains(pfs, range(n + 1))
        save_steps(m, seed, [n])
        cachex.exhaust_drain_retries(m.drainer_config, n + 1)
        attempts = m.durability(n).get("pfs_error", {}).get("attempts")
        if attempts != m.drainer_config.retry_max_attempts or m.all_steps() != list(range(n + 1)):
            raise RuntimeError("pfs_down: a drain failure was not final or not pinned")


# ------------------------------------------------------------------------------------------
# The fault campaign's faults of review cachex-2 (cachex_durability)
# ------------------------------------------------------------------------------------------

# Faults of review cachex-2, each a run of its own (see new_fault_run).
NEW_FAULTS = tuple(
    "listing_eio pfs_estale stray_entries two_drainers rollback_reuse recommit_killed "
    "preauth_flood".split()
)
# Faults that lose the node and its neighbour: only PFS-durable steps must survive them.
PFS_ONLY = ("kill_drainer", "kill_before_rename", "two_drainers", "rollback_reuse")
# Faults after which step n (the save after the good ones) committed; else step n - 1 is
# the newest committed step.
STEP_N_COMMITS = ("neighbour_slow", "pfs_down", "stray_entries", "preauth_flood")


def pfs_holds(pfs: Path, step: int, want: dict) -> bool:
    """Whether the PFS step ``step`` reads back (every CRC-32) as exactly ``want``."""
    try:
        manifest, pieces = cachex.read_rank_dir(pfs / str(step) / "rank_0")
        got = cachex.assemble_tree(want, manifest, pieces)
    except (OSError, ValueError):  # CorruptCheckpointError is a ValueError
        return False
    return all(
        np.asarray(got[k]).tobytes() == np.asarray(v).tobytes() and got[k].dtype == v.dtype
        for k, v in want.items()
    )


def false_claims(m, pfs: Path, ref, steps, records_dirs=()) -> set[int]:
    """The steps that ``m`` (or another node's records folder) says are PFS-durable while
    the PFS does not hold exactly that step's saved state."""
    out = set()
    for s in steps:
        claimed = m.tier_done(s, "pfs") or any(
            (Path(r) / str(s) / "pfs.json").exists() for r in records_dirs
        )
        if claimed and not pfs_holds(pfs, s, ref(s)):
            out.add(s)
    return out


def newest_pfs_claimed(m, steps, records_dirs=()) -> int:
    claimed = [
        s
        for s in steps
        if m.tier_done(s, "pfs")
        or any((Path(r) / str(s) / "pfs.json").exists() for r in records_dirs)
    ]
    return max(claimed, default=-1)


def _two_drainers(cfg_a, cfg_b) -> None:
    """One rank's drainer on this node and an orphan on another node (its own records
    folder, the same PFS) drain the same step at once, then each retries once."""
    go = threading.Barrier(2)

    def drain(cfg):
        go.wait()
        cachex.drain_once(cfg)

    threads = [threading.Thread(target=drain, args=(c,)) for c in (cfg_a, cfg_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in (cfg_a, cfg_b):  # a drain that lost the race is retried (its backoff passed)
        cachex.drain_once(c, now=time.time() + 3600)


def _recommit_killed(rroot: Path, step: int) -> None:
    """The neighbour's server died re-committing ``step``: its copy renamed aside to
    ``.old-<s>-<ns>``, the new copy complete in ``.tmp-<s>`` but not renamed in."""
    base = rroot / "rank_0"
    aside = base / f".old-{step}-{time.time_ns()}"
    shutil.copytree(base / str(step), base / f".tmp-{step}")
    (base / str(step)).rename(aside)


def new_fault_run(fault: str, run_dir: Path, seed: int, cfg: Any, t_stage: list) -> dict:
    """One run of a fault of :data:`NEW_FAULTS`; returns what :func:`_one_run` does."""
    local, pfs, rroot = run_dir / "local", run_dir / "pfs", run_dir / "neighbour"
    token = study_token()
    servers = [cachex.ReplicaServer(rroot, token, max_lifetime_s=300).start()]
    n = cfg.n_good
    ref = functools.partial(state, seed)
    steps = list(range(n + 1))
    kw = dict(pfs_dir=pfs, drainer=False, seed=seed, max_to_keep=2)

    def manager(root: Path) -> cachex.CacheXManager:
        client = cachex.ReplicaClient(servers[-1].address, token, timeout_s=10)
        return cachex.CacheXManager(root, neighbour=client, **kw)

    records: list[str] = []
    during = contextlib.nullcontext()
    m = manager(local)
    restorer = m
    guaranteed = n if fault in STEP_N_COMMITS else n - 1
    try:
        for s in range(n):
            t_stage += save_steps(m, seed, [s])
            if fault in ("pfs_estale", "rollback_reuse"):  # every good step on the PFS
                cachex.drain_once(m.drainer_config)
        if fault == "listing_eio":  # one local manifest unreadable while listing and reading
            during = cachex.io_error(m.steps_dir / str(n - 1) / "state" / cachex.MANIFEST_FILE)
        elif fault == "pfs_estale":  # the PFS mount's handle went stale
            during = cachex.io_error(pfs, errno.ESTALE)
        elif fault == "stray_entries":  # plain files named like steps on the PFS and locally
            (pfs / str(n + 5)).write_bytes(b"stray")
            (m.steps_dir / str(n + 5)).write_bytes(b"stray")
            save_steps(m, seed, [n])
            cachex.drain_once(m.drainer_config)
        elif fault == "two_drainers":  # step n - 1 drained by two nodes' drainers at once
            other = run_dir / "node2" / "durability"
            other.mkdir(parents=True)
            records = [str(other)]
            _two_drainers(
                m.drainer_config, dataclasses.replace(m.drainer_config, records_dir=str(other))
            )
        elif fault == "preauth_flood":  # idle sockets without the token, then a save
            flood = [socket.create_connection(servers[-1].address) for _ in range(80)]
            try:
                save_steps(m, seed, [n])
            finally:
                for sock in flood:
                    sock.close()
        elif fault == "recommit_killed":
            servers[-1].stop()
            _recommit_killed(rroot, n - 1)
            servers.append(cachex.ReplicaServer(rroot, token, max_lifetime_s=300).start())
            m.close()
            cachex.wipe_local(local)
            m = restorer = manager(local)
        elif fault == "rollback_reuse":
            m.close()
            k = max(n - 2, 0)  # node b rolls back to step k and saves k + 1 .. n anew
            m = manager(run_dir / "b")
            r = m.restore(ref(0), step=k)
            if r.step != k:
                raise RuntimeError(f"rollback_reuse: restored {r.step}, not {k}")
            ref = functools.partial(_rolled_back, seed, k)
            for s in range(k + 1, n + 1):
                m.save(s, ref(s))
                m.wait_until_finished()
            claims_before = false_claims(m, pfs, ref, steps)
            while cachex.drain_once(m.drainer_config):
                pass
        audit_tiers = dict(pfs_dir=pfs, replica_dir=rroot)
        if fault in PFS_ONLY:  # the node and its neighbour are lost: only the PFS is left
            servers[-1].stop()
            guaranteed = newest_pfs_claimed(m, steps, records)
            restorer = cachex.CacheXManager(run_dir / "fresh", **kw)
            audit_tiers["replica_dir"] = None
        false = false_claims(m, pfs, ref, steps, records)
        if fault == "rollback_reuse":
            false |= claims_before
        with during:
            audit = cachex.verified_steps(restorer.directory, **audit_tiers)
            expected = max(audit["local"] + audit["replica"] + audit["pfs"], default=-1)
            if fault == "rollback_reuse":
                expected = guaranteed  # the audit cannot tell the two timelines apart
            health = m.health(ping_neighbour=servers[-1].running)
            check = cachex.check_restore(restorer, ref(0), expected, ref, steps)
    finally:
        for x in {id(m): m, id(restorer): restorer}.values():
            with contextlib.suppress(Exception):
                x.close()
        for srv in servers:
            srv.stop()
    orbax_newest = -1 if fault in PFS_ONLY else max(audit["local"], default=-1)
    return fault_result(check, orbax_newest, health, guaranteed, len(false))


def fault_result(check, orbax_newest: int, health: dict, guaranteed: int, false: int) -> dict:
    """One fault run's record: the restore check's fields, orbax's newest step, ``health()``
    and its durability lag, the step CacheX guarantees, and the false durability claims."""
    return {
        **check._asdict(),
        "orbax_newest": orbax_newest,
        "lag_steps": health["durability_lag_steps"],
        "health": health,
        "guaranteed": guaranteed,
        "false_claims": false,
    }


def _rolled_back(seed: int, k: int, step: int) -> dict:
    """The state of ``step`` after a rollback to step ``k``: saved anew above ``k``."""
    return state(seed, step) if step <= k else state(seed + 7919, step)
