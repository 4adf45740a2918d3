"""T3: the PFS model and the drainer process that persists local steps to the PFS.

The drainer runs as its own process, detached from the trainer's process group, so it
survives the training process: a SIGKILLed trainer leaves its node-local steps behind, and the
drainer still carries them to the PFS, then exits once its parent is gone and nothing is left.

PFS commit protocol for step ``s`` with ``n`` ranks (one drainer per rank):

1. copy this rank's files into a folder private to this writer,
   ``<pfs>/.tmp-<s>/.part-<r>-<pid>-<token>/``, checking each file's CRC-32 against the
   manifest on the way (a corrupt local copy is never propagated), ``fsync`` each file and
   the folder, then rename it to ``rank_<r>``: the rename fails if ``rank_<r>`` exists, so two
   drainers of one rank (the per-rank ``flock`` below is node-local: an orphaned drainer of a
   lost node and the restarted rank's on a new node share only the PFS) never write into or
   unlink each other's part; the loser keeps the winner's part if it is the same save;
2. write the per-rank done marker ``<pfs>/.tmp-<s>/done_<r>`` and ``fsync`` the tmp dir;
3. the rank that sees all ``n`` markers renames ``.tmp-<s>`` to ``<s>`` (atomic; a losing
   racer finds ``<s>`` already there) and ``fsync``s ``<pfs>``;
4. the node records ``pfs_part`` (this rank's part is on the PFS) at step 2 and ``pfs`` once
   the step is committed and this rank's part in ``<pfs>/<s>`` is this node's local step:
   the same manifest bytes (every file's size and CRC-32, and the save's ``save_id`` and
   ``timeline``) and every file at its size. Only ``pfs`` counts as PFS-durable: the
   manager's GC pins, ``wait_for_pfs``, ``tier_done`` and this drainer's scheduler all use
   it, and the GC runs only after a commit that verifies.

Durability is proven by content, never by a folder's name (:func:`part_matches`,
:func:`durable_local_steps`): after a rollback or a fallback restore a step number is saved
again with other bytes, and ``<pfs>/<s>`` may hold the abandoned save. Such a step is not
durable for this run; the drainer retires it (renamed to ``.gc-<s>-<ns>``, then removed) and
drains ``s`` again, and :func:`retire_abandoned` retires the abandoned timeline's steps newer
than the node's newest step, so a restore from the PFS alone never returns them.

Full disks: a failed drain removes what it wrote (its private part, a ``rank_<r>`` it put in
place without a marker, a ``.tmp-<s>`` it made that is left empty), and a starting drainer
removes its rank's leftovers of a dead predecessor (:func:`sweep_own_leftovers`); a record's
temporary file is removed when its write fails.

A sweep (:func:`sweep_pfs`, run by every drainer when idle) renames a ``.tmp-<s>`` that holds
all ``n`` markers but was never renamed (its committer died between the last marker and the
rename) and removes a ``.tmp-<s>`` older than ``stale_tmp_s`` once a newer step is committed.

One drainer per rank: a drainer holds an exclusive ``flock`` on
``<records>/drainer_rank<r>.lock`` while it runs, so a drainer started while an older one is
still draining waits for it instead of wiping its half-written files. It runs until the
trainer is gone and nothing is left (no lifetime limit unless ``max_lifetime_s`` is set).

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
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import secrets
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

__all__ = [
    "DrainerConfig",
    "PFSModel",
    "committed_pfs_steps",
    "drain_once",
    "drainer_lock_path",
    "durable_local_steps",
    "gc_pfs",
    "part_matches",
    "retire_abandoned",
    "spawn_drainer",
    "sweep_own_leftovers",
    "sweep_pfs",
]


@dataclasses.dataclass(frozen=True)
class PFSModel:
    r"""A configurable model of a contended parallel file system.

    One rank's write of ``nbytes`` takes :math:`T = m\, e^{\sigma z}` seconds,
    :math:`z \sim \mathcal{N}(0, 1)` (a lognormal body, as the CacheX paper measures for
    rank-local completion times), with median

    .. math::

       m = \Big(\text{latency\_s} + \frac{\text{nbytes}}{\text{bandwidth}}\Big)
         \big(1 + c\, (\text{n\_writers} - 1)\big),

    :math:`c` the ``contention``: each extra concurrent writer slows the whole shared-PFS write
    (data and metadata) by the factor :math:`c`. This is exactly the contention model that
    :func:`fit_durability_model` fits.

    Attributes:
      bandwidth: per-node bandwidth in bytes/s without contention.
      n_writers: concurrent writers (ranks) sharing the PFS.
      contention: slowdown per extra concurrent writer (0 = none).
      latency_s: fixed per-write latency (metadata, open/close) in seconds.
      sigma: lognormal shape of the per-rank time.
      shared_sigma: lognormal shape of a load factor shared by every writer of one save
        (:meth:`draw`: :math:`T = m \exp(\sigma_{\text{shared}} z_{\text{save}} + \sigma
        z_{\text{rank}})`), the
        time-correlated PFS load that makes the slowest writer of a save matter; 0 = none.

    >>> PFSModel(bandwidth=1e9, n_writers=4, contention=0.5).median_time(1e9)
    2.505
    """

    bandwidth: float = 1e9
    n_writers: int = 1
    contention: float = 0.0
    latency_s: float = 0.002
    sigma: float = 0.3
    shared_sigma: float = 0.0

    def __post_init__(self):
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError(f"bandwidth: expected a finite float > 0, got {self.bandwidth}")
        if not isinstance(self.n_writers, int) or self.n_writers < 1:
            raise ValueError(f"n_writers: expected an int >= 1, got {self.n_writers!r}")
        for name in ("contention", "latency_s", "sigma", "shared_sigma"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name}: expected a finite float >= 0, got {v}")

    def median_time(self, nbytes: float) -> float:
        """Median seconds for one rank to write ``nbytes`` under this model."""
        slow = 1.0 + self.contention * (self.n_writers - 1)
        return (self.latency_s + float(nbytes) / self.bandwidth) * slow

    def lognormal(self, nbytes: float) -> tuple[float, float]:
        r"""The ``(mu, sigma)`` of the uncontended lognormal body of a write of ``nbytes``:
        :math:`\log T \sim \mathcal{N}(\mu, \sigma^2)` with contention removed, what
        :func:`hexad.cachex.fit_durability_model` estimates from this model's draws.

        >>> mu, sigma = PFSModel(bandwidth=1e9, latency_s=0.0, sigma=0.5).lognormal(1e9)
        >>> round(mu, 3), sigma
        (0.0, 0.5)
        """
        return float(np.log(self.latency_s + float(nbytes) / self.bandwidth)), self.sigma

    def quantile_ratio(self, p: float = 0.99) -> float:
        r"""The ``p``-quantile of a write's time over its median, :math:`\exp(s\, \Phi^{-1}(p))`
        with :math:`s = \sqrt{\sigma^2 + \sigma_{\text{shared}}^2}`: the model's own spread of one
        (save, rank)
        write (p99/p50 by default), whatever the size and contention.

        >>> round(PFSModel(sigma=0.5).quantile_ratio(0.99), 3)
        3.2
        """
        if not 0.0 < p < 1.0:
            raise ValueError(f"p: expected a probability in (0, 1), got {p!r}")
        s = math.hypot(self.sigma, self.shared_sigma)
        return math.exp(s * statistics.NormalDist().inv_cdf(p))

    def draw(self, seed: int, step: int, rank: int, nbytes: float) -> float:
        """The write time of ``rank``'s part of save ``step``: the save's shared load factor
        (seeded by ``(seed, step)``) times the rank's own lognormal draw (``(seed, step,
        rank)``), so the drainer and a baseline writing the same step see the same time.

        >>> m = PFSModel(sigma=0.5, shared_sigma=0.5)
        >>> m.draw(0, 3, 1, 1e6) == m.draw(0, 3, 1, 1e6) != m.draw(0, 3, 2, 1e6)
        True
        """
        z_save = np.random.default_rng([seed, step, 1 << 30]).standard_normal()
        z_rank = np.random.default_rng([seed, step, rank]).standard_normal()
        t = self.median_time(nbytes) * math.exp(self.shared_sigma * z_save + self.sigma * z_rank)
        return float(t)

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
      max_lifetime_s: hard bound on the drainer's lifetime in seconds, or None (no bound:
        the default; a bound is for tests only).
      stale_tmp_s: age after which :func:`sweep_pfs` removes an incomplete ``.tmp-<s>``
        older than the newest committed step.
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
    max_lifetime_s: float | None = None
    stale_tmp_s: float = 600.0
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
        life = self.max_lifetime_s
        if life is not None and not (isinstance(life, (int, float)) and life > 0):
            raise ValueError(f"max_lifetime_s: expected None or a float > 0, got {life!r}")
        for name in ("retry_backoff_s", "retry_backoff_max_s", "stale_tmp_s"):
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
    if not d.is_dir():
        d.mkdir(parents=True, exist_ok=True)
        _fsio.fsync_dir(d.parent)  # the new record folder's entry is durable too
    body = json.dumps({"time": time.time(), **info}, sort_keys=True).encode()
    tmp = d / f".{tier}.json.tmp-{os.getpid()}-{secrets.token_hex(8)}"
    try:
        _fsio.write_file_durable(tmp, body)
        os.replace(tmp, d / f"{tier}.json")
    except BaseException:
        # A full disk must not also leave the half-written record holding its space.
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsio.fsync_dir(d)


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


def _local_manifest(cfg: DrainerConfig, step: int) -> bytes | None:
    """The bytes of this node's manifest of local ``step`` if it reads and verifies (its own
    CRC-32), else None: an unreadable local manifest proves nothing about any other copy."""
    d = Path(cfg.steps_dir) / _fsio.validate_step_name(step) / cfg.item
    try:
        _format.read_manifest(d)
        return (d / _format.MANIFEST_FILE).read_bytes()
    except (OSError, ValueError):  # CorruptCheckpointError is a ValueError
        return None


def _part_verifies(part: Path, manifest: bytes) -> bool:
    """Whether the rank folder ``part`` holds exactly the save whose manifest is ``manifest``:
    the same manifest bytes (every file's size and CRC-32, the save's identity) and every file
    it names present at its size."""
    try:
        if (part / _format.MANIFEST_FILE).read_bytes() != manifest:
            return False
        files = json.loads(manifest)["files"]
        return all((part / f["file"]).stat().st_size == f["nbytes"] for f in files)
    except (OSError, ValueError, KeyError, TypeError):
        return False


def part_matches(cfg: DrainerConfig, step: int) -> bool | None:
    """Whether the committed PFS ``step`` holds this node's local ``step`` as this rank's part.

    The content, not the folder's name, proves durability: after a rollback or a fallback a
    step number is saved again with other bytes, and the PFS folder of that number then holds
    an abandoned save. Returns None when there is no verified local manifest to compare.
    """
    local = _local_manifest(cfg, step)
    if local is None:
        return None
    part = Path(cfg.pfs_dir) / _fsio.validate_step_name(step) / f"rank_{cfg.rank}"
    return _part_verifies(part, local)


def durable_local_steps(cfg: DrainerConfig) -> list[int]:
    """This node's committed local steps that are PFS-durable for this run: recorded ``pfs``
    (the records of a reused step number are removed when it is saved again), or committed on
    the PFS with this rank's part equal to the local copy (another rank did the rename)."""
    records, pfs = Path(cfg.records_dir), Path(cfg.pfs_dir)
    out = []
    for s in _committed_local_steps(Path(cfg.steps_dir), cfg.item):
        if (records / str(s) / "pfs.json").exists():
            out.append(s)
            continue
        try:
            committed = (pfs / str(s)).is_dir()
        except OSError:  # a stale PFS handle (ESTALE) proves nothing and must not stop a save
            committed = False
        if committed and part_matches(cfg, s):
            out.append(s)
    return out


def _timeline(part: Path, key: str = "timeline") -> str | None:
    try:
        return _format.read_manifest(part)["meta"].get(key)
    except (OSError, ValueError):
        return None


def retire_abandoned(cfg: DrainerConfig) -> list[int]:
    """Retires the committed PFS steps newer than this node's newest local step that are of
    the timeline that step branched from (its manifest's ``branched_from``); returns them.

    A timeline branches off another only at a restore of an older step than the newest
    listed (a rollback or a fallback): those newer steps are what that restore abandoned.
    Left on the PFS, a restore from the PFS alone (this node and its neighbour lost) would
    return them. Steps of any other timeline are left alone (an orphaned drainer of an older
    node never retires the live run's steps), and so is every step of a save made before
    timelines were recorded.
    """
    local = _committed_local_steps(Path(cfg.steps_dir), cfg.item)
    if not local:
        return []
    newest = local[-1]
    parent = _timeline(Path(cfg.steps_dir) / str(newest) / cfg.item, "branched_from")
    if not parent:
        return []
    pfs = Path(cfg.pfs_dir)
    out = []
    for s in _pfs_steps(pfs):
        if s > newest and _timeline(pfs / str(s) / f"rank_{cfg.rank}") == parent:
            if _retire(pfs, str(s)):
                out.append(s)
    return out


def _retire(pfs: Path, name: str) -> bool:
    """Moves the committed PFS step ``name`` aside and removes it; False if it was gone."""
    aside = pfs / f".gc-{name}-{time.monotonic_ns()}"
    try:
        os.rename(pfs / name, aside)
    except FileNotFoundError:  # another rank (or drainer) retired it first
        return False
    _fsio.fsync_dir(pfs)
    shutil.rmtree(aside, ignore_errors=True)
    return True


def _write_part(cfg: DrainerConfig, step: int, tmp: Path, manifest: bytes) -> tuple[int, bool]:
    """Copies this rank's files of local ``step`` into ``tmp/rank_<r>`` (CRC-checked, fsynced).

    Returns the bytes written and whether this call put ``rank_<r>`` in place.

    The part is written under a name private to this call and renamed to ``rank_<r>`` only
    once complete; ``rename`` onto a folder that exists fails, so two drainers of one rank
    (on two nodes: the node-local ``flock`` does not cover them) never write into or unlink
    each other's files. A complete ``rank_<r>`` of the same save (the other drainer's) is
    kept; one of another save without its done marker (an abandoned attempt) is replaced.
    """
    name = _fsio.validate_step_name(step)
    src = Path(cfg.steps_dir) / name / cfg.item
    mine = tmp / f".part-{cfg.rank}-{os.getpid()}-{secrets.token_hex(6)}"
    final = tmp / f"rank_{cfg.rank}"
    mine.mkdir()
    try:
        nbytes = 0
        for f in json.loads(manifest)["files"]:
            data = (src / f["file"]).read_bytes()
            if len(data) != f["nbytes"] or _fsio.crc32_bytes(data) != f["crc32"]:
                raise _format.CorruptCheckpointError(f"local step {name}: {f['file']} is corrupt")
            nbytes += _fsio.write_file_durable(mine / f["file"], data)
        _fsio.write_file_durable(mine / _format.MANIFEST_FILE, manifest)
        _fsio.fsync_dir(mine)
        for _ in range(2):
            try:
                os.rename(mine, final)
                _fsio.fsync_dir(tmp)
                return nbytes, True
            except OSError:
                if not final.exists():
                    raise
            if _part_verifies(final, manifest):
                return nbytes, False  # the same save, put there by another drainer
            if (tmp / f"done_{cfg.rank}").exists():
                raise OSError(f"PFS step {name}: rank_{cfg.rank} holds another save's part")
            _retire(tmp, final.name)  # an abandoned attempt of another save: replaced
        raise OSError(f"PFS step {name}: rank_{cfg.rank} keeps being replaced")
    finally:
        # A failure (ENOSPC, ...) leaves none of this call's bytes; the folder may have been
        # renamed with .tmp-<s> to <s> meanwhile, so both places are tried.
        for where in (mine, tmp.parent / name / mine.name):
            if where.exists():
                shutil.rmtree(where, ignore_errors=True)


def _drain_step(cfg: DrainerConfig, step: int) -> tuple[float, list[int], bool, bool]:
    """Copies this rank's files of ``step`` to the PFS.

    Returns the seconds this rank's part took, the PFS steps the GC removed (only the drainer
    that commits the step runs the GC, and only after the step verifies), whether the step
    is committed with this rank's part equal to the local copy (the only commit that counts)
    and whether this rank did the rename.

    A committed ``<pfs>/<s>`` whose part of this rank is another save (a reused step number
    after a rollback, or a broken commit) is retired first and ``s`` drained again.

    A retry after a failure past this rank's done marker (the part is complete: the marker is
    written only after its files are fsynced) does not rewrite the part, since another rank may
    be renaming the folder at that moment; it only tries the commit again.
    """
    t0 = time.perf_counter()
    name = _fsio.validate_step_name(step)
    pfs = Path(cfg.pfs_dir)
    manifest = _local_manifest(cfg, step)
    if manifest is None:
        raise _format.CorruptCheckpointError(f"local step {name}: manifest unreadable")
    tmp = pfs / f".tmp-{name}"
    if (pfs / name).is_dir():
        if _part_verifies(pfs / name / f"rank_{cfg.rank}", manifest):
            return time.perf_counter() - t0, [], True, False
        _retire(pfs, name)
    marker = tmp / f"done_{cfg.rank}"
    if not marker.exists():
        made_tmp = False
        if not tmp.is_dir():
            tmp.mkdir(parents=True, exist_ok=True)
            made_tmp = True
        placed = False
        try:
            nbytes, placed = _write_part(cfg, step, tmp, manifest)
            if cfg.pfs:
                target = PFSModel(**cfg.pfs).draw(cfg.seed, step, cfg.rank, nbytes)
                left = target - (time.perf_counter() - t0)
                if left > 0:
                    time.sleep(left)
            try:
                _fsio.write_file_durable(marker, b"1")
            except FileExistsError:  # the other drainer of this rank marked the same part
                pass
        except BaseException:
            if placed and not marker.exists():  # a part nobody vouches for: not left behind
                _retire(tmp, f"rank_{cfg.rank}")
            if made_tmp:
                with contextlib.suppress(OSError):
                    tmp.rmdir()  # only if empty: other ranks' parts stay
            raise
    # From here on another rank that sees every marker may rename the folder at any moment.
    try:
        _fsio.fsync_dir(tmp)
    except FileNotFoundError:
        if not (pfs / name).is_dir():
            raise
    renamed = False
    if all((tmp / f"done_{r}").exists() for r in range(cfg.n_ranks)):
        try:
            os.rename(tmp, pfs / name)
            renamed = True
        except OSError:
            if not (pfs / name).exists():
                raise
        _fsio.fsync_dir(pfs)
    seconds = time.perf_counter() - t0
    ok = _part_verifies(pfs / name / f"rank_{cfg.rank}", manifest)
    removed = []
    if renamed and ok and cfg.pfs_max_to_keep is not None:
        removed = gc_pfs(pfs, cfg.pfs_max_to_keep)
    return seconds, removed, ok, renamed


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


def committed_pfs_steps(pfs_dir: str | Path) -> list[int]:
    """The committed steps on the PFS (``<pfs>/<s>``: every rank's part present), oldest first."""
    return _pfs_steps(Path(pfs_dir))


def drainer_lock_path(cfg: DrainerConfig) -> Path:
    """The per-rank lock file a running drainer holds (``flock``, exclusive)."""
    return Path(cfg.records_dir) / f"drainer_rank{cfg.rank}.lock"


def _sync_committed(cfg: DrainerConfig) -> None:
    """Records ``pfs`` for every local step that is now committed (another rank's drainer may
    have done the rename) with this rank's part on the PFS equal to the local copy: a folder
    of that number holding another save (an abandoned timeline's) is no proof."""
    records, pfs = Path(cfg.records_dir), Path(cfg.pfs_dir)
    for s in _committed_local_steps(Path(cfg.steps_dir), cfg.item):
        if (records / str(s) / "pfs.json").exists() or not (pfs / str(s)).is_dir():
            continue
        if not part_matches(cfg, s):
            continue
        part = _read_record(records, s, "pfs_part") or {}
        record_tier(records, s, "pfs", seconds=part.get("seconds"), committed=True,
                    part_time=part.get("time"), committer=False)  # fmt: skip


def _candidates(cfg: DrainerConfig) -> tuple[list[int], list[int], list[int]]:
    """``(pending, todo, both)``: steps to finish, steps to drain, and their sorted union.

    ``pending``: steps another rank has started on the PFS that this rank has not marked done;
    ``todo``: committed local steps newer than the newest one PFS-durable for this run
    (:func:`durable_local_steps`: a PFS folder of the same number holding another save does
    not count) whose part this rank has not yet written, or whose committed PFS step holds
    another save. A step whose failure is final (``pfs_error``) is in neither. Retry
    schedules are not checked here.
    """
    steps = _committed_local_steps(Path(cfg.steps_dir), cfg.item)
    records = Path(cfg.records_dir)
    pfs = Path(cfg.pfs_dir)
    newest_done = max(durable_local_steps(cfg), default=-1)
    live = [s for s in steps if not (records / str(s) / "pfs_error.json").exists()]

    def unwritten(s: int) -> bool:
        if not (records / str(s) / "pfs_part.json").exists():
            return True
        return (pfs / str(s)).is_dir() and part_matches(cfg, s) is False

    todo = [s for s in live if s > newest_done and unwritten(s)]
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
    """Drains one step of this rank; returns ``[step]`` if this rank's part of it was written.

    The step: first any step another rank has started on the PFS (so ranks that skip ahead
    independently cannot strand a step with only some done markers), else the newest local
    step newer than the newest PFS-committed one; in both cases the newest one whose retry (if
    it failed before) is due. A failure is recorded and retried with backoff (module doc).
    The part is recorded as ``pfs_part``; ``pfs`` (PFS-durable) only once the step is
    committed, by this rank's rename or, seen at a later call, by another rank's.

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
    retire_abandoned(cfg)
    _sync_committed(cfg)
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
        seconds, removed, committed, renamed = _drain_step(cfg, step)
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
    info = dict(seconds=seconds, attempts=int(prev["attempts"]) + 1, pfs_gc=removed)
    record_tier(records, step, "pfs_part", **info)
    if committed:
        record_tier(records, step, "pfs", committed=True, committer=renamed, **info)
    return [step]


def sweep_pfs(pfs_dir: str | Path, n_ranks: int, stale_tmp_s: float = 600.0) -> dict:
    """Finishes or removes ``.tmp-<s>`` folders that no drainer will finish.

    A ``.tmp-<s>`` holding all ``n_ranks`` done markers is renamed to ``<s>`` (its committer
    died between the last marker and the rename; the markers are written only after the
    rank's files and folder are fsynced, so the step is complete). An incomplete one whose
    modification time is older than ``stale_tmp_s`` seconds and older than the newest
    committed step is removed (renamed to ``.gc-tmp-<s>`` first). Returns
    ``{"renamed": [...], "removed": [...]}``.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / ".tmp-3" / "rank_0").mkdir(parents=True)
    >>> _ = (root / ".tmp-3" / "done_0").write_bytes(b"1")
    >>> sweep_pfs(root, 1), sorted(p.name for p in root.iterdir())
    ({'renamed': [3], 'removed': []}, ['3'])
    """
    pfs = Path(pfs_dir)
    out: dict[str, list[int]] = {"renamed": [], "removed": []}
    if not pfs.exists():
        return out
    tmps = []
    for p in pfs.iterdir():
        if p.name.startswith(".tmp-") and p.name[5:].isdigit() and p.is_dir():
            tmps.append((int(p.name[5:]), p))
    for s, p in sorted(tmps):
        if all((p / f"done_{r}").exists() for r in range(n_ranks)):
            try:
                os.rename(p, pfs / str(s))
                out["renamed"].append(s)
            except OSError:
                continue  # another drainer renamed it, or <s> exists already
    if out["renamed"]:
        _fsio.fsync_dir(pfs)
    newest = max(_pfs_steps(pfs), default=-1)
    now = time.time()
    for s, p in sorted(tmps):
        if s in out["renamed"] or s >= newest or not p.exists():
            continue
        try:
            age = now - p.stat().st_mtime
        except FileNotFoundError:
            continue
        if age > stale_tmp_s:
            trash = pfs / f".gc-tmp-{s}-{time.monotonic_ns()}"
            try:
                os.rename(p, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)
            out["removed"].append(s)
    return out


def sweep_own_leftovers(cfg: DrainerConfig) -> list[str]:
    """Removes what a dead drainer of this rank left on the PFS; returns the removed names.

    Run by a drainer as it starts (holding the rank's lock): a private part folder of this
    rank (``.tmp-<s>/.part-<r>-*``) is always a dead writer's, and a ``.tmp-<s>`` holding
    nothing but this rank's unfinished part (no done marker, no other rank's entry) would
    otherwise hold its space until a newer step commits (with a PFS full, never). A part of
    this rank with its done marker is kept: another rank may be about to commit it.
    """
    pfs = Path(cfg.pfs_dir)
    removed: list[str] = []
    try:
        tmps = [p for p in pfs.iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
    except OSError:
        return removed
    own = {f"rank_{cfg.rank}"}
    for t in tmps:
        try:
            for p in t.iterdir():
                if p.name.startswith(f".part-{cfg.rank}-"):
                    shutil.rmtree(p, ignore_errors=True)
                    removed.append(f"{t.name}/{p.name}")
            names = {p.name for p in t.iterdir()}
        except OSError:
            continue
        if names <= own:  # no marker (not even this rank's), no other rank's entry
            if _retire(pfs, t.name):
                removed.append(t.name)
    return removed


def _loop(cfg: DrainerConfig) -> int:
    t_start = time.monotonic()
    idle_since = time.monotonic()
    last_sweep = -math.inf
    last_error = None
    stop_file = Path(cfg.records_dir) / "drainer.stop"
    while cfg.max_lifetime_s is None or time.monotonic() - t_start < cfg.max_lifetime_s:
        if not Path(cfg.records_dir).exists():  # the node's directory was removed: nothing left
            return 0
        try:
            drained = drain_once(cfg)
        except OSError as e:  # the step's own failures are recorded by drain_once
            if repr(e) != last_error:  # logged once while it repeats at every poll
                last_error = repr(e)
                print(f"drainer rank {cfg.rank}: {last_error}", file=sys.stderr, flush=True)
            drained = []
        if drained:
            idle_since = time.monotonic()
            continue
        if time.monotonic() - last_sweep > min(5.0, cfg.stale_tmp_s):
            last_sweep = time.monotonic()
            try:
                sweep_pfs(cfg.pfs_dir, cfg.n_ranks, cfg.stale_tmp_s)
                _sync_committed(cfg)
            except OSError:
                pass
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
    """Starts the drainer for ``cfg`` as a separate, detached process.

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
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _ENTRY, str(cfg_path)],
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=env,
        )
    finally:
        if log_path:
            out.close()  # the drainer holds its own copy of the descriptor


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hexad.cachex._pfs", description="CacheX drainer")
    p.add_argument("config", type=Path)
    args = p.parse_args(argv)
    raw = json.loads(args.config.read_text())
    cfg = DrainerConfig(**raw)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # One drainer per rank: wait for an older one (still draining after a restart) to exit.
    lock = open(drainer_lock_path(cfg), "ab")  # noqa: SIM115 - held for the process's life
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    with contextlib.suppress(OSError):  # a PFS that cannot be listed now is retried later
        sweep_own_leftovers(cfg)
    # T3 is background work: it yields the CPU to the trainer and the T1/T2 critical path.
    os.nice(10)
    return _loop(cfg)


if __name__ == "__main__":
    raise SystemExit(main())
