"""CacheX fault injection, and the fitted durability model with its C*_p(n) curves.

Command:  python -m experiments.cachex_durability [--quick] [--out DIR] [--seed N] [--set k=v]

What it measures. For each fault, ``runs_per_fault`` runs: a trainer saves ``n_good`` steps
through CacheX (node-local tier, a neighbour replica server on loopback, a PFS directory), then
the fault strikes during or after the next save; a fresh manager then restores. Faults: SIGKILL
of the trainer process during T0 staging, after the T1 local write, and after the replica
acknowledgement but before orbax's commit; SIGKILL of the drainer during the PFS drain; a rank
killed before the PFS rename (only some done markers); the node's whole local storage wiped;
the neighbour dead; the neighbour slow; disk full during the local write; a truncated and a
bit-flipped local data file; the PFS down for good while the trainer keeps saving (every drain
fails, is retried with backoff until its failure is final, and the undrained steps stay pinned
in the local tier beyond ``max_to_keep``). For each run the study verifies every tier by brute
force to find the newest complete step anywhere, and counts a restore *exact* when it returns
that step bit-exact, *corrupt* when it returns bytes that are not exactly some saved step's
state (the goal is zero), and the steps lost against plain orbax (a local-only orbax manager,
which commits the same local steps but has no replica or PFS copy; negative = CacheX kept steps
orbax lost).

Then the durability model: per-rank PFS write times are drawn from the PFS model (lognormal
body) for ``model_saves`` saves of ``model_writers`` writers under ``contention``; the model fit
(lognormal MLE with the contention factor removed, Gumbel MLE of the log slowest writer) is
compared with the truth, and ``C*_p(n)`` is computed against the stage-and-replicate time
``t_stage`` (p99 of the replica-durable times measured in the clean saves of this run).

Runtime: ``--quick`` about 1 min on 2 CPU cores (1 run per fault); full about 4 min (5 runs;
measured 3.5 min on 2 cores shared at load ~15).

``--set faults=bit_flip,node_wiped`` restricts the faults. The faults that make a save fail on
purpose (``neighbour_dead``, ``disk_full``) silence the ``absl`` logger while they strike, so
orbax's ``Save Finalize thread failed`` error lines, expected there, are not printed.

summary.json keys: ``fault_runs``, ``fault_exact_restores``, ``fault_corrupt_restores``,
``fault_steps_lost_vs_orbax`` (sum over runs of orbax's newest minus ours, floored at 0) and
``fault_steps_gained_vs_orbax`` (sum of ours minus orbax's, floored at 0); per fault ``F``:
``F_runs``, ``F_exact``, ``F_corrupt``, ``F_lost_vs_orbax``; the model: ``model_mu_true``,
``model_mu_fit``, ``model_sigma_true``, ``model_sigma_fit``, ``model_gumbel_loc``,
``model_gumbel_scale``, ``t_stage_p99_s``, ``c_star_p50_n64``, ``c_star_p99_n64``,
``stage_path_chosen`` (1 if stage-and-replicate is the faster durable path at ``contention``
for ``model_writers`` writers at p99, else 0). Plot: ``c_star.png``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from experiments import _runner
from experiments._cachex_faultworker import state
from hexad import cachex
from hexad.cachex import _format, _manager, _pfs

KILL_FAULTS = ("kill_staging", "kill_after_t1", "kill_after_replica_ack")
FAULTS = (
    *KILL_FAULTS,
    "kill_drainer",
    "kill_before_rename",
    "node_wiped",
    "neighbour_dead",
    "neighbour_slow",
    "disk_full",
    "truncated_file",
    "bit_flip",
    "pfs_down",
)


@dataclasses.dataclass(frozen=True)
class Config:
    faults: tuple[str, ...] = FAULTS
    runs_per_fault: int = 5
    n_good: int = 3
    model_saves: int = 2000
    model_writers: int = 64
    state_mib_model: float = 16.0
    pfs_bandwidth: float = 1e9
    pfs_latency_s: float = 0.01
    pfs_sigma: float = 0.5
    contention: float = 0.5
    token: str = "cachex-durability"

    def __post_init__(self):
        _runner.one_of(self, FAULTS, "faults")
        _runner.at_least(self, 1, "runs_per_fault", "n_good", "model_saves", "model_writers")
        _runner.at_least(self, 0, "pfs_latency_s", "pfs_sigma", "contention")
        _runner.positive(self, "state_mib_model", "pfs_bandwidth")


def _complete_steps(local: Path, replica_root: Path | None, pfs: Path, rank: int = 0) -> set[int]:
    """Every step with a complete, fully verified copy in a reachable tier (brute force).

    ``replica_root`` is None when the neighbour is down: its disk is then unreachable.
    """
    found = set()
    dirs = []
    if (local / "steps").exists():
        dirs += [
            (int(p.name), p / "state") for p in (local / "steps").iterdir() if p.name.isdigit()
        ]
    rep = replica_root / f"rank_{rank}" if replica_root is not None else None
    if rep is not None and rep.exists():
        dirs += [(int(p.name), p) for p in rep.iterdir() if p.name.isdigit()]
    if pfs.exists():
        dirs += [(int(p.name), p / f"rank_{rank}") for p in pfs.iterdir() if p.name.isdigit()]
    for step, d in dirs:
        try:
            _format.read_rank_dir(d)
            found.add(step)
        except (_format.CorruptCheckpointError, OSError):
            continue
    return found


def _orbax_newest(local: Path) -> int:
    """What a local-only orbax manager would restore: its newest committed, readable step."""
    best = -1
    if (local / "steps").exists():
        for p in (local / "steps").iterdir():
            if p.name.isdigit():
                try:
                    _format.read_rank_dir(p / "state")
                    best = max(best, int(p.name))
                except (_format.CorruptCheckpointError, OSError):
                    continue
    return best


@contextlib.contextmanager
def _injected_fault():
    """Silences absl's log records (orbax's ``Save Finalize thread failed`` tracebacks) while a
    fault injected on purpose makes a save fail: the failure is what the run then checks, not
    a crash. Only the ``absl`` logger and only within this scope; other loggers are untouched.
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _save_that_fails(m, step: int, st) -> None:
    """Saves ``step`` while an injected fault makes the save fail; the failure is the fault
    under test, so it is absorbed (quietly, see :func:`_injected_fault`) and checked after."""
    with _injected_fault():
        m.save(step, st)
        try:
            m.wait_until_finished()
        except Exception:  # noqa: BLE001 - the failed save is the fault under test
            pass


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    path.write_bytes(bytes(data))


def _one_run(fault: str, run_dir: Path, seed: int, cfg: Config, t_stage: list) -> dict:
    local, pfs, rroot = run_dir / "local", run_dir / "pfs", run_dir / "neighbour"
    server = cachex.ReplicaServer(rroot, cfg.token, max_lifetime_s=300).start()
    client = cachex.ReplicaClient(server.address, cfg.token, timeout_s=10)
    n = cfg.n_good
    try:
        if fault in KILL_FAULTS:
            host, port = server.address
            cmd = [sys.executable, "-m", "experiments._cachex_faultworker", str(local), str(pfs),
                   host, str(port), cfg.token, str(n), fault, str(seed)]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            if proc.returncode != -signal.SIGKILL:
                raise RuntimeError(f"{fault}: worker was not killed: {proc.stderr[-2000:]}")
            time.sleep(0.3)  # the orphaned drainer may still persist a step; let it
            m = cachex.CacheXManager(local, neighbour=client, pfs_dir=pfs, drainer=False)
        else:
            m = cachex.CacheXManager(
                local, neighbour=client, pfs_dir=pfs, drainer=False, seed=seed, max_to_keep=2
            )
            for s in range(n):
                m.save(s, state(seed, s))
                m.wait_until_finished()
                rec = m.durability(s).get("replica")
                if rec:
                    t_stage.append(rec["seconds"])
            newest_dir = m.steps_dir / str(n - 1) / "state" / _format.DATA
            if fault == "kill_drainer":
                slow = dataclasses.asdict(cachex.PFSModel(latency_s=60.0))
                cfg_d = dataclasses.replace(m.drainer_config, pfs=slow)
                proc = _pfs.spawn_drainer(cfg_d)
                marker = pfs / f".tmp-{n - 1}" / "rank_0" / _format.MANIFEST
                t_end = time.monotonic() + 60
                while not marker.exists() and time.monotonic() < t_end:
                    time.sleep(0.02)
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                # PFS alone (local and neighbour gone) must not offer the half-drained step.
                if (pfs / str(n - 1)).exists():
                    raise RuntimeError("kill_drainer: a half-drained step was committed")
                _pfs.drain_once(m.drainer_config)  # a restarted drainer finishes the job
                shutil.rmtree(local / "steps")
                (local / "steps").mkdir()
                server.stop()
            elif fault == "kill_before_rename":
                cfg2 = dataclasses.replace(m.drainer_config, n_ranks=2)
                _pfs.drain_once(cfg2)  # rank 0 done; rank 1 died before its marker + rename
                assert not (pfs / str(n - 1)).exists()
                shutil.rmtree(local / "steps")
                (local / "steps").mkdir()
                server.stop()
            elif fault == "node_wiped":
                shutil.rmtree(local / "steps")
                (local / "steps").mkdir()
            elif fault == "neighbour_dead":
                server.stop()
                _save_that_fails(m, n, state(seed, n))
            elif fault == "neighbour_slow":
                server.delay_s = 0.5
                m.save(n, state(seed, n))
                m.wait_until_finished()
            elif fault == "disk_full":
                real = _manager._format.write_encoded

                def full(*_a, **_k):
                    raise OSError(errno.ENOSPC, "No space left on device (injected)")

                _manager._format.write_encoded = full
                try:
                    _save_that_fails(m, n, state(seed, n))
                finally:
                    _manager._format.write_encoded = real
            elif fault == "truncated_file":
                newest_dir.write_bytes(newest_dir.read_bytes()[:-100])
            elif fault == "bit_flip":
                _flip(newest_dir)
            elif fault == "pfs_down":
                for s in range(n + 1):
                    (pfs / f".tmp-{s}").write_bytes(b"")  # the PFS refuses every drain
                m.save(n, state(seed, n))
                m.wait_until_finished()
                dcfg, t_now = m.drainer_config, time.time()
                for k in range(dcfg.retry_max_attempts * (n + 1)):  # every retry falls due
                    _pfs.drain_once(dcfg, now=t_now + 3600.0 * (k + 1))
                final = m.durability(n).get("pfs_error", {})
                if final.get("attempts") != dcfg.retry_max_attempts or m.all_steps() != list(
                    range(n + 1)
                ):
                    raise RuntimeError("pfs_down: a drain failure was not final or not pinned")
        orbax_newest = _orbax_newest(local)
        if fault == "node_wiped":
            orbax_newest = -1  # a local-only orbax loses everything with the node's storage
        elif fault == "neighbour_dead":
            orbax_newest = n  # a local-only orbax does not need the neighbour to commit step n
        alive = server.running
        complete = _complete_steps(local, rroot if alive else None, pfs)
        expected = max(complete, default=-1)
        target = state(seed, 0)
        try:
            r = m.restore(target)
            got, data = r.step, r.state
        except FileNotFoundError:
            got, data = -1, None
        exact = got == expected and (
            got == -1 or all(
                np.asarray(data[k]).tobytes() == np.asarray(v).tobytes()
                for k, v in state(seed, got).items()
            )
        )  # fmt: skip
        corrupt = data is not None and not any(
            all(np.asarray(data[k]).tobytes() == np.asarray(v).tobytes()
                for k, v in state(seed, s).items())
            for s in range(n + 1)
        )  # fmt: skip
        m.close()
    finally:
        server.stop()
    return {"exact": exact, "corrupt": corrupt, "restored": got, "expected": expected,
            "orbax_newest": orbax_newest}  # fmt: skip


def _model_part(cfg: Config, seed: int, t_stage_p99: float, ctx) -> dict:
    n = cfg.model_writers
    model = cachex.PFSModel(
        bandwidth=cfg.pfs_bandwidth,
        n_writers=n,
        contention=cfg.contention,
        latency_s=cfg.pfs_latency_s,
        sigma=cfg.pfs_sigma,
    )
    nbytes = cfg.state_mib_model * 2**20
    rng = np.random.default_rng(seed)
    times = model.sample(rng, nbytes, size=(cfg.model_saves, n))
    fit = cachex.fit_durability_model(jnp.asarray(times, jnp.float32), contention=cfg.contention)
    mu_true = float(np.log(dataclasses.replace(model, contention=0.0).median_time(nbytes)))
    out = {
        "model_mu_true": mu_true,
        "model_mu_fit": float(fit.mu),
        "model_sigma_true": cfg.pfs_sigma,
        "model_sigma_fit": float(fit.sigma),
        "model_gumbel_loc": float(fit.gumbel_loc),
        "model_gumbel_scale": float(fit.gumbel_scale),
        "t_stage_p99_s": t_stage_p99,
    }
    import matplotlib.pyplot as plt

    ns = np.unique(np.logspace(np.log10(2), np.log10(4096), 40).astype(int))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for p in (0.5, 0.9, 0.99):
        cs = [float(cachex.critical_contention(fit.mu, fit.sigma, int(k), p, t_stage_p99))
              for k in ns]  # fmt: skip
        ax.plot(ns, cs, label=f"p = {p}")
        if p in (0.5, 0.99):
            out[f"c_star_p{int(p * 100)}_n64"] = float(
                cachex.critical_contention(fit.mu, fit.sigma, 64, p, t_stage_p99)
            )
    ax.axhline(cfg.contention, color="k", ls=":", label=f"contention {cfg.contention}")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("writers n")
    ax.set_ylabel("C*_p(n)")
    ax.set_title(f"stage beats PFS above the curve (t_stage = {t_stage_p99:.3f} s)")
    ax.legend()
    ctx.save_plot(fig, "c_star")
    out["stage_path_chosen"] = int(
        bool(cachex.choose_path(fit.mu, fit.sigma, n, 0.99, t_stage_p99, cfg.contention))
    )
    return out


def run(cfg: Config, ctx: _runner.Context) -> dict:
    if cfg.n_good < 1 or cfg.runs_per_fault < 1:
        raise ValueError(
            f"n_good, runs_per_fault: expected >= 1, got {cfg.n_good}, {cfg.runs_per_fault}"
        )
    unknown = sorted(set(cfg.faults) - set(FAULTS))
    if unknown:
        raise ValueError(f"faults: expected names from {list(FAULTS)}, got unknown {unknown}")
    root = Path(ctx.out_dir) / "storage"
    summary: dict = {}
    totals = {"runs": 0, "exact": 0, "corrupt": 0, "lost": 0, "gained": 0}
    t_stage: list = []
    jobs = [(f, i) for f in cfg.faults for i in range(cfg.runs_per_fault)]
    per: dict = {f: {"runs": 0, "exact": 0, "corrupt": 0, "lost": 0} for f in cfg.faults}
    for fault, i in ctx.progress(jobs, desc="faults"):
        run_dir = root / f"{fault}-{i}"
        res = _one_run(fault, run_dir, ctx.seed * 1000 + i, cfg, t_stage)
        shutil.rmtree(run_dir, ignore_errors=True)
        diff = res["orbax_newest"] - res["restored"]
        per[fault]["runs"] += 1
        per[fault]["exact"] += int(res["exact"])
        per[fault]["corrupt"] += int(res["corrupt"])
        per[fault]["lost"] += diff
        totals["runs"] += 1
        totals["exact"] += int(res["exact"])
        totals["corrupt"] += int(res["corrupt"])
        totals["lost"] += max(diff, 0)
        totals["gained"] += max(-diff, 0)
        ctx.log(fault=fault, run=i, **res)
    for f, d in per.items():
        summary[f"{f}_runs"] = d["runs"]
        summary[f"{f}_exact"] = d["exact"]
        summary[f"{f}_corrupt"] = d["corrupt"]
        summary[f"{f}_lost_vs_orbax"] = d["lost"]
    summary.update(
        fault_runs=totals["runs"],
        fault_exact_restores=totals["exact"],
        fault_corrupt_restores=totals["corrupt"],
        fault_steps_lost_vs_orbax=totals["lost"],
        fault_steps_gained_vs_orbax=totals["gained"],
    )
    t99 = float(np.percentile(t_stage, 99)) if t_stage else float("nan")
    summary.update(_model_part(cfg, ctx.seed, t99, ctx))
    return summary


STUDY = _runner.Study(
    "cachex_durability",
    Config,
    run,
    quick={"runs_per_fault": 1, "model_saves": 500},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
