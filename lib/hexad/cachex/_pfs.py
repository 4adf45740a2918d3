"""T3: the PFS model and the drainer process that persists local steps to the PFS.

The drainer runs as its own process in its own session (``start_new_session=True``), so it
survives the training process: a SIGKILLed trainer leaves its node-local steps behind, and the
drainer still carries them to the PFS, then exits once its parent is gone and nothing is left.

PFS commit protocol for step ``s`` with ``n`` ranks (one drainer per rank):

1. copy this rank's files into ``<pfs>/.tmp-<s>/rank_<r>/``, checking each file's CRC-32
   against the manifest on the way (a corrupt local copy is never propagated), ``fsync`` each
   file and the directory;
2. write the per-rank done marker ``<pfs>/.tmp-<s>/done_<r>`` and ``fsync`` the tmp dir;
3. the rank that sees all ``n`` markers renames ``.tmp-<s>`` to ``<s>`` (atomic; a losing
   racer finds ``<s>`` already there) and ``fsync``s ``<pfs>``;
4. write the ``pfs`` durability record of ``s`` on the node.

PFS garbage collection (``pfs_max_to_keep``): after committing a step, the committing drainer
keeps the newest ``pfs_max_to_keep`` committed steps and deletes the older ones, each first
renamed to ``.gc-<s>`` (so no reader ever sees a half-deleted step as committed), then removed.
It never deletes the newest committed step (``pfs_max_to_keep >= 1``) and never touches a step
still draining (``.tmp-<s>``: not committed, so not a GC candidate).

Failed drains: a drain that raises (an ``OSError`` such as a full or unreachable PFS, or a
local file whose CRC-32 does not match) is recorded in ``pfs_retry`` (attempts, every error,
the time of the next try) and retried with exponential backoff
(``retry_backoff_s * 2**(attempt - 1)``, capped at ``retry_backoff_max_s``) up to
``retry_max_attempts`` attempts, after which ``pfs_error`` records the final failure. While a
step waits for its retry the drainer drains the newest other step it can. The node's
preservation policy (:mod:`hexad.cachex._manager`) pins every step newer than the newest
PFS-durable one in the local tier and hence on the neighbour's replica, so a step whose drain
failed stays restorable until it, or a newer step, is PFS-durable.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hexad.cachex import _format, _fsio

__all__ = ["DrainerConfig", "PFSModel", "drain_once", "gc_pfs", "spawn_drainer"]


@dataclasses.dataclass(frozen=True)
class PFSModel:
    """A configurable model of a contended parallel file system.

    One rank's write of ``nbytes`` takes ``T = m * exp(sigma * z)`` seconds, ``z ~ N(0, 1)``
    (a lognormal body, as the CacheX paper measures for rank-local completion times), with
    median ``m = (latency_s + nbytes / bandwidth) * (1 + contention * (n_writers - 1))``: each
    extra concurrent writer slows the whole shared-PFS write (data and metadata) by the factor
    ``contention``. This is exactly the contention model of :mod:`hexad.cachex._model`.

    Attributes:
      bandwidth: per-node bandwidth in bytes/s without contention.
      n_writers: concurrent writers (ranks) sharing the PFS.
      contention: slowdown per extra concurrent writer (0 = none).
      latency_s: fixed per-write latency (metadata, open/close) in seconds.
      sigma: lognormal shape of the per-rank time.

    >>> PFSModel(bandwidth=1e9, n_writers=4, contention=0.5).median_time(1e9)
    2.505
    """

    bandwidth: float = 1e9
    n_writers: int = 1
    contention: float = 0.0
    latency_s: float = 0.002
    sigma: float = 0.3

    def __post_init__(self):
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"bandwidth: expected a finite float > 0, got {self.bandwidth}")
        if not isinstance(self.n_writers, int) or self.n_writers < 1:
            raise ValueError(f"n_writers: expected an int >= 1, got {self.n_writers!r}")
        for name in ("contention", "latency_s", "sigma"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite float >= 0, got {v}")

    def median_time(self, nbytes: float) -> float:
        """Median seconds for one rank to write ``nbytes`` under this model."""
        slow = 1.0 + self.contention * (self.n_writers - 1)
        return (self.latency_s + float(nbytes) / self.bandwidth) * slow

    def lognormal(self, nbytes: float) -> tuple[float, float]:
        """The ``(mu, sigma)`` of the uncontended lognormal body of a write of ``nbytes``:
        ``log T ~ N(mu, sigma^2)`` with contention removed, what
        :func:`hexad.cachex.fit_durability_model` estimates from this model's draws.

        >>> mu, sigma = PFSModel(bandwidth=1e9, latency_s=0.0, sigma=0.5).lognormal(1e9)
        >>> round(mu, 3), sigma
        (0.0, 0.5)
        """
        return float(np.log(self.latency_s + float(nbytes) / self.bandwidth)), self.sigma

    def quantile_ratio(self, p: float = 0.99) -> float:
        """The ``p``-quantile of a write's time over its median, ``exp(sigma Phi^-1(p))``:
        the model's own spread (p99/p50 by default), whatever the size and contention.

        >>> round(PFSModel(sigma=0.5).quantile_ratio(0.99), 3)
        3.2
        """
        if not 0.0 < p < 1.0:
            raise ValueError(f"p: expected a probability in (0, 1), got {p!r}")
        return math.exp(self.sigma * statistics.NormalDist().inv_cdf(p))

    def sample(self, rng: np.random.Generator, nbytes: float, size: Any = None) -> np.ndarray:
        """Samples per-rank write seconds (``size`` draws) for ``nbytes`` each."""
        z = rng.standard_normal(size)
        return self.median_time(nbytes) * np.exp(self.sigma * z)


@dataclasses.dataclass(frozen=True)
class DrainerConfig:
    """What one rank's drainer reads and where it writes (all JSON-serialisable).

    Attributes:
      steps_dir: the node-local orbax step directory (``<local>/steps``).
      item: the orbax item name inside each step (``"state"``).
      records_dir: the node's durability records (``<local>/durability``).
      pfs_dir: the PFS root shared by all ranks.
      rank: this process's rank; n_ranks: number of ranks.
      pfs: PFS model parameters (a dict of :class:`PFSModel` fields) or None for no model.
      seed: seeds the PFS model's per-(step, rank) latency draws.
      parent_pid: the trainer; the drainer exits once it is gone and no work is left.
      poll_s: polling interval; idle_exit_s: idle time before exiting once the trainer is gone.
      max_lifetime_s: hard bound on the drainer's lifetime.
      pfs_max_to_keep: committed PFS steps kept by the GC (>= 1), or None to keep all.
      retry_max_attempts: drain attempts of one step before its failure is final (>= 1).
      retry_backoff_s: wait after the first failed attempt; doubles after each further one.
      retry_backoff_max_s: cap on that wait.
    """

    steps_dir: str
    item: str
    records_dir: str
    pfs_dir: str
    rank: int = 0
    n_ranks: int = 1
    pfs: dict | None = None
    seed: int = 0
    parent_pid: int = 0
    poll_s: float = 0.02
    idle_exit_s: float = 1.0
    max_lifetime_s: float = 3600.0
    pfs_max_to_keep: int | None = None
    retry_max_attempts: int = 5
    retry_backoff_s: float = 0.5
    retry_backoff_max_s: float = 30.0

    def __post_init__(self):
        keep = self.pfs_max_to_keep
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ValueError(f"pfs_max_to_keep: expected None or an int >= 1, got {keep!r}")
        n = self.retry_max_attempts
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"retry_max_attempts: expected an int >= 1, got {n!r}")
        for name in ("retry_backoff_s", "retry_backoff_max_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite float >= 0, got {v!r}")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (FileNotFoundError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def record_tier(records_dir: Path, step: int, tier: str, **info: Any) -> None:
    """Writes the durability record ``<records_dir>/<step>/<tier>.json`` atomically."""
    d = Path(records_dir) / _fsio.validate_step_name(step)
    d.mkdir(parents=True, exist_ok=True)
    _fsio.write_json_atomic(d / f"{tier}.json", {"time": time.time(), **info})


def _committed_local_steps(steps_dir: Path, item: str) -> list[int]:
    if not steps_dir.exists():
        return []
    out = []
    for p in steps_dir.iterdir():
        if p.name.isdigit() and (p / item / _format.MANIFEST_FILE).exists():
            out.append(int(p.name))
    return sorted(out)


def _pfs_steps(pfs_dir: Path) -> list[int]:
    if not pfs_dir.exists():
        return []
    return sorted(int(p.name) for p in pfs_dir.iterdir() if p.name.isdigit() and p.is_dir())


def _drain_step(cfg: DrainerConfig, step: int) -> tuple[float, list[int]]:
    """Copies this rank's files of ``step`` to the PFS.

    Returns the seconds to PFS-durable and the PFS steps the GC removed (only the drainer
    that commits the step runs the GC).
    """
    t0 = time.perf_counter()
    name = _fsio.validate_step_name(step)
    src = Path(cfg.steps_dir) / name / cfg.item
    pfs = Path(cfg.pfs_dir)
    tmp = pfs / f".tmp-{name}"
    rank_dir = tmp / f"rank_{cfg.rank}"
    manifest = _format.read_manifest(src)
    tmp.mkdir(parents=True, exist_ok=True)
    if rank_dir.exists():  # a previous drainer died half-way: start this rank over
        for p in rank_dir.iterdir():
            p.unlink()
    else:
        rank_dir.mkdir()
    nbytes = 0
    for f in manifest["files"]:
        data = (src / f["file"]).read_bytes()
        if len(data) != f["nbytes"] or _fsio.crc32_bytes(data) != f["crc32"]:
            raise _format.CorruptCheckpointError(f"local step {name}: {f['file']} is corrupt")
        nbytes += _fsio.write_file_durable(rank_dir / f["file"], data)
    _fsio.write_file_durable(
        rank_dir / _format.MANIFEST_FILE, (src / _format.MANIFEST_FILE).read_bytes()
    )
    _fsio.fsync_dir(rank_dir)
    if cfg.pfs:
        model = PFSModel(**cfg.pfs)
        rng = np.random.default_rng([cfg.seed, step, cfg.rank])
        target = float(model.sample(rng, nbytes))
        left = target - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
    marker = tmp / f"done_{cfg.rank}"
    if not marker.exists():
        _fsio.write_file_durable(marker, b"1")
    _fsio.fsync_dir(tmp)
    committed = False
    if all((tmp / f"done_{r}").exists() for r in range(cfg.n_ranks)):
        try:
            os.rename(tmp, pfs / name)
            committed = True
        except OSError:
            if not (pfs / name).exists():
                raise
        _fsio.fsync_dir(pfs)
    seconds = time.perf_counter() - t0
    removed = []
    if committed and cfg.pfs_max_to_keep is not None:
        removed = gc_pfs(pfs, cfg.pfs_max_to_keep)
    return seconds, removed


def gc_pfs(pfs_dir: str | Path, keep: int) -> list[int]:
    """Deletes all but the newest ``keep`` committed PFS steps; returns the deleted steps.

    Only committed steps (``<pfs>/<s>``) are candidates: a step still draining
    (``<pfs>/.tmp-<s>``) is never touched, and with ``keep >= 1`` the newest committed step is
    always kept. Each step is first renamed to ``.gc-<s>`` and the PFS directory ``fsync``ed,
    so a crash mid-delete leaves no partial step under a committed name; leftovers of such a
    crash are removed by the next call. Safe to run concurrently from several drainers.

    Args:
      pfs_dir: the PFS root.
      keep: committed steps to keep (>= 1).

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for s in ("1", "2", "3", ".tmp-4"): (root / s).mkdir()
    >>> gc_pfs(root, 2), sorted(p.name for p in root.iterdir())
    ([1], ['.tmp-4', '2', '3'])
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(
            f"keep: expected an int >= 1 (the newest step is never deleted), got {keep!r}"
        )
    pfs = Path(pfs_dir)
    for p in pfs.glob(".gc-*"):  # leftovers of a GC that died between rename and delete
        shutil.rmtree(p, ignore_errors=True)
    removed = []
    for s in _pfs_steps(pfs)[:-keep]:
        try:
            os.rename(pfs / str(s), pfs / f".gc-{s}")
        except FileNotFoundError:  # another drainer's GC took it
            continue
        removed.append(s)
    if removed:
        _fsio.fsync_dir(pfs)
        for s in removed:
            shutil.rmtree(pfs / f".gc-{s}", ignore_errors=True)
    return removed


def _read_record(records: Path, step: int, tier: str) -> dict | None:
    p = records / str(step) / f"{tier}.json"
    if not p.exists():
        return None
    try:
        return _fsio.read_json(p)
    except (ValueError, OSError):
        return None


def _candidates(cfg: DrainerConfig) -> tuple[list[int], list[int], list[int]]:
    """``(pending, todo, both)``: steps to finish, steps to drain, and their sorted union.

    ``pending``: steps another rank has started on the PFS that this rank has not marked done;
    ``todo``: committed local steps newer than the newest PFS-durable one. A step whose
    failure is final (``pfs_error``) is in neither. Retry schedules are not checked here.
    """
    steps = _committed_local_steps(Path(cfg.steps_dir), cfg.item)
    records = Path(cfg.records_dir)
    done = [s for s in steps if (records / str(s) / "pfs.json").exists()]
    newest_done = max(done, default=-1)
    live = [s for s in steps if not (records / str(s) / "pfs_error.json").exists()]
    todo = [s for s in live if s > newest_done]
    pfs = Path(cfg.pfs_dir)
    mine = f"done_{cfg.rank}"
    pending = [
        s for s in live if (pfs / f".tmp-{s}").is_dir() and not (pfs / f".tmp-{s}" / mine).exists()
    ]
    return pending, todo, sorted(set(pending) | set(todo))


def _due(records: Path, step: int, now: float) -> bool:
    retry = _read_record(records, step, "pfs_retry")
    return retry is None or retry.get("next_try") is None or retry["next_try"] <= now


def retry_waiting(cfg: DrainerConfig, now: float | None = None) -> list[int]:
    """Steps whose drain failed and whose next retry is not yet due (the drainer waits)."""
    now = time.time() if now is None else now
    records = Path(cfg.records_dir)
    return [s for s in _candidates(cfg)[2] if not _due(records, s, now)]


def drain_once(cfg: DrainerConfig, now: float | None = None) -> list[int]:
    """Drains one step of this rank; returns ``[step]`` if it became PFS-durable, else ``[]``.

    The step: first any step another rank has started on the PFS (so ranks that skip ahead
    independently cannot strand a step with only some done markers), else the newest local
    step newer than the newest PFS-durable one; in both cases the newest one whose retry (if
    it failed before) is due. A failure is recorded and retried with backoff (module doc).

    Args:
      cfg: this rank's drainer configuration.
      now: the wall-clock time (``time.time()``) the retry schedule is checked against
        (default: now).

    One pass in this process, as the drainer process runs it in a loop (a tool, a test or a
    restarted drainer can call it directly):

    >>> import tempfile
    >>> from hexad.cachex import CacheXManager
    >>> root = Path(tempfile.mkdtemp())
    >>> m = CacheXManager(root / "local", pfs_dir=root / "pfs", drainer=False)
    >>> m.save(0, {"w": np.ones(2)}); m.wait_until_finished()
    True
    >>> drain_once(m.drainer_config), m.tier_done(0, "pfs")
    ([0], True)
    >>> m.close()
    """
    now = time.time() if now is None else now
    records = Path(cfg.records_dir)
    pending, todo, _ = _candidates(cfg)
    pending = [s for s in pending if _due(records, s, now)]
    todo = [s for s in todo if _due(records, s, now)]
    if pending:
        step = pending[-1]
    elif todo:
        step = todo[-1]
    else:
        return []
    prev = _read_record(records, step, "pfs_retry") or {"attempts": 0, "errors": []}
    try:
        seconds, removed = _drain_step(cfg, step)
    except (OSError, _format.CorruptCheckpointError) as e:
        attempts = int(prev["attempts"]) + 1
        errors = [*prev["errors"], f"{type(e).__name__}: {e}"][-cfg.retry_max_attempts :]
        if attempts >= cfg.retry_max_attempts:
            record_tier(records, step, "pfs_retry", attempts=attempts, errors=errors, next_try=None)
            # Final: never retried again; the step stays pinned until a newer one is durable.
            record_tier(records, step, "pfs_error", error=errors[-1], attempts=attempts)
        else:
            backoff = min(cfg.retry_backoff_s * 2.0 ** (attempts - 1), cfg.retry_backoff_max_s)
            record_tier(
                records,
                step,
                "pfs_retry",
                attempts=attempts,
                errors=errors,
                backoff_s=backoff,
                next_try=now + backoff,
            )
        return []
    final = Path(cfg.pfs_dir) / str(step)
    record_tier(
        records,
        step,
        "pfs",
        seconds=seconds,
        committed=final.exists(),
        attempts=int(prev["attempts"]) + 1,
        pfs_gc=removed,
    )
    return [step]


def _loop(cfg: DrainerConfig) -> int:
    t_start = time.monotonic()
    idle_since = time.monotonic()
    stop_file = Path(cfg.records_dir) / "drainer.stop"
    while time.monotonic() - t_start < cfg.max_lifetime_s:
        if not Path(cfg.records_dir).exists():  # the node's directory was removed: nothing left
            return 0
        try:
            drained = drain_once(cfg)
        except OSError:
            drained = []
        if drained:
            idle_since = time.monotonic()
            continue
        trainer_gone = not _alive(cfg.parent_pid)
        try:
            waiting = retry_waiting(cfg)
        except OSError:
            waiting = []
        if waiting:  # a failed drain is retried even after the trainer has gone
            idle_since = time.monotonic()
        elif (stop_file.exists() or trainer_gone) and (
            time.monotonic() - idle_since > cfg.idle_exit_s
        ):
            return 0
        time.sleep(cfg.poll_s)
    return 0


_ENTRY = "import sys; from hexad.cachex._pfs import main; sys.exit(main(sys.argv[1:]))"


def spawn_drainer(cfg: DrainerConfig, log_path: Path | None = None) -> subprocess.Popen:
    """Starts the drainer for ``cfg`` as a separate process in its own session.

    The drainer outlives its caller: it exits once the trainer (``cfg.parent_pid``) is gone
    and nothing is left to drain, or on ``SIGTERM``. Here one local step (written directly in
    the T1 format) becomes PFS-durable:

    >>> import shutil, tempfile, time
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "local" / "steps" / "7" / "state").mkdir(parents=True)
    >>> snap = _format.Snapshot(
    ...     (_format.LeafSpec("w", (3,), "float32"),),
    ...     (_format.ShardRecord(0, ((0, 3),), np.arange(3, dtype=np.float32)),),
    ... )
    >>> _ = _format.write_rank_dir(root / "local" / "steps" / "7" / "state", snap, {})
    >>> cfg = DrainerConfig(
    ...     steps_dir=str(root / "local" / "steps"), item="state",
    ...     records_dir=str(root / "local" / "durability"), pfs_dir=str(root / "pfs"),
    ...     parent_pid=os.getpid(),
    ... )
    >>> proc = spawn_drainer(cfg)
    >>> t_end = time.monotonic() + 60
    >>> while not (root / "pfs" / "7").exists() and time.monotonic() < t_end:
    ...     time.sleep(0.05)
    >>> sorted(p.name for p in (root / "pfs" / "7" / "rank_0").iterdir())
    ['data.bin', 'manifest.json']
    >>> proc.terminate()  # the trainer is still alive, so the drainer would keep polling
    >>> proc.wait(timeout=30)
    0
    >>> shutil.rmtree(root)
    """
    cfg_path = Path(cfg.records_dir) / f"drainer_rank{cfg.rank}.json"
    Path(cfg.records_dir).mkdir(parents=True, exist_ok=True)
    _fsio.write_json_atomic(cfg_path, dataclasses.asdict(cfg))
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.Popen(
        [sys.executable, "-c", _ENTRY, str(cfg_path)],
        stdout=out,
        stderr=out,
        start_new_session=True,
        env=env,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hexad.cachex._pfs", description="CacheX drainer")
    p.add_argument("config", type=Path)
    args = p.parse_args(argv)
    raw = json.loads(args.config.read_text())
    cfg = DrainerConfig(**raw)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # T3 is background work: it yields the CPU to the trainer and the T1/T2 critical path.
    os.nice(10)
    return _loop(cfg)


if __name__ == "__main__":
    raise SystemExit(main())
