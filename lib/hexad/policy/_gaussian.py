"""Closed forms for composing diagonal-Gaussian policies: PoE, KL-regularised, KL, selectors.

All functions act on the last axis (the action dimension) and broadcast over leading axes
(states, batches). For tanh-squashed actors the Gaussians live in pre-tanh space: compose the
pre-tanh means and standard deviations, then squash the composed mean with :func:`squash`.

Notation per action dimension: precision ``lam = 1 / std**2``. The product of experts
``pi_alpha ∝ pi_A^(1 - alpha) p^alpha`` of two Gaussians is Gaussian with

    lam_alpha = (1 - alpha) lam_A + alpha lam_P,
    mu_alpha  = ((1 - alpha) lam_A mu_A + alpha lam_P mu_P) / lam_alpha.

The KL-regularised problem ``max_pi E_pi[log p] - (1 / beta) KL(pi || pi_A)`` has the solution
``pi ∝ pi_A p^beta`` (Gibbs variational principle), i.e. precision ``lam_A + beta lam_P`` and the
same precision-weighted mean as PoE when ``beta = alpha / (1 - alpha)``; its precision is
``lam_alpha / (1 - alpha)``, so PoE is wider by the factor ``1 / sqrt(1 - alpha)``.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int, is_traced

__all__ = [
    "DiagGaussian",
    "additive",
    "calibrate_kl_budget",
    "kl_budget_alpha",
    "kl_budget_alpha_per_state",
    "kl_diag_gaussian",
    "kl_regularised",
    "poe",
    "poe_kl_to_actor",
    "poe_mean_kl_to_actor",
    "prior_only",
    "squash",
]


class DiagGaussian(NamedTuple):
    """A diagonal Gaussian (in pre-tanh space for squashed policies).

    Attributes:
      mean: ``[..., d]`` means.
      std: ``[..., d]`` standard deviations, all > 0.
    """

    mean: jax.Array
    std: jax.Array


# --------------------------------------------------------------------------------------------
# Validation at the public boundary (skipped for traced values, whose contents are unknown).
# --------------------------------------------------------------------------------------------


def _check_gaussian(name: str, g: DiagGaussian) -> None:
    if not isinstance(g, DiagGaussian):
        raise TypeError(f"{name}: expected a DiagGaussian(mean, std), got {type(g).__name__}")
    ms, ss = jnp.shape(g.mean), jnp.shape(g.std)
    if ms != ss:
        raise ValueError(f"{name}: mean and std must have the same shape, got {ms} and {ss}")
    if len(ms) == 0:
        raise ValueError(f"{name}: expected arrays of shape [..., d], got a scalar")
    if not is_traced(g.std):
        s = np.asarray(g.std)
        if not np.all(s > 0):
            raise ValueError(f"{name}.std: expected all > 0, got min {float(np.min(s))!r}")
    if not is_traced(g.mean):
        if not np.all(np.isfinite(np.asarray(g.mean))):
            raise ValueError(f"{name}.mean: expected finite values, got NaN or inf")


def _check_pair(actor: DiagGaussian, prior: DiagGaussian) -> None:
    _check_gaussian("actor", actor)
    _check_gaussian("prior", prior)
    da, dp = jnp.shape(actor.mean)[-1], jnp.shape(prior.mean)[-1]
    if da != dp:
        raise ValueError(f"prior: expected action dimension {da} (the actor's), got {dp}")


def _check_alpha(alpha, name: str = "alpha") -> None:
    if not is_traced(alpha):
        a = np.asarray(alpha)
        if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
            lo, hi = float(np.min(a)), float(np.max(a))
            raise ValueError(f"{name}: expected values in [0, 1], got range [{lo}, {hi}]")


def _alpha_axis(alpha, ndim: int) -> jax.Array:
    """Gives ``alpha`` (scalar or ``[...]`` over leading axes) a trailing action axis."""
    alpha = jnp.asarray(alpha)
    return alpha[..., None] if alpha.ndim > 0 else alpha


# --------------------------------------------------------------------------------------------
# Compositions
# --------------------------------------------------------------------------------------------


def poe(actor: DiagGaussian, prior: DiagGaussian, alpha) -> DiagGaussian:
    r"""Returns the product of experts :math:`\pi_A^{1 - \alpha} p^\alpha` of two diagonal
    Gaussians.

    Precision-weighted, with :math:`\lambda = s^{-2}`:

    .. math::

       \lambda = (1 - \alpha) \lambda_A + \alpha \lambda_P, \qquad
       \mu = \frac{(1 - \alpha) \lambda_A \mu_A + \alpha \lambda_P \mu_P}{\lambda}.

    :math:`\alpha = 0` gives the actor, :math:`\alpha = 1` the prior.

    Args:
      actor: the frozen actor's Gaussian, ``mean``/``std`` of shape ``[..., d]``.
      prior: the prior's Gaussian, ``[..., d]``, same rank as ``actor`` (size-1 axes broadcast).
      alpha: scalar or ``[...]`` (one per leading index) in ``[0, 1]``.

    Returns:
      the composed ``DiagGaussian`` of the broadcast shape ``[..., d]``.

    >>> a = DiagGaussian(jnp.zeros(2), jnp.ones(2))
    >>> p = DiagGaussian(jnp.ones(2), jnp.ones(2))
    >>> poe(a, p, 0.5).mean
    Array([0.5, 0.5], dtype=float32)
    """
    _check_pair(actor, prior)
    _check_alpha(alpha)
    a = _alpha_axis(alpha, jnp.ndim(actor.mean))
    lam_a = 1.0 / jnp.square(actor.std)
    lam_p = 1.0 / jnp.square(prior.std)
    wa, wp = (1.0 - a) * lam_a, a * lam_p
    lam = wa + wp
    mean = (wa * actor.mean + wp * prior.mean) / lam
    return DiagGaussian(mean, jax.lax.rsqrt(lam))


def kl_regularised(actor: DiagGaussian, prior: DiagGaussian, beta) -> DiagGaussian:
    r"""Returns the maximiser of
    :math:`\mathbb{E}_\pi[\log p] - \beta^{-1} \mathrm{KL}(\pi \| \pi_A)` over Gaussians.

    The solution is :math:`\pi \propto \pi_A p^\beta`: precision
    :math:`\lambda_A + \beta \lambda_P` and mean
    :math:`(\lambda_A \mu_A + \beta \lambda_P \mu_P) / (\lambda_A + \beta \lambda_P)`, with
    :math:`\lambda = s^{-2}` the precisions. With :math:`\beta = \alpha / (1 - \alpha)` the
    mean equals :func:`poe`'s and the std is :math:`\sqrt{1 - \alpha}` times PoE's.

    Args:
      actor: the frozen actor's Gaussian, ``[..., d]``.
      prior: the prior's Gaussian, ``[..., d]``.
      beta: scalar or ``[...]``, ``>= 0`` (the inverse temperature of the KL penalty).

    Returns:
      the composed ``DiagGaussian``, ``[..., d]``.

    >>> a = DiagGaussian(jnp.zeros(1), jnp.ones(1))
    >>> kl_regularised(a, DiagGaussian(jnp.ones(1), jnp.ones(1)), 1.0).mean
    Array([0.5], dtype=float32)
    """
    _check_pair(actor, prior)
    if not is_traced(beta):
        b = np.asarray(beta)
        if not np.all(np.isfinite(b)) or np.any(b < 0):
            raise ValueError(f"beta: expected finite values >= 0, got min {float(np.min(b))!r}")
    b = _alpha_axis(beta, jnp.ndim(actor.mean))
    lam_a = 1.0 / jnp.square(actor.std)
    wp = b / jnp.square(prior.std)
    lam = lam_a + wp
    mean = (lam_a * actor.mean + wp * prior.mean) / lam
    return DiagGaussian(mean, jax.lax.rsqrt(lam))


def additive(actor: DiagGaussian, prior: DiagGaussian, alpha) -> DiagGaussian:
    r"""Returns the additive (precision-blind) blend :math:`(1 - \alpha) \mu_A + \alpha \mu_P`.

    The baseline PoE is compared against: the means are interpolated without looking at either
    expert's confidence, so a confident actor is overridden by an uninformed prior. The std is
    interpolated the same way (it is only used for sampling).

    Args:
      actor: ``[..., d]``.
      prior: ``[..., d]``.
      alpha: scalar or ``[...]`` in ``[0, 1]``.

    Returns:
      a ``DiagGaussian``, ``[..., d]``.

    >>> a = DiagGaussian(jnp.zeros(1), jnp.ones(1))
    >>> additive(a, DiagGaussian(jnp.ones(1), 9 * jnp.ones(1)), 0.5).mean
    Array([0.5], dtype=float32)
    """
    _check_pair(actor, prior)
    _check_alpha(alpha)
    a = _alpha_axis(alpha, jnp.ndim(actor.mean))
    mean = (1.0 - a) * actor.mean + a * prior.mean
    std = (1.0 - a) * actor.std + a * prior.std
    return DiagGaussian(mean, std)


def prior_only(actor: DiagGaussian, prior: DiagGaussian) -> DiagGaussian:
    r"""Returns the prior alone, broadcast to the actor's shape (the :math:`\alpha = 1` baseline).

    >>> a = DiagGaussian(jnp.zeros((3, 2)), jnp.ones((3, 2)))
    >>> prior_only(a, DiagGaussian(jnp.ones(2), jnp.ones(2))).mean.shape
    (3, 2)
    """
    _check_pair(actor, prior)
    shape = jnp.broadcast_shapes(jnp.shape(actor.mean), jnp.shape(prior.mean))
    return DiagGaussian(jnp.broadcast_to(prior.mean, shape), jnp.broadcast_to(prior.std, shape))


def squash(g: DiagGaussian, low=-1.0, high=1.0) -> jax.Array:
    r"""Returns the deterministic action :math:`\tanh(\text{mean})` rescaled to ``[low, high]``.

    Args:
      g: a pre-tanh ``DiagGaussian``, ``[..., d]``.
      low, high: action bounds, scalars or ``[d]``.

    Returns:
      ``[..., d]`` actions.

    >>> squash(DiagGaussian(jnp.zeros(2), jnp.ones(2)))
    Array([0., 0.], dtype=float32)
    """
    return low + (jnp.tanh(g.mean) + 1.0) * (0.5 * (high - low))


def kl_diag_gaussian(p: DiagGaussian, q: DiagGaussian) -> jax.Array:
    r"""Returns :math:`\mathrm{KL}(p \| q)` between diagonal Gaussians, summed over the last axis.

    .. math::

       \mathrm{KL}(p \| q) = \sum_i \log \frac{s_{q,i}}{s_{p,i}}
         + \frac{s_{p,i}^2 + (\mu_{p,i} - \mu_{q,i})^2}{2 s_{q,i}^2} - \frac{1}{2}

    Args:
      p, q: ``DiagGaussian`` with broadcastable ``[..., d]`` arrays.

    Returns:
      ``[...]`` KL values in nats.

    >>> kl_diag_gaussian(DiagGaussian(jnp.zeros(2), jnp.ones(2)),
    ...                  DiagGaussian(jnp.ones(2), jnp.ones(2)))
    Array(1., dtype=float32)
    """
    _check_gaussian("p", p)
    _check_gaussian("q", q)
    if jnp.shape(p.mean)[-1] != jnp.shape(q.mean)[-1]:
        raise ValueError(
            f"q: expected action dimension {jnp.shape(p.mean)[-1]}, got {jnp.shape(q.mean)[-1]}"
        )
    return _kl(p, q)


def _kl(p: DiagGaussian, q: DiagGaussian) -> jax.Array:
    r = jnp.square(p.std / q.std)
    m = jnp.square((p.mean - q.mean) / q.std)
    return 0.5 * jnp.sum(r + m - 1.0 - jnp.log(r), axis=-1)


def poe_kl_to_actor(actor: DiagGaussian, prior: DiagGaussian, alpha) -> jax.Array:
    r"""Returns :math:`\mathrm{KL}(\pi_\alpha \| \pi_A)` for the PoE :math:`\pi_\alpha`, summed
    over actions.

    Non-decreasing in :math:`\alpha`: the PoE path is a straight line in natural parameters
    (direction :math:`d`), and along such a line
    :math:`\frac{d}{d\alpha} \mathrm{KL}(p_\alpha \| p_0) = \alpha\, d^\top F(\alpha)\, d \ge 0`
    (:math:`F` the Fisher matrix), which is what lets the KL-budget selectors bisect.

    Args:
      actor, prior: ``[..., d]``.
      alpha: scalar or ``[...]`` in ``[0, 1]``.

    Returns:
      ``[...]`` KL values.

    >>> a = DiagGaussian(jnp.zeros(1), jnp.ones(1))
    >>> poe_kl_to_actor(a, DiagGaussian(jnp.ones(1), jnp.ones(1)), 0.0)
    Array(0., dtype=float32)
    """
    return _kl(poe(actor, prior, alpha), actor)


def poe_mean_kl_to_actor(actor: DiagGaussian, prior: DiagGaussian, alpha) -> jax.Array:
    r"""Returns the mean-only (Mahalanobis) part of :math:`\mathrm{KL}(\pi_\alpha \| \pi_A)`,
    summed over actions.

    :math:`\frac{1}{2} \sum_i ((\mu_{\alpha,i} - \mu_{A,i}) / s_{A,i})^2`: the KL of the PoE
    mean shift alone, with the actor's std kept, i.e. what a deterministic policy
    :math:`\tanh(\mu_\alpha)` (or :math:`\mu_\alpha`) actually changes. Per dimension
    :math:`\mu_\alpha - \mu_A = w(\alpha) (\mu_P - \mu_A)` with
    :math:`w = \alpha \lambda_P / ((1 - \alpha) \lambda_A + \alpha \lambda_P)` non-decreasing in
    :math:`\alpha`, so this is non-decreasing too and the KL-budget selectors can bisect it
    (``mean_only=True``).

    >>> a = DiagGaussian(jnp.zeros(1), jnp.ones(1))
    >>> poe_mean_kl_to_actor(a, DiagGaussian(jnp.ones(1), jnp.ones(1)), 1.0)
    Array(0.5, dtype=float32)
    """
    return _mean_kl(poe(actor, prior, alpha), actor)


def _mean_kl(p: DiagGaussian, q: DiagGaussian) -> jax.Array:
    return 0.5 * jnp.sum(jnp.square((p.mean - q.mean) / q.std), axis=-1)


def _bisect(kl_fn, budget, shape, n_iters: int, dtype) -> jax.Array:
    """Largest alpha in [0, 1] with ``kl_fn(alpha) <= budget`` (elementwise over ``shape``)."""
    lo = jnp.zeros(shape, dtype)
    hi = jnp.ones(shape, dtype)
    kl_hi = kl_fn(hi)
    full_ok = kl_hi <= budget

    def body(_, lohi):
        lo, hi = lohi
        mid = 0.5 * (lo + hi)
        ok = kl_fn(mid) <= budget
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, n_iters, body, (lo, hi))
    # lo is always feasible (KL(0) = 0 <= budget); alpha = 1 wins when it is itself feasible.
    # A NaN KL or budget (NaN inputs under a trace) compares False and would bisect down to a
    # valid-looking alpha = 0: return NaN there instead.
    nan = jnp.isnan(kl_hi) | jnp.isnan(budget)
    return jnp.where(nan, jnp.nan, jnp.where(full_ok, hi, lo))


def _check_budget(budget) -> None:
    if not is_traced(budget):
        b = np.asarray(budget)
        if b.ndim != 0 or not np.isfinite(b) or b <= 0:
            raise ValueError(f"budget: expected a finite scalar > 0 (nats), got {budget!r}")


def kl_budget_alpha(
    actor: DiagGaussian,
    prior: DiagGaussian,
    budget,
    n_iters: int = 30,
    weights=None,
    mean_only: bool = False,
) -> jax.Array:
    r"""Returns the largest :math:`\alpha` whose mean :math:`\mathrm{KL}(\pi_\alpha \| \pi_A)` over
    states is at most ``budget``.

    The global selector: one alpha for all states, found by bisection on ``[0, 1]`` (the mean KL
    is non-decreasing in alpha, see :func:`poe_kl_to_actor`). The result is always feasible;
    it is within :math:`2^{-n}` of the largest feasible alpha, :math:`n` = ``n_iters``.

    Args:
      actor: ``[n, d]`` the actor's Gaussians at ``n`` data states.
      prior: ``[n, d]`` the prior's Gaussians at the same states (either may have a size-1
        state axis, which broadcasts: the mean is over the ``n`` states).
      budget: scalar ``> 0``, nats.
      n_iters: bisection steps (static).
      weights: optional ``[n]`` non-negative state weights (e.g. a validity mask).
      mean_only: bound the mean-only (Mahalanobis) KL of :func:`poe_mean_kl_to_actor`
        instead of the full KL (static).

    Returns:
      a scalar alpha in ``[0, 1]``.

    >>> a = DiagGaussian(jnp.zeros((4, 1)), jnp.ones((4, 1)))
    >>> p = DiagGaussian(jnp.ones((4, 1)), jnp.ones((4, 1)))
    >>> round(float(kl_budget_alpha(a, p, 0.125)), 4)  # KL = alpha^2 / 2
    0.5
    """
    _check_pair(actor, prior)
    _check_budget(budget)
    check_int("n_iters", n_iters)
    # The states are the broadcast of both (a size-1 axis of one broadcasts, as in poe).
    states = jnp.broadcast_shapes(jnp.shape(actor.mean), jnp.shape(prior.mean))[:-1]
    if weights is None:
        w = jnp.ones(states, jnp.result_type(actor.mean))
    else:
        w = jnp.asarray(weights)
        if w.shape != states:
            raise ValueError(f"weights: expected shape {states}, got {w.shape}")
        if not is_traced(w):
            wn = np.asarray(w)
            if not np.all(np.isfinite(wn)) or np.any(wn < 0) or not wn.sum() > 0:
                raise ValueError("weights: expected finite values >= 0 with a positive sum")
    w = w / jnp.sum(w)
    dtype = jnp.result_type(actor.mean, float)

    kl = _mean_kl if mean_only else _kl

    def mean_kl(alpha):
        return jnp.sum(w * kl(poe(actor, prior, alpha), actor))

    return _bisect(mean_kl, budget, (), n_iters, dtype)


def kl_budget_alpha_per_state(
    actor: DiagGaussian, prior: DiagGaussian, budget, n_iters: int = 30, mean_only: bool = False
) -> jax.Array:
    r"""Returns, per state, the largest :math:`\alpha` with
    :math:`\mathrm{KL}(\pi_\alpha \| \pi_A) \le` ``budget``.

    Args:
      actor: ``[..., d]``.
      prior: ``[..., d]``.
      budget: scalar ``> 0``, nats.
      n_iters: bisection steps (static).
      mean_only: bound the mean-only KL (:func:`poe_mean_kl_to_actor`) instead (static).

    Returns:
      ``[...]`` alphas in ``[0, 1]``.

    >>> a = DiagGaussian(jnp.zeros((2, 1)), jnp.ones((2, 1)))
    >>> p = DiagGaussian(jnp.array([[1.0], [2.0]]), jnp.ones((2, 1)))
    >>> kl_budget_alpha_per_state(a, p, 0.125).round(3)  # KL = alpha^2 m^2 / 2
    Array([0.5 , 0.25], dtype=float32)
    """
    _check_pair(actor, prior)
    _check_budget(budget)
    check_int("n_iters", n_iters)
    shape = jnp.broadcast_shapes(jnp.shape(actor.mean), jnp.shape(prior.mean))[:-1]
    dtype = jnp.result_type(actor.mean, float)
    kl = _mean_kl if mean_only else _kl
    return _bisect(lambda al: kl(poe(actor, prior, al), actor), budget, shape, n_iters, dtype)


def calibrate_kl_budget(actor: DiagGaussian, fraction: float = 0.5) -> jax.Array:
    r"""Returns a KL budget in nats calibrated on the actor alone: ``fraction`` times the median
    KL between the actor at two of the data's states.

    .. math::

       B = f \cdot \operatorname{median}_i
         \mathrm{KL}\big(\pi_A(\cdot \mid s_{j(i)}) \,\|\, \pi_A(\cdot \mid s_i)\big),
       \qquad j(i) = (i + \lfloor n / 2 \rfloor) \bmod n,

    with :math:`f` the ``fraction``: each state is paired with the one half the list away, so for
    states drawn at random from the data the pairs are random pairs of data states. The budget is
    the actor's own scale of variation over the data, in nats of its own likelihood space: a
    composition held to :math:`B` (:func:`kl_budget_alpha`) moves the actor, on average over the
    states, by at most ``fraction`` of what separates the actor's own actions at two typical states.
    It is calibrated per likelihood space (a pre-tanh and an action-space actor each set their own)
    and is invariant to the action space's units (an affine rescaling of the actions scales means
    and stds alike and leaves every KL unchanged).

    It reads no reward, and no prior: the signature takes the actor's Gaussians only, so the
    budget is fixed before any return or any prior is seen.

    Args:
      actor: ``[n, d]`` the actor's Gaussians at ``n >= 2`` data states (in random order).
      fraction: a finite number ``> 0``: the share of the actor's between-state KL the
        composition may spend.

    Returns:
      a scalar budget in nats (> 0 unless the actor is the same at every paired state, which
      raises for concrete inputs).

    >>> a = DiagGaussian(jnp.array([[0.0], [1.0], [0.0], [3.0]]), jnp.ones((4, 1)))
    >>> float(calibrate_kl_budget(a, 0.5))  # pair KLs 0, 2, 0, 2 (m^2 / 2): median 1
    0.5
    """
    _check_gaussian("actor", actor)
    shape = jnp.shape(actor.mean)
    if len(shape) != 2 or shape[0] < 2:
        raise ValueError(f"actor: expected Gaussians at n >= 2 states, shape [n, d], got {shape}")
    real = isinstance(fraction, numbers.Real) and not isinstance(fraction, bool)
    if not (real and math.isfinite(fraction) and fraction > 0):
        raise ValueError(f"fraction: expected a finite number > 0, got {fraction!r}")
    n = shape[0]
    other = jax.tree.map(lambda x: jnp.roll(x, -(n // 2), axis=0), actor)
    budget = fraction * jnp.median(_kl(other, actor))
    if not is_traced(budget) and not float(budget) > 0:
        raise ValueError(
            "actor: its Gaussians are the same at the paired states (a between-state KL of "
            "0), so no budget can be calibrated on it"
        )
    return budget
