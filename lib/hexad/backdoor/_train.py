"""Training loops (host loops over jitted chunks) and backdoor metrics: accuracy, ASR, RA, DER.

``apply_fn(params, x) -> logits`` is any classifier (e.g. ``SmallCNN().apply``).
:func:`make_trainer` is the :class:`hexad._base.Algorithm` shape (``init`` + ``step``, the
caller jits); :func:`minimize` and :func:`fit` are host loops over jitted chunks of steps.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from hexad import sharding
from hexad._base import DATA_AXIS, Algorithm, TrainState, check_int
from hexad.backdoor._triggers import apply_trigger, check_images, shift

__all__ = [
    "TrainInfo",
    "accuracy",
    "attack_success_rate",
    "cross_entropy",
    "defense_effectiveness_rating",
    "fit",
    "make_trainer",
    "minimize",
    "robust_accuracy",
    "target_rate",
    "sample_batch",
]


class TrainInfo(NamedTuple):
    """Diagnostics of one step: ``loss`` (float scalar) and batch ``acc`` (float scalar)."""

    loss: jax.Array
    acc: jax.Array


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Returns the mean softmax cross-entropy of ``logits`` ``[n, k]`` vs int ``labels`` ``[n]``.

    >>> float(cross_entropy(jnp.zeros((2, 4)), jnp.array([0, 1])))  # log 4
    1.386...
    """
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))


def _batch_spec(mesh: Mesh | None, axis: str):
    """The sharding of a batch's leading axis over ``axis`` of ``mesh`` (None: unsharded)."""
    if mesh is None:
        return None
    mesh = sharding.auto_axes(mesh)
    if axis not in mesh.shape:
        raise ValueError(
            f"axis: expected one of the mesh axes {tuple(mesh.axis_names)}, got {axis!r}"
        )
    return sharding.batch_sharding(mesh, axis)


def _place_rows(tree, placement: NamedSharding | None):
    """Every leaf of ``tree`` (traced) constrained to ``placement`` along its rows."""
    if placement is None:
        return tree
    return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, placement), tree)


def make_trainer(
    model,
    optimizer: optax.GradientTransformation,
    *,
    params: Any = None,
    mesh: Mesh | None = None,
    axis: str = DATA_AXIS,
) -> Algorithm:
    """Returns a plain cross-entropy trainer as an :class:`hexad._base.Algorithm`.

    ``init(key, example_batch) -> TrainState``: ``params`` if given (then ``key`` is unused:
    fine-tuning or continuing a run), else ``model.init(key, x)`` with ``x`` the batch's
    images. ``step(key, state, batch) -> (TrainState, TrainInfo)`` with ``batch = (x, y)``,
    ``x: [b, H, W, C]``, ``y: [b]`` int labels; plain SGD-style training draws no randomness,
    so ``key`` is unused (the uniform signature). The caller jits ``step``.

    Args:
      model: a flax module with ``init(key, x)`` and ``apply(params, x) -> logits``, e.g.
        :class:`SmallCNN` (static).
      optimizer: an optax transformation (static).
      params: optional initial parameters (closed over by ``init``).
      mesh: optional mesh (any axis types; converted to Auto axes with
        :func:`hexad.sharding.auto_axes`); each batch's leading axis is split along ``axis``.
      axis: the mesh axis of the batch (static); ``b`` must be divisible by its size.

    >>> from hexad.backdoor import SmallCNN
    >>> m = SmallCNN(2, (2,), 4)
    >>> tr = make_trainer(m, optax.sgd(0.1))
    >>> batch = (jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int))
    >>> st, info = jax.jit(tr.step)(jax.random.key(1), tr.init(jax.random.key(0), batch), batch)
    >>> int(st.step), round(float(info.loss), 3)
    (1, 0.693)
    """
    spec = _batch_spec(mesh, axis)

    def loss_fn(p, x, y):
        logits = model.apply(p, x)
        return cross_entropy(logits, y), jnp.mean(jnp.argmax(logits, -1) == y)

    def init(key, example_batch) -> TrainState:
        p = model.init(key, example_batch[0]) if params is None else params
        return TrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32))

    def step(key, state: TrainState, batch):
        del key  # plain SGD needs no randomness; kept for the uniform step signature
        x, y = batch
        if spec is not None:
            sharding.check_divisible(mesh, axis, x.shape[0], "batch")
            x, y = _place_rows((x, y), spec)
        (loss, acc), g = jax.value_and_grad(loss_fn, has_aux=True)(state.params, x, y)
        upd, opt_state = optimizer.update(g, state.opt_state, state.params)
        p = optax.apply_updates(state.params, upd)
        return TrainState(p, opt_state, state.step + 1), TrainInfo(loss, acc)

    return Algorithm(init, step)


def sample_batch(key, data, batch_size: int):
    """Returns ``batch_size`` rows of the pytree ``data`` (common leading axis), drawn
    uniformly with replacement.

    >>> sample_batch(jax.random.key(0), (jnp.arange(5), jnp.arange(5)), 3)[0].shape
    (3,)
    """
    n = jax.tree.leaves(data)[0].shape[0]
    idx = jax.random.randint(key, (batch_size,), 0, n)
    return jax.tree.map(lambda a: a[idx], data)


def minimize(
    key,
    params,
    loss_fn: Callable,
    data,
    optimizer: optax.GradientTransformation,
    n_steps: int,
    batch_size: int,
    chunk: int = 1,
    project: Callable | None = None,
    until: Callable | None = None,
    consts=None,
):
    """Returns ``(params, losses [n_steps])`` after ``n_steps`` of ``optimizer``.

    Each step draws a minibatch of ``batch_size`` rows of ``data`` and differentiates
    ``loss_fn(params, key, batch)``. This loop is shared by fitting and every fine-tuning
    defense.

    On a mesh, the computation follows the data: when ``data``'s rows are split over a mesh
    axis (:func:`hexad.sharding.row_placement`, e.g. a defender's :class:`DefenseData` placed with
    :func:`hexad.sharding.from_process_rows`, each process holding its own rows), every drawn
    minibatch is split the same way (``batch_size`` must then divide evenly over that axis),
    so the forward and backward passes are data-parallel and the gradients all-reduced; data
    whose rows are not split runs as before.

    The steps run as ``ceil(n_steps / chunk)`` calls of one jitted chunk, each ``chunk``
    steps of straight-line code (a Python loop traced once), driven from the host. Why not a
    ``lax.scan``: XLA:CPU runs convolutions inside a ``while`` loop about 15x slower than
    straight-line code, and a scan is lowered to a ``while`` loop even when it is fully
    unrolled (``unroll=True``, one trip). So do not wrap this function in ``jax.jit``. The
    chunk is one module-level jit keyed on ``loss_fn``, the optimiser's ``update``,
    ``batch_size`` and ``project``: pass the same (or equal, value-hashable) objects to reuse
    its compile (``init`` runs on the host, so optimisers that share an ``update`` and differ
    only in what ``init`` puts in the state, e.g. an ``optax.inject_hyperparams`` step size,
    share the compile).

    Args:
      key: PRNG key.
      params: initial parameters.
      loss_fn: ``loss_fn(params, key, batch) -> scalar`` (static).
      data: pytree of arrays sharing the leading axis ``[n, ...]``.
      optimizer: optax transformation (static).
      n_steps: number of steps (static).
      batch_size: rows per step (static).
      chunk: steps per jitted call (static); larger compiles longer and runs faster.
      project: optional ``project(params) -> params`` applied after every update (static),
        e.g. clipping masks to [0, 1].
      until: optional host predicate ``until(params) -> bool`` checked after every chunk;
        the loop stops early once it holds (then fewer losses are returned).
      consts: optional pytree of arrays held fixed (e.g. a teacher's parameters); when given,
        the loss is called as ``loss_fn(params, key, batch, consts)``. Pass arrays here
        rather than closing over them: closed-over arrays are compiled in as constants, so
        the same computation on other values (another model) could not reuse a compile.

    >>> p, l = minimize(jax.random.key(0), jnp.ones(2), lambda p, k, b: jnp.sum(p**2 * b),
    ...                 jnp.ones(4), optax.sgd(0.25), n_steps=3, batch_size=2)
    """
    n_steps = check_int("n_steps", n_steps)
    batch_size = check_int("batch_size", batch_size)
    chunk = check_int("chunk", chunk)
    rows = sharding.row_placement(data)
    if rows is not None:
        axes = rows.spec[0] if isinstance(rows.spec[0], tuple) else (rows.spec[0],)
        split = math.prod(rows.mesh.shape[a] for a in axes)
        if batch_size % split:
            raise ValueError(
                f"batch_size: expected a multiple of the {split} shards data's rows are split "
                f"over (mesh axes {axes}), got {batch_size}"
            )
    carry = (params, optimizer.init(params))
    keys = jax.random.split(key, n_steps)
    losses = []
    static = dict(loss_fn=loss_fn, update=optimizer.update, batch_size=batch_size,
                  project=project, rows=rows)  # fmt: skip
    for start in range(0, n_steps, chunk):
        # a short last chunk compiles once more, at its own length
        ks = keys[start : start + chunk]
        carry, l = _run_chunk(carry, ks, data, consts, has_consts=consts is not None, **static)
        losses.append(l)
        if until is not None and until(carry[0]):
            break
    return carry[0], jnp.concatenate(losses)


@functools.partial(
    jax.jit, static_argnames=("loss_fn", "update", "batch_size", "project", "has_consts", "rows")
)
def _run_chunk(carry, keys, data, consts, *, loss_fn, update, batch_size, project, has_consts,
               rows):  # fmt: skip
    """One chunk of :func:`minimize`: one step per key, as straight-line code (no ``while``).

    Module-level, so its compile cache is shared by every call with equal static arguments:
    a loss that is a value-hashable object (a frozen dataclass closing over a model) and the
    same optimiser ``update`` compile once per shape, across models, defenses and step
    sizes."""

    def one(c, k):
        p, s = c
        k1, k2 = jax.random.split(k)
        lf = (lambda q, kk, b: loss_fn(q, kk, b, consts)) if has_consts else loss_fn
        batch = _place_rows(sample_batch(k1, data, batch_size), rows)
        loss, g = jax.value_and_grad(lf)(p, k2, batch)
        upd, s = update(g, s, p)
        p = optax.apply_updates(p, upd)
        return ((project(p) if project is not None else p), s), loss

    losses = []
    for i in range(keys.shape[0]):
        carry, loss = one(carry, keys[i])
        losses.append(loss)
    return carry, jnp.stack(losses)


def fit(
    key,
    params,
    x: jax.Array,
    y: jax.Array,
    apply_fn: Callable,
    optimizer: optax.GradientTransformation,
    n_steps: int,
    batch_size: int,
    *,
    mesh: Mesh | None = None,
    axis: str = DATA_AXIS,
    chunk: int = 1,
    pad: int = 0,
):
    """Returns ``(params, losses [n_steps])``: cross-entropy training (see :func:`minimize`).

    With ``pad > 0`` each minibatch is randomly shifted by up to ``pad`` pixels with zero
    fill (the shift of a zero-padded crop, as BackdoorBench's RandomCrop with padding), the
    offsets drawn from the step's key: the training distribution of the fine-tuning defenses,
    which shift too. Poisoned rows of ``x`` carry their trigger already, so it moves with the
    image. ``pad = 0`` draws nothing: the same run as without augmentation.

    Args:
      key: PRNG key.
      params: initial parameters.
      x: ``[n, H, W, C]`` training images.
      y: ``[n]`` int labels.
      apply_fn: ``apply_fn(params, x) -> logits`` (static).
      optimizer: optax transformation (static).
      n_steps: steps (static).
      batch_size: minibatch size (static; a multiple of the mesh size when ``mesh`` is given).
      mesh: optional data-parallel mesh, e.g. :func:`hexad.sharding.data_mesh` or
        ``jax.make_mesh`` (Explicit axes are converted with :func:`hexad.sharding.auto_axes`):
        each batch is sharded along ``axis``.
      axis: the mesh axis of the batch (static).
      chunk: steps per jitted call (static), see :func:`minimize`.
      pad: the largest shift in pixels (static, an int >= 0; 0: no augmentation).

    >>> from hexad.backdoor import SmallCNN
    >>> m = SmallCNN(2, (2,), 4)
    >>> p0 = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> p, losses = fit(jax.random.key(1), p0, jnp.zeros((8, 8, 8, 1)), jnp.zeros(8, int),
    ...                 m.apply, optax.sgd(0.1), n_steps=2, batch_size=4)
    """
    check_images(x, "x")
    if y.shape != x.shape[:1]:
        raise ValueError(f"y: expected shape [{x.shape[0]}], got {tuple(y.shape)}")
    pad = check_int("pad", pad, lo=0)
    spec = _batch_spec(mesh, axis)
    if spec is not None:
        sharding.check_divisible(spec.mesh, axis, batch_size, "batch_size")

    def loss_fn(p, k, batch):
        xb, yb = batch
        xb, yb = _place_rows((shift(k, xb, pad), yb), spec)  # pad 0: xb itself, k unused
        return cross_entropy(apply_fn(p, xb), yb)

    return minimize(key, params, loss_fn, (x, y), optimizer, n_steps, batch_size, chunk)


# --------------------------------------------------------------------------------------------
# Metrics (BackdoorBench definitions, arXiv 2206.12654)
# --------------------------------------------------------------------------------------------


def accuracy(apply_fn: Callable, params, x: jax.Array, y: jax.Array) -> jax.Array:
    """Returns the clean accuracy (float scalar) of ``apply_fn(params, .)`` on ``(x, y)``.

    >>> accuracy(lambda p, x: jnp.zeros((x.shape[0], 2)), None, jnp.zeros((2, 4, 4, 1)),
    ...          jnp.array([0, 1]))
    Array(0.5, dtype=float32)
    """
    return jnp.mean(jnp.argmax(apply_fn(params, x), -1) == y).astype(jnp.float32)


def _non_target(y, target):
    return (y != target).astype(jnp.float32)


def attack_success_rate(apply_fn, params, x, y, trigger, target) -> jax.Array:
    """Returns the attack success rate: among samples whose label is not ``target``, the
    fraction classified as ``target`` once ``trigger`` is applied (float scalar).

    >>> from hexad.backdoor import patch_trigger
    >>> t = patch_trigger((4, 4, 1), 2)
    >>> attack_success_rate(lambda p, x: jnp.zeros((x.shape[0], 2)).at[:, 1].set(1.0), None,
    ...                     jnp.zeros((2, 4, 4, 1)), jnp.array([0, 1]), t, 1)
    Array(1., dtype=float32)
    """
    w = _non_target(y, target)
    pred = jnp.argmax(apply_fn(params, apply_trigger(trigger, x)), -1)
    return jnp.sum(w * (pred == target)) / jnp.maximum(jnp.sum(w), 1.0)


def target_rate(apply_fn, params, x, y, target) -> jax.Array:
    """Returns, among clean samples whose label is not ``target``, the fraction classified as
    ``target`` (no trigger; float scalar): how far a model has collapsed towards one class.

    >>> target_rate(lambda p, x: jnp.zeros((x.shape[0], 2)).at[:, 1].set(1.0), None,
    ...             jnp.zeros((2, 4, 4, 1)), jnp.array([0, 1]), 1)
    Array(1., dtype=float32)
    """
    w = _non_target(y, target)
    pred = jnp.argmax(apply_fn(params, x), -1)
    return jnp.sum(w * (pred == target)) / jnp.maximum(jnp.sum(w), 1.0)


def robust_accuracy(apply_fn, params, x, y, trigger, target) -> jax.Array:
    """Returns the robust accuracy: among non-target samples, the fraction still classified as
    their true label with ``trigger`` applied (float scalar).

    >>> from hexad.backdoor import patch_trigger
    >>> t = patch_trigger((4, 4, 1), 2)
    >>> robust_accuracy(lambda p, x: jnp.zeros((x.shape[0], 2)).at[:, 0].set(1.0), None,
    ...                 jnp.zeros((2, 4, 4, 1)), jnp.array([0, 0]), t, 1)
    Array(1., dtype=float32)
    """
    w = _non_target(y, target)
    pred = jnp.argmax(apply_fn(params, apply_trigger(trigger, x)), -1)
    return jnp.sum(w * (pred == y)) / jnp.maximum(jnp.sum(w), 1.0)


def defense_effectiveness_rating(acc_before, acc_after, asr_before, asr_after):
    """Returns BackdoorBench's DER in [0, 1] (arXiv 2206.12654, sec. 4):
    ``(max(0, ASR_before - ASR_after) - max(0, ACC_before - ACC_after) + 1) / 2``.

    >>> defense_effectiveness_rating(0.9, 0.9, 1.0, 0.0)
    1.0
    """
    d_asr = max(0.0, float(asr_before) - float(asr_after))
    d_acc = max(0.0, float(acc_before) - float(acc_after))
    return (d_asr - d_acc + 1.0) / 2.0
