"""Pref-MH on a 2-D Gaussian mixture: accuracy and efficiency of each acceptance rule.

Many chains sample a five-component 2-D Gaussian mixture through a Bradley-Terry judge of its
log-density (the judge only returns sampled binary preferences). Rules: exact MH (oracle,
densities known), Pref-MH's K-budget rule for K in ``ks`` (Gaussian random walk), the two-coin
Bernoulli factory with an asymmetric AR(1) proposal, and majority vote over K = 3 (inexact
baseline). For each: total variation on a grid to the exact cell probabilities (normal CDFs),
sliced Wasserstein-1 to exact i.i.d. draws, acceptance, effective sample size per chain-step
and per 1000 judge comparisons. Reference floors: the same metrics for exact i.i.d. draws of
the same size (``tv_iid``, ``sw1_iid``) show the Monte-Carlo noise level.

Checkpoints: each finished rule's summary values (and its plotted arrays) are checkpointed
through ``hexad.cachex`` into ``settings-<hash>/rules/`` (the hash of the seed and every
setting) under ``--ckpt`` (default ``checkpoints/<study>/<run>/``, where ``<run>`` is the
``--out`` folder's name); ``--resume`` with the same ``--out`` or ``--ckpt``, seed and
settings skips the finished rules and gives the same summary as an uninterrupted run.

Command:  python -m experiments.prefmh_mixture [--quick] [--out DIR] [--seed N] [--set k=v ...]
Runtime:  --quick (256 chains, 300 steps) about 1.5 min on 2 shared CPU cores; full (4096
          chains, 2000 steps) measured 2 min on 2 shared CPU cores (results/prefmh_mixture).

summary.json keys, for each method ``m`` in ``mh``, ``prefmh_k1``, ``prefmh_k3``,
``prefmh_k5``, ``prefmh_k9`` (one per K in ``ks``), ``two_coin``, ``majority_k3``:
``tv_<m>`` (grid total variation to the target), ``sw1_<m>`` (sliced W1 to exact draws),
``acc_<m>`` (mean acceptance), ``calls_per_step_<m>`` (judge comparisons per step),
``ess_per_step_<m>`` (min over coordinates of ESS / (chains x kept steps)), ``rhat_<m>``
(max R-hat over coordinates); and for every method but ``mh``, ``ess_per_kcall_<s>`` (ESS per
1000 judge comparisons) with ``<s>`` = ``k1``, ``k3``, ``k5``, ``k9``, ``two_coin``,
``majority_k3``; ``truncated_two_coin`` (two-coin steps that hit ``max_rounds`` and were
rejected: a cost in acceptance, not in exactness, since the cut keeps detailed balance, see
``hexad.prefmh.two_coin_acceptance``); plus ``tv_iid``, ``sw1_iid``,
``num_samples`` (kept draws per method), ``runtime_s``.

Validity check a verdict reads (docs/render_results.py): ``rhat_mh <= 1.05``, the exact MH
reference mixed; without it a chain's TV against it says nothing about exactness.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from experiments import _prefmh, _runner
from hexad import prefmh

WEIGHTS = np.array([0.3, 0.2, 0.2, 0.15, 0.15])
MEANS = np.array([[-2.0, -1.5], [2.0, -1.5], [0.0, 2.0], [-2.5, 2.5], [2.5, 2.5]])
SDS = np.array([[0.8, 0.6], [0.6, 0.9], [1.0, 0.5], [0.5, 0.5], [0.7, 0.4]])


@dataclasses.dataclass(frozen=True)
class Config:
    num_chains: int = 4096
    num_steps: int = 2000
    burn_in: int = 1000
    chunk_size: int = 250
    step_size: float = 1.5
    ar_shrink: float = 0.2
    rules: tuple[str, ...] = ("mh", "kbudget", "two_coin", "majority")
    ks: tuple[int, ...] = (1, 3, 5, 9)
    majority_k: int = 3
    grid_bins: int = 48
    grid_half_width: float = 6.0
    sliced_directions: int = 64
    sliced_points: int = 20000

    def __post_init__(self):
        _runner.check_chains(self)
        _runner.positive(self, "step_size", "grid_half_width")
        _runner.in_unit(self, "ar_shrink", hi_open=True)
        _runner.one_of(self, ("mh", "kbudget", "two_coin", "majority"), "rules")
        _runner.at_least(self, 1, "ks", "majority_k", "grid_bins", "sliced_directions")
        _runner.at_least(self, 1, "sliced_points")


def logdensity(x):
    """Log-density of the mixture at ``x [2]``."""
    z = (x[None, :] - MEANS) / SDS
    comps = np.log(WEIGHTS) - np.sum(np.log(SDS), axis=1) - 0.5 * jnp.sum(z**2, axis=1)
    return jax.scipy.special.logsumexp(comps) - np.log(2 * np.pi)


def exact_samples(rng: np.random.Generator, n: int) -> np.ndarray:
    comp = rng.choice(len(WEIGHTS), size=n, p=WEIGHTS)
    return MEANS[comp] + SDS[comp] * rng.standard_normal((n, 2))


def grid_probabilities(bins: int, half: float) -> np.ndarray:
    """Exact mixture mass of each grid cell ``[bins, bins]`` (product of normal CDFs)."""
    from scipy.stats import norm

    edges = np.linspace(-half, half, bins + 1)
    p = np.zeros((bins, bins))
    for w, m, s in zip(WEIGHTS, MEANS, SDS, strict=True):
        px = np.diff(norm.cdf(edges, m[0], s[0]))
        py = np.diff(norm.cdf(edges, m[1], s[1]))
        p += w * np.outer(px, py)
    return p


def _methods(cfg: Config):
    judge = prefmh.bradley_terry_judge(logdensity)
    rw = prefmh.random_walk(cfg.step_size)
    out = {}
    if "mh" in cfg.rules:
        out["mh"] = ("mh", prefmh.prefmh(judge, rw, "mh"))
    for k in cfg.ks if "kbudget" in cfg.rules else ():
        out[f"prefmh_k{k}"] = (f"k{k}", prefmh.prefmh(judge, rw, "kbudget", k))
    if "two_coin" in cfg.rules:
        ar = prefmh.autoregressive(cfg.step_size, cfg.ar_shrink)
        out["two_coin"] = ("two_coin", prefmh.prefmh(judge, ar, "two_coin"))
    mk = cfg.majority_k
    if "majority" in cfg.rules:
        out[f"majority_k{mk}"] = (f"majority_k{mk}", prefmh.prefmh(judge, rw, "majority", mk))
    return out


def run(cfg: Config, ctx: _runner.Context) -> dict:
    rng = np.random.default_rng(ctx.seed)
    p_grid = grid_probabilities(cfg.grid_bins, cfg.grid_half_width)
    dirs = _prefmh.directions(rng, cfg.sliced_directions, 2)
    kept = cfg.num_chains * (cfg.num_steps - cfg.burn_in)
    n_sw = min(cfg.sliced_points, kept)
    ref = exact_samples(rng, n_sw)
    iid = exact_samples(rng, kept)
    summary = {
        "tv_iid": float(prefmh.grid_tv(iid, p_grid, cfg.grid_half_width)),
        "sw1_iid": float(prefmh.sliced_w1(exact_samples(rng, n_sw), ref, dirs)),
        "num_samples": kept,
    }
    key = ctx.key()
    k_init, key = jax.random.split(key)
    x0 = 3.0 * jax.random.normal(k_init, (cfg.num_chains, 2))
    methods = _methods(cfg)
    h = cfg.grid_half_width

    def run_rule(i, name, key, arrays):
        short, algo = methods[name]
        out = _prefmh.run_chains(ctx, cfg, key, algo, x0, name)
        samples = np.asarray(out.trace).reshape(-1, 2)
        pick = np.random.default_rng([ctx.seed, i]).choice(len(samples), n_sw, False)
        f = _prefmh.figures(out, cfg)
        m = {
            f"tv_{name}": float(prefmh.grid_tv(samples, p_grid, h)),
            f"sw1_{name}": float(prefmh.sliced_w1(samples[pick], ref, dirs)),
            f"acc_{name}": f["acc"],
            f"calls_per_step_{name}": f["calls_per_step"],
            f"ess_per_step_{name}": f["ess_per_step"],
            f"rhat_{name}": float(jnp.max(out.rhat)),
        }
        if name == "two_coin":
            m["truncated_two_coin"] = int(jnp.sum(out.truncated))
        if name != "mh":
            m[f"ess_per_kcall_{short}"] = f["ess_per_kcall"]
        arrays["hists"][i] = np.histogram2d(*samples.T, bins=cfg.grid_bins, range=[[-h, h]] * 2)[0]
        return m

    names = list(methods)
    hists = {"hists": ((len(names), cfg.grid_bins, cfg.grid_bins), "float64")}
    records, arrays = _prefmh.run_rules(ctx, cfg, names, key, run_rule, hists)
    summary.update(records)
    _plot(ctx, cfg, p_grid, dict(zip(names, arrays["hists"], strict=True)), summary)
    return summary


def _plot(ctx, cfg, p_grid, hists, summary):
    import matplotlib.pyplot as plt

    names = list(hists)
    show = names[:3]
    fig, axes = plt.subplots(1, len(show) + 2, figsize=(4 * (len(show) + 2), 3.8))
    h = cfg.grid_half_width
    axes[0].imshow(p_grid.T, origin="lower", extent=[-h, h, -h, h])
    axes[0].set_title("exact target")
    for ax, name in zip(axes[1:-1], show, strict=False):
        ax.imshow(hists[name].T, origin="lower", extent=[-h, h, -h, h])
        ax.set_title(f"{name}  TV={summary['tv_' + name]:.3f}")
    tvs = [summary[f"tv_{n}"] for n in names]
    axes[-1].barh(names, tvs)
    axes[-1].axvline(summary["tv_iid"], color="k", ls="--", label="i.i.d. floor")
    axes[-1].set_xlabel("grid TV to target")
    axes[-1].legend()
    ctx.save_plot(fig, "mixture")


STUDY = _runner.Study(
    "prefmh_mixture",
    Config,
    run,
    quick={"num_chains": 256, "num_steps": 300, "burn_in": 100, "chunk_size": 100},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
