"""Pref-MH for conditional image generation on scikit-learn's bundled digits.

A probabilistic-PCA generator (Tipping & Bishop 1999, maximum-likelihood fit in closed form,
``latent_dim`` latents) is trained on the 8x8 digit images; ``G(z) = mean + W z`` with
``z ~ N(0, I)``. A judge built from a flax MLP classifier (trained with optax on the same
split) prefers images that look more like digit ``target``: Bradley-Terry with score
``beta * log p(target | x)``. The chains sample ``pi(z) ∝ N(z; 0, I) p(target | G(z))^beta``
with latent random-walk moves (prior ratio in ``rho``) or independent draws from the
generator. The rate of the asked-for property is measured by a *separate* classifier
(scikit-learn 5-nearest-neighbours on the training images), so that the judge does not grade
itself.

Checkpoints: each finished rule's summary values (and its plotted arrays) are checkpointed
through ``hexad.cachex`` into ``settings-<hash>/rules/`` (the hash of the seed and every
setting) under ``--ckpt`` (default ``checkpoints/<study>/<run>/``, where ``<run>`` is the
``--out`` folder's name); ``--resume`` with the same ``--out`` or ``--ckpt``, seed and
settings skips the finished rules and gives the same summary as an uninterrupted run.

Command:  python -m experiments.prefmh_digits [--quick] [--out DIR] [--seed N] [--set k=v ...]
Runtime:  --quick (128 chains, 200 steps) about 1 min on 2 shared CPU cores; full (1024
          chains, 800 steps) measured 22 s on 2 shared CPU cores (results/prefmh_digits).

summary.json keys: ``classifier_test_acc`` (judge's MLP), ``evaluator_test_acc`` (5-NN),
``base_rate`` (evaluator's rate of ``target`` among generator draws),
``base_diversity`` (mean pairwise L2 distance of generator images), and for each method ``m``
in ``mh_latent`` (oracle MH), ``prefmh_k1_latent``, ``prefmh_k3_latent``,
``prefmh_k1_indep``: ``rate_<m>`` (evaluator's rate of ``target`` in the kept draws),
``judge_rate_<m>`` (the judge's own argmax rate), ``diversity_<m>`` (mean pairwise L2
distance of final images), ``sw1_to_mh_<m>`` (sliced W1 in latent space to the MH chains'
draws, only when ``mh_latent`` runs first; for ``mh_latent``, between the two halves of its
own chains: the noise floor),
``acc_<m>`` (acceptance), ``ess_per_step_<m>`` (min latent ESS per chain-step), and for all
but MH ``ess_per_kcall_<m>`` (ESS per 1000 comparisons); ``runtime_s``.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _prefmh, _runner
from hexad import prefmh

METHODS = ("mh_latent", "prefmh_k1_latent", "prefmh_k3_latent", "prefmh_k1_indep")


@dataclasses.dataclass(frozen=True)
class Config:
    num_chains: int = 1024
    num_steps: int = 800
    burn_in: int = 400
    chunk_size: int = 200
    latent_dim: int = 16
    target: int = 3
    beta: float = 2.0
    latent_step: float = 0.6
    train_steps: int = 400
    sliced_directions: int = 64
    methods: tuple[str, ...] = METHODS

    def __post_init__(self):
        _runner.check_chains(self)
        _runner.at_least(self, 1, "latent_dim", "train_steps", "sliced_directions")
        _runner.in_range(self, 0, 9, "target")
        _runner.positive(self, "beta", "latent_step")
        _runner.one_of(self, METHODS, "methods")


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(64)(x)))


def train_classifier(key, x, y, steps):
    model = MLP()
    params = model.init(key, x[:1])
    opt = optax.adam(1e-2)

    def loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()

    @jax.jit
    def step(carry, _):
        p, s = carry
        g = jax.grad(loss)(p)
        u, s = opt.update(g, s, p)
        return (optax.apply_updates(p, u), s), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)), None, length=steps)
    return jax.jit(lambda inp: model.apply(params, inp))


def _diversity(images: np.ndarray, rng) -> float:
    i, j = _prefmh.random_pairs(rng, len(images), 4000)
    return float(np.mean(np.linalg.norm(images[i] - images[j], axis=1)))


def run(cfg: Config, ctx: _runner.Context) -> dict:
    from sklearn.datasets import load_digits
    from sklearn.neighbors import KNeighborsClassifier

    digits = load_digits()
    x_all, y_all = digits.data / 16.0, digits.target
    rng = np.random.default_rng(ctx.seed)
    perm = rng.permutation(len(x_all))
    tr, te = perm[:1400], perm[1400:]
    ppca = prefmh.fit_ppca(x_all[tr], cfg.latent_dim)
    decode_batch = jax.jit(jax.vmap(ppca.decode))
    key = ctx.key()
    k_cls, k_base, k_init, key = jax.random.split(key, 4)
    x_tr, x_te = jnp.asarray(x_all[tr], jnp.float32), jnp.asarray(x_all[te], jnp.float32)
    logits_fn = train_classifier(k_cls, x_tr, jnp.asarray(y_all[tr]), cfg.train_steps)
    evaluator = KNeighborsClassifier(n_neighbors=5).fit(x_all[tr], y_all[tr])
    summary = {
        "classifier_test_acc": float(np.mean(np.argmax(logits_fn(x_te), 1) == y_all[te])),
        "evaluator_test_acc": float(evaluator.score(x_all[te], y_all[te])),
    }
    base_img = np.asarray(decode_batch(jax.random.normal(k_base, (4000, cfg.latent_dim))))
    summary["base_rate"] = float(np.mean(evaluator.predict(base_img) == cfg.target))
    summary["base_diversity"] = _diversity(base_img, rng)

    judge = prefmh.pullback_judge(
        prefmh.classifier_judge(logits_fn, cfg.target, beta=cfg.beta), ppca.decode
    )
    walk = prefmh.latent_random_walk(cfg.latent_step)
    indep = prefmh.independent(lambda k: jax.random.normal(k, (cfg.latent_dim,)))
    methods = {
        "mh_latent": (walk, "mh", 1),
        "prefmh_k1_latent": (walk, "kbudget", 1),
        "prefmh_k3_latent": (walk, "kbudget", 3),
        "prefmh_k1_indep": (indep, "kbudget", 1),
    }
    dirs = _prefmh.directions(rng, cfg.sliced_directions, cfg.latent_dim)
    z0 = jax.random.normal(k_init, (cfg.num_chains, cfg.latent_dim))
    names = list(cfg.methods)
    stride = max(1, (cfg.num_steps - cfg.burn_in) // 20)
    rows = cfg.num_chains * len(range(0, cfg.num_steps - cfg.burn_in, stride))

    def run_rule(i, name, key, arrays):
        out = _prefmh.run_chains(ctx, cfg, key, prefmh.prefmh(judge, *methods[name]), z0, name)
        draws = np.asarray(out.trace[:, ::stride]).reshape(-1, cfg.latent_dim)  # chain-major
        imgs = np.asarray(decode_batch(jnp.asarray(draws)))
        final = np.asarray(decode_batch(out.state.position))
        arrays["shown"][i] = final[:8]
        # Sliced W1 to the MH chains' draws when MH ran before this rule; for MH itself, between
        # the first and the second half of its chains (the noise floor).
        sw1, mh = None, arrays["mh_draws"]
        if name == "mh_latent":
            half = len(draws) // 2
            sw1 = prefmh.sliced_w1(draws[:half], draws[half:][:half], dirs)
            mh[...] = draws
        elif "mh_latent" in names[:i]:
            sw1 = prefmh.sliced_w1(draws, mh, dirs)
        f = _prefmh.figures(out, cfg)
        m = {
            f"rate_{name}": float(np.mean(evaluator.predict(imgs) == cfg.target)),
            f"judge_rate_{name}": float(
                np.mean(np.argmax(logits_fn(jnp.asarray(imgs)), 1) == cfg.target)
            ),
            # One generator per rule: a resumed run skips rules exactly.
            f"diversity_{name}": _diversity(final, np.random.default_rng([ctx.seed, i])),
            f"acc_{name}": f["acc"],
            f"ess_per_step_{name}": f["ess_per_step"],
        }
        if sw1 is not None:
            m[f"sw1_to_mh_{name}"] = float(sw1)
        if name != "mh_latent":
            m[f"ess_per_kcall_{name}"] = f["ess_per_kcall"]
        return m

    arrays = {
        "shown": ((len(names), 8, 64), "float32"),
        "mh_draws": ((rows, cfg.latent_dim), "float32"),
    }
    records, arrays = _prefmh.run_rules(ctx, cfg, names, key, run_rule, arrays)
    summary.update(records)
    _plot(ctx, dict(zip(names, arrays["shown"], strict=True)), base_img[:8])
    return summary


def _plot(ctx, shown, base):
    import matplotlib.pyplot as plt

    rows = {"generator": base, **shown}
    fig, axes = plt.subplots(len(rows), 8, figsize=(8, 1.1 * len(rows)))
    for r, (name, imgs) in enumerate(rows.items()):
        for c in range(8):
            axes[r, c].imshow(imgs[c].reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
            axes[r, c].axis("off")
        axes[r, 0].set_title(name, fontsize=7, loc="left")
    ctx.save_plot(fig, "samples")


STUDY = _runner.Study(
    "prefmh_digits",
    Config,
    run,
    quick={"num_chains": 128, "num_steps": 200, "burn_in": 100, "chunk_size": 100},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
