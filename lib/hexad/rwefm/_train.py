"""RWEFM training: noise model, minibatch OT pairing of clouds, loss, init/step, samplers.

RWEFM (Riemannian Wasserstein entropic flow matching) regresses a vector field on clouds onto
the velocity of McCann's interpolation ``x_i(t) = exp_{x_i}(t log_{x_i} T(x_i))`` between a
noise cloud and a data cloud, where ``T`` is the Riemannian entropic map (see
:mod:`hexad.ot`). The Euclidean baseline is the same code with ``Euclidean(d)`` as the manifold.

The trainer follows :mod:`hexad._base`: :func:`make_trainer` returns an
:class:`hexad._base.Algorithm` ``(init, step)`` over a :class:`hexad._base.TrainState`, with the
mesh convention ``mesh=None, axis="data"``; :func:`make_loss` is the same objective without the
update (for evaluation), and :func:`make_train` scans ``n_steps`` minibatch steps in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jax.sharding import Mesh
from ott.geometry import geometry as ott_geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn

from hexad import sharding
from hexad._base import DATA_AXIS, Algorithm, TrainState, check_int, check_positive, check_unit
from hexad.geometry import Euclidean, Manifold, check_points
from hexad.ot import EntropicMap, chamfer, check_settings, greedy_matching, mccann_interpolation

__all__ = [
    "NOISE_KINDS",
    "PAIRINGS",
    "CloudBatch",
    "NoiseModel",
    "Sampler",
    "TrainInfo",
    "TrainState",
    "calibrate_map_iterations",
    "check_noise_kind",
    "euclidean_baseline",
    "fit_noise",
    "flow_matching_loss",
    "make_loss",
    "make_sampler",
    "make_train",
    "make_trainer",
    "match_clouds",
    "pair_clouds",
    "shard_batch",
    "validate_batch",
]

Array = jax.Array


class CloudBatch(NamedTuple):
    """A batch of clouds.

    Attributes:
      points: ``[B, n, d]`` float, points on the manifold (anything finite where padded).
      weights: ``[B, n]`` float, non-negative point masses; zero marks padding.
      labels: ``[B]`` int32 class labels, or ``None``.
    """

    points: Array
    weights: Array
    labels: Array | None = None


class TrainInfo(NamedTuple):
    """Diagnostics of one step (all ``[]``).

    Attributes:
      loss: the weighted flow-matching loss.
      grad_norm: global gradient norm.
      map_converged: fraction of the batch's entropic maps whose Sinkhorn converged.
      map_iters: mean Sinkhorn iterations of the maps.
    """

    loss: Array
    grad_norm: Array
    map_converged: Array
    map_iters: Array


class Sampler(NamedTuple):
    """``sample(params, x0 [B, n, d], mask [B, n], labels [B] | None) -> [B, n, d]``."""

    sample: Callable


NOISE_KINDS = ("ambient_gaussian", "uniform", "wrapped_normal")
"""The kinds of :class:`NoiseModel`, the source distribution of clouds."""


@struct.dataclass
class NoiseModel:
    """The source distribution of clouds (one of :data:`NOISE_KINDS`).

    - ``"ambient_gaussian"``: each cloud is Gaussian in the manifold's coordinates (ambient
      ``R^d`` for the sphere, the angle chart for the torus) with mean ``loc`` and Cholesky
      factor ``chol_mean + chol_std * Z`` (``Z`` entrywise standard normal, one draw per
      cloud), projected onto M (``manifold.proj``): the reference's default, fitted by
      :func:`fit_noise` to the per-cloud means and Cholesky factors of the data.
    - ``"uniform"``: i.i.d. uniform points on a compact M.
    - ``"wrapped_normal"``: i.i.d. ``manifold.random_normal(loc, scale)``.

    The samples lie on ``manifold``; a Euclidean baseline trained in the ambient coordinates
    takes the same model (same clouds), so both arms start from the same noise.

    Attributes:
      manifold: the manifold the noise lives on (static).
      kind: one of :data:`NOISE_KINDS` (static).
      loc: ``[d]`` centre (ambient mean or wrapped-normal centre), or ``None`` (the origin).
      scale: ``[]`` the wrapped normal's tangent standard deviation.
      chol_mean, chol_std: ``[d, d]`` mean and spread of the per-cloud Cholesky factors.

    >>> from hexad.geometry import Sphere
    >>> NoiseModel(Sphere(3)).sample(jax.random.key(0), (2, 4)).shape
    (2, 4, 3)
    """

    manifold: Manifold = struct.field(pytree_node=False)
    kind: str = struct.field(pytree_node=False, default="uniform")
    loc: Array | None = None
    scale: Array | float = 1.0
    chol_mean: Array | None = None
    chol_std: Array | None = None

    def sample(self, key: Array, shape: tuple[int, ...]) -> Array:
        """Returns noise points ``[*shape, d]``; ``shape = (*clouds, n_points)``."""
        check_noise_kind(self.kind)
        d = self.manifold.dim
        loc = jnp.zeros(d) if self.loc is None else self.loc
        if self.kind == "uniform":
            return self.manifold.random_uniform(key, shape)
        if self.kind == "wrapped_normal":
            return self.manifold.random_normal(key, loc, self.scale, shape)
        if self.chol_mean is None or self.chol_std is None:
            raise ValueError("noise: an ambient_gaussian NoiseModel needs chol_mean and chol_std")
        kc, kz = jax.random.split(key)
        draw = jax.random.normal(kc, (*shape[:-1], d, d))
        chol = (
            jnp.broadcast_to(self.chol_mean, draw.shape)
            + jnp.broadcast_to(self.chol_std, draw.shape) * draw
        )
        z = jnp.einsum("...nj,...ij->...ni", jax.random.normal(kz, (*shape, d)), chol)
        return self.manifold.proj(z + jnp.broadcast_to(loc, z.shape))


def check_noise_kind(kind: Any) -> str:
    """Returns ``kind`` or raises a ValueError naming ``noise`` unless it is in NOISE_KINDS.

    >>> check_noise_kind("gaussian")
    Traceback (most recent call last):
    ...
    ValueError: noise: expected one of (...), got 'gaussian'
    """
    if kind not in NOISE_KINDS:
        raise ValueError(f"noise: expected one of {NOISE_KINDS}, got {kind!r}")
    return kind


def fit_noise(manifold: Manifold, batch: CloudBatch, kind: str = "ambient_gaussian") -> NoiseModel:
    r"""Returns a :class:`NoiseModel` of ``kind`` fitted to the training clouds (host side).

    - ``"ambient_gaussian"``: per cloud :math:`c`, the mass-weighted mean :math:`\mu_c` and
      covariance :math:`S_c` of the real points' coordinates; ``loc`` the mean over clouds of
      :math:`\mu_c`, ``chol_mean`` / ``chol_std`` the mean and standard deviation over clouds of
      :math:`\operatorname{chol}(S_c + 10^{-5} I)` (the reference's ``ambient_gaussian``; on the
      torus in the angle chart, as there).
    - ``"wrapped_normal"``: ``loc = manifold.mean`` of all real points (extrinsic: projected
      on the sphere, circular per angle on the torus), ``scale`` the root mean squared
      geodesic distance to it over :math:`\sqrt{\text{intrinsic\_dim}}`.
    - ``"uniform"``: nothing to fit.

    Args:
      manifold: the manifold the noise lives on.
      batch: the training clouds (points on ``manifold``).
      kind: one of :data:`NOISE_KINDS`.

    >>> from hexad.geometry import Euclidean
    >>> b = CloudBatch(jnp.ones((1, 3, 2)), jnp.ones((1, 3)))
    >>> fit_noise(Euclidean(2), b, "wrapped_normal").loc.tolist()
    [1.0, 1.0]
    """
    check_noise_kind(kind)
    validate_batch(manifold, batch)
    if kind == "uniform":
        return NoiseModel(manifold, kind)
    if kind == "wrapped_normal":
        real = (batch.weights.reshape(-1) > 0).astype(batch.points.dtype)
        # padding (any finite value) is replaced by a point of M before its zero weight is used
        x = jnp.where(
            real[:, None] > 0,
            batch.points.reshape(-1, manifold.dim),
            manifold.proj(jnp.ones(manifold.dim, batch.points.dtype)),
        )
        loc = manifold.mean(x, real)
        w = real / jnp.sum(real)
        d2 = manifold.sqdist(jnp.broadcast_to(loc, x.shape), x)
        scale = jnp.sqrt(jnp.sum(w * d2) / manifold.intrinsic_dim)
        return NoiseModel(manifold, kind, loc, scale)
    x = jnp.where(batch.weights[..., None] > 0, batch.points, 0.0)  # padding (finite) to 0
    w = jnp.where(batch.weights > 0, batch.weights, 0.0)
    w = w / jnp.sum(w, axis=1, keepdims=True)
    mu = jnp.einsum("bn,bnd->bd", w, x)
    dev = x - mu[:, None, :]
    cov = jnp.einsum("bn,bni,bnj->bij", w, dev, dev)
    chol = jnp.linalg.cholesky(cov + 1e-5 * jnp.eye(manifold.dim)[None])
    return NoiseModel(
        manifold,
        kind,
        jnp.mean(mu, axis=0),
        1.0,
        jnp.mean(chol, axis=0),
        jnp.std(chol, axis=0),
    )


def validate_batch(manifold: Manifold, batch: CloudBatch, name: str = "batch") -> None:
    """Raises ValueError/TypeError naming ``name`` for malformed clouds (host side).

    Checks ``points [B, n, d]`` (``d = manifold.dim``) finite everywhere and on ``manifold``
    where the weight is positive (padded points may hold any finite value), ``weights [B, n]``
    finite, non-negative and not all zero per cloud, and ``labels [B]`` if given.

    >>> from hexad.geometry import Sphere
    >>> validate_batch(Sphere(3), CloudBatch(2.0 * jnp.ones((1, 2, 3)), jnp.ones((1, 2))))
    Traceback (most recent call last):
    ...
    ValueError: batch.points: expected points on Sphere(dim=3) (error <= 0.0001), got points ...
    """
    if not isinstance(batch, CloudBatch):
        raise TypeError(f"{name}: expected a CloudBatch, got {type(batch).__name__}")
    pts, w = batch.points, batch.weights
    if jnp.ndim(pts) != 3:
        raise ValueError(f"{name}.points: expected shape [B, n, d], got {jnp.shape(pts)}")
    if jnp.shape(pts)[-1] != manifold.dim:
        raise ValueError(
            f"{name}.points: expected shape [B, n, {manifold.dim}] for {manifold}, got "
            f"{jnp.shape(pts)}"
        )
    if jnp.shape(w) != jnp.shape(pts)[:2]:
        raise ValueError(f"{name}.weights: expected shape {jnp.shape(pts)[:2]}, got {jnp.shape(w)}")
    bad = int(np.sum(~np.isfinite(np.asarray(pts))))
    if bad:
        raise ValueError(f"{name}.points: expected finite values, got {bad} NaN/inf")
    mask = jnp.asarray(w) > 0
    # padded points may hold anything finite; check the real ones only
    filled = jnp.where(mask[..., None], pts, manifold.proj(jnp.ones(manifold.dim)))
    check_points(manifold, filled, f"{name}.points")
    if not bool(jnp.all(jnp.isfinite(w))) or bool(jnp.any(jnp.asarray(w) < 0)):
        raise ValueError(f"{name}.weights: expected finite non-negative weights")
    if bool(jnp.any(jnp.sum(w, axis=-1) <= 0)):
        raise ValueError(f"{name}.weights: expected a positive total per cloud, got all-zero")
    if batch.labels is not None and jnp.shape(batch.labels) != jnp.shape(pts)[:1]:
        raise ValueError(
            f"{name}.labels: expected shape {jnp.shape(pts)[:1]}, got {jnp.shape(batch.labels)}"
        )


def flow_matching_loss(v_pred: Array, v_target: Array, weights: Array) -> Array:
    r"""Returns the mass-weighted tangent squared error, averaged over clouds.

    .. math::

       \frac{1}{B} \sum_b \frac{\sum_i a_{bi} \|v^{\text{pred}}_{bi} - v^{\text{target}}_{bi}\|^2}
         {\sum_i a_{bi}}

    with :math:`a` the ``weights`` (the ambient Euclidean norm is the Riemannian norm of tangent
    vectors on the sphere, the flat torus and :math:`\mathbb{R}^d`).

    Args:
      v_pred, v_target: ``[B, n, d]``.
      weights: ``[B, n]`` point masses.

    >>> flow_matching_loss(jnp.ones((1, 2, 1)), jnp.zeros((1, 2, 1)), jnp.ones((1, 2))).item()
    1.0
    """
    a = weights / jnp.sum(weights, axis=-1, keepdims=True)
    err = jnp.sum(jnp.square(v_pred - v_target), axis=-1)
    return jnp.mean(jnp.sum(a * err, axis=-1))


def pair_clouds(
    key: Array,
    manifold: Manifold,
    noise: Array,
    noise_w: Array,
    data: Array,
    data_w: Array,
    *,
    epsilon: float = 0.05,
    inner_iterations: int = 20,
    plan_epsilon: float = 0.01,
    rows_per_block: int | None = None,
) -> Array:
    """Returns ``[B]`` indices into ``noise`` so noise cloud ``idx[j]`` pairs with data cloud ``j``.

    Cloud-level minibatch OT: the ``[B, B]`` cost between clouds is the entropic OT cost
    (ott-jax Sinkhorn with ``inner_iterations`` iterations, vmapped over all pairs) for
    :math:`d_M^2`; a second ott-jax Sinkhorn on that cost (``plan_epsilon`` relative to its mean)
    gives a plan, and each data cloud draws its noise cloud from its column of the plan
    (with replacement, as in minibatch OT flow matching, arXiv:2302.00482).

    Args:
      key: PRNG key.
      manifold: the manifold (static).
      noise: ``[B, n, d]``, ``noise_w``: ``[B, n]`` noise clouds and masses (noise cloud
        ``i`` is costed against data cloud ``j`` with masses ``noise_w[i] * (data_w[j] > 0)``).
      data: ``[B, n, d]``, ``data_w``: ``[B, n]`` data clouds and masses.
      epsilon: entropic regularisation of the point-level costs (static).
      inner_iterations: Sinkhorn iterations per point-level cost (static).
      plan_epsilon: regularisation of the cloud-level plan, relative to the mean cost (static).
      rows_per_block: noise clouds whose ``B`` point-level solves run together (static).
        ``None`` picks all ``B`` on accelerators and, on CPU, as many as keep a block near
        ``2**20`` cost entries: the :math:`B^2` solves are memory-bound there, and blocks that stay
        in cache run faster than one ``[B, B, n, m]`` batch (same result, exactly).

    >>> from hexad.geometry import Torus
    >>> x = Torus(2).random_uniform(jax.random.key(0), (3, 4))
    >>> w = jnp.ones((3, 4))
    >>> pair_clouds(jax.random.key(1), Torus(2), x, w, x, w).shape
    (3,)
    """
    solver = sinkhorn.Sinkhorn(
        max_iterations=inner_iterations, min_iterations=inner_iterations, inner_iterations=1
    )

    def cost(x, a, y, b):
        c = manifold.pairwise_sqdist(x, y)
        geom = ott_geometry.Geometry(cost_matrix=c, epsilon=epsilon)
        a = a / jnp.sum(a)
        b = b / jnp.sum(b)
        with jax.numpy_rank_promotion("allow"):
            out = solver(linear_problem.LinearProblem(geom, a=a, b=b))
        return jnp.sum(out.matrix * c)

    # noise cloud i is costed under data cloud j's padding mask, the mask it is used with
    row = jax.vmap(lambda x, a, y, b: cost(x, a * (b > 0), y, b), in_axes=(None, None, 0, 0))
    n_clouds = noise.shape[0]
    if rows_per_block is None:
        per_row = n_clouds * noise.shape[1] * data.shape[1]
        on_cpu = jax.default_backend() == "cpu"
        rows_per_block = max(1, 2**20 // per_row) if on_cpu else n_clouds
    cmat = jax.lax.map(
        lambda xa: row(xa[0], xa[1], data, data_w),
        (noise, noise_w),
        batch_size=min(int(rows_per_block), n_clouds),
    )
    geom = ott_geometry.Geometry(cost_matrix=cmat, epsilon=plan_epsilon * jnp.mean(cmat) + 1e-12)
    with jax.numpy_rank_promotion("allow"):
        plan = sinkhorn.Sinkhorn(max_iterations=200)(linear_problem.LinearProblem(geom)).matrix
    logits = jnp.log(jnp.maximum(plan.T, 1e-30))  # [B data, B noise]
    return jax.random.categorical(key, logits, axis=-1)


PAIRINGS = ("matching", "sample", "none")
"""How a minibatch pairs noise clouds with data clouds, by a one-to-one matching
(:func:`match_clouds`), by a draw from the cloud-level plan (:func:`pair_clouds`), or as drawn."""


def match_clouds(
    manifold: Manifold,
    noise: Array,
    data: Array,
    data_w: Array,
    *,
    plan_epsilon: float = 0.01,
) -> Array:
    """Returns ``[B]`` indices, a permutation: noise cloud ``idx[j]`` pairs with data cloud ``j``.

    Cloud-level minibatch OT as in the RWEFM reference: the ``[B, B]`` cost is the Chamfer
    cost for :math:`d_M^2` (:func:`hexad.ot.chamfer`, each noise cloud costed under the data
    cloud's padding mask, the mask it is then used with), an ott-jax Sinkhorn plan on it with
    ``plan_epsilon`` relative to its largest entry, rounded to a one-to-one matching
    (:func:`hexad.ot.greedy_matching`).

    Args:
      manifold: the manifold (static).
      noise: ``[B, n, d]`` noise clouds.
      data: ``[B, n, d]`` data clouds with masses ``data_w [B, n]``.
      plan_epsilon: the cloud-level plan's regularisation, relative to the largest cost
        (static).

    >>> from hexad.geometry import Torus
    >>> x = Torus(2).random_uniform(jax.random.key(0), (3, 4))
    >>> sorted(match_clouds(Torus(2), x, x, jnp.ones((3, 4))).tolist())
    [0, 1, 2]
    """

    def cost(x, y, b):
        return chamfer(manifold, x, y, (b > 0).astype(x.dtype), b)

    cmat = jax.vmap(jax.vmap(cost, in_axes=(None, 0, 0)), in_axes=(0, None, None))(
        noise, data, data_w
    )
    geom = ott_geometry.Geometry(cost_matrix=cmat, epsilon=plan_epsilon * jnp.max(cmat) + 1e-12)
    with jax.numpy_rank_promotion("allow"):
        plan = sinkhorn.Sinkhorn(max_iterations=500)(linear_problem.LinearProblem(geom)).matrix
    return greedy_matching(plan)


def calibrate_map_iterations(
    key: Array,
    manifold: Manifold,
    noise: NoiseModel,
    clouds: Array,
    weights: Array,
    *,
    epsilon: float = 0.002,
    scale_cost: str | None = "max_cost",
    target: float = 0.95,
    n_pairs: int = 100,
    max_iterations: int = 5000,
    inner_iterations: int = 10,
    pairing: str = "none",
    batch_size: int = 16,
) -> tuple[int, float]:
    """Returns ``(iterations, converged_fraction)``: the smallest Sinkhorn bound at which at
    least ``target`` of ``n_pairs`` sampled noise/data maps converge (host side).

    The reference's automatic rule: ``n_pairs`` data clouds drawn at random (with
    replacement) are each mapped from a fresh noise cloud with :class:`hexad.ot.EntropicMap`
    bounded by ``max_iterations``, the noise paired with the data as the trainer pairs it
    (``pairing``, within groups of ``batch_size`` clouds, its minibatches); the returned
    bound is the smallest multiple of
    ``inner_iterations`` by which a ``target`` fraction had converged, or ``max_iterations``
    when fewer than that converge at all (then ``converged_fraction < target`` says so).
    A vmapped Sinkhorn runs until its slowest pair stops, so the bound sets a step's cost.

    Args:
      key: PRNG key.
      manifold: the geometry the maps are computed in (``Euclidean(d)`` for the baseline).
      noise: the :class:`NoiseModel` (its samples must be valid points of ``manifold``).
      clouds: ``[N, n, d]`` training clouds, ``weights``: ``[N, n]``.
      epsilon, scale_cost: the maps' regularisation (as :class:`hexad.ot.EntropicMap`).
      target: the fraction of maps that must converge, in ``(0, 1]``.
      n_pairs, max_iterations, inner_iterations: sizes (``>= 1``).
      pairing: one of :data:`PAIRINGS`, as the trainer's; batch_size: its minibatch size.
    """
    check_unit("target", target, hi_open=False)
    check_settings(epsilon, scale_cost, max_iterations)
    n_pairs = check_int("n_pairs", n_pairs)
    inner = check_int("inner_iterations", inner_iterations)
    batch_size = min(check_int("batch_size", batch_size), n_pairs)
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing: expected one of {PAIRINGS}, got {pairing!r}")
    validate_batch(noise.manifold, CloudBatch(clouds, weights), "clouds")
    kc, kn, kp = jax.random.split(key, 3)
    n_groups = -(-n_pairs // batch_size)
    idx = jax.random.choice(kc, clouds.shape[0], (n_groups, batch_size))
    y, b = clouds[idx], weights[idx]
    x = noise.sample(kn, y.shape[:3])

    def paired(k, x, y, b):
        if pairing == "matching":
            return x[match_clouds(manifold, x, y, b)]
        if pairing == "sample":
            return x[pair_clouds(k, manifold, x, jnp.ones_like(b), y, b)]
        return x

    x = jax.jit(jax.vmap(paired))(jax.random.split(kp, n_groups), x, y, b)
    x, y, b = (v.reshape(-1, *v.shape[2:])[:n_pairs] for v in (x, y, b))
    mapper = EntropicMap(
        manifold,
        epsilon=epsilon,
        scale_cost=scale_cost,
        max_iterations=max_iterations,
        inner_iterations=inner,
    )
    a = (b > 0).astype(y.dtype)
    out = jax.jit(jax.vmap(mapper))(x, y, a, b)
    ok = np.asarray(out.converged)
    its = np.where(ok, np.asarray(out.n_iters), np.iinfo(np.int32).max)
    frac = int(np.sum(ok)) / n_pairs
    if frac < target:
        return int(max_iterations), frac
    # the fewest converged maps m with m / n_pairs >= target, by the same float test as frac
    # (ceil(target * n_pairs) can overshoot by one: 0.55 * 100 = 55.00000000000001)
    m = next(j for j in range(1, n_pairs + 1) if j / n_pairs >= target)
    need = int(np.sort(its)[m - 1])
    return int(min(max_iterations, inner * int(np.ceil(need / inner)))), frac


def shard_batch(batch: CloudBatch, mesh: Mesh, axis: str = DATA_AXIS) -> CloudBatch:
    """Returns ``batch`` placed on ``mesh`` with its leading (cloud) axis split along ``axis``.

    Any mesh is accepted (``jax.make_mesh``'s Explicit axes are converted to Auto axes on the
    same devices, :func:`hexad.sharding.auto_axes`); the number of clouds must divide evenly.

    >>> from hexad.sharding import data_mesh
    >>> mesh = data_mesh(jax.devices()[:1])
    >>> shard_batch(CloudBatch(jnp.zeros((2, 3, 2)), jnp.ones((2, 3))), mesh).points.shape
    (2, 3, 2)
    """
    placement = sharding.batch_sharding(mesh, axis)
    sharding.check_divisible(placement.mesh, axis, int(jnp.shape(batch.points)[0]), "batch")
    return jax.tree.map(lambda a: jax.device_put(a, placement), batch)


def _check_settings(
    manifold, noise, epsilon, scale_cost, iterations, threshold, pairing, p_uncond
) -> None:
    if not isinstance(manifold, Manifold):
        raise TypeError(
            f"manifold: expected a hexad.geometry.Manifold, got {type(manifold).__name__}"
        )
    if not isinstance(noise, NoiseModel):
        raise TypeError(f"noise: expected a NoiseModel, got {type(noise).__name__}")
    check_noise_kind(noise.kind)
    if noise.manifold.dim != manifold.dim:
        raise ValueError(
            f"noise: expected noise of dimension {manifold.dim}, got {noise.manifold.dim}"
        )
    check_positive("epsilon", epsilon)
    check_settings(epsilon, scale_cost, 1)
    check_int("sinkhorn_iterations", iterations)
    check_positive("sinkhorn_threshold", threshold)
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing: expected one of {PAIRINGS}, got {pairing!r}")
    check_unit("p_uncond", p_uncond, lo_open=False, hi_open=False)


def _objective(
    manifold,
    model,
    noise,
    epsilon,
    scale_cost,
    iterations,
    threshold,
    pairing,
    p_uncond,
    mesh,
    axis,
):
    """The pieces :func:`make_trainer` and :func:`make_loss` share: ``constrain(tree)`` (the
    mesh constraint), ``targets(key, batch) -> (regression targets, entropic maps)`` and
    ``regress(params, targets) -> []``."""
    _check_settings(manifold, noise, epsilon, scale_cost, iterations, threshold, pairing, p_uncond)
    mapper = EntropicMap(
        manifold,
        epsilon=epsilon,
        scale_cost=scale_cost,
        threshold=threshold,
        max_iterations=iterations,
    )
    num_classes = int(getattr(model, "num_classes", 0))
    placement = None if mesh is None else sharding.batch_sharding(mesh, axis)

    def constrain(tree):
        if placement is None:
            return tree
        for a in jax.tree.leaves(tree):
            sharding.check_divisible(placement.mesh, axis, a.shape[0], "batch")
        return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, placement), tree)

    def targets(key: Array, batch: CloudBatch):
        kn, kp, kt, kl = jax.random.split(key, 4)
        data, b = batch.points, batch.weights
        mask = b > 0
        # a NaN weight is not padding (NaN > 0 is False): it makes the loss NaN, not masked
        a = jnp.where(jnp.isnan(b), jnp.nan, mask.astype(data.dtype))
        x0 = noise.sample(kn, data.shape[:2])
        if pairing == "matching":
            x0 = x0[match_clouds(manifold, x0, data, b)]
        elif pairing == "sample":
            x0 = x0[pair_clouds(kp, manifold, x0, jnp.ones_like(b), data, b)]
        x0, a, data, b = constrain((x0, a, data, b))
        out = jax.vmap(mapper)(x0, data, a, b)
        t = jax.random.uniform(kt, data.shape[:1], data.dtype)
        xt, vt = mccann_interpolation(manifold, x0, out.tangent, t[:, None, None])
        labels = batch.labels
        if labels is not None and num_classes > 0:
            drop = jax.random.bernoulli(kl, p_uncond, labels.shape)
            labels = jnp.where(drop, num_classes, labels)
        return (xt, mask, t, labels, vt, a), out

    def regress(params, tg):
        xt, mask, t, labels, vt, a = tg
        v = model.apply(params, xt, mask, t, labels)
        return flow_matching_loss(v, vt, a)

    return constrain, targets, regress


def make_trainer(
    manifold: Manifold,
    model: Any,
    optimizer: optax.GradientTransformation,
    noise: NoiseModel,
    *,
    epsilon: float = 0.002,
    scale_cost: str | None = "max_cost",
    sinkhorn_iterations: int = 1000,
    sinkhorn_threshold: float = 1e-3,
    pairing: str = "matching",
    p_uncond: float = 0.1,
    mesh: Mesh | None = None,
    axis: str = DATA_AXIS,
) -> Algorithm:
    """Returns the RWEFM trainer, an :class:`hexad._base.Algorithm` ``(init, step)``.

    ``init(key, example_batch) -> TrainState`` and ``step(key, state, batch) -> (TrainState,
    TrainInfo)`` are pure; the caller jits (or scans them with :func:`make_train`).

    One step: draw a noise cloud per data cloud (same padding mask, uniform masses), pair
    noise and data clouds (``pairing``: ``"matching"``, the Chamfer cost and a one-to-one
    matching, :func:`match_clouds`; ``"sample"``, an entropic cost and a plan sampled with
    replacement, :func:`pair_clouds`; ``"none"``), compute the Riemannian entropic map of
    every pair (vmapped ott-jax Sinkhorn, ``epsilon`` relative to each pair's largest cost
    with ``scale_cost="max_cost"``, bounded by ``sinkhorn_iterations``; see
    :func:`calibrate_map_iterations`), draw ``t ~ U(0, 1)``
    per cloud, regress ``model(x_t, mask, t, labels)`` onto McCann's velocity at ``x_t`` with
    :func:`flow_matching_loss`, and apply ``optimizer``. With labels and
    ``model.num_classes > 0``, labels are replaced by the null label with probability
    ``p_uncond`` (classifier-free guidance training). ``info.loss`` is the objective at the
    parameters before the update; :func:`make_loss` with the same arguments gives it without
    the update (``make_loss(...)(state.params, key, batch) == step(key, state, batch)[1].loss``).

    With ``mesh``, the batch is constrained to be split along ``axis`` (parameters are
    replicated); the same code runs on one device without it. Any mesh is accepted: its axes
    are made Auto (:func:`hexad.sharding.auto_axes`), and a batch whose number of clouds does
    not divide the axis raises a ValueError when the step is traced.

    Args:
      manifold: the manifold (static); ``Euclidean(d)`` gives the Euclidean baseline.
      model: a flax module called as ``model.apply(params, x, mask, t, labels)``
        (e.g. :class:`hexad.rwefm.VectorField`) (static).
      optimizer: an optax transformation (static).
      noise: the :class:`NoiseModel` (its manifold may differ from ``manifold``, e.g. the
        baseline's ``Euclidean(d)`` with noise on M; the dimensions must agree).
      epsilon: entropic regularisation of the point-level maps, ``> 0`` (static).
      scale_cost: ``"max_cost"`` (``epsilon`` relative) or ``None`` (absolute) (static).
      sinkhorn_iterations: Sinkhorn's iteration bound for the maps, ``>= 1`` (static).
      sinkhorn_threshold: Sinkhorn's marginal-error tolerance for the maps, ``> 0``
        (:class:`hexad.ot.EntropicMap`'s ``threshold``) (static).
      pairing: one of :data:`PAIRINGS` (static).
      p_uncond: label-dropout probability for CFG, in ``[0, 1]`` (static).
      mesh: optional device mesh (static).
      axis: the mesh axis that splits clouds (static).

    >>> from hexad.geometry import Torus
    >>> from hexad.rwefm import VectorField
    >>> t2 = Torus(2)
    >>> tr = make_trainer(t2, VectorField(t2, width=8, depth=1, heads=1), optax.adam(1e-3),
    ...                   NoiseModel(t2), pairing="none")
    >>> batch = CloudBatch(t2.random_uniform(jax.random.key(0), (2, 4)), jnp.ones((2, 4)))
    >>> state = tr.init(jax.random.key(1), batch)
    >>> state, info = jax.jit(tr.step)(jax.random.key(2), state, batch)
    >>> int(state.step), info.loss.shape
    (1, ())
    """
    constrain, targets, regress = _objective(
        manifold,
        model,
        noise,
        epsilon,
        scale_cost,
        sinkhorn_iterations,
        sinkhorn_threshold,
        pairing,
        p_uncond,
        mesh,
        axis,
    )

    def init(key: Array, batch: CloudBatch) -> TrainState:
        validate_batch(manifold, batch)
        b = batch.points.shape[0]
        params = model.init(
            key,
            batch.points,
            batch.weights > 0,
            jnp.zeros((b,), batch.points.dtype),
            batch.labels,
        )
        return TrainState(params, optimizer.init(params), jnp.zeros((), jnp.int32))

    def step(key: Array, state: TrainState, batch: CloudBatch) -> tuple[TrainState, TrainInfo]:
        tg, out = targets(key, constrain(batch))
        lval, grads = jax.value_and_grad(regress)(state.params, tg)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        info = TrainInfo(
            loss=lval,
            grad_norm=optax.tree.norm(grads),
            map_converged=jnp.mean(out.converged.astype(jnp.float32)),
            map_iters=jnp.mean(out.n_iters.astype(jnp.float32)),
        )
        return TrainState(params, opt_state, state.step + 1), info

    return Algorithm(init=init, step=step)


def make_loss(
    manifold: Manifold,
    model: Any,
    noise: NoiseModel,
    *,
    epsilon: float = 0.002,
    scale_cost: str | None = "max_cost",
    sinkhorn_iterations: int = 1000,
    sinkhorn_threshold: float = 1e-3,
    pairing: str = "matching",
    p_uncond: float = 0.1,
    mesh: Mesh | None = None,
    axis: str = DATA_AXIS,
) -> Callable[[Any, Array, CloudBatch], Array]:
    """Returns ``loss(params, key, batch) -> []``, the objective of :func:`make_trainer`'s step.

    The same noise, pairing, maps, times and label dropout as the step built with the same
    arguments (no optimizer) and the same ``key``, without the gradient or the update: for
    evaluating a model on held-out clouds, or comparing fields. Pure; the caller jits.

    Every argument (``manifold``, ``model``, ``noise``, ``epsilon``, ``scale_cost``,
    ``sinkhorn_iterations``, ``sinkhorn_threshold``, ``pairing``, ``p_uncond``, ``mesh``,
    ``axis``) is as for :func:`make_trainer` (all static but ``noise``).

    >>> from hexad.geometry import Torus
    >>> from hexad.rwefm import VectorField
    >>> t2 = Torus(2)
    >>> f = VectorField(t2, width=8, depth=1, heads=1)
    >>> loss = make_loss(t2, f, NoiseModel(t2), pairing="none")
    >>> batch = CloudBatch(t2.random_uniform(jax.random.key(0), (2, 4)), jnp.ones((2, 4)))
    >>> params = f.init(jax.random.key(1), batch.points, batch.weights > 0, jnp.zeros(2))
    >>> float(loss(params, jax.random.key(2), batch)) >= 0.0
    True
    """
    constrain, targets, regress = _objective(
        manifold,
        model,
        noise,
        epsilon,
        scale_cost,
        sinkhorn_iterations,
        sinkhorn_threshold,
        pairing,
        p_uncond,
        mesh,
        axis,
    )

    def loss(params, key: Array, batch: CloudBatch) -> Array:
        tg, _ = targets(key, constrain(batch))
        return regress(params, tg)

    return loss


def make_train(
    trainer: Algorithm, n_steps: int, batch_size: int, replace: bool = False
) -> Callable[..., tuple[TrainState, TrainInfo]]:
    """Returns ``train(key, state, clouds, weights, labels=None) -> (state, infos)``.

    ``n_steps`` calls of ``trainer.step`` in one ``lax.scan`` (the loop of
    :func:`hexad.policy.make_train`, for clouds): step ``s`` takes the ``s``-th key of
    ``jax.random.split(key, n_steps)``, splits it into ``(k_idx, k_step)``, draws
    ``batch_size`` clouds with ``jax.random.choice(k_idx, N, (batch_size,), replace=replace)``
    and calls ``trainer.step(k_step, state, CloudBatch(clouds[idx], weights[idx],
    labels[idx]))``. Jit ``train``; call it once per chunk (e.g. from a progress-bar loop
    with ``jax.random.fold_in(key, chunk)``). Sharding is the trainer's (its ``mesh``).

    Args:
      trainer: an ``Algorithm`` whose ``step(key, state, batch: CloudBatch)`` returns
        ``(state, info)``, e.g. :func:`make_trainer`'s (static).
      n_steps: steps per call, ``>= 1`` (static).
      batch_size: clouds per step, ``>= 1`` (static); at most ``N`` without ``replace``.
      replace: draw each minibatch with replacement (static).

    Returns:
      ``train(key, state, clouds [N, n, d], weights [N, n], labels [N] | None = None)``
      returning the final state and the stacked infos (each field ``[n_steps]``).

    >>> from hexad.geometry import Torus
    >>> from hexad.rwefm import VectorField
    >>> t2 = Torus(2)
    >>> tr = make_trainer(t2, VectorField(t2, width=8, depth=1, heads=1), optax.adam(1e-3),
    ...                   NoiseModel(t2), pairing="none")
    >>> clouds = t2.random_uniform(jax.random.key(0), (4, 5))
    >>> w = jnp.ones((4, 5))
    >>> state = tr.init(jax.random.key(1), CloudBatch(clouds[:2], w[:2]))
    >>> state, infos = jax.jit(make_train(tr, 3, 2))(jax.random.key(2), state, clouds, w)
    >>> int(state.step), infos.loss.shape
    (3, (3,))
    """
    if not callable(getattr(trainer, "step", None)):
        raise TypeError(
            f"trainer: expected an Algorithm with a step function, got {type(trainer).__name__}"
        )
    n_steps = check_int("n_steps", n_steps)
    batch_size = check_int("batch_size", batch_size)
    if not isinstance(replace, bool):
        raise TypeError(f"replace: expected a bool, got {replace!r}")

    def train(key: Array, state: Any, clouds: Array, weights: Array, labels: Array | None = None):
        if jnp.ndim(clouds) != 3:
            raise ValueError(f"clouds: expected shape [N, n, d], got {jnp.shape(clouds)}")
        n = jnp.shape(clouds)[0]
        if jnp.shape(weights) != jnp.shape(clouds)[:2]:
            raise ValueError(
                f"weights: expected shape {jnp.shape(clouds)[:2]}, got {jnp.shape(weights)}"
            )
        if labels is not None and jnp.shape(labels) != (n,):
            raise ValueError(f"labels: expected shape ({n},), got {jnp.shape(labels)}")
        if not replace and batch_size > n:
            raise ValueError(
                f"batch_size: expected at most the {n} clouds without replace, got {batch_size}"
            )

        def body(st, k):
            k_idx, k_step = jax.random.split(k)
            idx = jax.random.choice(k_idx, n, (batch_size,), replace=replace)
            sub = None if labels is None else labels[idx]
            return trainer.step(k_step, st, CloudBatch(clouds[idx], weights[idx], sub))

        return jax.lax.scan(body, state, jax.random.split(key, n_steps))

    return train


def make_sampler(
    manifold: Manifold,
    model: Any,
    *,
    n_steps: int = 100,
    method: str = "euler",
    guidance: float | None = None,
) -> Sampler:
    """Returns a :class:`Sampler` integrating the field from ``t = 0`` to ``1`` in ``lax.scan``.

    Euler: ``x <- exp_x(dt v(x, t))``. Midpoint: ``x_h = exp_x(dt/2 v(x, t))``,
    ``x <- exp_x(dt P_x v(x_h, t + dt/2))`` with ``P_x`` the tangent projection at ``x`` (a
    first-order stand-in for parallel transport). Every step ends with the manifold's ``exp``
    (which re-projects), so points stay on ``M`` to float precision. With ``guidance = w`` and
    labels, the field is ``v_null + w (v_label - v_null)`` (classifier-free guidance).

    Args:
      manifold: the manifold (static).
      model: the flax vector field (static).
      n_steps: number of steps, an int ``>= 1`` (static).
      method: ``"euler"`` or ``"midpoint"`` (static).
      guidance: CFG weight, or ``None`` (static).

    >>> from hexad.geometry import Sphere
    >>> from hexad.rwefm import VectorField
    >>> s = Sphere(3)
    >>> f = VectorField(s, width=8, depth=1, heads=1)
    >>> x0 = s.random_uniform(jax.random.key(0), (1, 4))
    >>> m = jnp.ones((1, 4), bool)
    >>> p = f.init(jax.random.key(1), x0, m, jnp.zeros(1))
    >>> make_sampler(s, f, n_steps=4).sample(p, x0, m).shape
    (1, 4, 3)
    """
    if method not in ("euler", "midpoint"):
        raise ValueError(f"method: expected 'euler' or 'midpoint', got {method!r}")
    n_steps = check_int("n_steps", n_steps)
    num_classes = int(getattr(model, "num_classes", 0))
    dt = 1.0 / n_steps

    def sample(params, x0: Array, mask: Array, labels: Array | None = None) -> Array:
        mask = mask.astype(bool)

        def field(x, t):
            tt = jnp.full(x.shape[:1], t, x.dtype)
            if guidance is None or labels is None or num_classes == 0:
                return model.apply(params, x, mask, tt, labels)
            null = jnp.full_like(labels, num_classes)
            vc = model.apply(params, x, mask, tt, labels)
            vu = model.apply(params, x, mask, tt, null)
            return vu + guidance * (vc - vu)

        def body(x, i):
            t = i * dt
            v = field(x, t)
            if method == "midpoint":
                xh = manifold.exp(x, 0.5 * dt * v)
                v = manifold.proj_tangent(x, field(xh, t + 0.5 * dt))
            return manifold.exp(x, dt * v), None

        x1, _ = jax.lax.scan(body, x0, jnp.arange(n_steps, dtype=x0.dtype))
        return x1

    return Sampler(sample=sample)


def euclidean_baseline(manifold: Manifold) -> Euclidean:
    """Returns the ambient Euclidean space of ``manifold`` (for the baseline).

    >>> from hexad.geometry import Sphere
    >>> euclidean_baseline(Sphere(3))
    Euclidean(dim=3)
    """
    return Euclidean(manifold.dim)
