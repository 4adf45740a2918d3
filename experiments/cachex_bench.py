"""CacheX against orbax's own async CheckpointManager writing straight to the PFS (an
emulation: one machine stands in for the nodes, the neighbours and the PFS).

Command:  python -m experiments.cachex_bench [--quick] [--out DIR] [--seed N] [--set k=v ...]

What it measures. ``n_ranks`` ranks (one process; each rank has its own node-local directory,
its own replica server process as the next rank's neighbour, and its own drainer process) run
jitted training steps on their own ``state_mib`` MiB state and save every ``save_interval_s``
seconds, ``n_saves`` times. The same loop then runs with one orbax async ``CheckpointManager``
per rank writing straight to the PFS directory. The node-local tiers and the replicas live on
tmpfs (``fast_dir="shm"``: the shared-memory mount when there is one; its fsync is a no-op, so
this emulates fast node-local storage, not its durability), the PFS directories on the output
disk. The PFS is that disk plus a :class:`hexad.cachex.PFSModel`: a rank's PFS write completes
at ``max(real write, model draw)``, the draw ``m * exp(shared_sigma z_save + sigma z_rank)``
with a load factor shared by all writers of a save. CacheX's drainer imposes it on the T3
drain; the orbax baseline gets the same draws (:meth:`hexad.cachex.PFSModel.draw`) through a
``PFSDelayHandler`` item (``experiments._cachex``) in the same orbax commit.

The PFS model's parameters, fixed before any run: 1 GB/s per node, 10 ms latency, 64 writers,
``contention = 0.5`` (each writer 32.5x slower: about a 2 GB/s PFS shared by 64 writers), and
a total lognormal shape ``sigma`` split evenly between the shared and the per-rank factor
(``shared_fraction = 0.5``). The curve runs ``sigma`` over ``sigmas`` plus ``pfs_sigma``:
0.35-0.8 is the range that published run-to-run spreads give when read as the max/min of
20-50 lognormal runs (Lustre on Kraken: CCSM I/O time varying "from 5x to 18x", NCAR CISL
seminar, N. Jones; write-write interference "up to a factor of five", Shah et al.,
Supercomputing Frontiers and Innovations 2019). No sigma is tuned toward the paper's bar; with
p99/p50 a ratio of 10 would need sigma >= 0.99 even for a perfectly steady CacheX. Loopback T2
flatters CacheX (no network congestion); the save interval is meant to exceed the PFS p99 so
that the baseline does not queue (a queue wait shows up as its stall).

Per save and rank: the training-loop stall (the time the ``save`` call blocked, measured the
same way for both), the time to replica-durable (CacheX: local + neighbour ack), the time to
PFS-durable, and the completion time (from just before the rank's ``save`` call to the moment
its step is durable as the training loop sees it: orbax's atomic rename of the step directory,
seen by one watcher thread polling every 2 ms; replica-durable for CacheX, PFS-durable for
orbax) whose p99/p50 is the variability. After each round of saves the study samples every
manager's ``health()`` (drainer alive, durability lag in steps and seconds).

Runtime: ``--quick`` about 1-2 min on 2 CPU cores (2 ranks, 8 saves of 2 MiB every 0.4 s, two
values of sigma); full (4 ranks, 24 saves of 4 MiB every 1 s, three values, and orbax's
emergency manager) 172 s measured on 2 idle cores (results/cachex_bench).

summary.json keys (headline: the ``pfs_sigma`` condition):
  ``stall_ms_cachex``, ``stall_ms_orbax``: mean blocked time per save and rank (ms);
  ``stall_ratio_vs_orbax``: their ratio (goal <= 1.0); ``stall_ms_median_*``,
  ``stall_ms_p99_*``, ``stall_median_ratio_vs_orbax``: medians and p99s of the same;
  ``stage_ms_cachex``: mean T0 copy alone (part of the stall);
  ``replica_durable_s``: median per-(save, rank) time to replica-durable (CacheX);
  ``replica_durable_gib_s_per_node``: state bytes / that time (GiB/s, one rank per node);
  ``pfs_durable_s_orbax``: median per-(save, rank) time to PFS-durable of orbax;
  ``replica_vs_pfs_durable_ratio``: their ratio (goal <= 0.3; both per (save, rank));
  ``replica_vs_pfs_durable_ratio_save``: the same per whole save (slowest rank - first call);
  ``pfs_durable_s_cachex``: median whole-save time to PFS-committed of the drained steps;
  ``pfs_drained_fraction``: fraction of saved steps committed on the PFS;
  ``variability_cachex``, ``variability_orbax``: p99/p50 of the completion times;
  ``variability_ratio_vs_orbax``: orbax's over CacheX's (goal >= 10);
  ``spread_iqr_s_cachex``, ``spread_iqr_s_orbax``: their interquartile spread (s);
  ``variability_save_cachex``, ``variability_save_orbax``: p99/p50 per whole save;
  ``variability_t1t2_cachex``: p99/p50 of T1 + T2 inside CacheX's commit;
  ``variability_model_pfs``: the PFS model's own p99/p50; ``model_median_pfs_s``;
  ``health_max_durability_lag_steps``, ``health_max_durability_lag_s``,
  ``health_drainer_down_samples``, ``health_drainer_restarts``: from ``health()``;
  the curve: ``curve_sigma`` and, per sigma, ``curve_variability_ratio_vs_orbax``,
  ``curve_variability_orbax``, ``curve_variability_cachex``, ``curve_spread_iqr_s_orbax``,
  ``curve_spread_iqr_s_cachex``, ``curve_replica_vs_pfs_durable_ratio``;
  orbax's own multi-tier checkpointing, the emergency ``CheckpointManager``
  (``orbax.checkpoint.experimental.emergency``), once per run on the same ``state_mib`` state:
  two processes of one ``jax.distributed`` job on this host (process 1 writes the local tier,
  process 0 the persistent one, every step; see
  :class:`~experiments._cachex_faultworker.EmergencyPeer` for what it needs and why one process
  cannot run it), ``n_saves`` saves, each started once every earlier commit finished (so its
  stall holds no queueing), both tiers on the output disk and without the PFS model (orbax's
  emergency manager takes no handler that could delay its persistent tier), so its durable times
  compare with ``replica_durable_s``, not with the modelled PFS times:
  ``orbax_emergency_stall_ms``, ``orbax_emergency_stall_ms_median``: mean and median blocking
  ``save`` (the slower of its two processes, ms); ``orbax_emergency_local_durable_s``,
  ``orbax_emergency_persistent_durable_s``: median time from a save's start to its local /
  persistent commit; ``orbax_emergency_restore_local_s``: a restore from the local tier;
  ``orbax_emergency_restore_local_lost_s``: a restore after the local tier was deleted (from the
  persistent tier; GKE's replicator, which would copy the local tier to other nodes, does not
  run here); ``orbax_emergency_error``: None, or why the peer failed (the others None).
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments import _runner
from experiments._cachex import (
    HealthWatch,
    PFSConfig,
    completion_stats,
    fast_root,
    orbax_pfs_manager,
    orbax_pfs_save,
    paced_saves,
    pctl,
    pfs_commit_times,
    plot_bench,
    study_token,
)
from experiments._cachex_faultworker import emergency_summary
from hexad import cachex


@dataclasses.dataclass(frozen=True)
class Config(PFSConfig):
    n_ranks: int = 4
    n_saves: int = 24
    save_interval_s: float = 1.0
    state_mib: float = 4.0
    hidden: int = 512
    pfs_writers: int = 64
    sigmas: tuple[float, ...] = (0.35, 0.8)
    shared_fraction: float = 0.5
    fast_dir: str = "shm"

    def __post_init__(self):
        super().__post_init__()
        _runner.at_least(self, 1, "n_ranks", "n_saves", "hidden", "pfs_writers")
        _runner.at_least(self, 0, "save_interval_s", "sigmas", "shared_fraction")
        _runner.positive(self, "state_mib")
        _runner.require(self.shared_fraction <= 1, "shared_fraction", "expected <= 1")


QUICK = {"n_ranks": 2, "n_saves": 8, "state_mib": 2.0, "save_interval_s": 0.4, "sigmas": (0.8,)}


def _condition(cfg: Config, sigma: float, root: Path, fast: Path, seed: int, ctx) -> dict:
    n, f = cfg.n_ranks, cfg.shared_fraction
    model = dataclasses.replace(
        cfg.pfs_model(cfg.pfs_writers, cfg.contention),
        sigma=sigma * (1 - f) ** 0.5,
        shared_sigma=sigma * f**0.5,
    )
    rows = max(8, int(cfg.state_mib * 2**20 / 4 / cfg.hidden))
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (cfg.hidden, cfg.hidden), jnp.float32) / cfg.hidden**0.5
    w0 = jax.random.normal(kw, (n, rows, cfg.hidden), jnp.float32)
    nbytes = rows * cfg.hidden * 4
    out: dict = {"model_median_pfs_s": model.median_time(nbytes)}

    # -- CacheX: local tiers and replicas on the fast root, the PFS on disk ------------------
    token = study_token()
    servers = [cachex.spawn_replica_server(fast / f"node{r}" / "replicas", token) for r in range(n)]
    opts = dict(pfs_dir=root / "pfs_cachex", pfs_model=model, n_ranks=n, seed=seed, max_to_keep=2)
    mgrs = [
        cachex.CacheXManager(
            fast / f"node{r}" / "local",
            neighbour=cachex.ReplicaClient(servers[(r + 1) % n][1], token),
            neighbour_rank=(r + 1) % n,
            rank=r,
            pfs_max_to_keep=2,
            **opts,
        )  # fmt: skip
        for r in range(n)
    ]
    health = HealthWatch(mgrs)
    stalls, starts, done = paced_saves(
        cfg, ctx, w0, x, lambda s, r, state: mgrs[r].save(s, state),
        lambda s, r: mgrs[r].steps_dir / str(s), mgrs, f"cachex sigma={sigma}", health,
    )  # fmt: skip
    rep, t1t2, rep_end = [], [], {}
    for (s, r), t in starts.items():
        if rec := mgrs[r].durability(s).get("replica"):
            rep.append(rec["time"] - t)
            t1t2.append(rec["seconds"])
            rep_end[(s, r)] = rec["time"]
    stage = [mgrs[r].stage_seconds(s) or 0.0 for (s, r) in starts]
    for m in mgrs:
        m.close(wait_for_drain=True, timeout_s=120)
    out.update(health.summary())
    pfs_times = pfs_commit_times(mgrs, starts, cfg.n_saves, n)
    for proc, _ in servers:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
    figures, out["_write_cachex"], _ = completion_stats(
        "cachex", stalls, done, starts, cfg.n_saves, n
    )
    _, _, rep_save = completion_stats("replica", [0.0], rep_end, starts, cfg.n_saves, n)
    out.update(
        figures,
        stage_ms_cachex=1e3 * float(np.mean(stage)),
        replica_durable_s=pctl(rep, 50),
        replica_durable_gib_s_per_node=nbytes / pctl(rep, 50) / 2**30,
        pfs_durable_s_cachex=pctl(pfs_times, 50),
        pfs_drained_fraction=len(pfs_times) / cfg.n_saves,
        variability_t1t2_cachex=pctl(t1t2, 99) / pctl(t1t2, 50),
        variability_model_pfs=model.quantile_ratio(0.99),
    )

    # -- orbax async straight to the PFS ---------------------------------------------------
    omgrs = [orbax_pfs_manager(root / "pfs_orbax" / f"rank_{r}") for r in range(n)]

    def save_orbax(s, r, state):  # the same per-(save, rank) PFS time the drainer draws
        orbax_pfs_save(omgrs[r], s, state, model.draw(seed, s, r, nbytes))

    stalls, starts, done = paced_saves(
        cfg, ctx, w0, x, save_orbax, lambda s, r: root / "pfs_orbax" / f"rank_{r}" / str(s),
        omgrs, f"orbax sigma={sigma}",
    )  # fmt: skip
    for m in omgrs:
        m.close()
    figures, write, per_save = completion_stats("orbax", stalls, done, starts, cfg.n_saves, n)
    out.update(figures, pfs_durable_s_orbax=pctl(write, 50), _write_orbax=write)
    out["stall_ratio_vs_orbax"] = out["stall_ms_cachex"] / out["stall_ms_orbax"]
    out["stall_median_ratio_vs_orbax"] = (
        out["stall_ms_median_cachex"] / out["stall_ms_median_orbax"]
    )
    out["replica_vs_pfs_durable_ratio"] = out["replica_durable_s"] / out["pfs_durable_s_orbax"]
    out["replica_vs_pfs_durable_ratio_save"] = pctl(rep_save, 50) / pctl(per_save, 50)
    out["variability_ratio_vs_orbax"] = out["variability_orbax"] / out["variability_cachex"]
    return out


CURVE = ("variability_ratio_vs_orbax", "variability_orbax", "variability_cachex",
         "spread_iqr_s_orbax", "spread_iqr_s_cachex", "replica_vs_pfs_durable_ratio")  # fmt: skip


def run(cfg: Config, ctx: _runner.Context) -> dict:
    if cfg.n_ranks < 2:
        raise ValueError(f"n_ranks: expected >= 2 (a rank needs a neighbour), got {cfg.n_ranks}")
    root = Path(ctx.out_dir) / "storage"
    sigmas = sorted({*cfg.sigmas, cfg.pfs_sigma})
    summary, curves = {"curve_sigma": sigmas}, {}
    summary.update({f"curve_{k}": [] for k in CURVE})
    for sigma in sigmas:
        sub, fast = root / f"s{sigma}", fast_root(cfg.fast_dir, root / f"s{sigma}")
        try:
            res = _condition(cfg, sigma, sub, fast, ctx.seed, ctx)
        finally:
            shutil.rmtree(sub, ignore_errors=True)
            shutil.rmtree(fast, ignore_errors=True)
        curves[sigma] = (res.pop("_write_cachex"), res.pop("_write_orbax"))
        for k in CURVE:
            summary[f"curve_{k}"].append(res[k])
        if sigma == cfg.pfs_sigma:
            summary.update(res)
        ctx.log(condition=f"sigma={sigma}", **res)
    plot_bench(curves, sigmas, summary["curve_variability_ratio_vs_orbax"], ctx)
    summary.update(emergency_summary(root / "orbax_emergency", cfg.state_mib, cfg.n_saves))
    return summary


STUDY = _runner.Study("cachex_bench", Config, run, quick=QUICK, doc=__doc__)

if __name__ == "__main__":
    STUDY.main()
