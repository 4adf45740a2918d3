"""Fine-tuning defenses: FT, FT-SAM, NAD, MCR.

Each is ``defense(key, model, params, data, n_steps=DEFAULT_STEPS, **settings) ->
DefenseOutput`` on the clean split ``data.x_clean, data.y_clean`` (:class:`DefenseData`);
``n_steps`` stands for BackdoorBench's 100 epochs (:mod:`hexad.backdoor.defenses`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from hexad.backdoor._models import apply_channel_mask, conv_layers
from hexad.backdoor._train import cross_entropy, minimize
from hexad.backdoor.defenses._common import (
    DEFAULT_STEPS,
    CELoss,
    bb_epochs,
    budget,
    check_data,
    output,
    sgd,
    shift,
    train,
)


def finetune(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    pad=2,
    batch_size=64,
    masks=None,
):
    """Returns :class:`DefenseOutput`: ``params`` fine-tuned on the clean split (FT,
    BackdoorBench's ``ft``).

    SGD (``momentum``, weight decay ``weight_decay``, cosine decay of ``lr`` over
    ``n_steps``) on cross-entropy with random-shift augmentation of ``pad`` pixels (BB:
    RandomCrop(pad 4) at 32x32). With ``masks`` (layer -> ``[c]``) those channel masks are
    held during training and baked into the result (FP). Budget: ``n_steps`` steps.
    ``info``: ``acted``, ``retrains``.

    >>> from hexad.backdoor import SmallCNN
    >>> from hexad.backdoor.defenses import DefenseData
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> d = DefenseData(jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int))
    >>> out = finetune(jax.random.key(1), m, p, d, n_steps=2)
    >>> jax.tree.structure(out.params) == jax.tree.structure(p)
    True
    """
    check_data(model, params, data)
    n = budget(n_steps)
    opt = sgd(float(lr), float(momentum), n, float(weight_decay))
    p = train(key, model, params, data.x_clean, data.y_clean, n, opt, batch_size, masks, pad)
    return output(params, apply_channel_mask(p, masks) if masks else p)


def _sam_perturbation(params, grads, rho, adaptive: bool = False):
    """Returns SAM's ascent step ``e`` (a pytree like ``params``) from the gradient ``grads``.

    SAM (Foret et al., arXiv 2010.01412, eq. 2): ``e = rho g / ||g||``; ASAM (Kwon et al.,
    arXiv 2102.11600, with ``T_w = |w|`` on every parameter, as the SAM code BackdoorBench's
    FT-SAM uses): ``e = rho T_w^2 g / ||T_w g||``. The norm is over the whole tree (every
    leaf at once), not per leaf; ``||e|| = rho`` for SAM.
    """
    t = jax.tree.map(lambda w, a: jnp.abs(w) * a, params, grads) if adaptive else grads
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(t)) + 1e-24)
    if adaptive:
        return jax.tree.map(lambda w, a: rho * jnp.square(w) * a / norm, params, grads)
    return jax.tree.map(lambda a: rho * a / norm, grads)


@dataclasses.dataclass(frozen=True)
class _SAMLoss:
    """SAM's objective ``base(w + stop_gradient(e(w)))`` for :func:`minimize`: its gradient
    is ``grad base`` at the ascent point ``w + e`` (:func:`_sam_perturbation`), the same key
    (augmentation) and batch for both gradients. ``base``: a value-hashable
    ``base(params, key, batch)``."""

    base: Any
    rho: float
    adaptive: bool

    def __call__(self, p, key, batch):
        g = jax.grad(self.base)(p, key, batch)
        e = jax.lax.stop_gradient(_sam_perturbation(p, g, self.rho, self.adaptive))
        return self.base(jax.tree.map(jnp.add, p, e), key, batch)


def ft_sam(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    rho=2.0,
    adaptive=True,
    smoothing=0.1,
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    pad=2,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: sharpness-aware fine-tuning (FT-SAM; Zhu et al.,
    arXiv 2304.11823), as BackdoorBench's ``ft-sam``: SAM at radius ``rho`` (``adaptive``:
    ASAM, arXiv 2102.11600, whose radius scales with ``|w|``), label smoothing ``smoothing``,
    SGD as :func:`finetune`. Budget: ``n_steps`` steps. ``info``: ``acted``, ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    loss = _SAMLoss(CELoss(model, float(smoothing), int(pad)), float(rho), bool(adaptive))
    xy = (data.x_clean, data.y_clean)
    opt = sgd(float(lr), float(momentum), n, float(weight_decay))
    p, _ = minimize(key, params, loss, xy, opt, n, min(batch_size, xy[0].shape[0]))
    return output(params, p)


def _attention(f, p: float = 2.0):
    a = jnp.mean(jnp.abs(f) ** p, axis=-1).reshape(f.shape[0], -1)
    return a / (jnp.linalg.norm(a, axis=-1, keepdims=True) + 1e-8)


@dataclasses.dataclass(frozen=True)
class _NADLoss:
    model: Any
    betas: tuple
    layers: tuple
    pad: int
    p: float = 2.0

    def __call__(self, p, key, batch, teacher):
        xb, yb = batch
        xb = shift(key, xb, self.pad)
        logits, fs = self.model.apply(p, xb, features=True)
        _, ft = self.model.apply(teacher, xb, features=True)
        at = sum(
            b * jnp.mean((_attention(fs[l], self.p) - _attention(ft[l], self.p)) ** 2)
            for b, l in zip(self.betas, self.layers, strict=True)
        )
        return cross_entropy(logits, yb) + at


def nad(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    betas=(500.0, 1000.0, 1000.0),
    p=2.0,
    teacher_epochs=10,
    epochs=10,
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    pad=2,
    batch_size=64,
):
    r"""Returns :class:`DefenseOutput`: Neural Attention Distillation (NAD; Li et al., arXiv
    2101.05930), as BackdoorBench's ``nad``.

    A teacher is fine-tuned from ``params`` for ``teacher_epochs``; the student (``params``) is then
    trained for ``epochs`` on :math:`\mathrm{CE} + \sum_l \beta_l \operatorname{mean}((A_s^l -
    A_t^l)^2)`, :math:`A^l` the L2-normalised attention map :math:`\operatorname{mean}_c |f|^p` of
    conv layer :math:`l` on the last three conv layers (fewer layers take the last betas;
    BackdoorBench takes its PreAct-ResNet18's last two stage outputs and the pooled features). Both
    by SGD at a constant ``lr`` (``momentum``, ``weight_decay``; BackdoorBench's student schedule
    holds 0.01 for its first 20 epochs, and its teacher's cosine over 100 epochs barely decays in
    10) with ``pad``-pixel shifts. Budget: ``teacher_epochs`` and ``epochs`` of BackdoorBench's
    epochs (``n_steps`` standing for 100 of them; its student trains for ``te_epochs`` too).
    ``info``: ``acted``, ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    k1, k2 = jax.random.split(key)
    opt = sgd(float(lr), float(momentum), 0, float(weight_decay))
    xy = (data.x_clean, data.y_clean)
    teacher = train(k1, model, params, *xy, bb_epochs(n, teacher_epochs), opt, batch_size, pad=pad)
    layers = conv_layers(params)[-len(betas) :]
    bs = tuple(float(b) for b in betas[-len(layers) :])
    loss = _NADLoss(model, bs, layers, int(pad), float(p))
    q, _ = minimize(
        k2,
        params,
        loss,
        xy,
        opt,
        bb_epochs(n, epochs),
        min(batch_size, xy[0].shape[0]),
        consts=teacher,
    )
    return output(params, q)


def _bezier(c, s, ends):
    return jax.tree.map(
        lambda a, m, b: (1 - s) ** 2 * a + 2 * s * (1 - s) * m + s**2 * b, ends[0], c, ends[1]
    )


@dataclasses.dataclass(frozen=True)
class _CurveLoss:
    model: Any

    def __call__(self, c, key, batch, ends):
        xb, yb = batch
        return cross_entropy(self.model.apply(_bezier(c, jax.random.uniform(key), ends), xb), yb)


def mcr(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    t=0.1,
    lr=0.01,
    curve_lr=3e-5,
    momentum=0.9,
    weight_decay=5e-4,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: the point ``t`` of a quadratic Bezier curve between
    the backdoored model and its fine-tuned copy (mode connectivity repair, MCR; Zhao et
    al., arXiv 2005.00060, eq. 2; BackdoorBench's ``num_bends 3``), as BackdoorBench's
    ``mcr``. The far end is :func:`finetune` at ``lr``; the curve's control point starts at
    the midpoint and is trained with ``t ~ U(0, 1)`` per step, SGD at ``curve_lr``
    (``momentum``, ``weight_decay``, cosine decay). Budget: ``n_steps`` fine-tuning steps for
    the far end and as many on the curve (BackdoorBench's ``ft_epochs`` and
    ``train_curve_epochs``, 100 each). ``info``: ``acted``, ``retrains``."""
    check_data(model, params, data)
    n = budget(n_steps)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"t: expected a number in [0, 1], got {t!r}")
    k1, k2 = jax.random.split(key)
    w1 = finetune(
        k1,
        model,
        params,
        data,
        n,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        batch_size=batch_size,
    ).params
    c0 = jax.tree.map(lambda a, b: 0.5 * (a + b), params, w1)
    xy = (data.x_clean, data.y_clean)
    c, _ = minimize(
        k2,
        c0,
        _CurveLoss(model),
        xy,
        sgd(float(curve_lr), float(momentum), n, float(weight_decay)),
        n,
        min(batch_size, xy[0].shape[0]),
        consts=(params, w1),
    )
    return output(params, _bezier(c, t, (params, w1)))
