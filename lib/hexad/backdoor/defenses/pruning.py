"""Pruning and mask defenses: FP, ANP, CLP, RNP.

Each is ``defense(key, model, params, data, n_steps=DEFAULT_STEPS, **settings) ->
DefenseOutput`` on the clean split; ``n_steps`` stands for BackdoorBench's 100 epochs
(:mod:`hexad.backdoor.defenses`). ANP and RNP pick their pruning level by BackdoorBench's rule
when ``data.x_bd`` is given (``pruning_by: threshold``: the channels whose mask is at most the
threshold are pruned, for the thresholds ``0, 0.05, ..., 0.9`` (``pruning_max 0.9``,
``pruning_step 0.05``), keeping the one with the lowest ASR on the backdoor validation data
among those keeping the clean-split accuracy within a relative ``acc_drop``), else use the
fixed ``threshold``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hexad.backdoor._models import (
    apply_channel_mask,
    channel_count,
    conv_layers,
    head_activation,
    head_input_layer,
    mask_layers,
)
from hexad.backdoor._train import cross_entropy, minimize
from hexad.backdoor.defenses._common import (
    DEFAULT_STEPS,
    CELoss,
    bb_epochs,
    budget,
    check_data,
    features,
    masked_accuracy,
    masked_hits,
    output,
    sgd,
)
from hexad.backdoor.defenses.finetuning import finetune

_SWEEP = tuple(round(0.05 * i, 2) for i in range(19))


def _select(model, params, values, data, threshold, acc_drop):
    """Returns ``(masks, chosen threshold)``: prune channels whose ``values`` are at most a
    threshold (BackdoorBench's ``mask <= threshold``), chosen by its rule when ``data.x_bd``
    is given."""
    mk = lambda th: {
        l: jnp.asarray((np.asarray(v) > th).astype(np.float32)) for l, v in values.items()
    }
    if data.x_bd is None:
        return mk(threshold), float(threshold)
    base = float(masked_accuracy(model, params, None, data.x_clean, data.y_clean))
    best, best_asr = 0.0, np.inf
    for th in _SWEEP:
        m = mk(th)
        acc = float(masked_accuracy(model, params, m, data.x_clean, data.y_clean))
        if acc < (1.0 - acc_drop) * base:
            continue
        asr = float(masked_hits(model, params, m, data.x_bd, data.y_bd))
        if asr < best_asr - 1e-9:
            best, best_asr = th, asr
    return mk(best), best


def fine_pruning(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    acc_drop=0.1,
    prune_ratio=0.01,
    max_ratio=1.0,
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    pad=2,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: fine-pruning (FP; Liu et al., arXiv 1805.12185), as
    BackdoorBench's ``fp``.

    The head's input features (:func:`~hexad.backdoor.head_input_layer`: the channels of
    ``norm_out`` in a :class:`~hexad.backdoor.PreActResNet`, i.e. the pooled post-residual
    features the linear head reads, which BackdoorBench masks as the final linear layer's
    input columns; the last conv layer in a :class:`~hexad.backdoor.SmallCNN`, whose dense
    part reads it) are ranked by their mean activation on the clean split and pruned from
    the least active, ``ceil(prune_ratio c)`` channels at a time, while the clean-split
    accuracy stays within a relative ``acc_drop`` of the unpruned model's (BackdoorBench
    judges on its test set, which the defender here does not hold; at most ``max_ratio`` of
    the channels). The pruned model is then fine-tuned (:func:`finetune`, masks held and
    baked in). Budget: ``n_steps`` fine-tuning steps. ``info``: ``pruned`` (channels
    pruned), ``layer`` (the layer pruned), ``mask`` (``{layer: [c]}``, 0 where pruned),
    ``acted``, ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    if not 0.0 < float(prune_ratio) <= 1.0:
        raise ValueError(f"prune_ratio: expected a number in (0, 1], got {prune_ratio!r}")
    if not 0.0 <= float(max_ratio) <= 1.0:
        raise ValueError(f"max_ratio: expected a number in [0, 1], got {max_ratio!r}")
    layer = head_input_layer(params)
    _, feats = features(model, params, data.x_clean)
    order = np.argsort(np.asarray(head_activation(feats, layer)))
    c = order.shape[0]
    acc = lambda m: float(
        masked_accuracy(model, params, {layer: jnp.asarray(m)}, data.x_clean, data.y_clean)
    )
    base = acc(np.ones(c, np.float32))
    mask = np.ones(c, np.float32)
    step = max(1, math.ceil(float(prune_ratio) * c))
    for k in range(step, int(float(max_ratio) * c) + 1, step):
        trial = mask.copy()
        trial[order[:k]] = 0.0
        if acc(trial) < (1.0 - acc_drop) * base:
            break
        mask = trial
    masks = {layer: jnp.asarray(mask)}
    out = finetune(
        key,
        model,
        params,
        data,
        n,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        pad=pad,
        batch_size=batch_size,
        masks=masks,
    )
    info = {"pruned": int((mask == 0).sum()), "layer": layer, "mask": masks}
    return output(params, out.params, info)


@dataclasses.dataclass(frozen=True)
class _ANPLoss:
    model: Any
    layers: tuple
    eps: float
    alpha: float

    def __call__(self, m, k, batch, params):
        xb, yb = batch
        ks = jax.random.split(k, 2 * len(self.layers))
        u = lambda kk, l: jax.random.uniform(kk, m[l].shape, minval=-self.eps, maxval=self.eps)
        d0 = {l: u(ks[2 * i], l) for i, l in enumerate(self.layers)}
        x0 = {l: u(ks[2 * i + 1], l) for i, l in enumerate(self.layers)}

        def pert_loss(dx):
            d, xi = dx
            sc = {l: m[l] + d[l] for l in self.layers}
            bs = {l: 1.0 + xi[l] for l in self.layers}
            return cross_entropy(self.model.apply(params, xb, sc, bs), yb)

        g = jax.grad(pert_loss)((d0, x0))
        clip = lambda a, gg: jnp.clip(a + self.eps * jnp.sign(gg), -self.eps, self.eps)
        d1 = jax.lax.stop_gradient(jax.tree.map(clip, (d0, x0), g))
        nat = cross_entropy(self.model.apply(params, xb, m, None), yb)  # masks weights only
        return self.alpha * nat + (1 - self.alpha) * pert_loss(d1)


def _clip01(m):
    return jax.tree.map(lambda a: jnp.clip(a, 0.0, 1.0), m)


def anp(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    eps=0.4,
    alpha=0.2,
    mask_lr=0.01,
    threshold=0.2,
    acc_drop=0.1,
    batch_size=64,
):
    r"""Returns :class:`DefenseOutput`: Adversarial Neuron Pruning (ANP; Wu & Wang, arXiv
    2110.14430), as BackdoorBench's ``anp``.

    Per-channel masks ``m`` in [0, 1] of every :func:`~hexad.backdoor.mask_layers` layer
    (the GroupNorms of a PreAct-ResNet, as BackdoorBench masks its batch norms; else the
    conv layers) minimise

    .. math::

       \alpha L(m) + (1 - \alpha) \max_{|\delta|, |\xi| \le \epsilon} L(m + \delta, 1 + \xi)

    (paper eq. 5; one signed ascent step of ``eps`` from a random start, as the
    reference code's ``anp_steps 1``; the natural term masks the weights only), by SGD
    (momentum 0.9) at ``mask_lr`` (BackdoorBench's ``lr``, which its ``anp.py`` gives the mask
    optimiser), then the channels whose mask is at most the threshold are pruned (module
    docstring for the rule). Budget: ``2 n_steps`` mask steps (BackdoorBench's ``nb_iter``
    2000 batches of 256 on 2,500 images are 205 of its epochs, about twice the 100 that
    ``n_steps`` stands for). ``info``: ``threshold``, ``pruned``, ``acted`` (False when
    nothing was pruned), ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    layers = mask_layers(params)
    m0 = {l: jnp.ones(channel_count(params, l)) for l in layers}
    loss = _ANPLoss(model, layers, float(eps), float(alpha))
    xy = (data.x_clean, data.y_clean)
    m, _ = minimize(
        key,
        m0,
        loss,
        xy,
        sgd(float(mask_lr), 0.9),
        2 * n,
        min(batch_size, xy[0].shape[0]),
        project=_clip01,
        consts=params,
    )
    masks, th = _select(model, params, m, data, threshold, acc_drop)
    pruned = int(sum(float(jnp.sum(1 - v)) for v in masks.values()))
    return output(params, apply_channel_mask(params, masks), {"threshold": th, "pruned": pruned})


def clp(key, model, params, data, n_steps=DEFAULT_STEPS, u=3.0):
    """Returns :class:`DefenseOutput`: Channel Lipschitzness-based Pruning (CLP; Zheng et
    al., arXiv 2208.03111), as BackdoorBench's ``clp``. Data-free: channels whose kernel
    spectral norm (``[in, kh kw]``, paper eq. 9; no batch norm to fold in here) exceeds
    ``mean + u std`` of their layer (``std`` with Bessel's correction, as torch's) are
    pruned. ``n_steps`` is checked but unused (no training). ``info``: ``pruned`` (channels
    pruned), ``acted`` (False when none was), ``retrains``."""
    del key
    check_data(model, params, data)
    budget(n_steps)
    masks = {}
    for l in conv_layers(params):
        k = params["params"][l]["kernel"]
        w = jnp.transpose(k, (3, 2, 0, 1)).reshape(k.shape[3], k.shape[2], -1)
        ub = jnp.linalg.norm(w, ord=2, axis=(1, 2))
        sd = jnp.std(ub, ddof=1) if ub.shape[0] > 1 else jnp.zeros((), ub.dtype)
        masks[l] = (ub <= jnp.mean(ub) + u * sd).astype(k.dtype)
    pruned = int(sum(float(jnp.sum(1 - v)) for v in masks.values()))
    return output(params, apply_channel_mask(params, masks), {"pruned": pruned})


@dataclasses.dataclass(frozen=True)
class _MaskCE:
    model: Any
    alpha: float = 1.0

    def __call__(self, m, k, batch, params):
        del k
        xb, yb = batch
        return self.alpha * cross_entropy(self.model.apply(params, xb, m, m), yb)


def rnp(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    unlearn_lr=0.01,
    unlearn_epochs=20,
    clean_floor=0.2,
    mask_lr=0.2,
    recover_epochs=20,
    alpha=0.2,
    weight_decay=5e-4,
    threshold=0.2,
    acc_drop=0.1,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: Reconstructive Neuron Pruning (RNP; Li et al., arXiv
    2305.14876), as BackdoorBench's ``rnp``.

    1. Unlearn: gradient ascent on clean CE (SGD at ``unlearn_lr``, momentum 0.9, weight
       decay ``weight_decay``), stopped once the clean-split accuracy falls to
       ``clean_floor``.
    2. Recover: per-channel masks in [0, 1] of every :func:`~hexad.backdoor.mask_layers`
       layer of the unlearned model minimise ``alpha`` times the clean CE (SGD at
       ``mask_lr``, momentum 0.9).
    3. Prune the original model's channels whose recovered mask is at most the threshold
       (module docstring for the rule).

    Budget (``n_steps`` standing for 100 of BackdoorBench's epochs): ``unlearn_epochs`` of
    them for unlearning (checked in chunks of 5 steps) and ``recover_epochs`` for recovery.
    ``info``: ``threshold``, ``pruned``, ``acted`` (False when nothing was pruned),
    ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    k1, k2 = jax.random.split(key)
    xy = (data.x_clean, data.y_clean)
    bs = min(batch_size, xy[0].shape[0])
    neg = CELoss(model, sign=-1.0)
    floor = lambda p: float(masked_accuracy(model, p, None, *xy)) <= clean_floor
    opt = sgd(float(unlearn_lr), 0.9, 0, float(weight_decay))
    unl, _ = minimize(
        k1, params, neg, xy, opt, bb_epochs(n, unlearn_epochs), bs, chunk=5, until=floor
    )
    layers = mask_layers(params)
    m0 = {l: jnp.ones(channel_count(params, l)) for l in layers}
    m, _ = minimize(
        k2,
        m0,
        _MaskCE(model, float(alpha)),
        xy,
        sgd(float(mask_lr), 0.9),
        bb_epochs(n, recover_epochs),
        bs,
        project=_clip01,
        consts=unl,
    )
    masks, th = _select(model, params, m, data, threshold, acc_drop)
    pruned = int(sum(float(jnp.sum(1 - v)) for v in masks.values()))
    return output(params, apply_channel_mask(params, masks), {"threshold": th, "pruned": pruned})
