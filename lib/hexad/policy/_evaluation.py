"""Deciding a composition study: likelihood spaces, selection/test splits, paired bootstrap
intervals, the pre-stated verdict rules, and the spread statistics of actors and priors."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from hexad._base import check_int
from hexad.policy._gaussian import DiagGaussian

__all__ = [
    "SPACES",
    "actor_for_space",
    "check_disjoint",
    "check_space",
    "deterministic_action",
    "paired_bootstrap_ci",
    "precision_ratio",
    "std_quantiles",
    "verdict",
]

# The likelihood spaces a policy (and so its PoE) may live in.
SPACES = ("pretanh", "action")


def check_space(space: str) -> str:
    """Returns ``space`` if it is one of :data:`SPACES`, else raises ``ValueError``.

    ``"pretanh"``: a tanh-squashed Gaussian, composed over pre-tanh variables, acting with
    ``tanh(mean)``; ``"action"``: a Gaussian over actions with a state-independent std (as
    the IQL reference), composed in action space, acting with ``clip(mean, -1, 1)``.

    >>> check_space("action")
    'action'
    """
    if space not in SPACES:
        raise ValueError(f"space: expected one of {SPACES}, got {space!r}")
    return space


def actor_for_space(space: str, action_dim: int, hidden: Sequence[int]):
    """Returns the ``GaussianActor`` of a likelihood space (see :func:`check_space`).

    >>> actor_for_space("action", 2, (8,)).squash
    False
    """
    from hexad.policy._networks import GaussianActor

    pre = check_space(space) == "pretanh"
    return GaussianActor(action_dim, tuple(hidden), state_dependent_std=pre, squash=pre)


def deterministic_action(mean, squashed):
    """Returns ``tanh(mean)`` where ``squashed`` and ``clip(mean, -1, 1)`` elsewhere.

    Args:
      mean: ``[B, d]`` composed means.
      squashed: bool, scalar or ``[B]`` (one flag per row).

    >>> a = deterministic_action(jnp.array([[2.0], [2.0]]), jnp.array([True, False]))
    >>> [round(float(v), 3) for v in a[:, 0]]
    [0.964, 1.0]
    """
    flag = jnp.asarray(squashed)
    flag = flag[:, None] if flag.ndim == 1 else flag
    return jnp.where(flag, jnp.tanh(mean), jnp.clip(mean, -1.0, 1.0))


def check_disjoint(select, test, name: str = "select_seeds") -> None:
    """Raises ``ValueError`` naming ``name`` if the selection and test episodes share a seed.

    >>> check_disjoint([1, 2], [3, 4])
    """
    shared = set(np.asarray(select).ravel().tolist()) & set(np.asarray(test).ravel().tolist())
    if shared:
        raise ValueError(
            f"{name}: selection and test episodes must not overlap, got shared seeds "
            f"{sorted(shared)[:5]}"
        )


def paired_bootstrap_ci(
    diffs, strata=None, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Returns ``(mean, lo, hi)``: a paired bootstrap interval of a mean per-episode difference.

    ``diffs[i]`` is method minus reference on the same episode ``i`` (same start, goal and
    seed). Episodes are resampled with replacement within each stratum (e.g. the training
    seed, so every resample keeps each seed's share) and the percentile interval of the
    resampled means is returned. Host-side numpy.

    Args:
      diffs: ``[n]`` finite differences.
      strata: optional ``[n]`` labels (default: one stratum).
      n_boot: resamples, ``>= 1``.
      level: coverage in ``(0, 1)``.
      seed: the resampling generator's seed.

    >>> m, lo, hi = paired_bootstrap_ci(np.array([1.0, 1.0, 1.0]))
    >>> (m, lo, hi)
    (1.0, 1.0, 1.0)
    """
    d = np.asarray(diffs, np.float64)
    if d.ndim != 1 or d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f"diffs: expected a non-empty [n] of finite values, got {d.shape}")
    check_int("n_boot", n_boot)
    if not 0 < level < 1:
        raise ValueError(f"level: expected a value in (0, 1), got {level!r}")
    s = np.zeros(d.shape, int) if strata is None else np.asarray(strata)
    if s.shape != d.shape:
        raise ValueError(f"strata: expected shape {d.shape}, got {s.shape}")
    rng = np.random.default_rng(seed)
    total = np.zeros(n_boot)
    for lab in np.unique(s):
        x = d[s == lab]
        total += x[rng.integers(0, x.size, (n_boot, x.size))].sum(1)
    means = total / d.size
    q = (1 - level) / 2
    return float(d.mean()), float(np.quantile(means, q)), float(np.quantile(means, 1 - q))


def verdict(ci_ok: Sequence[float], margin: float, ci_bad: Sequence = ()) -> str:
    """Decides a no-worse-than claim from intervals: holds, fails or undecided.

    Returns ``"holds"``, ``"fails"`` or ``"undecided"``.

    The claim: a method loses at most ``margin`` against its reference, and each comparison
    that should be bad loses more. With ``ci_ok = (mean, lo, hi)`` the interval of the
    method's difference and ``ci_bad`` those that should fall below ``-margin``:

    - holds: ``lo >= -margin`` and every ``ci_bad`` has ``hi < -margin``;
    - fails: ``hi < -margin`` (the method decidedly loses more than the margin);
    - undecided: anything else (an interval straddles ``-margin``).

    >>> verdict((0.0, -0.1, 0.1), 0.5, [(-2.0, -3.0, -1.0)])
    'holds'
    >>> verdict((-2.0, -3.0, -1.0), 0.5)
    'fails'
    """
    if not margin >= 0:
        raise ValueError(f"margin: expected a value >= 0, got {margin!r}")
    _, lo, hi = ci_ok
    if hi < -margin:
        return "fails"
    if lo >= -margin and all(b[2] < -margin for b in ci_bad):
        return "holds"
    return "undecided"


def std_quantiles(dist: DiagGaussian, qs=(0.1, 0.5, 0.9)) -> list[float]:
    """Returns the quantiles ``qs`` of a policy's stds over states and action dimensions.

    >>> std_quantiles(DiagGaussian(jnp.zeros((2, 2)), jnp.ones((2, 2))))
    [1.0, 1.0, 1.0]
    """
    return [float(v) for v in np.quantile(np.asarray(dist.std), qs)]


def precision_ratio(actor: DiagGaussian, prior: DiagGaussian) -> np.ndarray:
    """Returns ``lam_P / lam_A = (s_A / s_P)^2`` elementwise: how much the prior's precision
    outweighs the actor's in a PoE (``> 1``: the prior dominates the composed mean).

    >>> a = DiagGaussian(jnp.zeros(1), jnp.full(1, 2.0))
    >>> precision_ratio(a, DiagGaussian(jnp.zeros(1), jnp.ones(1))).tolist()
    [4.0]
    """
    return np.square(np.asarray(actor.std) / np.asarray(prior.std))
