"""Synthetic meta-distributions: clouds drawn from random vMF mixtures (S^2) and wrapped-normal
mixtures (T^2)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hexad.geometry import Sphere, Torus

__all__ = ["vmf_mixture_clouds", "wrapped_normal_mixture_clouds"]


def vmf_mixture_clouds(
    key: jax.Array,
    n_clouds: int,
    n_points: int,
    *,
    n_modes: int = 3,
    kappa_range: tuple[float, float] = (10.0, 40.0),
    dim: int = 3,
) -> jax.Array:
    r"""Returns ``[n_clouds, n_points, dim]`` clouds on :math:`S^{\mathrm{dim}-1}`, one vMF mixture
    each.

    Each cloud draws ``n_modes`` uniform mean directions, concentrations log-uniform in
    ``kappa_range`` and Dirichlet(1) mixture weights, then ``n_points`` i.i.d. points.

    Args:
      key: PRNG key.
      n_clouds, n_points, n_modes, dim: sizes (static).
      kappa_range: ``(low, high)`` concentration range (static).

    >>> vmf_mixture_clouds(jax.random.key(0), 2, 5).shape
    (2, 5, 3)
    """
    s = Sphere(dim)
    lo, hi = math.log(kappa_range[0]), math.log(kappa_range[1])

    def one(k):
        km, kk, kw, kc, kp = jax.random.split(k, 5)
        mus = s.random_uniform(km, (n_modes,))
        kappas = jnp.exp(jax.random.uniform(kk, (n_modes,), minval=lo, maxval=hi))
        w = jax.random.dirichlet(kw, jnp.ones(n_modes))
        comp = jax.random.categorical(kc, jnp.log(w), shape=(n_points,))
        keys = jax.random.split(kp, n_modes)
        pts = jax.vmap(lambda kk_, mu, ka: s.random_vmf(kk_, mu, ka, (n_points,)))(
            keys, mus, kappas
        )  # [n_modes, n_points, dim]
        return pts[comp, jnp.arange(n_points)]

    return jax.vmap(one)(jax.random.split(key, n_clouds))


def wrapped_normal_mixture_clouds(
    key: jax.Array,
    n_clouds: int,
    n_points: int,
    *,
    n_modes: int = 3,
    scale_range: tuple[float, float] = (0.15, 0.5),
    seam_width: float | None = None,
    dim: int = 2,
) -> jax.Array:
    r"""Returns ``[n_clouds, n_points, dim]`` clouds of angles on :math:`T^{\mathrm{dim}}`.

    Each cloud is a mixture of ``n_modes`` isotropic wrapped normals with uniform centres,
    scales uniform in ``scale_range`` and Dirichlet(1) weights. With ``seam_width = w``,
    every centre angle is uniform within ``w`` of the seam ``+-pi`` instead, so the clouds
    straddle it (where the torus and the angle chart ``R^dim`` differ).

    Args:
      key: PRNG key.
      n_clouds, n_points, n_modes, dim: sizes (static).
      scale_range: ``(low, high)`` of the modes' scales (static).
      seam_width: ``None`` or the half-width ``> 0`` of the band of centres around the seam.

    >>> wrapped_normal_mixture_clouds(jax.random.key(0), 2, 5).shape
    (2, 5, 2)
    """
    if seam_width is not None and not seam_width > 0:
        raise ValueError(f"seam_width: expected None or a number > 0, got {seam_width!r}")
    t = Torus(dim)

    def one(k):
        km, ks, kw, kc, kp = jax.random.split(k, 5)
        mus = t.random_uniform(km, (n_modes,))
        if seam_width is not None:
            mus = t.proj(math.pi + seam_width * mus / math.pi)
        scales = jax.random.uniform(ks, (n_modes,), minval=scale_range[0], maxval=scale_range[1])
        w = jax.random.dirichlet(kw, jnp.ones(n_modes))
        comp = jax.random.categorical(kc, jnp.log(w), shape=(n_points,))
        z = jax.random.normal(kp, (n_points, dim))
        return t.proj(mus[comp] + scales[comp][:, None] * z)

    return jax.vmap(one)(jax.random.split(key, n_clouds))
