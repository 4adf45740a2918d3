"""Pruning and mask defenses: FP, ANP, CLP, RNP.

Each is ``defense(key, model, params, data, n_steps=100, **settings) -> DefenseOutput`` on
the clean split. ANP and RNP pick their pruning level by BackdoorBench's rule when
``data.x_bd`` is given (the threshold in ``0, 0.05, ..., 0.9`` with the lowest ASR on the
backdoor validation data among those keeping the clean-split accuracy within a relative
``acc_drop``), else use the fixed ``threshold``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hexad.backdoor._models import apply_channel_mask, channel_count, conv_layers, mask_layers
from hexad.backdoor._train import cross_entropy, minimize
from hexad.backdoor.defenses._common import (
    CELoss,
    DefenseOutput,
    budget,
    check_data,
    features,
    frac,
    masked_accuracy,
    masked_hits,
    sgd,
)
from hexad.backdoor.defenses.finetuning import finetune

_SWEEP = tuple(round(0.05 * i, 2) for i in range(19))


def _select(model, params, values, data, threshold, acc_drop):
    """Returns ``(masks, chosen threshold)``: prune channels whose ``values`` fall below a
    threshold, chosen by BackdoorBench's rule when ``data.x_bd`` is given."""
    mk = lambda th: {
        l: jnp.asarray((np.asarray(v) >= th).astype(np.float32)) for l, v in values.items()
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
    key, model, params, data, n_steps=100, max_ratio=0.8, acc_drop=0.1, lr=0.01, batch_size=64
):
    """Returns :class:`DefenseOutput`: fine-pruning (FP; Liu et al., arXiv 1805.12185).

    Channels of the last conv layer (the inputs of the classifier's dense part) are pruned
    in increasing order of mean clean activation, one at a time, until the clean-split
    accuracy falls by a relative ``acc_drop`` (BackdoorBench's stopping rule; at most
    ``max_ratio`` of them), then the pruned model is fine-tuned (:func:`finetune`, masks
    held). Budget: ``n_steps`` fine-tuning steps. ``info["pruned"]``: channels pruned.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    layer = conv_layers(params)[-1]
    _, feats = features(model, params, data.x_clean)
    order = np.argsort(np.asarray(jnp.mean(feats[layer], axis=(0, 1, 2))))
    c = order.shape[0]
    acc = lambda m: float(
        masked_accuracy(model, params, {layer: jnp.asarray(m)}, data.x_clean, data.y_clean)
    )
    base = acc(np.ones(c, np.float32))
    mask = np.ones(c, np.float32)
    for k in range(1, int(max_ratio * c) + 1):
        trial = mask.copy()
        trial[order[:k]] = 0.0
        if acc(trial) < (1.0 - acc_drop) * base:
            break
        mask = trial
    out = finetune(
        key, model, params, data, n, lr, batch_size=batch_size, masks={layer: jnp.asarray(mask)}
    )
    return DefenseOutput(out.params, {"pruned": int((mask == 0).sum())})


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
    n_steps=100,
    eps=0.2,
    alpha=0.2,
    mask_lr=0.2,
    threshold=0.2,
    acc_drop=0.1,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: Adversarial Neuron Pruning (ANP; Wu & Wang, arXiv
    2110.14430).

    Per-channel masks ``m`` in [0, 1] of every :func:`~hexad.backdoor.mask_layers` layer
    (the GroupNorms of a PreAct-ResNet, else the conv layers) minimise ``alpha L(m) + (1 -
    alpha) max_{|delta|,|xi| <= eps} L(m + delta, 1 + xi)`` (paper eq. 5; one signed ascent
    step from a random start, as the reference code; the natural term masks the weights
    only), then channels below the threshold are pruned (module docstring for the rule).
    Budget: ``2 n_steps`` mask steps. ``info``: ``threshold``, ``pruned``.
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
    return DefenseOutput(apply_channel_mask(params, masks), {"threshold": th, "pruned": pruned})


def clp(key, model, params, data, n_steps=100, u=3.0):
    """Returns :class:`DefenseOutput`: Channel Lipschitzness-based Pruning (CLP; Zheng et
    al., arXiv 2208.03111). Data-free: channels whose kernel spectral norm (``[in, kh kw]``,
    paper eq. 9, no BN here) exceeds ``mean + u std`` of their layer are pruned.
    ``n_steps`` is checked but unused (no training). ``info["pruned"]``: channels pruned."""
    del key
    check_data(model, params, data)
    budget(n_steps)
    masks = {}
    for l in conv_layers(params):
        k = params["params"][l]["kernel"]
        w = jnp.transpose(k, (3, 2, 0, 1)).reshape(k.shape[3], k.shape[2], -1)
        ub = jnp.linalg.norm(w, ord=2, axis=(1, 2))
        masks[l] = (ub <= jnp.mean(ub) + u * jnp.std(ub)).astype(k.dtype)
    pruned = int(sum(float(jnp.sum(1 - v)) for v in masks.values()))
    return DefenseOutput(apply_channel_mask(params, masks), {"pruned": pruned})


@dataclasses.dataclass(frozen=True)
class _MaskCE:
    model: Any

    def __call__(self, m, k, batch, params):
        del k
        xb, yb = batch
        return cross_entropy(self.model.apply(params, xb, m, m), yb)


def rnp(
    key,
    model,
    params,
    data,
    n_steps=100,
    unlearn_lr=0.01,
    clean_floor=0.2,
    mask_lr=0.2,
    threshold=0.2,
    acc_drop=0.1,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: Reconstructive Neuron Pruning (RNP; Li et al., arXiv
    2305.14876).

    1. Unlearn: gradient ascent on clean CE (SGD, momentum 0.9), stopped once the
       clean-split accuracy falls to ``clean_floor``.
    2. Recover: per-channel masks in [0, 1] of every :func:`~hexad.backdoor.mask_layers`
       layer of the unlearned model,
       minimising clean CE.
    3. Prune the original model's channels whose recovered mask is below the threshold
       (module docstring for the rule).

    Budget: ``n_steps / 5`` unlearning steps (checked in chunks of 5) and ``n_steps``
    recovery steps. ``info``: ``threshold``, ``pruned``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    k1, k2 = jax.random.split(key)
    xy = (data.x_clean, data.y_clean)
    bs = min(batch_size, xy[0].shape[0])
    neg = CELoss(model, sign=-1.0)
    floor = lambda p: float(masked_accuracy(model, p, None, *xy)) <= clean_floor
    unl, _ = minimize(
        k1, params, neg, xy, sgd(float(unlearn_lr), 0.9), frac(n, 0.2), bs, chunk=5, until=floor
    )
    layers = mask_layers(params)
    m0 = {l: jnp.ones(channel_count(params, l)) for l in layers}
    m, _ = minimize(
        k2, m0, _MaskCE(model), xy, sgd(float(mask_lr), 0.9), n, bs, project=_clip01, consts=unl
    )
    masks, th = _select(model, params, m, data, threshold, acc_drop)
    pruned = int(sum(float(jnp.sum(1 - v)) for v in masks.values()))
    return DefenseOutput(apply_channel_mask(params, masks), {"threshold": th, "pruned": pruned})
