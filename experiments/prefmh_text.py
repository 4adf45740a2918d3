"""Pref-MH for conditional text generation: a character trigram model tilted by a judge.

A character trigram model (add-0.1 smoothing) is trained on the text that ships with Python
itself (``pydoc_data.topics``, lower-cased, a 33-symbol alphabet). It is the generator ``p0``
of ``length``-character strings. A judge prefers strings with more occurrences of the bigram
``target`` (Bradley-Terry with score ``beta * count``), so the chains, proposing independent
strings from ``p0``, sample the tilted law ``pi(x) ∝ p0(x) exp(beta * count(x))``. The
asked-for property is ``count >= min_count``. Rules: exact MH (oracle), Pref-MH K = 1 and
K = 3, majority vote K = 3. The reference law of the count under ``pi`` is computed by
reweighting a large pool of ``p0`` draws by ``exp(beta * count)`` (exact up to pool noise).

Checkpoints: each finished rule's summary values (and its plotted arrays) are checkpointed
through ``hexad.cachex`` into ``settings-<hash>/rules/`` (the hash of the seed and every
setting) under ``--ckpt`` (default ``checkpoints/<study>/<run>/``, where ``<run>`` is the
``--out`` folder's name); ``--resume`` with the same ``--out`` or ``--ckpt``, seed and
settings skips the finished rules and gives the same summary as an uninterrupted run.

Command:  python -m experiments.prefmh_text [--quick] [--out DIR] [--seed N] [--set k=v ...]
Runtime:  --quick (256 chains, 200 steps) about 1.5 min on 2 shared CPU cores; full (1024
          chains, 1000 steps) measured 22 s on 2 shared CPU cores (results/prefmh_text).

Note: independent proposals from ``p0`` mix slowly here (a chain that reaches a string with
many ``target`` bigrams keeps it for long), so compare the rules with each other (they share
the target) as much as with the pool-reweighted reference.

summary.json keys: ``base_rate`` (property rate under ``p0``), ``exact_rate`` (under the
tilted reference), and for each method ``m`` in ``mh``, ``prefmh_k1``, ``prefmh_k3``,
``majority_k3``: ``rate_<m>`` (property rate of the kept chain draws), ``tv_count_<m>`` (total
variation between the chains' count law and the reference), ``mean_count_<m>``, ``acc_<m>``
(acceptance), ``unique_frac_<m>`` (distinct strings among the chains' final states),
``hamming_<m>`` (mean normalised Hamming distance between random pairs of final states),
``ess_per_step_<m>`` (ESS of the count per chain-step); ``ess_per_kcall_k1``,
``ess_per_kcall_k3``, ``ess_per_kcall_majority_k3`` (ESS per 1000 comparisons);
``exact_mean_count``, ``examples`` (three final strings of the K = 1 chains), ``runtime_s``.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from experiments import _prefmh, _runner
from hexad import prefmh

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,()'_"  # '_' stands for every other character
#: method -> (its ``ess_per_kcall`` suffix, or None for the oracle; (rule, K)).
METHODS = {
    "mh": (None, ("mh", 1)),
    "prefmh_k1": ("k1", ("kbudget", 1)),
    "prefmh_k3": ("k3", ("kbudget", 3)),
    "majority_k3": ("majority_k3", ("majority", 3)),
}


@dataclasses.dataclass(frozen=True)
class Config:
    num_chains: int = 1024
    num_steps: int = 1000
    burn_in: int = 400
    chunk_size: int = 200
    length: int = 40
    target: str = "th"
    beta: float = 1.5
    min_count: int = 2
    pool: int = 200000
    smoothing: float = 0.1
    methods: tuple[str, ...] = tuple(METHODS)

    def __post_init__(self):
        _runner.check_chains(self)
        _runner.at_least(self, 1, "length", "min_count", "pool")
        _runner.positive(self, "beta", "smoothing")
        _runner.one_of(self, METHODS, "methods")
        _runner.require(
            len(self.target) >= 1 and all(c in ALPHABET for c in self.target),
            "target",
            f"target must be a non-empty string of characters from {ALPHABET!r}, "
            f"got {self.target!r}",
        )


def corpus_tokens() -> np.ndarray:
    """The bundled pydoc topics text as token ids over :data:`ALPHABET`."""
    from pydoc_data.topics import topics

    text = re.sub(r"\s+", " ", " ".join(topics.values()).lower())
    index = {c: i for i, c in enumerate(ALPHABET)}
    other = index["_"]
    return np.array([index.get(c, other) for c in text], np.int32)


def make_count(target: str):
    ids = [ALPHABET.index(c) for c in target]

    def count(x):
        hits = jnp.ones(x.shape[0] - len(ids) + 1, jnp.bool_)
        for j, t in enumerate(ids):
            hits = hits & (x[j : x.shape[0] - len(ids) + 1 + j] == t)
        return jnp.sum(hits).astype(jnp.float32)

    return count


def decode(x) -> str:
    return "".join(ALPHABET[int(i)] for i in np.asarray(x))


def _count_law(counts: np.ndarray, support: int) -> np.ndarray:
    h = np.bincount(np.clip(counts.astype(int), 0, support - 1), minlength=support)
    return h / h.sum()


def run(cfg: Config, ctx: _runner.Context) -> dict:
    model = prefmh.fit_trigram(corpus_tokens(), len(ALPHABET), cfg.smoothing)
    sample = prefmh.trigram_sampler(model, cfg.length)
    count = make_count(cfg.target)
    key = ctx.key()
    k_pool, k_init, key = jax.random.split(key, 3)
    pool_counts = np.asarray(
        jax.jit(jax.vmap(lambda k: count(sample(k))))(jax.random.split(k_pool, cfg.pool))
    )
    support = cfg.length
    base = _count_law(pool_counts, support)
    w = np.exp(cfg.beta * (pool_counts - pool_counts.max()))
    exact = np.bincount(pool_counts.astype(int), weights=w, minlength=support)[:support]
    exact = exact / exact.sum()
    cs = np.arange(support)
    summary = {
        "base_rate": float(base[cfg.min_count :].sum()),
        "exact_rate": float(exact[cfg.min_count :].sum()),
        "exact_mean_count": float(exact @ cs),
    }
    judge = prefmh.bradley_terry_judge(lambda x: cfg.beta * count(x))
    proposal = prefmh.independent(sample)
    x0 = jax.jit(jax.vmap(sample))(jax.random.split(k_init, cfg.num_chains))
    count_batch = jax.jit(jax.vmap(jax.vmap(count)))

    def run_rule(i, name, key, arrays):
        short, rule = METHODS[name]
        out = _prefmh.run_chains(ctx, cfg, key, prefmh.prefmh(judge, proposal, *rule), x0, name)
        counts = count_batch(out.trace)  # [chains, kept]
        law = _count_law(np.asarray(counts).reshape(-1), support)
        f = _prefmh.figures(out, cfg, float(prefmh.effective_sample_size(counts)))
        final = np.asarray(out.state.position)
        # One generator per rule: a resumed run skips rules exactly.
        a, b = _prefmh.random_pairs(np.random.default_rng([ctx.seed, i]), cfg.num_chains, 2000)
        m = {
            f"rate_{name}": float(law[cfg.min_count :].sum()),
            f"tv_count_{name}": float(0.5 * np.abs(law - exact).sum()),
            f"mean_count_{name}": float(law @ cs),
            f"acc_{name}": f["acc"],
            f"unique_frac_{name}": len({r.tobytes() for r in final}) / cfg.num_chains,
            f"hamming_{name}": float(np.mean(final[a] != final[b])),
            f"ess_per_step_{name}": f["ess_per_step"],
        }
        if short is not None:
            m[f"ess_per_kcall_{short}"] = f["ess_per_kcall"]
        if name == "prefmh_k1":
            m["examples"] = [decode(final[c]) for c in range(3)]
        return m

    records, _ = _prefmh.run_rules(ctx, cfg, list(cfg.methods), key, run_rule)
    summary.update(records)
    _plot(ctx, cfg, base, exact, summary)
    return summary


def _plot(ctx, cfg, base, exact, summary):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(cfg.methods)
    rates = [summary[f"rate_{n}"] for n in names]
    ax.bar(["p0", "exact"] + names, [summary["base_rate"], summary["exact_rate"]] + rates)
    ax.set_ylabel(f"P(count('{cfg.target}') >= {cfg.min_count})")
    ax.tick_params(axis="x", rotation=30)
    ctx.save_plot(fig, "property_rate")


STUDY = _runner.Study(
    "prefmh_text",
    Config,
    run,
    quick={"num_chains": 256, "num_steps": 200, "burn_in": 100, "chunk_size": 100, "pool": 50000},
    doc=__doc__,
)

if __name__ == "__main__":
    STUDY.main()
