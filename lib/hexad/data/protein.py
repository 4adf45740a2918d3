"""Alanine dipeptide backbone torsions (phi, psi) on the torus T^2, simulated with OpenMM.

Nothing is downloaded. The molecule (ACE-ALA-NME, 22 atoms) is built here: the ten heavy
atoms are placed from standard internal coordinates (bond lengths, angles, trans peptide
bonds; the CB placement of PeptideBuilder, Tien et al. 2013, for L-alanine) by the natural
extension reference frame, written as a PDB in memory, and OpenMM's ``Modeller.addHydrogens``
adds the twelve hydrogens from the force field's templates. No PDB file from elsewhere is used.

Simulation (:func:`simulate`): the Amber ff99SB-ILDN force field (``amber99sbildn.xml``) with
OBC implicit solvent (``amber99_obc.xml``; ``solvent="vacuum"`` drops it), no cutoff, bonds to
hydrogen constrained, a 2 fs Langevin middle integrator with friction 1/ps, on OpenMM's CPU
platform. The structure is energy-minimised, equilibrated for ``equil_steps`` steps at the
target temperature, then a frame is recorded every ``steps_per_frame`` steps. Both dihedrals
are computed from the frame's positions: ``phi = C(ACE)-N-CA-C`` and ``psi = N-CA-C-N(NME)``,
wrapped into ``[-pi, pi)``. At 22 atoms, one trajectory of 100k steps (200 ps) takes about a
minute on one CPU core.

Data layout (:class:`Torsions`, an ``.npz`` without pickle): ``torsions [n_traj, n_frames, 2]``
float32 (phi, psi), one trajectory per (temperature, seed) pair, with ``temperature [n_traj]``
and ``seed [n_traj]``.

Clouds (:func:`torsion_clouds`): a cloud is a window of ``window`` consecutive frames of one
trajectory; windows start every ``stride`` frames (``stride = window`` gives disjoint windows),
and windows never cross trajectories. A cloud is thus the empirical measure of a short stretch
of one trajectory at one temperature: hotter trajectories give broader clouds that visit more
basins.

Generated sets are cached under :func:`hexad.data.cache_dir` ``("protein")``, named by their
settings (:func:`alanine_dipeptide`). A tiny sample (2 temperatures x 4 seeds x 320 frames,
0.5 ps apart) ships in ``hexad/data/files/protein/`` for tests and ``--quick`` runs
(:func:`load_torsions` without a path).

Command:  python -m hexad.data.protein --out DIR [--temperatures 300 400 500] [--seeds 0 1 2 3]
          [--frames 1000] [--steps-per-frame 100] [--equil-steps 5000] [--solvent obc|vacuum]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hexad._base import check_int
from hexad.data import _bundled
from hexad.data._bundled import cache_dir
from hexad.data._optional import require

__all__ = [
    "BASINS",
    "Torsions",
    "alanine_dipeptide",
    "alanine_dipeptide_pdb",
    "basins",
    "dihedral",
    "generate",
    "load_torsions",
    "save_torsions",
    "simulate",
    "torsion_clouds",
    "wrap_angle",
]

SOLVENTS = ("obc", "vacuum")
_SAMPLE = ("protein", "alanine_dipeptide_sample.npz")


@dataclasses.dataclass(frozen=True)
class Torsions:
    """Backbone torsions of several alanine dipeptide trajectories.

    Attributes:
      torsions: ``[n_traj, n_frames, 2]`` float32 ``(phi, psi)`` in radians, in ``[-pi, pi)``.
      temperature: ``[n_traj]`` float32 kelvin.
      seed: ``[n_traj]`` int64 integrator seeds.
      frame_ps: picoseconds between frames.
      solvent: ``"obc"`` or ``"vacuum"``.
    """

    torsions: np.ndarray
    temperature: np.ndarray
    seed: np.ndarray
    frame_ps: float
    solvent: str

    @property
    def n_traj(self) -> int:
        return int(self.torsions.shape[0])

    @property
    def n_frames(self) -> int:
        return int(self.torsions.shape[1])


def wrap_angle(x: np.ndarray) -> np.ndarray:
    """Wraps angles into ``[-pi, pi)`` (float64 arithmetic; the float32 result stays below pi).

    >>> [round(float(a), 4) for a in wrap_angle(np.array([math.pi, -math.pi, 4.0]))]
    [-3.1416, -3.1416, -2.2832]
    """
    y = np.mod(np.asarray(x, np.float64) + math.pi, 2 * math.pi) - math.pi
    y32 = y.astype(np.float32)
    return np.where(y32 >= np.float32(math.pi), np.float32(-math.pi), y32)


#: The coarse conformational basins :func:`basins` assigns, in its index order.
BASINS = ("beta", "alpha_R", "alpha_L")


def basins(torsions: np.ndarray) -> np.ndarray:
    r"""Returns ``[...]`` int: the coarse basin of each ``(phi, psi)`` ``[..., 2]`` (radians).

    Rectangular regions of the Ramachandran plane, as coarse-grained analyses of alanine
    dipeptide draw them: ``alpha_L`` (index 2, with C7ax) where :math:`\phi \ge 0`; for
    :math:`\phi < 0`, ``alpha_R`` (1) where :math:`-120^\circ \le \psi < 50^\circ` and ``beta``
    (0, with C7eq and PII) elsewhere. The beta basin straddles :math:`\psi`'s seam at
    :math:`\pm 180^\circ`.

    >>> basins(np.radians([[-80.0, 150.0], [-70.0, -40.0], [60.0, 40.0], [-150.0, -170.0]]))
    array([0, 1, 2, 0])
    """
    x = np.asarray(torsions, np.float64)
    if x.ndim < 1 or x.shape[-1] != 2:
        raise ValueError(f"torsions: expected [..., 2] (phi, psi), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("torsions: expected finite angles, got NaN/inf")
    phi, psi = wrap_angle(x[..., 0]), wrap_angle(x[..., 1])
    alpha_r = (psi >= math.radians(-120.0)) & (psi < math.radians(50.0))
    return np.where(phi >= 0, 2, np.where(alpha_r, 1, 0)).astype(np.int64)


def dihedral(p0: np.ndarray, p1: np.ndarray, p2: np.ndarray, p3: np.ndarray) -> np.ndarray:
    """The IUPAC dihedral angle ``p0-p1-p2-p3`` in radians (atan2 form), ``[..., 3]`` -> ``[...]``.

    >>> p = np.array([[1.0, 0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 1]])
    >>> round(float(dihedral(*p)), 4)
    1.5708
    """
    b0, b1, b2 = p0 - p1, p2 - p1, p3 - p2
    b1n = b1 / np.linalg.norm(b1, axis=-1, keepdims=True)
    v = b0 - np.sum(b0 * b1n, -1, keepdims=True) * b1n
    w = b2 - np.sum(b2 * b1n, -1, keepdims=True) * b1n
    x = np.sum(v * w, -1)
    y = np.sum(np.cross(b1n, v) * w, -1)
    return np.arctan2(y, x)


def _place(a, b, c, bond, angle_deg, torsion_deg):
    """Natural extension reference frame: the atom bonded to ``c`` at the given geometry."""
    ang, tor = math.radians(angle_deg), math.radians(torsion_deg)
    bc = (c - b) / np.linalg.norm(c - b)
    n = np.cross(b - a, bc)
    n /= np.linalg.norm(n)
    m = np.cross(n, bc)
    d = np.array(
        [
            -bond * math.cos(ang),
            bond * math.sin(ang) * math.cos(tor),
            bond * math.sin(ang) * math.sin(tor),
        ]
    )
    return c + d[0] * bc + d[1] * m + d[2] * n


def alanine_dipeptide_pdb(phi: float = -80.0, psi: float = 150.0) -> str:
    """The heavy atoms of ACE-ALA-NME from standard geometry, as PDB text (angstrom).

    Bonds (A): CH3-C 1.52, C-N 1.33, N-CA 1.46, CA-C 1.52, C=O 1.23, CA-CB 1.53, N-CH3 1.46;
    angles: 116 (CH3-C-N, CA-C-N), 122 (C-N-CA, C-N-CH3), 111 (N-CA-C), 123 (N-C=O); both
    peptide bonds trans; L-alanine's CB at dihedral N-C-CA-CB = 122.686 deg.

    Args:
      phi, psi: the starting backbone dihedrals in degrees.

    >>> alanine_dipeptide_pdb().count("ATOM")
    10
    """
    ch3 = np.zeros(3)
    c0 = np.array([1.52, 0.0, 0.0])
    a = math.radians(116.0)
    n1 = c0 + 1.33 * np.array([-math.cos(a), math.sin(a), 0.0])
    ca = _place(ch3, c0, n1, 1.46, 122.0, 180.0)
    c1 = _place(c0, n1, ca, 1.52, 111.0, phi)
    n2 = _place(n1, ca, c1, 1.33, 116.0, psi)
    ch3b = _place(ca, c1, n2, 1.46, 122.0, 180.0)
    o0 = _place(ca, n1, c0, 1.23, 123.0, 0.0)
    o1 = _place(ch3b, n2, c1, 1.23, 123.0, 0.0)
    cb = _place(n1, c1, ca, 1.53, 109.5, 122.686)
    atoms = [
        ("CH3", "ACE", 1, ch3, "C"),
        ("C", "ACE", 1, c0, "C"),
        ("O", "ACE", 1, o0, "O"),
        ("N", "ALA", 2, n1, "N"),
        ("CA", "ALA", 2, ca, "C"),
        ("C", "ALA", 2, c1, "C"),
        ("O", "ALA", 2, o1, "O"),
        ("CB", "ALA", 2, cb, "C"),
        ("N", "NME", 3, n2, "N"),
        ("C", "NME", 3, ch3b, "C"),
    ]
    lines = [
        f"ATOM  {i:5d}  {name:<3s} {res:3s} A{rid:4d}    {x[0]:8.3f}{x[1]:8.3f}{x[2]:8.3f}"
        f"  1.00  0.00          {el:>2s}"
        for i, (name, res, rid, x, el) in enumerate(atoms, 1)
    ]
    return "\n".join([*lines, "TER", "END"]) + "\n"


def _check_settings(temperature, n_frames, steps_per_frame, equil_steps, solvent):
    if not (
        isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0
    ):
        raise ValueError(f"temperature: expected a positive number of kelvin, got {temperature!r}")
    for name, v, low in (
        ("n_frames", n_frames, 1),
        ("steps_per_frame", steps_per_frame, 1),
        ("equil_steps", equil_steps, 0),
    ):
        check_int(name, v, low)
    if solvent not in SOLVENTS:
        raise ValueError(f"solvent: expected one of {SOLVENTS}, got {solvent!r}")


def simulate(
    temperature: float,
    seed: int,
    n_frames: int,
    steps_per_frame: int = 100,
    *,
    equil_steps: int = 5000,
    solvent: str = "obc",
    timestep_fs: float = 2.0,
    friction_per_ps: float = 1.0,
    threads: int = 1,
) -> np.ndarray:
    """Runs one Langevin trajectory of alanine dipeptide and returns its torsions.

    Args:
      temperature: kelvin.
      seed: the integrator's random seed (and the initial velocities'); must be positive for
        OpenMM to use it (0 is replaced by 1 << 20 here so every int is reproducible).
      n_frames: frames recorded after equilibration.
      steps_per_frame: integrator steps between frames.
      equil_steps: steps run (after minimisation) before the first frame.
      solvent: ``"obc"`` (OBC implicit solvent) or ``"vacuum"``.
      timestep_fs: integrator step in femtoseconds.
      friction_per_ps: Langevin friction.
      threads: CPU threads for OpenMM.

    Returns:
      ``[n_frames, 2]`` float32 ``(phi, psi)`` in ``[-pi, pi)``.

    >>> simulate(300.0, 1, n_frames=2, steps_per_frame=10, equil_steps=0).shape
    (2, 2)
    """
    _check_settings(temperature, n_frames, steps_per_frame, equil_steps, solvent)
    openmm = require("openmm", "protein")
    app, unit = require("openmm.app", "protein"), require("openmm.unit", "protein")

    pdb = app.PDBFile(io.StringIO(alanine_dipeptide_pdb()))
    files = ["amber99sbildn.xml"] + (["amber99_obc.xml"] if solvent == "obc" else [])
    ff = app.ForceField(*files)
    model = app.Modeller(pdb.topology, pdb.positions)
    model.addHydrogens(ff)
    system = ff.createSystem(model.topology, nonbondedMethod=app.NoCutoff, constraints=app.HBonds)
    integrator = openmm.LangevinMiddleIntegrator(
        temperature * unit.kelvin,
        friction_per_ps / unit.picosecond,
        timestep_fs * unit.femtoseconds,
    )
    seed = int(seed) if int(seed) > 0 else 1 << 20
    integrator.setRandomNumberSeed(seed)
    platform = openmm.Platform.getPlatformByName("CPU")
    context = openmm.Context(system, integrator, platform, {"Threads": str(threads)})
    context.setPositions(model.positions)
    openmm.LocalEnergyMinimizer.minimize(context)
    context.setVelocitiesToTemperature(temperature * unit.kelvin, seed)
    if equil_steps:
        integrator.step(equil_steps)
    idx = {(a.residue.name, a.name): a.index for a in model.topology.atoms()}
    quad_phi = [idx["ACE", "C"], idx["ALA", "N"], idx["ALA", "CA"], idx["ALA", "C"]]
    quad_psi = [idx["ALA", "N"], idx["ALA", "CA"], idx["ALA", "C"], idx["NME", "N"]]
    frames = np.empty((n_frames, 4 + 4, 3))
    for f in range(n_frames):
        integrator.step(steps_per_frame)
        pos = context.getState(getPositions=True).getPositions(asNumpy=True)
        pos = np.asarray(pos.value_in_unit(unit.nanometer))
        frames[f] = pos[quad_phi + quad_psi]
    phi = dihedral(*(frames[:, i] for i in range(4)))
    psi = dihedral(*(frames[:, i] for i in range(4, 8)))
    return wrap_angle(np.stack([phi, psi], axis=-1))


def generate(
    temperatures: Sequence[float],
    seeds: Sequence[int],
    n_frames: int,
    steps_per_frame: int = 100,
    *,
    equil_steps: int = 5000,
    solvent: str = "obc",
    timestep_fs: float = 2.0,
    progress=None,
) -> Torsions:
    """Simulates one trajectory per (temperature, seed) pair (temperature-major order).

    Args:
      temperatures: kelvin values.
      seeds: integrator seeds, each run at every temperature.
      n_frames, steps_per_frame, equil_steps, solvent, timestep_fs: as in :func:`simulate`.
      progress: optional callable ``progress(i, n, temperature, seed, seconds)`` called after
        each trajectory (host-side reporting).

    Returns:
      the :class:`Torsions`.

    >>> generate([300.0], [1], n_frames=2, steps_per_frame=10, equil_steps=0).torsions.shape
    (1, 2, 2)
    """
    if len(temperatures) == 0 or len(seeds) == 0:
        raise ValueError(
            f"temperatures, seeds: expected non-empty lists, got {list(temperatures)}, "
            f"{list(seeds)}"
        )
    pairs = [(float(t), int(s)) for t in temperatures for s in seeds]
    out = []
    for i, (t, s) in enumerate(pairs):
        t0 = time.perf_counter()
        out.append(
            simulate(
                t,
                s,
                n_frames,
                steps_per_frame,
                equil_steps=equil_steps,
                solvent=solvent,
                timestep_fs=timestep_fs,
            )
        )
        if progress is not None:
            progress(i, len(pairs), t, s, time.perf_counter() - t0)
    return Torsions(
        torsions=np.stack(out).astype(np.float32),
        temperature=np.array([t for t, _ in pairs], np.float32),
        seed=np.array([s for _, s in pairs], np.int64),
        frame_ps=steps_per_frame * timestep_fs / 1000.0,
        solvent=solvent,
    )


def _validate(t: Torsions, where: str) -> Torsions:
    x = t.torsions
    if x.ndim != 3 or x.shape[-1] != 2:
        raise ValueError(f"{where}: torsions: expected shape [n_traj, n_frames, 2], got {x.shape}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{where}: torsions: expected at least one frame, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{where}: torsions: expected finite angles, found NaN or inf")
    if np.any(x < -math.pi) or np.any(x >= math.pi):
        raise ValueError(
            f"{where}: torsions: expected angles in [-pi, pi), got range "
            f"[{x.min():.4f}, {x.max():.4f}]"
        )
    for name in ("temperature", "seed"):
        v = getattr(t, name)
        if v.shape != (x.shape[0],):
            raise ValueError(f"{where}: {name}: expected shape ({x.shape[0]},), got {v.shape}")
    if t.solvent not in SOLVENTS:
        raise ValueError(f"{where}: solvent: expected one of {SOLVENTS}, got {t.solvent!r}")
    if not (math.isfinite(t.frame_ps) and t.frame_ps > 0):
        raise ValueError(f"{where}: frame_ps: expected a positive number, got {t.frame_ps}")
    return t


def save_torsions(path: str | os.PathLike, data: Torsions) -> Path:
    """Writes ``data`` as an uncompressed ``.npz`` (no pickle); creates the parent folder."""
    _validate(data, "data")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(
        tmp,
        torsions=data.torsions.astype(np.float32),
        temperature=data.temperature.astype(np.float32),
        seed=data.seed.astype(np.int64),
        frame_ps=np.float64(data.frame_ps),
        solvent=np.array(data.solvent),
    )
    os.replace(tmp, path)
    return path


def load_torsions(path: str | os.PathLike | None = None) -> Torsions:
    """Loads a torsion set written by :func:`save_torsions`; the bundled sample without ``path``.

    The bundled sample: OBC implicit solvent, temperatures 300 K and 500 K, seeds 1-4,
    320 frames 0.5 ps apart after 10 ps of equilibration (``[8, 320, 2]``).

    Raises:
      FileNotFoundError: no file at ``path``.
      ValueError: missing arrays, wrong shapes, non-finite angles or angles outside [-pi, pi).

    >>> load_torsions().torsions.shape
    (8, 320, 2)
    """
    p = _bundled.bundled_path(*_SAMPLE) if path is None else Path(path)
    raw = _bundled.load_npz(p, ("torsions", "temperature", "seed", "frame_ps", "solvent"))
    return _validate(
        Torsions(
            torsions=raw["torsions"].astype(np.float32),
            temperature=raw["temperature"].astype(np.float32),
            seed=raw["seed"].astype(np.int64),
            frame_ps=float(raw["frame_ps"]),
            solvent=str(raw["solvent"]),
        ),
        p.name,
    )


def _file_name(temperatures, seeds, n_frames, steps_per_frame, equil_steps, solvent) -> str:
    temps = "-".join(f"{float(t):g}" for t in temperatures)
    sds = "-".join(str(int(s)) for s in seeds)
    return f"ala2_{solvent}_T{temps}_s{sds}_f{n_frames}x{steps_per_frame}_e{equil_steps}.npz"


def _check_request(
    data: Torsions, path: Path, temperatures, seeds, n_frames, steps_per_frame, solvent
) -> Torsions:
    """``data`` read from ``path`` if it is the set :func:`generate` makes for these settings."""
    pairs = [(float(t), int(s)) for t in temperatures for s in seeds]
    want_t = np.array([t for t, _ in pairs], np.float32)
    want_s = np.array([s for _, s in pairs], np.int64)
    where = f"path: {str(path)!r} holds another set than requested"
    if data.temperature.shape != want_t.shape or not np.array_equal(data.temperature, want_t):
        raise ValueError(
            f"{where}: per-trajectory temperatures {data.temperature.tolist()}, expected "
            f"{want_t.tolist()} for temperatures={list(temperatures)} x seeds={list(seeds)}"
        )
    if not np.array_equal(data.seed, want_s):
        raise ValueError(
            f"{where}: per-trajectory seeds {data.seed.tolist()}, expected {want_s.tolist()} "
            f"for temperatures={list(temperatures)} x seeds={list(seeds)}"
        )
    if data.n_frames != n_frames:
        raise ValueError(f"{where}: {data.n_frames} frames, expected n_frames={n_frames}")
    if data.solvent != solvent:
        raise ValueError(f"{where}: solvent {data.solvent!r}, expected solvent={solvent!r}")
    frame_ps = steps_per_frame * 2.0 / 1000.0  # generate's default 2 fs timestep
    if not math.isclose(data.frame_ps, frame_ps, rel_tol=1e-9):
        raise ValueError(
            f"{where}: frame_ps {data.frame_ps}, expected {frame_ps} for "
            f"steps_per_frame={steps_per_frame} at 2 fs"
        )
    return data


def alanine_dipeptide(
    temperatures: Sequence[float] = (300.0, 400.0, 500.0),
    seeds: Sequence[int] = (1, 2, 3, 4),
    n_frames: int = 1000,
    steps_per_frame: int = 100,
    *,
    equil_steps: int = 5000,
    solvent: str = "obc",
    path: str | os.PathLike | None = None,
    progress=None,
) -> Torsions:
    """Returns the cached torsion set for these settings, simulating and caching it if absent.

    Args:
      temperatures, seeds, n_frames, steps_per_frame, equil_steps, solvent: see :func:`generate`.
      path: an explicit ``.npz``; default a file in ``hexad.data.cache_dir("protein")`` named by the
        settings.
      progress: passed to :func:`generate` when simulating.

    Raises:
      ValueError: the file at ``path`` (explicit or the cache's) holds another set: its
        per-trajectory temperatures and seeds (temperature-major, as :func:`generate` writes
        them), frame count, solvent or ``frame_ps`` (``steps_per_frame`` x 2 fs) differ from the
        requested ones. ``equil_steps`` is not recorded in the file and cannot be compared.
    """
    if path is None:
        path = cache_dir("protein") / _file_name(
            temperatures, seeds, n_frames, steps_per_frame, equil_steps, solvent
        )
    path = Path(path)
    if path.is_file():
        return _check_request(
            load_torsions(path), path, temperatures, seeds, n_frames, steps_per_frame, solvent
        )
    data = generate(
        temperatures,
        seeds,
        n_frames,
        steps_per_frame,
        equil_steps=equil_steps,
        solvent=solvent,
        progress=progress,
    )
    save_torsions(path, data)
    return data


def torsion_clouds(
    data: Torsions, window: int, stride: int | None = None, select: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Cuts trajectories into clouds of ``window`` consecutive frames.

    Args:
      data: the torsions.
      window: frames per cloud.
      stride: frames between consecutive window starts (default ``window``: disjoint).
      select: optional ``[k]`` trajectory indices to use (default all).

    Returns:
      ``(clouds [n_clouds, window, 2], traj [n_clouds])``: the clouds (trajectory-major,
      then by start frame) and the trajectory index of each.

    >>> t = Torsions(np.zeros((2, 10, 2), np.float32), np.ones(2, np.float32),
    ...              np.arange(2), 0.5, "obc")
    >>> c, j = torsion_clouds(t, 4, 3)
    >>> c.shape, j.tolist()
    ((6, 4, 2), [0, 0, 0, 1, 1, 1])
    """
    stride = window if stride is None else stride
    for name, v in (("window", window), ("stride", stride)):
        check_int(name, v)
    if window > data.n_frames:
        raise ValueError(f"window: expected at most n_frames={data.n_frames}, got {window}")
    traj = np.arange(data.n_traj) if select is None else np.asarray(select, np.int64)
    if traj.ndim != 1 or traj.size == 0 or traj.min() < 0 or traj.max() >= data.n_traj:
        raise ValueError(
            f"select: expected trajectory indices in [0, {data.n_traj}), got {traj.tolist()}"
        )
    starts = np.arange(0, data.n_frames - window + 1, stride)
    clouds = np.stack([data.torsions[j, s : s + window] for j in traj for s in starts])
    return clouds.astype(np.float32), np.repeat(traj, starts.size)


def main(argv: Sequence[str] | None = None) -> Path:
    """The command line: simulate and write one ``.npz``."""
    p = argparse.ArgumentParser(prog="python -m hexad.data.protein", description=__doc__)
    p.add_argument("--out", type=Path, default=None, help="folder (default: the cache folder)")
    p.add_argument("--name", default=None, help="file name (default: named by the settings)")
    p.add_argument("--temperatures", type=float, nargs="+", default=[300.0, 400.0, 500.0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--frames", type=int, default=1000)
    p.add_argument("--steps-per-frame", type=int, default=100)
    p.add_argument("--equil-steps", type=int, default=5000)
    p.add_argument("--solvent", choices=SOLVENTS, default="obc")
    a = p.parse_args(argv)
    name = a.name or _file_name(
        a.temperatures, a.seeds, a.frames, a.steps_per_frame, a.equil_steps, a.solvent
    )
    path = (a.out or cache_dir("protein")) / name

    def report(i, n, t, s, sec):
        print(f"trajectory {i + 1}/{n}: T={t:g} K seed={s}: {sec:.1f} s", file=sys.stderr)

    alanine_dipeptide(
        a.temperatures,
        a.seeds,
        a.frames,
        a.steps_per_frame,
        equil_steps=a.equil_steps,
        solvent=a.solvent,
        path=path,
        progress=report,
    )
    print(path)
    return path


if __name__ == "__main__":
    main()
