"""RWEFM versus Euclidean flow matching on single-cell clouds (PBMC 68k reduced) on a sphere.

Data: the bundled PBMC 68k reduced set (:func:`hexad.data.load_pbmc68k`; 700 cells, 50 PCs,
10 cell types, one donor). Embedding: the first ``n_pcs`` principal components, centred and
normalised to unit length, so every cell is a point on ``S^{n_pcs - 1}``.

How samples are formed: the cells are split at random into a training pool and a held-out
pool (``test_fraction``). A sample is a cloud of ``n_points`` cells with its own cell-type
composition: the composition is drawn from ``Dirichlet(concentration * p)``, with ``p`` the
pool's cell-type proportions, and cells are drawn with replacement from each type of the pool
according to it. Training clouds use only training-pool cells; held-out clouds only held-out
cells. So the generator must produce new clouds with plausible compositions, not copy cells.

The sphere here is imposed (normalised PCs, the norm discarded), not a learned hyperspherical
latent space as in the paper's single-cell setting.

Models: RWEFM on the sphere and the Euclidean baseline on the ambient ``R^{n_pcs}`` (samples
normalised onto the sphere at the end), from the same noise, ``n_seeds`` seeds each (the
shared :func:`experiments._rwefm.compare`, which gives the settings they share).

Reference ("floor"): ``n_floor`` sets of clouds drawn the same way from the *training* pool:
what a generator that had learned the training distribution perfectly would score against the
held-out clouds. (Clouds drawn again from the held-out pool share cells with the held-out
clouds, a floor no generator trained on other cells can reach.)

Metrics that see the cell types, besides the shared ones (per seed, paired like them): each
generated or held-out point takes the type of its nearest training cell (geodesic);
``composition_tv`` is the total variation between the generated and the held-out clouds' pooled
type proportions, and ``type_nn_dist`` the mean over cell types of the held-out cells' mean
geodesic distance to their nearest generated point (a type the generator misses scores high).
The equivalence margin of the verdict is stated in ``experiments._verdicts.MARGINS``.

Training checkpoints through ``hexad.cachex``
(``checkpoints/<study>/<run>/settings-<hash>/<arm>/`` or ``--ckpt DIR``); ``--resume``
continues from each arm's newest durable chunk trained with the same settings.

Command:  python -m experiments.rwefm_singlecell [--quick] [--out DIR] [--seed N] [--set k=v ...]
          [--resume] [--ckpt DIR]
Runtime:  --quick about 2 minutes on 2 idle cores, mostly compilation; the full study
          (2 arms x 3 seeds x 5000 steps, 5 generations per seed scored) about 80 min on 2
          cores (the last run: 80 min beside other work, 35-70 s per 100-step chunk, about
          35 s when the cores are free).

summary.json keys: every key of :func:`experiments._rwefm.compare` (``noise``, ``arms``,
``map_converged_frac_<arm>``, ``eval_converged_frac``, the metric means, sds, seeds, paired
differences and floors, for the shared metrics and ``composition_tv`` and ``type_nn_dist``,
the verdict keys, ...).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from experiments import _runner
from experiments._rwefm import QUICK, TrainConfig, compare
from hexad.data import load_pbmc68k
from hexad.geometry import Sphere


@dataclasses.dataclass(frozen=True)
class Config(TrainConfig):
    n_pcs: int = 8
    test_fraction: float = 0.3
    concentration: float = 5.0

    def __post_init__(self):
        super().__post_init__()
        _runner.in_range(self, 1, 50, "n_pcs")  # the bundled set has 50 PCs
        _runner.in_unit(self, "test_fraction", lo_open=True, hi_open=True)
        _runner.positive(self, "concentration")


def _clouds(rng, x, types, n_clouds, n_points, concentration):
    """Clouds [n_clouds, n_points, d] with Dirichlet cell-type compositions (host numpy)."""
    kinds = np.unique(types)
    p = np.array([np.mean(types == k) for k in kinds])
    by_type = [np.flatnonzero(types == k) for k in kinds]
    out = np.empty((n_clouds, n_points, x.shape[1]), np.float32)
    for c in range(n_clouds):
        comp = rng.dirichlet(concentration * p)
        counts = rng.multinomial(n_points, comp)
        idx = np.concatenate(
            [rng.choice(by_type[i], size=k, replace=True) for i, k in enumerate(counts) if k]
        )
        out[c] = x[rng.permutation(idx)]
    return out


def type_scores(cells, types):
    """``(generated, test) -> {composition_tv, type_nn_dist}``, types by the nearest of
    ``cells [m, d]`` (unit vectors, types ``[m]``)."""
    kinds = np.unique(types)

    def label(points):
        return types[np.argmax(points @ cells.T, axis=1)]  # nearest = largest cosine

    def scores(gen, test):
        g, r = (np.asarray(c, np.float64).reshape(-1, cells.shape[1]) for c in (gen, test))
        lg, lr = label(g), label(r)
        share = [np.array([np.mean(lab == k) for k in kinds]) for lab in (lg, lr)]
        # geodesic distance of each held-out point to its nearest generated point
        nearest = np.arccos(np.clip(np.max(r @ g.T, axis=1), -1.0, 1.0))
        per_type = [nearest[lr == k].mean() for k in kinds if np.any(lr == k)]
        return {
            "composition_tv": float(0.5 * np.abs(share[0] - share[1]).sum()),
            "type_nn_dist": float(np.mean(per_type)),
        }

    return scores


def run(cfg: Config, ctx: _runner.Context) -> dict:
    if not 2 <= cfg.n_pcs <= 50:
        raise ValueError(f"n_pcs: expected an int in [2, 50], got {cfg.n_pcs}")
    data = load_pbmc68k()
    z = data.X_pca[:, : cfg.n_pcs].astype(np.float64)
    z = z - z.mean(axis=0)
    x = (z / np.linalg.norm(z, axis=1, keepdims=True)).astype(np.float32)
    rng = np.random.default_rng(ctx.seed)
    perm = rng.permutation(x.shape[0])
    n_test_cells = int(round(cfg.test_fraction * x.shape[0]))
    te, tr = perm[:n_test_cells], perm[n_test_cells:]
    train = jnp.asarray(
        _clouds(rng, x[tr], data.cell_type[tr], cfg.n_train, cfg.n_points, cfg.concentration)
    )
    test = jnp.asarray(
        _clouds(rng, x[te], data.cell_type[te], cfg.n_test, cfg.n_points, cfg.concentration)
    )
    floors = [
        jnp.asarray(
            _clouds(rng, x[tr], data.cell_type[tr], cfg.n_test, cfg.n_points, cfg.concentration)
        )
        for _ in range(cfg.n_floor)
    ]
    extra = type_scores(x[tr].astype(np.float64), data.cell_type[tr])
    figures, gen_r, gen_e = compare(
        ctx.key(), Sphere(cfg.n_pcs), train, test, floors, cfg, ctx, extra_scores=extra
    )
    _plot(ctx, test, gen_r, gen_e)
    return figures


def _plot(ctx, test, gen_r, gen_e):
    import matplotlib.pyplot as plt

    k = 4
    fig, axes = plt.subplots(3, k, figsize=(3 * k, 8), sharex=True, sharey=True)
    for row, (title, clouds) in enumerate(
        (("held-out", test), ("RWEFM", gen_r), ("Euclidean", gen_e))
    ):
        for j in range(k):
            c = np.asarray(clouds[j])
            axes[row, j].scatter(c[:, 0], c[:, 1], s=6)
            if j == 0:
                axes[row, j].set_ylabel(title)
    fig.suptitle("PBMC clouds on the sphere: first two embedding coordinates")
    ctx.save_plot(fig, "clouds_pbmc")


STUDY = _runner.Study(
    "rwefm_singlecell",
    Config,
    run,
    quick=QUICK,
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
