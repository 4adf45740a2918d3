"""Small generators ``p0`` for Pref-MH's latent and independent proposals.

A judge tilts a generator: the chains sample ``pi ∝ p0 exp(s)``, proposing from ``p0`` itself
(:func:`~hexad.prefmh.independent`) or moving in its latent space
(:func:`~hexad.prefmh.latent_random_walk` with :func:`~hexad.prefmh.pullback_judge`). Two
generators with closed-form maximum-likelihood fits:

- :func:`fit_ppca`: probabilistic PCA (Tipping & Bishop 1999), ``x = mean + W z + noise`` with
  ``z ~ N(0, I)``; decode a latent with :meth:`PPCA.decode`.
- :func:`fit_trigram`: a smoothed token trigram model; draw sequences with
  :func:`trigram_sampler`.

The fits are host-side NumPy in float64 (a one-off closed form on data already on the host,
like :func:`hexad.cvxclust.knn_gaussian_weights`; not traceable); what they return is used
inside jitted chains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import check_int, check_positive

__all__ = ["PPCA", "Trigram", "fit_ppca", "fit_trigram", "trigram_sampler"]


class PPCA(NamedTuple):
    r"""A probabilistic-PCA model (NumPy float64 arrays).

    Attributes:
      mean: ``[D]`` data mean.
      weight: ``[D, d]`` loading matrix ``W``.
      noise: ``[]`` isotropic noise variance :math:`\sigma^2`.
    """

    mean: np.ndarray
    weight: np.ndarray
    noise: float

    def decode(self, z: jax.Array) -> jax.Array:
        """Returns the noise-free generator output ``mean + W z`` ``[D]`` for ``z`` ``[d]``.

        Jittable; the parameters are cast to ``z``'s dtype.
        """
        z = jnp.asarray(z)
        return jnp.asarray(self.mean, z.dtype) + jnp.asarray(self.weight, z.dtype) @ z


def fit_ppca(x, latent_dim: int) -> PPCA:
    r"""Returns the probabilistic PCA of ``x`` in Tipping & Bishop's (1999) closed form.

    With :math:`S` the unbiased sample covariance (``np.cov``, divisor :math:`n - 1`) and
    :math:`l_1 \ge \dots \ge l_D` its eigenvalues (eigenvectors :math:`U`),

    .. math::

       \sigma^2 = \frac{1}{D - d} \sum_{i > d} l_i, \qquad
       W = U_d \operatorname{diag}\big(\sqrt{\max(l_i - \sigma^2, 0)}\big)_{i \le d}

    (the rotation left free by the likelihood is taken as the identity). The model covariance
    :math:`W W^\top + \sigma^2 I` keeps the top :math:`d` eigenpairs of :math:`S`. This is *not*
    exactly the maximum-likelihood fit: Tipping & Bishop's :math:`S` divides by :math:`n`, so
    :math:`W W^\top + \sigma^2 I` here is the ML one times :math:`n / (n - 1)` (same :math:`U`;
    :math:`\sigma^2` and :math:`l_i - \sigma^2` scaled by it).

    Args:
      x: ``[n, D]`` data, ``n >= 2``.
      latent_dim: ``d`` (static), ``1 <= d < D``.

    >>> x = np.random.default_rng(0).normal(size=(200, 5))
    >>> model = fit_ppca(x, 2)
    >>> model.weight.shape, model.decode(jnp.zeros(2)).shape
    ((5, 2), (5,))
    """
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] < 2 or not np.isfinite(x).all():
        raise ValueError(f"x: expected a finite [n >= 2, D] array, got shape {x.shape}")
    d = check_int("latent_dim", latent_dim, 1, x.shape[1] - 1)
    mean = x.mean(0)
    evals, evecs = np.linalg.eigh(np.cov(x - mean, rowvar=False))
    evals, evecs = evals[::-1], evecs[:, ::-1]
    noise = evals[d:].mean()
    weight = evecs[:, :d] * np.sqrt(np.maximum(evals[:d] - noise, 0.0))
    return PPCA(mean=mean, weight=weight, noise=float(noise))


class Trigram(NamedTuple):
    """A token trigram model over ``V`` symbols (arrays of the default float dtype).

    Attributes:
      log_start: ``[V, V]`` log-probabilities of the first two tokens.
      log_cond: ``[V, V, V]`` ``log p(c | a, b)``.
    """

    log_start: jax.Array
    log_cond: jax.Array


def fit_trigram(tokens, vocab_size: int, smoothing: float) -> Trigram:
    """Returns the add-``smoothing`` trigram model of a token sequence.

    ``p(c | a, b) ∝ count(a, b, c) + smoothing`` and, for the first two tokens,
    ``p(a, b) ∝ count(a, b) + smoothing`` (bigram counts over the whole sequence).

    Args:
      tokens: ``[T]`` int token ids in ``[0, vocab_size)``, ``T >= 3``.
      vocab_size: ``V`` (static).
      smoothing: pseudo-count ``> 0``.

    >>> model = fit_trigram(np.array([0, 1, 0, 1, 0]), 2, 0.5)
    >>> round(float(jnp.exp(model.log_cond[0, 1, 0])), 4)  # (2 + 0.5) / (2 + 2 * 0.5)
    0.8333
    """
    v = check_int("vocab_size", vocab_size)
    smoothing = check_positive("smoothing", smoothing)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or tokens.shape[0] < 3 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"tokens: expected a [T >= 3] int array, got {tokens.dtype} {tokens.shape}"
        )
    if tokens.min() < 0 or tokens.max() >= v:
        raise ValueError(f"tokens: expected ids in [0, {v}), got [{tokens.min()}, {tokens.max()}]")
    tri = np.zeros((v, v, v))
    np.add.at(tri, (tokens[:-2], tokens[1:-1], tokens[2:]), 1.0)
    tri += smoothing
    bi = np.zeros((v, v))
    np.add.at(bi, (tokens[:-1], tokens[1:]), 1.0)
    bi += smoothing
    ftype = jnp.result_type(float)
    return Trigram(
        log_start=jnp.asarray(np.log(bi / bi.sum()), ftype),
        log_cond=jnp.asarray(np.log(tri / tri.sum(axis=2, keepdims=True)), ftype),
    )


def trigram_sampler(model: Trigram, length: int) -> Callable[[jax.Array], jax.Array]:
    """Returns ``sample(key) -> [length]`` int32, a sequence drawn from ``model``.

    Inverse-CDF sampling, one uniform per token (cheaper than Gumbel-max over ``V``); pure
    and jittable, for :func:`~hexad.prefmh.independent`.

    Args:
      model: a :class:`Trigram`.
      length: (static) tokens per sequence, ``>= 2``.

    >>> sample = trigram_sampler(fit_trigram(np.array([0, 1, 0, 1, 0]), 2, 0.5), 6)
    >>> sample(jax.random.key(0)).shape
    (6,)
    """
    length = check_int("length", length, lo=2)
    v = model.log_start.shape[0]
    cdf_start = jnp.cumsum(jnp.exp(model.log_start.reshape(-1)))
    cdf_cond = jnp.cumsum(jnp.exp(model.log_cond), axis=-1)

    def draw(u, cdf):
        return jnp.minimum(jnp.sum(u * cdf[-1] > cdf), cdf.shape[0] - 1)

    def sample(key):
        u = jax.random.uniform(key, (length - 1,))
        first = draw(u[0], cdf_start)
        a, b = first // v, first % v

        def body(carry, ui):
            a, b = carry
            c = draw(ui, cdf_cond[a, b])
            return (b, c), c

        _, rest = jax.lax.scan(body, (a, b), u[1:])
        return jnp.concatenate([jnp.stack([a, b]), rest]).astype(jnp.int32)

    return sample
