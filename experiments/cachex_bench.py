"""CacheX against orbax's own async CheckpointManager writing straight to the PFS.

Command:  python -m experiments.cachex_bench [--quick] [--out DIR] [--seed N] [--set k=v ...]

What it measures. ``n_ranks`` ranks (one process; each rank has its own node-local directory,
its own replica server process as the next rank's neighbour, and its own drainer process) run
jitted training steps on their own ``state_mib`` MiB state and save every ``save_interval_s``
seconds, ``n_saves`` times. The same loop then runs with one orbax async ``CheckpointManager``
per rank writing straight to the PFS directory. The PFS is the same local disk plus a
:class:`hexad.cachex.PFSModel` (per-node bandwidth, ``pfs_writers`` concurrent writers,
contention, per-rank lognormal latency): a rank's PFS write completes at ``max(real write,
model draw)``. CacheX's drainer imposes it on the T3 drain; the orbax baseline gets the same
draws through a :class:`hexad.cachex.PFSDelayHandler` item in the same orbax commit. Both
conditions run: without contention (``contention = 0``) and with ``contention``.

Per save and rank: the training-loop stall (the blocking ``save`` call), the time to
replica-durable (CacheX: local + neighbour ack), the time to PFS-durable (CacheX: drainer's
last-writer rename; orbax: its commit), and the completion time whose p99/p50 is the
variability. The completion time is measured the same way for both systems: from just before
the rank's ``save`` call to the moment its step becomes durable as the training loop sees it,
i.e. orbax finalizes (atomically renames) the step directory, observed by one watcher thread
polling every 2 ms. For CacheX that point is replica-durable (orbax commits a CacheX step after
T1 + T2); for orbax writing to the PFS it is PFS-durable. Both include any wait of the
``save`` call for the previous save.

Variability and the PFS model. The per-rank PFS times are lognormal with shape ``pfs_sigma``,
so the model alone has p99/p50 = exp(2.326 sigma) (3.2 at sigma = 0.5), and contention scales
the median only, not that ratio. Hence ``variability_ratio_vs_orbax`` cannot exceed
exp(2.326 sigma) / (CacheX's own p99/p50 >= 1): reaching 10 needs sigma >= 0.99 even for a
perfectly steady CacheX, 43 needs sigma >= 1.62. sigma = 0.5 is our assumption: the CacheX
paper's measured per-rank distribution (its sigma) was not available to us, and sigma is not
tuned to reach the bar.

Testbed caveat: node-local disks, the neighbour's disk and the PFS are all the one disk of
this machine, so CacheX's three copies (local, replica, drain) share one device that a cluster
would spread over three. The default state (4 MiB per rank, 4 ranks, a save a second) keeps
that traffic within one disk's bandwidth; at 16 MiB per rank (``--set state_mib=16``) the
shared disk, not the PFS model, sets CacheX's times.

PFS model defaults: 1 GB/s per node, 10 ms latency, lognormal sigma 0.5, 64 writers; with
``contention = 0.5`` each writer runs 32.5x slower (about a 2 GB/s PFS shared by 64 writers).

Runtime: ``--quick`` about 1 min on 2 CPU cores (2 ranks, 8 saves of 2 MiB every 0.4 s;
measured 35 s); full about 3-4 min (4 ranks, 24 saves of 4 MiB every 1 s; measured 2 min 50 s
on 2 cores shared at load ~15).

summary.json keys (the headline keys are the contended condition; the same keys with the
suffix ``_uncontended`` hold the contention-free condition):
  ``stall_ms_cachex``, ``stall_ms_orbax``: mean stall per save and rank (ms; the mean is
  the training time lost per save, blocking waits for a previous save included);
  ``stall_ratio_vs_orbax``: their ratio (goal <= 1.0);
  ``stall_ms_median_cachex``, ``stall_ms_median_orbax``, ``stall_median_ratio_vs_orbax``,
  ``stall_ms_p99_cachex``, ``stall_ms_p99_orbax``: the median and p99 of the same stalls;
  ``replica_durable_s``: median time to replica-durable (CacheX);
  ``pfs_durable_s_cachex``: median time to PFS-durable of the steps the drainer persisted;
  ``pfs_drained_fraction``: fraction of saved steps the drainer persisted (it skips to the
  newest step when the PFS lags);
  ``pfs_durable_s_orbax``: median time to PFS-durable of orbax's direct saves;
  ``replica_vs_pfs_durable_ratio``: ``replica_durable_s / pfs_durable_s_orbax`` (goal <= 0.3);
  ``variability_cachex``, ``variability_orbax``: p99/p50 of the completion times (above)
  across ranks and saves;
  ``variability_ratio_vs_orbax``: orbax's over CacheX's (goal >= 10);
  ``variability_save_cachex``, ``variability_save_orbax``: p99/p50 across saves of the whole
  save's completion (slowest rank's durable point minus the first rank's save call);
  ``variability_t1t2_cachex``: p99/p50 of CacheX's T1 + T2 time inside its commit (the
  handler's own clock, without orbax's bookkeeping);
  ``variability_model_pfs``: exp(2.326 pfs_sigma), the PFS model's own p99/p50;
  ``model_median_pfs_s``: the PFS model's median per-rank write time for the state.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from experiments import _runner
from hexad import cachex


@dataclasses.dataclass(frozen=True)
class Config:
    n_ranks: int = 4
    n_saves: int = 24
    save_interval_s: float = 1.0
    state_mib: float = 4.0
    hidden: int = 512
    pfs_bandwidth: float = 1e9
    pfs_writers: int = 64
    pfs_latency_s: float = 0.01
    pfs_sigma: float = 0.5
    contention: float = 0.5
    token: str = "cachex-bench"

    def __post_init__(self):
        _runner.at_least(self, 1, "n_ranks", "n_saves", "hidden", "pfs_writers")
        _runner.at_least(self, 0, "save_interval_s", "pfs_latency_s", "pfs_sigma", "contention")
        _runner.positive(self, "state_mib", "pfs_bandwidth")


def _make_step(hidden: int):
    @jax.jit
    def step(w, x):
        # One cheap "training" update per rank: w <- w + 1e-3 tanh(w x); w: [n, rows, hidden].
        return w + 1e-3 * jnp.tanh(jnp.einsum("nrh,hk->nrk", w, x))

    return step


_Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile


def _save_variability(done: dict, starts: dict, cfg: Config) -> float:
    """p99/p50 over saves of (slowest rank's durable point - first rank's save call)."""
    per_save = []
    for s in range(cfg.n_saves):
        ends = [done.get((s, r)) for r in range(cfg.n_ranks)]
        if all(e is not None for e in ends):
            per_save.append(max(ends) - min(starts[(s, r)] for r in range(cfg.n_ranks)))
    return _pctl(per_save, 99) / _pctl(per_save, 50)


def _pctl(x, q) -> float:
    return float(np.percentile(np.asarray(x, np.float64), q)) if len(x) else float("nan")


class _Watcher:
    """Records when each orbax step directory appears (orbax's atomic finalize)."""

    def __init__(self):
        self.pending: dict[tuple[int, int], Path] = {}
        self.done: dict[tuple[int, int], float] = {}
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


def _condition(cfg: Config, contention: float, root: Path, seed: int, ctx) -> dict:
    n = cfg.n_ranks
    model = cachex.PFSModel(
        bandwidth=cfg.pfs_bandwidth,
        n_writers=cfg.pfs_writers,
        contention=contention,
        latency_s=cfg.pfs_latency_s,
        sigma=cfg.pfs_sigma,
    )
    rows = max(8, int(cfg.state_mib * 2**20 / 4 / cfg.hidden))
    step = _make_step(cfg.hidden)
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (cfg.hidden, cfg.hidden), jnp.float32) / cfg.hidden**0.5
    w0 = jax.random.normal(kw, (n, rows, cfg.hidden), jnp.float32)
    nbytes = rows * cfg.hidden * 4
    out: dict = {"model_median_pfs_s": model.median_time(nbytes)}

    # -- CacheX ------------------------------------------------------------------------------
    servers = [
        cachex.spawn_replica_server(root / f"node{r}" / "replicas", cfg.token, max_lifetime_s=900)
        for r in range(n)
    ]
    mgrs = [
        cachex.CacheXManager(
            root / f"node{r}" / "local",
            neighbour=cachex.ReplicaClient(servers[(r + 1) % n][1], cfg.token),
            pfs_dir=root / "pfs_cachex",
            pfs_model=model,
            rank=r,
            n_ranks=n,
            seed=seed,
            max_to_keep=2,
            pfs_max_to_keep=2,
        )
        for r in range(n)
    ]
    stalls, starts = [], {}
    cwatcher = _Watcher()
    w = w0
    w = step(w, x).block_until_ready()  # compile outside the timed loop
    last = time.perf_counter()
    for s in ctx.progress(range(cfg.n_saves), desc=f"cachex c={contention}"):
        while time.perf_counter() - last < cfg.save_interval_s:
            w = step(w, x).block_until_ready()
        last = time.perf_counter()
        for r in range(n):
            state = {"w": w[r]}
            jax.block_until_ready(state)
            starts[(s, r)] = time.time()
            t0 = time.perf_counter()
            cwatcher.add((s, r), mgrs[r].steps_dir / str(s))
            mgrs[r].save(s, state)
            stalls.append(time.perf_counter() - t0)
    for m in mgrs:
        m.wait_until_finished()
    cwatcher.stop()
    write = [cwatcher.done[k] - starts[k] for k in starts if k in cwatcher.done]
    rep, t1t2 = [], []
    for (s, r), t in starts.items():
        rec = mgrs[r].durability(s)
        if "replica" in rec:
            rep.append(rec["replica"]["time"] - t)
            t1t2.append(rec["replica"]["seconds"])
    for m in mgrs:
        m.close(wait_for_drain=True, timeout_s=120)
    pfs_times = []
    for s in range(cfg.n_saves):  # from the records: the PFS GC keeps only the newest steps
        recs = [mgrs[r].durability(s).get("pfs") for r in range(n)]
        if all(recs) and any(x.get("committed") for x in recs):
            t_start = min(starts[(s, r)] for r in range(n))
            pfs_times.append(max(x["time"] for x in recs) - t_start)
    for proc, _ in servers:
        proc.terminate()
        proc.wait(timeout=30)
    out.update(
        stall_ms_cachex=1e3 * float(np.mean(stalls)),
        stall_ms_median_cachex=1e3 * _pctl(stalls, 50),
        stall_ms_p99_cachex=1e3 * _pctl(stalls, 99),
        replica_durable_s=_pctl(rep, 50),
        pfs_durable_s_cachex=_pctl(pfs_times, 50),
        pfs_drained_fraction=len(pfs_times) / cfg.n_saves,
        variability_cachex=_pctl(write, 99) / _pctl(write, 50),
        variability_save_cachex=_save_variability(cwatcher.done, starts, cfg),
        variability_t1t2_cachex=_pctl(t1t2, 99) / _pctl(t1t2, 50),
        variability_model_pfs=float(np.exp(_Z99 * cfg.pfs_sigma)),
        _write_cachex=write,
    )

    # -- orbax async straight to the PFS ---------------------------------------------------
    handlers = {"state": ocp.StandardCheckpointHandler(), "pfs": cachex.PFSDelayHandler()}
    omgrs = [
        ocp.CheckpointManager(
            root / "pfs_orbax" / f"rank_{r}",
            item_handlers=dict(handlers),
            options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True, max_to_keep=2),
        )
        for r in range(n)
    ]
    watcher = _Watcher()
    ostalls, ostarts = [], {}
    w = w0
    last = time.perf_counter()
    for s in ctx.progress(range(cfg.n_saves), desc=f"orbax c={contention}"):
        while time.perf_counter() - last < cfg.save_interval_s:
            w = step(w, x).block_until_ready()
        last = time.perf_counter()
        for r in range(n):
            state = {"w": w[r]}
            jax.block_until_ready(state)
            draw = float(model.sample(np.random.default_rng([seed, s, r]), nbytes))
            watcher.add((s, r), root / "pfs_orbax" / f"rank_{r}" / str(s))
            ostarts[(s, r)] = time.time()
            t0 = time.perf_counter()
            omgrs[r].save(
                s,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    pfs=cachex.PFSDelaySave(draw, t0=time.monotonic()),
                ),
            )
            ostalls.append(time.perf_counter() - t0)
    for m in omgrs:
        m.wait_until_finished()
    watcher.stop()
    for m in omgrs:
        m.close()
    owrite = [watcher.done[k] - ostarts[k] for k in ostarts if k in watcher.done]
    opfs = []
    for s in range(cfg.n_saves):
        ends = [watcher.done.get((s, r)) for r in range(n)]
        if all(e is not None for e in ends):
            opfs.append(max(ends) - min(ostarts[(s, r)] for r in range(n)))
    out.update(
        stall_ms_orbax=1e3 * float(np.mean(ostalls)),
        stall_ms_median_orbax=1e3 * _pctl(ostalls, 50),
        stall_ms_p99_orbax=1e3 * _pctl(ostalls, 99),
        pfs_durable_s_orbax=_pctl(opfs, 50),
        variability_orbax=_pctl(owrite, 99) / _pctl(owrite, 50),
        variability_save_orbax=_save_variability(watcher.done, ostarts, cfg),
        _write_orbax=owrite,
    )
    out["stall_ratio_vs_orbax"] = out["stall_ms_cachex"] / out["stall_ms_orbax"]
    out["stall_median_ratio_vs_orbax"] = (
        out["stall_ms_median_cachex"] / out["stall_ms_median_orbax"]
    )
    out["replica_vs_pfs_durable_ratio"] = out["replica_durable_s"] / out["pfs_durable_s_orbax"]
    out["variability_ratio_vs_orbax"] = out["variability_orbax"] / out["variability_cachex"]
    return out


def run(cfg: Config, ctx: _runner.Context) -> dict:
    if cfg.n_ranks < 2:
        raise ValueError(f"n_ranks: expected >= 2 (a rank needs a neighbour), got {cfg.n_ranks}")
    root = Path(ctx.out_dir) / "storage"
    summary, curves = {}, {}
    for label, c in (("_uncontended", 0.0), ("", cfg.contention)):
        sub = root / f"c{c}"
        res = _condition(cfg, c, sub, ctx.seed, ctx)
        shutil.rmtree(sub, ignore_errors=True)
        curves[label] = (res.pop("_write_cachex"), res.pop("_write_orbax"))
        for k, v in res.items():
            summary[k + label] = v
        ctx.log(condition=label or "contended", contention=c, **res)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (label, (wc, wo)) in zip(axes, curves.items(), strict=True):
        for data, name in ((wc, "CacheX (replica-durable)"), (wo, "orbax direct to PFS")):
            xs = np.sort(np.asarray(data))
            ax.plot(xs, np.linspace(0, 1, len(xs)), label=name)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_xlabel("save call to durable step, per rank and save (s)")
        ax.set_title("no contention" if label else f"contention {cfg.contention}")
        ax.legend()
    axes[0].set_ylabel("CDF")
    ctx.save_plot(fig, "write_time_cdf")
    return summary


STUDY = _runner.Study(
    "cachex_bench",
    Config,
    run,
    quick={"n_ranks": 2, "n_saves": 8, "state_mib": 2.0, "save_interval_s": 0.4},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
