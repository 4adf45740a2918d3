"""CacheX fault injection, and the fitted durability model with its C*_p(n) curves.

Command:  python -m experiments.cachex_durability [--quick] [--out DIR] [--seed N] [--set k=v]

What it measures. For each fault, ``runs_per_fault`` runs: a trainer saves ``n_good`` steps
through CacheX (node-local tier, a neighbour replica server on loopback, a PFS directory), then
the fault strikes during or after the next save; a fresh manager then restores. Faults: SIGKILL
of the trainer process as T0 staging starts, after the T1 local write, and after the replica
acknowledgement but before orbax's commit (each struck through the manager's ``fault_hooks``);
SIGKILL of the drainer during the PFS drain; a rank killed before the PFS rename (only some
done markers); the node's whole local storage wiped; the neighbour dead; the neighbour slow;
disk full at the local write (a fault hook raising ``ENOSPC``); a truncated and a bit-flipped
local data file; the PFS down for good while the trainer keeps saving (every drain fails, is
retried with backoff until its failure is final, and the undrained steps stay pinned in the
local tier beyond ``max_to_keep``). The faults of review cachex-2: an I/O error (EIO) on the
newest local manifest while listing and reading (``listing_eio``); the PFS mount's handle
gone stale (``pfs_estale``, ESTALE on the PFS root); plain files named like steps on the PFS
and in ``steps/`` (``stray_entries``); one rank's step drained at once by its drainer and an
orphan drainer of another node (``two_drainers``: two records folders, one PFS; then the node
and its neighbour are lost); a rollback on a fresh node (restore of step ``n_good - 2``) and
the step numbers above it saved again with other bytes and drained (``rollback_reuse``; then
the node and its neighbour are lost); the neighbour's server killed mid re-commit (its copy
renamed aside, the new one complete but not renamed in) and restarted, with the node's local
storage lost (``recommit_killed``); 80 idle unauthenticated sockets on the neighbour's server
while a save needs it (``preauth_flood``). For each run the study verifies every tier by brute
force to find the newest complete step anywhere, and counts a restore *exact* when it returns
that step bit-exact, *corrupt* when it returns bytes that are not exactly some saved step's
state (the goal is zero), and the steps lost against plain orbax (a local-only orbax manager,
which commits the same local steps but has no replica or PFS copy; negative = CacheX kept steps
orbax lost). It also counts the steps lost outright (*steps_lost*: the newest step CacheX
guarantees after the fault, minus the step restored, floored at 0; the guarantee is the newest
committed step when the fault takes at most one of the node and its neighbour, and the newest
step recorded PFS-durable when it takes both) and the *false durability claims*: steps that
``tier_done(s, "pfs")`` (or another node's ``pfs`` record) calls PFS-durable while the PFS does
not read back as exactly that step's state (after a rollback: the new one).

The same campaign, where its API allows, on orbax's own multi-tier checkpointing, the emergency
``CheckpointManager`` run as two ``jax.distributed`` processes
(:class:`~experiments._cachex_faultworker.EmergencyPeer`; it has no fault hooks, so its faults
strike between calls): ``n_good`` steps of a 1 MiB state (step ``s``'s state differs from every
other's) saved and committed on both tiers, then the job SIGKILLed with the next save's commit
in flight and restarted; the local slice's node storage lost; a bit flipped in, or the second
half cut off, the largest file of the newest local step; a bit flipped in the newest persistent
step with the local tier lost; plain files named like steps in every tier's root. The newest
step its manager lists is restored and matched against every saved state: *exact* when it is
that step's state, *corrupt* when it is no saved step's, *failed* when the restore (or the job)
fails; its *steps lost* are the newest step committed before the fault minus the step restored
exactly (-1 when none), its *false durability claims* the listed steps that do not restore as
themselves.

Then the durability model: per-rank PFS write times are drawn from the PFS model (lognormal
body) for ``model_saves`` saves of ``model_writers`` writers under ``contention``; the model fit
(lognormal MLE with the contention factor removed, Gumbel MLE of the log slowest writer) is
compared with the truth, and ``C*_p(n)`` is computed against the stage-and-replicate time
``t_stage`` (p99 of the replica-durable times measured in the clean saves of this run).

Before each restore the study reads the manager's ``health()`` (drainer and neighbour
liveness, and the durability lag: committed local steps not yet PFS-committed, i.e. the steps
a loss of the node and its neighbour would roll back) and logs it with the run.

Runtime: ``--quick`` about 3 min on 2 CPU cores (1 run per fault, 19 faults, and 6 on the
peer, whose truncated-file run waits about a minute for its job to fail); full (5 runs per
fault, 95 runs and 30 on the peer) about 10 min on 2 idle cores.

``--set faults=bit_flip,node_wiped`` restricts the faults, ``--set emergency_faults=node_lost``
the peer's (a config with ``emergency_faults=()`` runs none). The faults that make a save fail on
purpose (``neighbour_dead``, ``disk_full``) silence the ``absl`` logger while they strike, so
orbax's ``Save Finalize thread failed`` error lines, expected there, are not printed.

summary.json keys: ``faults_tried`` (fault kinds run), ``steps_lost`` and
``false_durable_claims`` (sums over runs; the goal is 0 for both), ``fault_runs``,
``fault_exact_restores``, ``fault_corrupt_restores``,
``fault_steps_lost_vs_orbax`` (sum over runs of orbax's newest minus ours, floored at 0) and
``fault_steps_gained_vs_orbax`` (sum of ours minus orbax's, floored at 0); per fault ``F``:
``F_runs``, ``F_exact``, ``F_corrupt``, ``F_lost_vs_orbax``, ``F_max_lag_steps`` (the largest
``health()`` durability lag in steps seen before a restore), ``F_steps_lost``,
``F_false_claims``; the peer: ``orbax_emergency_faults_tried``,
``orbax_emergency_fault_runs``, ``orbax_emergency_steps_lost``,
``orbax_emergency_false_durable_claims``, ``orbax_emergency_exact_restores``,
``orbax_emergency_corrupt_restores``, ``orbax_emergency_failed_restores`` and per fault ``F``
``orbax_emergency_F_runs``, ``_exact``, ``_corrupt``, ``_failed``, ``_steps_lost``,
``_false_claims``; the model: ``model_mu_true``,
``model_mu_fit``, ``model_sigma_true``, ``model_sigma_fit``, ``model_gumbel_loc``,
``model_gumbel_scale``, ``t_stage_p99_s``, ``c_star_p50_n64``, ``c_star_p99_n64``,
``stage_path_chosen`` (1 if stage-and-replicate is the faster durable path at ``contention``
for ``model_writers`` writers at p99, else 0). Plot: ``c_star.png``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import shutil
from pathlib import Path

import numpy as np

from experiments import _runner
from experiments._cachex import (
    KILL_POINTS,
    NEW_FAULTS,
    PFS_ONLY,
    STEP_N_COMMITS,
    PFSConfig,
    false_claims,
    fault_result,
    new_fault_run,
    newest_pfs_claimed,
    plot_c_star,
    save_steps,
    state,
    strike,
    study_token,
)
from experiments._cachex_faultworker import EMERGENCY_FAULTS, emergency_campaign, run_killed
from hexad import cachex

# The trainer kills (a fault worker process), then the faults struck in this process.
IN_PROCESS = (
    "kill_drainer kill_before_rename node_wiped neighbour_dead neighbour_slow disk_full "
    "truncated_file bit_flip pfs_down"
)
FAULTS = (*KILL_POINTS, *IN_PROCESS.split(), *NEW_FAULTS)


@dataclasses.dataclass(frozen=True)
class Config(PFSConfig):
    faults: tuple[str, ...] = FAULTS
    emergency_faults: tuple[str, ...] = EMERGENCY_FAULTS
    runs_per_fault: int = 5
    n_good: int = 3
    model_saves: int = 2000
    model_writers: int = 64
    state_mib_model: float = 16.0

    def __post_init__(self):
        super().__post_init__()
        _runner.one_of(self, FAULTS, "faults")
        _runner.one_of(self, EMERGENCY_FAULTS, "emergency_faults")  # () runs none
        _runner.at_least(self, 1, "runs_per_fault", "n_good", "model_saves", "model_writers")
        _runner.positive(self, "state_mib_model")


QUICK = {"runs_per_fault": 1, "model_saves": 500}


def _one_run(fault: str, run_dir: Path, seed: int, cfg: Config, t_stage: list) -> dict:
    local, pfs, rroot = run_dir / "local", run_dir / "pfs", run_dir / "neighbour"
    token = study_token()
    server = cachex.ReplicaServer(rroot, token, max_lifetime_s=300).start()
    client = cachex.ReplicaClient(server.address, token, timeout_s=10)
    n = cfg.n_good
    hooks = {"local_write": cachex.fail_at(n)} if fault == "disk_full" else None
    kw = dict(neighbour=client, pfs_dir=pfs, drainer=False, seed=seed, max_to_keep=2)
    try:
        if fault in KILL_POINTS:  # the worker saves n steps and is SIGKILLed in the next
            run_killed(fault, local, pfs, server.address, token, n, seed)
        with cachex.CacheXManager(local, fault_hooks=hooks, **kw) as m:
            if fault not in KILL_POINTS:
                t_stage += save_steps(m, seed, range(n))
                strike(fault, m, server, pfs, n, seed)
            reachable = rroot if server.running else None  # a dead neighbour's disk is not
            audit = cachex.verified_steps(local, pfs_dir=pfs, replica_dir=reachable)
            orbax_newest = max(audit["local"], default=-1)
            if fault == "node_wiped":
                orbax_newest = -1  # a local-only orbax loses everything with the node's storage
            elif fault == "neighbour_dead":
                orbax_newest = n  # a local-only orbax does not need the neighbour to commit n
            expected = max(audit["local"] + audit["replica"] + audit["pfs"], default=-1)
            health = m.health(ping_neighbour=server.running)
            ref = functools.partial(state, seed)  # ref(s): the state saved at step s
            false = len(false_claims(m, pfs, ref, range(n + 1)))
            guaranteed = n if fault in STEP_N_COMMITS else n - 1
            if fault in PFS_ONLY:
                guaranteed = newest_pfs_claimed(m, range(n + 1))
            check = cachex.check_restore(m, ref(0), expected, ref, range(n + 1))
    finally:
        server.stop()
    return fault_result(check, orbax_newest, health, guaranteed, false)


def _model_part(cfg: Config, seed: int, t_stage_p99: float, ctx) -> dict:
    n, nbytes = cfg.model_writers, cfg.state_mib_model * 2**20
    model = cfg.pfs_model(n, cfg.contention)
    times = model.sample(np.random.default_rng(seed), nbytes, size=(cfg.model_saves, n))
    fit = cachex.fit_durability_model(times.astype(np.float32), contention=cfg.contention)
    mu_true, sigma_true = model.lognormal(nbytes)
    out = {"model_mu_true": mu_true, "model_sigma_true": sigma_true, "t_stage_p99_s": t_stage_p99}
    names = ("mu_fit", "sigma_fit", "gumbel_loc", "gumbel_scale")  # DurabilityModel's fields
    out.update({f"model_{k}": float(v) for k, v in zip(names, fit, strict=True)})
    for p in (0.5, 0.99):
        c = cachex.critical_contention(fit.mu, fit.sigma, 64, p, t_stage_p99)
        out[f"c_star_p{int(p * 100)}_n64"] = float(c)
    path = cachex.choose_path(fit.mu, fit.sigma, n, 0.99, t_stage_p99, cfg.contention)
    out["stage_path_chosen"] = int(bool(path))
    plot_c_star(fit, cfg.contention, t_stage_p99, ctx)
    return out


def run(cfg: Config, ctx: _runner.Context) -> dict:
    root = Path(ctx.out_dir) / "storage"
    t_stage: list = []
    per = {f: collections.Counter() for f in cfg.faults}
    diffs = []  # per run: the newest step a local-only orbax restores minus ours
    jobs = [(f, i) for f in cfg.faults for i in range(cfg.runs_per_fault)]
    for fault, i in ctx.progress(jobs, desc="faults"):
        run_dir = root / f"{fault}-{i}"
        one = new_fault_run if fault in NEW_FAULTS else _one_run
        res = one(fault, run_dir, ctx.seed * 1000 + i, cfg, t_stage)
        shutil.rmtree(run_dir, ignore_errors=True)
        diffs.append(res["orbax_newest"] - res["restored"])
        res["steps_lost"] = max(res["guaranteed"] - res["restored"], 0)
        per[fault].update(
            runs=1,
            exact=res["exact"],
            corrupt=res["corrupt"],
            lost_vs_orbax=diffs[-1],
            steps_lost=res["steps_lost"],
            false_claims=res["false_claims"],
        )
        per[fault]["max_lag_steps"] = max(per[fault]["max_lag_steps"], res["lag_steps"])
        ctx.log(fault=fault, run=i, **res)
    kinds = ("runs", "exact", "corrupt", "lost_vs_orbax", "max_lag_steps", "steps_lost")
    kinds += ("false_claims",)
    summary = {f"{f}_{k}": int(c[k]) for f, c in per.items() for k in kinds}
    summary.update(
        faults_tried=len(per),
        steps_lost=sum(c["steps_lost"] for c in per.values()),
        false_durable_claims=sum(c["false_claims"] for c in per.values()),
        fault_runs=len(diffs),
        fault_exact_restores=sum(c["exact"] for c in per.values()),
        fault_corrupt_restores=sum(c["corrupt"] for c in per.values()),
        fault_steps_lost_vs_orbax=sum(max(d, 0) for d in diffs),
        fault_steps_gained_vs_orbax=sum(max(-d, 0) for d in diffs),
    )
    em = emergency_campaign(cfg.emergency_faults, cfg.runs_per_fault, cfg.n_good,
                            root / "orbax_emergency", ctx)  # fmt: skip
    summary.update(em)
    t99 = float(np.percentile(t_stage, 99)) if t_stage else float("nan")
    summary.update(_model_part(cfg, ctx.seed, t99, ctx))
    return summary


STUDY = _runner.Study("cachex_durability", Config, run, quick=QUICK, doc=__doc__)

if __name__ == "__main__":
    STUDY.main()
