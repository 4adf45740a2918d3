"""RWEFM versus Euclidean flow matching on alanine dipeptide torsion clouds on the torus T^2.

Data: backbone torsions (phi, psi) of alanine dipeptide from OpenMM Langevin simulations
(Amber ff99SB-ILDN, OBC implicit solvent, 2 fs steps; :mod:`hexad.data.protein`), one
trajectory per (temperature, seed). ``data="generate"`` simulates the configured set (or reads
it from the cache, ``$HEXAD_CACHE/protein``); ``data="sample"`` uses the bundled sample
(300 K and 500 K, seeds 1-4, 320 frames 0.5 ps apart), which ``--quick`` does.

How samples are formed: a cloud is a window of ``n_points`` consecutive frames of one
trajectory, windows starting every ``stride`` frames (:func:`hexad.data.protein.torsion_clouds`;
the default, 32 = ``n_points``, gives disjoint windows: with overlapping ones most held-out
clouds had a near-duplicate among the held-out clouds, which saturated the 1-NNA).
Trajectories, not windows, are held out: for every temperature the last seed's trajectory
gives the second held-out set (the data floor), the one before it the held-out set, and the
remaining seeds the training clouds (so at least 3 seeds are needed). At most ``n_train``
training windows and ``n_test`` windows of each held-out set are drawn at random without
replacement. A cloud thus shows which basins (beta / C7eq, alpha_R, alpha_L) one stretch of
one trajectory visits; the generator must produce new, plausible stretches at the mixture of
temperatures.

Models: RWEFM on ``T^2`` and the Euclidean baseline on the angles in ``R^2`` (samples wrapped
into ``[-pi, pi)`` at the end), and the same Euclidean flow fed the torus's ``(cos, sin)``
features (``euclid_periodic``), from the same noise, ``n_seeds`` seeds each (the shared
:func:`experiments._rwefm.compare`, which gives the settings they share). Floors come from
``n_floor`` held-out draws: the second held-out trajectory's windows, drawn ``n_floor`` times
at random. Training checkpoints through ``hexad.cachex`` (``--resume`` continues from the
newest durable chunk).

Metrics that see the basins, besides the shared ones (per seed, averaged over generations,
paired like them): ``basin_tv`` (total variation between the generated and held-out clouds'
pooled occupancies of the beta, alpha_R and alpha_L basins, :func:`hexad.data.protein.basins`)
and ``rama_js`` (Jensen-Shannon divergence, in nats, between their pooled Ramachandran
histograms on ``rama_bins`` x ``rama_bins`` cells).

Chart control: ``chart_shift_deg = (a, b)`` rotates every torsion by ``(a, b)`` degrees (and
wraps) before anything else: an isometry of the torus, so RWEFM's problem is unchanged, while
the Euclidean arms' seam moves. ``--set chart_shift_deg=-60,30`` puts the seam through the beta
basin (phi near -120 deg, psi near 150 deg), where the torus should matter most; the basins
are assigned in the original chart.

Command:  python -m experiments.rwefm_protein [--quick] [--out DIR] [--seed N] [--set k=v ...]
          [--resume] [--ckpt DIR]
Runtime:  --quick (bundled sample, no simulation) about 2-3 minutes on 2 idle cores, mostly
          compilation; the full study first simulates 12 trajectories of 105k steps (about
          9 min, cached afterwards), then trains 3 arms x 3 seeds x 5000 steps and scores 5
          generations per seed. The last full run (2 arms, 1 generation) took 55 min on 2
          CPU cores (26-31 s per 100-step chunk for RWEFM, 22-23 s for the baseline); the
          third arm costs about as much as the baseline, so expect about 75-80 min.

summary.json keys: every key of :func:`experiments._rwefm.compare` (``noise``, ``arms``,
``map_converged_frac_<arm>``, ``eval_converged_frac``, the metric means, sds, seeds, paired
differences and floors, for the shared metrics and ``basin_tv`` and ``rama_js``, the verdict
keys, ...), plus ``n_train_clouds``,
``n_test_clouds`` and ``frame_ps`` (picoseconds between frames).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from scipy.spatial.distance import jensenshannon

from experiments import _runner
from experiments._rwefm import QUICK, TrainConfig, compare
from hexad.data import protein
from hexad.geometry import Torus


@dataclasses.dataclass(frozen=True)
class Config(TrainConfig):
    data: str = "generate"
    temperatures: tuple[float, ...] = (300.0, 400.0, 500.0)
    seeds: tuple[int, ...] = (1, 2, 3, 4)
    n_frames: int = 1000
    steps_per_frame: int = 100
    equil_steps: int = 5000
    solvent: str = "obc"
    stride: int = 32
    chart_shift_deg: tuple[float, float] = (0.0, 0.0)
    rama_bins: int = 18

    def __post_init__(self):
        super().__post_init__()
        _runner.one_of(self, ("generate", "sample"), "data")
        _runner.one_of(self, ("obc", "vacuum"), "solvent")
        _runner.positive(self, "temperatures")
        _runner.at_least(self, 1, "n_frames", "steps_per_frame", "stride")
        _runner.at_least(self, 2, "rama_bins")
        _runner.require(
            len(self.chart_shift_deg) == 2, "chart_shift_deg", "expected (phi, psi) degrees"
        )
        _runner.at_least(self, 0, "equil_steps")


def _load(cfg: Config, ctx: _runner.Context) -> protein.Torsions:
    if cfg.data == "sample":
        return protein.load_torsions()
    if cfg.data != "generate":
        raise ValueError(f"data: expected 'generate' or 'sample', got {cfg.data!r}")

    def report(i, n, t, s, sec):
        ctx.log(simulated=i + 1, of=n, temperature=t, seed=s, seconds=sec)

    return protein.alanine_dipeptide(
        cfg.temperatures,
        cfg.seeds,
        cfg.n_frames,
        cfg.steps_per_frame,
        equil_steps=cfg.equil_steps,
        solvent=cfg.solvent,
        progress=report,
    )


def split_trajectories(data: protein.Torsions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(train, test, test2)`` trajectory indices: per temperature, last seed -> test2,
    the one before -> test, the rest -> train."""
    train, test, test2 = [], [], []
    for t in np.unique(data.temperature):
        idx = np.flatnonzero(data.temperature == t)
        idx = idx[np.argsort(data.seed[idx], kind="stable")]
        if idx.size < 3:
            raise ValueError(
                f"data: expected at least 3 seeds per temperature, got {idx.size} at {t:g} K"
            )
        train.extend(idx[:-2].tolist())
        test.append(int(idx[-2]))
        test2.append(int(idx[-1]))
    return np.array(train), np.array(test), np.array(test2)


def _subset(rng, clouds, k):
    if clouds.shape[0] <= k:
        return clouds
    return clouds[np.sort(rng.choice(clouds.shape[0], k, replace=False))]


def basin_scores(shift_rad, bins):
    """``(generated, test) -> {basin_tv, rama_js}`` on pooled points, in the original chart."""
    edges = np.linspace(-np.pi, np.pi, bins + 1)

    def scores(gen, test):
        g, r = (protein.wrap_angle(np.asarray(c).reshape(-1, 2) - shift_rad) for c in (gen, test))
        occ = [np.bincount(protein.basins(c), minlength=3) / c.shape[0] for c in (g, r)]
        hist = [np.histogram2d(*c.T, bins=[edges, edges])[0].ravel() for c in (g, r)]
        return {
            "basin_tv": float(0.5 * np.abs(occ[0] - occ[1]).sum()),
            # scipy's Jensen-Shannon distance is the square root of the divergence (nats)
            "rama_js": float(jensenshannon(*hist) ** 2),
        }

    return scores


def run(cfg: Config, ctx: _runner.Context) -> dict:
    data = _load(cfg, ctx)
    shift = np.radians(np.asarray(cfg.chart_shift_deg, np.float64))
    data = dataclasses.replace(data, torsions=protein.wrap_angle(data.torsions + shift))
    tr, te, te2 = split_trajectories(data)
    rng = np.random.default_rng(ctx.seed)

    def clouds(sel, k):
        c, _ = protein.torsion_clouds(data, cfg.n_points, cfg.stride, sel)
        return jnp.asarray(_subset(rng, c, k))

    train, test = clouds(tr, cfg.n_train), clouds(te, cfg.n_test)
    floors = [clouds(te2, cfg.n_test) for _ in range(cfg.n_floor)]
    n = min(test.shape[0], *(f.shape[0] for f in floors))
    test, floors = test[:n], [f[:n] for f in floors]
    if cfg.n_test != n:
        cfg = dataclasses.replace(cfg, n_test=n)
    extra = basin_scores(shift, cfg.rama_bins)
    figures, gen_r, gen_e = compare(
        ctx.key(), Torus(2), train, test, floors, cfg, ctx, extra_scores=extra
    )
    _plot(ctx, test, gen_r, gen_e)
    return {
        **figures,
        "n_train_clouds": int(train.shape[0]),
        "n_test_clouds": int(n),
        "frame_ps": float(data.frame_ps),
    }


def _plot(ctx, test, gen_r, gen_e):
    import matplotlib.pyplot as plt

    sets = (("held-out", test), ("RWEFM", gen_r), ("Euclidean", gen_e))
    fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), sharex=True, sharey=True)
    for ax, (title, c) in zip(axes, sets, strict=True):
        c = np.asarray(c).reshape(-1, 2)
        ax.scatter(np.degrees(c[:, 0]), np.degrees(c[:, 1]), s=2, alpha=0.4)
        ax.set_title(f"{title} ({c.shape[0]} points)")
        ax.set_xlim(-180, 180)
        ax.set_ylim(-180, 180)
        ax.set_xlabel("phi (deg)")
    axes[0].set_ylabel("psi (deg)")
    fig.suptitle("Alanine dipeptide: Ramachandran plot of all clouds pooled")
    ctx.save_plot(fig, "ramachandran")

    k = min(4, test.shape[0])
    fig, axes = plt.subplots(3, k, figsize=(3 * k, 8), sharex=True, sharey=True, squeeze=False)
    for row, (title, clouds) in enumerate(sets):
        for j in range(k):
            c = np.asarray(clouds[j])
            axes[row, j].scatter(np.degrees(c[:, 0]), np.degrees(c[:, 1]), s=6)
            axes[row, j].set_xlim(-180, 180)
            axes[row, j].set_ylim(-180, 180)
            if j == 0:
                axes[row, j].set_ylabel(f"{title}\npsi (deg)")
    fig.suptitle("Single clouds (seed 0): (phi, psi) in degrees")
    ctx.save_plot(fig, "clouds_ramachandran")


STUDY = _runner.Study(
    "rwefm_protein",
    Config,
    run,
    quick={**QUICK, "data": "sample", "stride": 8},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
