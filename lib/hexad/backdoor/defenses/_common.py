"""The shapes every defense shares: its data, its output, checks, shared jits and losses."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad._base import check_int
from hexad.backdoor._train import accuracy, cross_entropy, minimize
from hexad.backdoor._triggers import check_images, shift
from hexad.backdoor._types import DefenseData
from hexad.backdoor._types import DefenseOutput as DefenseOutput  # the defenses import it here


def check_data(model, params, data, need_train: bool = False, name: str = "data") -> DefenseData:
    """Validates a :class:`DefenseData` (the arrays' shapes, floating images, flax params)."""
    if not isinstance(data, DefenseData):
        raise TypeError(f"{name}: expected a DefenseData, got {type(data).__name__}")
    if not isinstance(params, dict) or "params" not in params:
        raise TypeError("params: expected flax parameters {'params': ...}")
    pairs = [("x_clean", "y_clean")]
    if need_train:
        if data.x_train is None or data.y_train is None:
            raise ValueError(
                f"{name}: this defense needs the training set the defender holds "
                "(x_train, y_train), got None"
            )
    if data.x_train is not None:
        pairs.append(("x_train", "y_train"))
    if data.x_bd is not None:
        pairs.append(("x_bd", "y_bd"))
    k = getattr(model, "num_classes", None)
    for xn, yn in pairs:
        x, y = getattr(data, xn), getattr(data, yn)
        check_images(x, f"{name}.{xn}")
        if x.ndim != 4:
            raise ValueError(f"{name}.{xn}: expected shape [n, H, W, C], got {tuple(x.shape)}")
        if y is None or tuple(y.shape) != tuple(x.shape[:1]):
            got = None if y is None else tuple(y.shape)
            raise ValueError(f"{name}.{yn}: expected shape [{x.shape[0]}], got {got}")
        if isinstance(k, int) and y.shape[0]:  # labels (y_bd: attack targets) the model has
            # reduced where the labels live: on a mesh spanning processes, each holds its rows
            lo, hi = int(jnp.min(jnp.asarray(y))), int(jnp.max(jnp.asarray(y)))
            if lo < 0 or hi >= k:
                raise ValueError(
                    f"{name}.{yn}: expected class labels in [0, {k}) (the model's "
                    f"num_classes), got labels in [{lo}, {hi}]"
                )
    return data


#: BackdoorBench's defense budget in its epochs (``epochs: 100`` in every
#: ``config/defense/<name>/config.yaml``): a defense's step budget ``n_steps`` stands for it.
BB_EPOCHS = 100


def backdoorbench_steps(epochs: int = BB_EPOCHS, n_clean: int = 500, batch_size: int = 64) -> int:
    """Returns the steps that make ``epochs`` passes over a clean split of ``n_clean`` images
    at batch ``batch_size``: ``epochs * ceil(n_clean / batch_size)`` (an epoch of a torch
    ``DataLoader`` without ``drop_last``, as BackdoorBench's).

    BackdoorBench's epoch is a pass over its clean split (5% of the training set, 2,500
    CIFAR-10 images at batch 256, 10 steps); here an epoch is a pass over the defender's own
    split, so its 100 epochs on a 500-image split at batch 64 are 800 steps
    (:data:`DEFAULT_STEPS`, every defense's default ``n_steps``).

    >>> backdoorbench_steps(100), backdoorbench_steps(100, 2500, 256)
    (800, 1000)
    """
    epochs = check_int("epochs", epochs)
    n_clean = check_int("n_clean", n_clean)
    batch_size = check_int("batch_size", batch_size)
    return epochs * math.ceil(n_clean / batch_size)


#: Every defense's default step budget, BackdoorBench's 100 epochs over a 500-image clean
#: split at batch 64 (:func:`backdoorbench_steps`).
DEFAULT_STEPS = backdoorbench_steps()


def budget(n_steps) -> int:
    """Validates a step budget (an int >= 1)."""
    return check_int("n_steps", n_steps, lo=1)


def frac(n: int, f: float) -> int:
    """``max(1, round(f * n))``: a sub-budget derived from the budget ``n``."""
    return max(1, int(round(f * n)))


def bb_epochs(n: int, epochs: float) -> int:
    """The steps of ``epochs`` of BackdoorBench's epochs when the budget ``n`` stands for its
    :data:`BB_EPOCHS` (100): ``max(1, round(epochs n / 100))``."""
    return frac(n, float(epochs) / BB_EPOCHS)


def same_params(a, b) -> bool:
    """Whether two parameter pytrees are identical: the same structure, shapes and values
    (host-side)."""
    if a is b:
        return True
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    if ta != tb:
        return False
    return all(
        np.shape(x) == np.shape(y) and bool(np.array_equal(np.asarray(x), np.asarray(y)))
        for x, y in zip(la, lb, strict=True)
    )


def output(params_in, params_out, info: dict | None = None, retrains: bool = False):
    """Returns ``DefenseOutput(params_out, info)`` with ``info["acted"]`` (False when
    ``params_out`` equals ``params_in``: the defense returned the model unchanged) and
    ``info["retrains"]`` (True when it trained a fresh model from the data it was given)."""
    acted = bool(retrains) or not same_params(params_in, params_out)
    return DefenseOutput(params_out, {**(info or {}), "acted": acted, "retrains": bool(retrains)})


# One compile per optimiser setting, whatever the step size. :func:`minimize`'s module-level
# chunk jit is keyed on the optimiser's ``update``; the step size is an
# ``optax.inject_hyperparams`` hyperparameter that ``init`` writes into the state, so the same
# ``update`` (built once per momentum, schedule length and weight decay) serves every step size
# a defense or :func:`hexad.backdoor.defenses.select_lr` tries, as a traced value.
@functools.cache
def _injected(kind: str, momentum: float, n_steps: int, weight_decay: float, nesterov: bool):
    def make(learning_rate):
        if kind == "adam":
            return optax.adam(learning_rate)
        lr_ = optax.cosine_decay_schedule(learning_rate, n_steps) if n_steps > 0 else learning_rate
        opt = optax.sgd(lr_, momentum=momentum or None, nesterov=nesterov)
        return optax.chain(optax.add_decayed_weights(weight_decay), opt) if weight_decay else opt

    return optax.inject_hyperparams(make)(learning_rate=1.0)


def _init_at(init, lr: float, params):
    state = init(params)
    rate = jnp.full_like(state.hyperparams["learning_rate"], lr)
    return state._replace(hyperparams={**state.hyperparams, "learning_rate": rate})


def _at_lr(
    kind: str, lr: float, momentum: float = 0.0, n_steps: int = 0, weight_decay=0.0, nesterov=False
):
    inner = _injected(kind, float(momentum), int(n_steps), float(weight_decay), bool(nesterov))
    return optax.GradientTransformationExtraArgs(
        functools.partial(_init_at, inner.init, float(lr)), inner.update
    )


@functools.cache
def sgd(
    lr: float,
    momentum: float = 0.9,
    n_steps: int = 0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
):
    """SGD with momentum (Nesterov's with ``nesterov``); a cosine decay over ``n_steps`` when
    ``n_steps > 0``; L2 weight decay ``weight_decay`` added to the gradient before the
    momentum (coupled, as torch's SGD ``weight_decay``).
    ``lr`` lives in the optimiser state, so every ``lr`` shares one compile."""
    return _at_lr("sgd", lr, momentum, n_steps, weight_decay, nesterov)


@functools.cache
def adam(lr: float):
    """Adam at a constant ``lr`` (``lr`` in the state, see :func:`sgd`)."""
    return _at_lr("adam", lr)


@dataclasses.dataclass(frozen=True)
class CELoss:
    """Cross-entropy of ``model`` for :func:`minimize` (value-hashable: one compile per
    setting). With ``consts`` (layer -> ``[c]`` masks) the masks scale the channels;
    ``smoothing``: label smoothing; ``pad``: random-shift augmentation of the batch."""

    model: Any
    smoothing: float = 0.0
    pad: int = 0
    sign: float = 1.0

    def __call__(self, p, key, batch, masks=None):
        xb, yb = batch
        xb = shift(key, xb, self.pad)
        logits = self.model.apply(p, xb, masks, masks)
        if self.smoothing:
            k = logits.shape[-1]
            t = optax.smooth_labels(jax.nn.one_hot(yb, k), self.smoothing)
            return self.sign * jnp.mean(optax.softmax_cross_entropy(logits, t))
        return self.sign * cross_entropy(logits, yb)


@functools.partial(jax.jit, static_argnums=0)
def masked_accuracy(model, params, masks, x, y):
    """Accuracy of ``model`` with channel ``masks`` as scales and bias scales (``None``:
    unmasked); ``model`` static, so one compile serves every parameter set."""
    return accuracy(lambda p, x_: model.apply(p, x_, masks, masks), params, x, y)


@functools.partial(jax.jit, static_argnums=0)
def masked_correct(model, params, masks, x, y):
    """``[n]`` bool: whether each image of ``x`` is classified as ``y`` under ``masks``."""
    return jnp.argmax(model.apply(params, x, masks, masks), -1) == y


@functools.partial(jax.jit, static_argnums=0)
def masked_hits(model, params, masks, x, y):
    """Fraction of ``x`` classified as ``y`` (the ASR on backdoor data) under ``masks``."""
    return jnp.mean(masked_correct(model, params, masks, x, y))


@functools.partial(jax.jit, static_argnums=0)
def features(model, params, x):
    """``(logits, features)`` of ``model`` on ``x``."""
    return model.apply(params, x, features=True)


@functools.partial(jax.jit, static_argnums=0)
def per_sample_ce(model, params, x, y):
    """``[n]`` cross-entropy of each sample."""
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y)


def train(key, model, params, x, y, n_steps, opt, batch_size, masks=None, pad=0, smoothing=0.0):
    """``n_steps`` of cross-entropy training of ``params`` on ``(x, y)`` with ``opt``."""
    loss = CELoss(model, smoothing, pad)
    p, _ = minimize(
        key, params, loss, (x, y), opt, n_steps, min(batch_size, x.shape[0]), consts=masks
    )
    return p
