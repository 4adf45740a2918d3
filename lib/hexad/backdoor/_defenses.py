"""Backdoor defenses, following BackdoorBench's protocol (arXiv 2206.12654) at our scale.

Post-training defenses take ``(key, model, params, x_clean, y_clean)``: a :class:`SmallCNN`,
its parameters and the defender's small clean split (BackdoorBench: 5% of the training set),
and return sanitised parameters. Hyper-parameters default to BackdoorBench's, with epochs
turned into optimiser steps on our tiny models. Detection defenses (AC, SS) take the
(possibly poisoned) training set and return a boolean ``[n]`` flag per sample.

Implemented (paper in each docstring): FT, FP, NAD, ANP, NC, I-BAU, CLP, FT-SAM, RNP, MCR,
SAU (model repair), ABL (isolation + unlearning on the training set the defender holds) and
AC, SS (poison detection): 14 in all. Loops run through :func:`minimize` (host-driven
jitted chunks; do not wrap these functions in ``jax.jit``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad._base import check_int
from hexad.backdoor._models import apply_channel_mask, conv_layers
from hexad.backdoor._train import accuracy, cross_entropy, minimize
from hexad.backdoor._triggers import check_images

__all__ = [
    "ABLOutput",
    "DEFENSES",
    "NCOutput",
    "abl",
    "activation_clustering",
    "anp",
    "clp",
    "compose",
    "fine_pruning",
    "finetune",
    "ft_sam",
    "ibau",
    "make_defense",
    "mcr",
    "nad",
    "neural_cleanse",
    "rnp",
    "sau",
    "spectral_signatures",
]


def _check(model, params, x, y):
    check_images(x, "x_clean")
    if x.ndim != 4:
        raise ValueError(f"x_clean: expected shape [n, H, W, C], got {tuple(x.shape)}")
    if y.shape != x.shape[:1]:
        raise ValueError(f"y_clean: expected shape [{x.shape[0]}], got {tuple(y.shape)}")
    if "params" not in params:
        raise TypeError("params: expected flax parameters {'params': ...} of a SmallCNN")


@functools.partial(jax.jit, static_argnums=0)
def _masked_accuracy(model, params, masks, x, y):
    """Clean accuracy of ``model`` with channel ``masks`` as both scales and bias scales
    (``None``: unmasked). Jitted once per architecture and shapes: the model (hashable, equal by
    value) is static, and parameters, masks and data are arguments, so the defenses reuse one
    compile across the models they sanitise."""
    return accuracy(lambda p, x_: model.apply(p, x_, masks, masks), params, x, y)


@functools.partial(jax.jit, static_argnums=0)
def _features(model, params, x):
    """``(logits, features)`` of ``model`` on ``x``: one compile per architecture and shapes."""
    return model.apply(params, x, features=True)


@functools.partial(jax.jit, static_argnums=0)
def _per_sample_ce(model, params, x, y):
    """``[n]`` cross-entropy of each sample (ABL's isolation score)."""
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y)


def _ce_loss(model):
    """Cross-entropy loss for :func:`minimize` with channel masks passed as its ``consts``."""

    def loss(p, key, batch, scales=None):
        del key
        xb, yb = batch
        return cross_entropy(model.apply(p, xb, scales, scales), yb)

    return loss


def finetune(key, model, params, x_clean, y_clean, n_steps=100, lr=0.01, batch_size=32, masks=None):
    """Returns ``params`` fine-tuned on the clean split (FT; BackdoorBench's ``ft`` baseline).

    SGD with momentum 0.9 on cross-entropy. With ``masks`` (layer -> ``[c]``), those channel
    masks are held during training and baked into the result (used by FP).

    Args:
      key: PRNG key.
      model: :class:`SmallCNN` (static).
      params: parameters to sanitise.
      x_clean: ``[n, H, W, C]`` clean images; y_clean: ``[n]`` labels.
      n_steps, lr, batch_size: SGD settings (static).
      masks: optional fixed channel masks.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = finetune(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    opt = optax.sgd(lr, momentum=0.9)
    p, _ = minimize(
        key, params, _ce_loss(model), (x_clean, y_clean), opt, n_steps, batch_size, consts=masks
    )
    return apply_channel_mask(p, masks) if masks else p


def _mean_activation(model, params, x, layer):
    _, feats = model.apply(params, x, features=True)
    return jnp.mean(feats[layer], axis=(0, 1, 2))


def fine_pruning(
    key,
    model,
    params,
    x_clean,
    y_clean,
    max_ratio=0.8,
    acc_drop=0.1,
    n_steps=100,
    lr=0.01,
    batch_size=32,
):
    """Returns fine-pruned params (FP; Liu et al., arXiv 1805.12185).

    Channels of the last conv layer are pruned in increasing order of mean activation on the
    clean split, as long as clean-split accuracy stays within ``acc_drop`` of the original
    and at most ``max_ratio`` of the channels go; then the pruned model is fine-tuned.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = fine_pruning(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    layer = conv_layers(params)[-1]
    act = np.asarray(_mean_activation(model, params, x_clean, layer))
    order = np.argsort(act)
    c = act.shape[0]
    acc_fn = lambda q, m: _masked_accuracy(model, q, {layer: m}, x_clean, y_clean)
    base = float(acc_fn(params, jnp.ones(c)))
    mask = np.ones(c, np.float32)
    for n in range(1, int(max_ratio * c) + 1):
        trial = mask.copy()
        trial[order[:n]] = 0.0
        if float(acc_fn(params, jnp.asarray(trial))) < base - acc_drop:
            break
        mask = trial
    return finetune(
        key, model, params, x_clean, y_clean, n_steps, lr, batch_size, {layer: jnp.asarray(mask)}
    )


def _attention(f):
    a = jnp.mean(f**2, axis=-1).reshape(f.shape[0], -1)
    return a / (jnp.linalg.norm(a, axis=-1, keepdims=True) + 1e-8)


def nad(
    key,
    model,
    params,
    x_clean,
    y_clean,
    beta=1000.0,
    teacher_steps=100,
    n_steps=100,
    lr=0.01,
    batch_size=32,
):
    """Returns params after Neural Attention Distillation (NAD; Li et al., arXiv 2101.05930).

    A teacher is fine-tuned from ``params`` on the clean split; the student (also ``params``)
    is trained on ``CE + beta * sum_l mean((A_s^l - A_t^l)^2)`` where ``A^l`` is the
    L2-normalised spatial attention map ``mean_c(f^2)`` of conv layer ``l`` (paper eq. 1-3
    with p = 2, in the mean-squared form of the reference code; BackdoorBench's betas are
    500-5000, ours is one beta for all layers).

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = nad(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    k1, k2 = jax.random.split(key)
    teacher = finetune(k1, model, params, x_clean, y_clean, teacher_steps, lr, batch_size)
    layers = conv_layers(params)

    def loss(p, k, batch, teacher_):
        xb, yb = batch
        logits, fs = model.apply(p, xb, features=True)
        _, ft = model.apply(teacher_, xb, features=True)
        at = sum(jnp.mean((_attention(fs[l]) - _attention(ft[l])) ** 2) for l in layers)
        return cross_entropy(logits, yb) + beta * at

    opt = optax.sgd(lr, momentum=0.9)
    p, _ = minimize(k2, params, loss, (x_clean, y_clean), opt, n_steps, batch_size, consts=teacher)
    return p


def _optimise_masks(key, m0, loss, x_clean, y_clean, lr, n_steps, batch_size, params):
    """Returns channel masks minimising ``loss`` by SGD with momentum, kept in ``[0, 1]``.

    The mask optimisation that ANP and RNP share; ``loss(masks, key, batch, params)`` as in
    ``minimize`` with the fixed model ``params`` as its ``consts``.
    """
    clip01 = lambda m: jax.tree.map(lambda a: jnp.clip(a, 0.0, 1.0), m)
    m, _ = minimize(
        key,
        m0,
        loss,
        (x_clean, y_clean),
        optax.sgd(lr, momentum=0.9),
        n_steps,
        batch_size,
        project=clip01,
        consts=params,
    )
    return m


def anp(
    key,
    model,
    params,
    x_clean,
    y_clean,
    eps=0.4,
    alpha=0.2,
    mask_lr=0.2,
    n_steps=200,
    threshold=0.2,
    batch_size=32,
):
    """Returns params pruned by Adversarial Neuron Pruning (ANP; Wu & Wang, arXiv 2110.14430).

    Learns per-channel masks ``m`` in [0, 1] for all conv layers minimising
    ``alpha * L(m) + (1 - alpha) * max_{|delta|,|xi| <= eps} L(m + delta, 1 + xi)`` (paper
    eq. 5; one signed ascent step from a random start for the inner max, as in the reference
    code), then prunes channels with ``m < threshold``.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = anp(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    layers = conv_layers(params)
    widths = {l: params["params"][l]["kernel"].shape[-1] for l in layers}

    def loss(m, k, batch, params_):
        xb, yb = batch
        ks = jax.random.split(k, 2 * len(layers))
        d0 = {
            l: jax.random.uniform(ks[2 * i], (widths[l],), minval=-eps, maxval=eps)
            for i, l in enumerate(layers)
        }
        x0 = {
            l: jax.random.uniform(ks[2 * i + 1], (widths[l],), minval=-eps, maxval=eps)
            for i, l in enumerate(layers)
        }

        def pert_loss(dx):
            d, xi = dx
            sc = {l: m[l] + d[l] for l in layers}
            bs = {l: 1.0 + xi[l] for l in layers}
            return cross_entropy(model.apply(params_, xb, sc, bs), yb)

        gd = jax.grad(pert_loss)((d0, x0))
        d1 = jax.tree.map(lambda a, g: jnp.clip(a + eps * jnp.sign(g), -eps, eps), (d0, x0), gd)
        d1 = jax.lax.stop_gradient(d1)
        nat = cross_entropy(model.apply(params_, xb, m, m), yb)
        return alpha * nat + (1 - alpha) * pert_loss(d1)

    m0 = {l: jnp.ones(widths[l]) for l in layers}
    m = _optimise_masks(key, m0, loss, x_clean, y_clean, mask_lr, n_steps, batch_size, params)
    return apply_channel_mask(params, {l: (m[l] >= threshold).astype(jnp.float32) for l in layers})


class NCOutput(NamedTuple):
    """Neural Cleanse's result.

    Attributes:
      params: the unlearned parameters (unchanged when no class is flagged).
      masks: ``[K, H, W]`` reversed trigger masks in [0, 1], one per class.
      patterns: ``[K, H, W, C]`` reversed patterns.
      norms: ``[K]`` L1 norms of the masks.
      anomaly: ``[K]`` anomaly indices ``(median - norm) / (1.4826 * MAD)``.
      flagged: ``[K]`` bool, classes with anomaly index above 2.
    """

    params: Any
    masks: jax.Array
    patterns: jax.Array
    norms: jax.Array
    anomaly: jax.Array
    flagged: jax.Array


def neural_cleanse(
    key,
    model,
    params,
    x_clean,
    y_clean,
    lam=1e-2,
    n_steps=300,
    lr=0.1,
    batch_size=32,
    unlearn_steps=100,
    unlearn_lr=0.01,
    unlearn_frac=0.2,
    threshold=2.0,
) -> NCOutput:
    """Returns :class:`NCOutput`: Neural Cleanse (Wang et al., IEEE S&P 2019,
    doi:10.1109/SP.2019.00031).

    For every class ``t`` at once (independent Adam problems), a mask ``m = sigmoid(u)``
    ``[H, W]`` and pattern ``p = sigmoid(v)`` ``[H, W, C]`` minimise
    ``CE(f((1 - m) x + m p), t) + lam * |m|_1`` (paper eq. 3; fixed ``lam`` where the paper
    schedules it). A class whose mask norm is an outlier below the median (anomaly index
    > ``threshold`` under the MAD rule, paper sec. IV-C) is flagged; the model is then
    unlearned by fine-tuning on the clean split with the flagged reversed triggers stamped on
    ``unlearn_frac`` of each batch under the true labels (paper sec. VI-C).

    >>> from hexad.backdoor import SmallCNN
    >>> model = SmallCNN(num_classes=3, widths=(2,), hidden=4)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> xc = jax.random.uniform(jax.random.key(1), (6 * 64,)).reshape(6, 8, 8, 1)
    >>> yc = jnp.arange(6) % 3
    >>> out = neural_cleanse(
    ...     jax.random.key(2), model, params, xc, yc, n_steps=2, batch_size=6, unlearn_steps=1
    ... )
    >>> out.masks.shape, out.patterns.shape, out.norms.shape, out.flagged.dtype
    ((3, 8, 8), (3, 8, 8, 1), (3,), dtype('bool'))
    >>> bool(jnp.all((out.masks > 0) & (out.masks < 1)))  # sigmoid masks
    True
    """
    _check(model, params, x_clean, y_clean)
    K = model.num_classes
    H, W, C = x_clean.shape[1:]
    k1, k2 = jax.random.split(key)

    def stamp(x, m, p):
        return (1 - m[..., None]) * x + m[..., None] * p

    def rev_loss(uv, k, batch, params_):
        del k
        xb, _ = batch
        u, v = uv
        m, p = jax.nn.sigmoid(u), jax.nn.sigmoid(v)

        def one(t, mt, pt):
            logits = model.apply(params_, stamp(xb, mt[None], pt[None]))
            return cross_entropy(logits, jnp.full((xb.shape[0],), t)) + lam * jnp.sum(mt)

        return jnp.sum(jax.vmap(one)(jnp.arange(K), m, p))

    uv0 = (jnp.full((K, H, W), -2.0), jnp.zeros((K, H, W, C)))
    uv, _ = minimize(
        k1,
        uv0,
        rev_loss,
        (x_clean, y_clean),
        optax.adam(lr),
        n_steps,
        batch_size,
        consts=params,
    )
    masks, patterns = jax.nn.sigmoid(uv[0]), jax.nn.sigmoid(uv[1])
    norms = jnp.sum(masks, axis=(1, 2))
    med = jnp.median(norms)
    mad = 1.4826 * jnp.median(jnp.abs(norms - med))
    anomaly = (med - norms) / jnp.maximum(mad, 1e-12)
    flagged = anomaly > threshold
    if not bool(jnp.any(flagged)):
        return NCOutput(params, masks, patterns, norms, anomaly, flagged)
    fl = jnp.asarray(np.flatnonzero(np.asarray(flagged)))

    def unlearn(p, k, batch, c):
        xb, yb = batch
        fl_, masks_, patterns_ = c
        ka, kb = jax.random.split(k)
        which = fl_[jax.random.randint(ka, (xb.shape[0],), 0, fl_.shape[0])]
        use = jax.random.uniform(kb, (xb.shape[0],)) < unlearn_frac
        xs = stamp(xb, masks_[which], patterns_[which])
        xb = jnp.where(use[:, None, None, None], xs, xb)
        return cross_entropy(model.apply(p, xb), yb)

    p, _ = minimize(
        k2,
        params,
        unlearn,
        (x_clean, y_clean),
        optax.sgd(unlearn_lr, momentum=0.9),
        unlearn_steps,
        batch_size,
        consts=(fl, masks, patterns),
    )
    return NCOutput(p, masks, patterns, norms, anomaly, flagged)


def ibau(
    key,
    model,
    params,
    x_clean,
    y_clean,
    eps=2.0,
    inner_steps=5,
    inner_lr=0.5,
    n_steps=100,
    lr=0.005,
    batch_size=32,
):
    """Returns params after Implicit Backdoor Adversarial Unlearning-style minimax (I-BAU;
    Zeng et al., arXiv 2110.03735).

    Outer: ``min_theta CE(f_theta(x + delta*(theta)), y)``; inner: ``delta*(theta)`` a
    batch-universal perturbation with ``||delta||_2 <= eps`` maximising the same loss (paper
    eq. 4). The paper differentiates ``delta*`` implicitly (eq. 7); here the hypergradient
    is reverse-mode through ``inner_steps`` normalised gradient-ascent steps with projection
    (the unrolled alternative the paper compares against). Adam on the outer problem, as in
    the reference code.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = ibau(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)

    def proj(d):
        n = jnp.sqrt(jnp.sum(d**2) + 1e-12)
        return d * jnp.minimum(1.0, eps / n)

    def loss(p, k, batch):
        del k
        xb, yb = batch
        adv = lambda d: cross_entropy(model.apply(p, xb + d[None]), yb)
        d = jnp.zeros(xb.shape[1:], xb.dtype)
        for _ in range(inner_steps):
            g = jax.grad(adv)(d)
            d = proj(d + inner_lr * eps * g / jnp.sqrt(jnp.sum(g**2) + 1e-12))
        return 0.5 * cross_entropy(model.apply(p, xb), yb) + 0.5 * adv(d)

    p, _ = minimize(key, params, loss, (x_clean, y_clean), optax.adam(lr), n_steps, batch_size)
    return p


def clp(key, model, params, x_clean=None, y_clean=None, u=3.0):
    """Returns params pruned by Channel Lipschitzness-based Pruning (CLP; Zheng et al.,
    arXiv 2208.03111). Data-free: ``x_clean``, ``y_clean`` and ``key`` are ignored.

    For each conv channel ``k``, the upper bound of its channel Lipschitz constant is the
    spectral norm of its kernel reshaped to ``[in, kh * kw]`` (paper eq. 9, no BN here);
    channels above ``mean + u * std`` of their layer are pruned.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = clp(None, model, params)
    """
    del key, x_clean, y_clean
    masks = {}
    for l in conv_layers(params):
        k = params["params"][l]["kernel"]  # [kh, kw, in, out]
        w = jnp.transpose(k, (3, 2, 0, 1)).reshape(k.shape[3], k.shape[2], -1)
        ub = jnp.linalg.norm(w, ord=2, axis=(1, 2))
        masks[l] = (ub <= jnp.mean(ub) + u * jnp.std(ub)).astype(k.dtype)
    return apply_channel_mask(params, masks)


def ft_sam(key, model, params, x_clean, y_clean, rho=0.05, n_steps=100, lr=0.01, batch_size=32):
    """Returns params fine-tuned with sharpness-aware minimisation (FT-SAM; Zhu et al.,
    arXiv 2304.11823; SAM of Foret et al., arXiv 2010.01412).

    Each step evaluates the gradient at ``theta + rho * g / ||g||`` (SAM's eq. 2), which
    FT-SAM shows pushes the model away from the backdoor's sharp region.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = ft_sam(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    base = _ce_loss(model)

    def loss(p, k, batch):
        g = jax.grad(base)(p, k, batch)
        n = jnp.sqrt(sum(jnp.sum(a**2) for a in jax.tree.leaves(g)) + 1e-12)
        e = jax.lax.stop_gradient(jax.tree.map(lambda a: rho * a / n, g))
        return base(jax.tree.map(jnp.add, p, e), k, batch)

    p, _ = minimize(
        key, params, loss, (x_clean, y_clean), optax.sgd(lr, momentum=0.9), n_steps, batch_size
    )
    return p


def rnp(
    key,
    model,
    params,
    x_clean,
    y_clean,
    unlearn_steps=20,
    unlearn_lr=0.01,
    clean_floor=0.2,
    recover_steps=100,
    mask_lr=0.2,
    threshold=0.2,
    acc_drop=0.1,
    batch_size=32,
):
    """Returns params pruned by Reconstructive Neuron Pruning (RNP; Li et al.,
    arXiv 2305.14876).

    1. Unlearn: gradient *ascent* on clean CE (SGD, ``unlearn_steps``), stopped early once
       clean-split accuracy falls to ``clean_floor``.
    2. Recover: on the unlearned model, learn per-channel masks in [0, 1] for every conv layer
       minimising clean CE.
    3. Prune the original model's channels in increasing order of recovered mask, those
       below ``threshold`` (backdoor neurons are the ones recovery does not need), stopping
       before clean-split accuracy falls more than ``acc_drop`` below the original's.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = rnp(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    k1, k2 = jax.random.split(key)
    neg = lambda p, k, b: -_ce_loss(model)(p, k, b)
    unl, _ = minimize(
        k1,
        params,
        neg,
        (x_clean, y_clean),
        optax.sgd(unlearn_lr),
        unlearn_steps,
        batch_size,
        until=lambda p: float(_masked_accuracy(model, p, None, x_clean, y_clean)) <= clean_floor,
    )
    layers = conv_layers(params)

    def mloss(m, k, batch, unl_):
        xb, yb = batch
        return cross_entropy(model.apply(unl_, xb, m, m), yb)

    m0 = {l: jnp.ones(params["params"][l]["kernel"].shape[-1]) for l in layers}
    m = _optimise_masks(k2, m0, mloss, x_clean, y_clean, mask_lr, recover_steps, batch_size, unl)
    # prune in increasing order of recovered mask, below threshold, while the clean split
    # keeps its accuracy within acc_drop (BackdoorBench's validation-based stopping rule)
    flat = sorted((float(v), l, i) for l in layers for i, v in enumerate(np.asarray(m[l])))
    acc_p = lambda ms: _masked_accuracy(model, params, ms, x_clean, y_clean)
    cur = {l: np.ones(np.asarray(m[l]).shape, np.float32) for l in layers}
    base = float(acc_p({l: jnp.asarray(v) for l, v in cur.items()}))
    for v, l, i in flat:
        if v >= threshold:
            break
        cur[l][i] = 0.0
        if float(acc_p({l_: jnp.asarray(a) for l_, a in cur.items()})) < base - acc_drop:
            cur[l][i] = 1.0
            break
    return apply_channel_mask(params, {l: jnp.asarray(v) for l, v in cur.items()})


def mcr(
    key,
    model,
    params,
    x_clean,
    y_clean,
    t=0.4,
    ft_steps=100,
    n_steps=100,
    lr=0.01,
    batch_size=32,
):
    """Returns the point ``t`` of a trained quadratic Bezier curve between the backdoored
    model and its fine-tuned copy (mode connectivity repair, MCR; Zhao et al.,
    arXiv 2005.00060).

    ``phi(t) = (1-t)^2 w0 + 2 t (1-t) c + t^2 w1``; the control point ``c`` (initialised at
    the midpoint) is trained on the clean split with ``t ~ U(0, 1)`` each step (paper eq. 2).
    Points in the middle of the path keep accuracy and lose the backdoor.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = mcr(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"t: expected a number in [0, 1], got {t!r}")
    k1, k2 = jax.random.split(key)
    w0 = params
    w1 = finetune(k1, model, params, x_clean, y_clean, ft_steps, lr, batch_size)
    bez = lambda c, s, ends: jax.tree.map(
        lambda a, m, b: (1 - s) ** 2 * a + 2 * s * (1 - s) * m + s**2 * b, ends[0], c, ends[1]
    )

    def loss(c, k, batch, ends):
        xb, yb = batch
        return cross_entropy(model.apply(bez(c, jax.random.uniform(k), ends), xb), yb)

    c0 = jax.tree.map(lambda a, b: 0.5 * (a + b), w0, w1)
    c, _ = minimize(
        k2,
        c0,
        loss,
        (x_clean, y_clean),
        optax.sgd(lr, momentum=0.9),
        n_steps,
        batch_size,
        consts=(w0, w1),
    )
    return bez(c, t, (w0, w1))


class ABLOutput(NamedTuple):
    """Anti-Backdoor Learning's result.

    Attributes:
      params: parameters after isolation, fine-tuning on the rest and unlearning.
      isolated: ``[n]`` bool, the samples isolated as suspected poisons.
      losses: ``[n]`` per-sample cross-entropy under the LGA model (the isolation score).
    """

    params: Any
    isolated: jax.Array
    losses: jax.Array


def abl(
    key,
    model,
    params,
    x_train,
    y_train,
    gamma=0.5,
    lga_steps=100,
    lr=0.1,
    isolation_ratio=0.01,
    finetune_steps=100,
    unlearn_steps=20,
    unlearn_lr=5e-4,
    batch_size=64,
) -> ABLOutput:
    """Returns :class:`ABLOutput`: Anti-Backdoor Learning (ABL; Li et al., NeurIPS 2021,
    arXiv 2110.11571), on the (possibly poisoned) training set the defender holds.

    1. LGA: ``lga_steps`` of SGD (momentum 0.9, ``lr`` 0.1 as BackdoorBench's ABL) from
       ``params`` on the local gradient ascent
       loss ``sign(L - gamma) * L`` of each minibatch's mean cross-entropy ``L`` (paper
       eq. 3): clean samples are held near loss ``gamma`` while backdoor samples, learned
       much faster, fall below it.
    2. Isolation: the ``isolation_ratio`` fraction of samples with the lowest loss under the
       LGA model (paper sec. 3.3; BackdoorBench's default 1%).
    3. Fine-tuning on the rest (``finetune_steps``, BackdoorBench's ``finetuning_ascent_model``).
    4. Unlearning: ``unlearn_steps`` of gradient *ascent* on the isolated samples'
       cross-entropy (paper eq. 4), SGD with momentum at ``unlearn_lr`` (BackdoorBench 5e-4).

    ABL is a training-time defense: pass a fresh initialisation as ``params`` to train from
    scratch as in the paper, or a suspect model to sanitise it with the same data.

    Args:
      key: PRNG key.
      model: :class:`SmallCNN` or :class:`PreActResNet` (static).
      params: initial parameters.
      x_train: ``[n, H, W, C]`` training images (may contain poisons); y_train: ``[n]``.
      gamma: LGA loss threshold.
      lga_steps, lr: LGA steps and SGD step size (static); also used for fine-tuning.
      isolation_ratio: fraction isolated, in (0, 1).
      finetune_steps: steps on the non-isolated samples (0 = skip).
      unlearn_steps, unlearn_lr: unlearning steps and step size.
      batch_size: minibatch size (static).

    Example, with an initialisation ``p0`` and a training set ``x, y``:

        out = abl(jax.random.key(0), model, p0, x, y)
    """
    _check(model, params, x_train, y_train)
    if not 0.0 < isolation_ratio < 1.0:
        raise ValueError(f"isolation_ratio: expected a number in (0, 1), got {isolation_ratio!r}")
    k1, k2, k3 = jax.random.split(key, 3)
    ce = _ce_loss(model)

    def lga(p, k, batch):
        loss = ce(p, k, batch)
        return jnp.sign(jax.lax.stop_gradient(loss) - gamma) * loss

    sgd = optax.sgd(lr, momentum=0.9)
    p, _ = minimize(k1, params, lga, (x_train, y_train), sgd, lga_steps, batch_size)
    losses = _per_sample_ce(model, p, x_train, y_train)
    n = x_train.shape[0]
    n_iso = max(1, int(round(isolation_ratio * n)))
    iso_idx = np.argsort(np.asarray(losses))[:n_iso]
    isolated = np.zeros(n, bool)
    isolated[iso_idx] = True
    rest = np.flatnonzero(~isolated)
    if finetune_steps > 0:
        p, _ = minimize(k2, p, ce, (x_train[rest], y_train[rest]), sgd, finetune_steps, batch_size)
    neg = lambda p_, k, b: -ce(p_, k, b)
    p, _ = minimize(
        k3,
        p,
        neg,
        (x_train[iso_idx], y_train[iso_idx]),
        optax.sgd(unlearn_lr, momentum=0.9),
        unlearn_steps,
        min(batch_size, n_iso),
    )
    return ABLOutput(p, jnp.asarray(isolated), losses)


def sau(
    key,
    model,
    params,
    x_clean,
    y_clean,
    eps=0.2,
    adv_lr=0.2,
    adv_steps=5,
    beta_1=0.01,
    beta_2=1.0,
    lmd_1=1.0,
    lmd_2=0.0,
    lmd_3=1.0,
    n_steps=100,
    lr=1e-3,
    batch_size=32,
):
    """Returns params after Shared Adversarial Unlearning (SAU; Wei et al., NeurIPS 2023,
    arXiv 2307.10562).

    Each step first finds, for the batch, *shared* adversarial examples of the original
    (backdoored, frozen) model ``h0`` and the model being purified ``h``: ``adv_steps``
    signed-gradient steps of size ``adv_lr`` on a per-sample perturbation in the L-inf ball
    of radius ``eps`` (started at ``+eps``), minimising
    ``beta_1 * L_adv + beta_2 * L_share``, where ``L_adv`` is minus the cross-entropy of both
    models on the samples each does not yet misclassify and ``L_share`` the Jensen-Shannon
    divergence of their predictions on the samples not yet shared (paper sec. 4; the
    reference implementation's losses). Then one Adam step on
    ``lmd_1 CE(h(x), y) + lmd_2 CE(h(x + delta), y) + lmd_3 L_sar``, with ``L_sar`` the mean
    over samples ``h0`` is fooled on of ``-log(1 - p_h(y0' | x + delta))``, ``y0'`` ``h0``'s
    adversarial label (paper eq. 9): ``h`` unlearns agreeing with ``h0`` on them.
    BackdoorBench's defaults (eps 0.2, 5 PGD steps of 0.2, beta 0.01 / 1, lmd 1 / 0 / 1);
    its 100 epochs of Adam at 1e-4 become ``n_steps`` steps at ``lr`` here.

    Example, with trained ``params`` and a clean split ``xc, yc``:

        p = sau(jax.random.key(0), model, params, xc, yc)
    """
    _check(model, params, x_clean, y_clean)
    ref = params

    def shared_pert(p, xb, yb):
        lab = jnp.argmax(model.apply(p, xb), -1)
        lab_ref = jnp.argmax(model.apply(ref, xb), -1)

        def obj(d):
            lg = model.apply(p, xb + d)
            lg_ref = model.apply(ref, xb + d)
            pl, pl_ref = jnp.argmax(lg, -1), jnp.argmax(lg_ref, -1)
            succ, succ_ref = pl != lab, pl_ref != lab_ref
            shared = succ & succ_ref & (pl == pl_ref)
            ce_ = optax.softmax_cross_entropy_with_integer_labels
            adv = jnp.sum(jnp.where(succ, 0.0, ce_(lg, yb))) + jnp.sum(
                jnp.where(succ_ref, 0.0, ce_(lg_ref, yb))
            )
            adv = -adv / (2 * xb.shape[0])
            pm = jnp.clip(jax.nn.softmax(lg, -1), 1e-8)
            pr = jnp.clip(jax.nn.softmax(lg_ref, -1), 1e-8)
            mix = 0.5 * (pm + pr)
            js = 0.5 * jnp.sum(pm * (jnp.log(pm) - jnp.log(mix)), -1) + 0.5 * jnp.sum(
                pr * (jnp.log(pr) - jnp.log(mix)), -1
            )
            share = jnp.sum(jnp.where(shared, 0.0, js)) / xb.shape[0]
            return beta_1 * adv + beta_2 * share

        d = jnp.full_like(xb, eps)
        for _ in range(adv_steps):
            d = jnp.clip(d - adv_lr * jnp.sign(jax.grad(obj)(d)), -eps, eps)
        return jax.lax.stop_gradient(d)

    def loss(p, k, batch):
        del k
        xb, yb = batch
        xa = xb + shared_pert(jax.lax.stop_gradient(p), xb, yb)
        logits, per_logits = model.apply(p, xb), model.apply(p, xa)
        lab_ref = jnp.argmax(model.apply(ref, xb), -1)
        pl_ref = jnp.argmax(model.apply(ref, xa), -1)
        fooled = (pl_ref != yb) & (pl_ref != lab_ref)
        pos = jnp.take_along_axis(jax.nn.softmax(per_logits, -1), pl_ref[:, None], -1)[:, 0]
        # the reference code's two numerically different forms of -log(1 - pos), averaged
        terms = -jnp.log(1e-6 + jnp.minimum(1.0 - pos, 0.999)) - jnp.log(
            1.0 + 1e-6 - jnp.maximum(pos, 0.001)
        )
        l_sar = jnp.sum(jnp.where(fooled, terms, 0.0)) / 2 / xb.shape[0]
        return (
            lmd_1 * cross_entropy(logits, yb)
            + lmd_2 * cross_entropy(per_logits, yb)
            + lmd_3 * l_sar
        )

    p, _ = minimize(key, params, loss, (x_clean, y_clean), optax.adam(lr), n_steps, batch_size)
    return p


# --------------------------------------------------------------------------------------------
# Poison detection on the training set
# --------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="n_iter")
def _two_means(z, n_iter=20):
    """2-means on ``z`` ``[n, d]`` from the two points farthest along the first axis.

    Jitted: run eagerly, its loop compiled anew on every call (each class of each model).
    """
    c = jnp.stack([z[jnp.argmin(z[:, 0])], z[jnp.argmax(z[:, 0])]])

    def body(_, c):
        lab = jnp.argmin(jnp.sum((z[:, None, :] - c[None]) ** 2, -1), -1)
        oh = jax.nn.one_hot(lab, 2, dtype=z.dtype)
        return (oh.T @ z) / jnp.maximum(oh.sum(0)[:, None], 1.0)

    c = jax.lax.fori_loop(0, n_iter, body, c)
    return jnp.argmin(jnp.sum((z[:, None, :] - c[None]) ** 2, -1), -1)


def activation_clustering(model, params, x, y, n_components=10, size_threshold=0.35):
    """Returns a ``[n]`` bool flag of suspected poisons by Activation Clustering (AC; Chen et
    al., arXiv 1811.03728).

    Per class, the penultimate activations are centred, projected on their top
    ``n_components`` principal directions (the paper uses ICA; PCA is its common substitute,
    also in BackdoorBench) and split by 2-means; the smaller cluster is flagged when it holds
    less than ``size_threshold`` of the class (paper's relative-size criterion).

    >>> from hexad.backdoor import SmallCNN
    >>> model = SmallCNN(num_classes=2, widths=(2,), hidden=4)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> x = jax.random.uniform(jax.random.key(1), (20 * 64,)).reshape(20, 8, 8, 1)
    >>> flags = activation_clustering(model, params, x, jnp.arange(20) % 2)
    >>> flags.shape, flags.dtype
    ((20,), dtype('bool'))
    """
    _check(model, params, x, y)
    _, feats = _features(model, params, x)
    r = np.asarray(feats["fc"])
    y = np.asarray(y)
    flags = np.zeros(len(y), bool)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        if len(idx) < 4:
            continue
        z = r[idx] - r[idx].mean(0)
        _, _, vt = np.linalg.svd(z, full_matrices=False)
        lab = np.asarray(_two_means(jnp.asarray(z @ vt[:n_components].T)))
        sizes = np.bincount(lab, minlength=2)
        small = int(np.argmin(sizes))
        if sizes[small] / len(idx) < size_threshold:
            flags[idx[lab == small]] = True
    return flags


def spectral_signatures(model, params, x, y, eps=0.1):
    """Returns a ``[n]`` bool flag of suspected poisons by Spectral Signatures (SS; Tran et
    al., arXiv 1811.00636).

    Per class, scores are squared projections of the centred penultimate representations on
    their top singular vector; the ``1.5 * eps * n_c`` highest are flagged (paper Alg. 1).

    >>> from hexad.backdoor import SmallCNN
    >>> model = SmallCNN(num_classes=2, widths=(2,), hidden=4)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> x = jax.random.uniform(jax.random.key(1), (20 * 64,)).reshape(20, 8, 8, 1)
    >>> flags = spectral_signatures(model, params, x, jnp.arange(20) % 2, eps=0.2)
    >>> flags.shape, int(flags.sum())  # round(1.5 * 0.2 * 10) = 3 flagged per class
    ((20,), 6)
    """
    _check(model, params, x, y)
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps: expected a poison-rate bound in (0, 1), got {eps!r}")
    _, feats = _features(model, params, x)
    r = np.asarray(feats["fc"])
    y = np.asarray(y)
    flags = np.zeros(len(y), bool)
    for c in np.unique(y):
        idx = np.flatnonzero(y == c)
        z = r[idx] - r[idx].mean(0)
        _, _, vt = np.linalg.svd(z, full_matrices=False)
        score = (z @ vt[0]) ** 2
        k = int(min(len(idx), round(1.5 * eps * len(idx))))
        flags[idx[np.argsort(-score)[:k]]] = True
    return flags


def _repaired(out):
    """The parameters of a defense's result (NC and ABL return them inside their output)."""
    return out.params if isinstance(out, (NCOutput, ABLOutput)) else out


def compose(*defenses: Callable) -> Callable:
    """Returns the multi-round defense that applies ``defenses`` in order, each on the
    previous one's parameters (compositional sanitisation); round ``i`` gets
    ``fold_in(key, i)``. It returns parameters, also when a round is NC or ABL.

    >>> both = compose(finetune, clp)
    """
    if not defenses:
        raise ValueError("defenses: expected at least one defense, got none")
    for i, d in enumerate(defenses):
        if not callable(d):
            raise TypeError(f"defenses[{i}]: expected a callable defense, got {d!r}")

    def run(key, model, params, x_clean, y_clean):
        for i, d in enumerate(defenses):
            params = _repaired(d(jax.random.fold_in(key, i), model, params, x_clean, y_clean))
        return params

    return run


def _nc_params(key, model, params, x_clean, y_clean):
    return neural_cleanse(key, model, params, x_clean, y_clean).params


def _abl_params(key, model, params, x_train, y_train):
    return abl(key, model, params, x_train, y_train).params


DEFENSES: Mapping[str, Callable] = {
    "ft": finetune,
    "fp": fine_pruning,
    "nad": nad,
    "anp": anp,
    "nc": _nc_params,
    "ibau": ibau,
    "clp": clp,
    "ftsam": ft_sam,
    "rnp": rnp,
    "mcr": mcr,
    "sau": sau,
    "abl": _abl_params,
}
"""Model-repair defenses by short name, each ``(key, model, params, x, y) -> params`` with its
default hyper-parameters: ``x, y`` is the defender's clean split, except for ``"abl"``, which
expects the training set the defender holds (poisons included) and sanitises ``params`` on
it. With the detectors AC and SS, 14 defenses."""


def _budget(name: str, n: int) -> dict[str, int]:
    # Every main loop of a defense scales with the budget; at n = 100 these are its defaults.
    # Not scaled: CLP (data-free), and RNP's and ABL's short unlearning phases.
    return {
        "ft": {"n_steps": n},
        "fp": {"n_steps": n},
        "nad": {"n_steps": n, "teacher_steps": n},
        "anp": {"n_steps": 2 * n},
        "nc": {"n_steps": 3 * n, "unlearn_steps": n},
        "ibau": {"n_steps": n},
        "clp": {},
        "ftsam": {"n_steps": n},
        "rnp": {"recover_steps": n},
        "mcr": {"n_steps": n, "ft_steps": n},
        "sau": {"n_steps": n},
        "abl": {"lga_steps": n, "finetune_steps": n},
    }[name]


_BY_NAME = {**DEFENSES, "nc": neural_cleanse, "abl": abl}


def make_defense(name: str, n_steps: int = 100, **overrides: Any) -> Callable:
    """Returns the defense ``name`` of :data:`DEFENSES` with a step budget of ``n_steps``.

    One budget for every defense: each derives its step counts from it (FT, FP, I-BAU,
    FT-SAM, SAU: ``n_steps``; NAD and MCR: ``n_steps`` for the teacher or fine-tuned end
    and as many for the student or curve; ANP: ``2 n_steps`` mask steps; NC: ``3 n_steps``
    trigger-reversal steps and ``n_steps`` of unlearning; RNP: ``n_steps`` mask-recovery
    steps; ABL: ``n_steps`` of LGA and of fine-tuning; CLP is data-free). At the default
    budget of 100 these are the defenses' own defaults. Names joined by ``+`` (``"nc+ft"``)
    give their :func:`compose`, each round at the same budget; ABL is not composable (it
    sanitises on the training set the defender holds, the others on the clean split).

    Args:
      name: a key of :data:`DEFENSES`, or keys other than ``"abl"`` joined by ``+``.
      n_steps: the step budget (>= 1).
      **overrides: other keyword arguments of the defense, of every round of a composition
        (e.g. ``lr``); they win over the budget's step counts.

    Returns:
      ``defense(key, model, params, x, y) -> params`` (``x, y``: the clean split; for
      ``"abl"`` the training set the defender holds).

    >>> from hexad.backdoor import SmallCNN
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> ft = make_defense("ft+ft", 2)
    >>> q = ft(jax.random.key(1), m, p, jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int))
    >>> jax.tree.structure(q) == jax.tree.structure(p)
    True
    """
    rounds = name.split("+") if isinstance(name, str) else [name]
    if not all(r in DEFENSES for r in rounds):
        raise ValueError(
            f"name: expected one of {sorted(DEFENSES)} or '+'-joined ones, got {name!r}"
        )
    if len(rounds) > 1 and "abl" in rounds:
        raise ValueError(
            f"name: expected no 'abl' in a composition (ABL needs the poisoned training set), "
            f"got {name!r}"
        )
    n_steps = check_int("n_steps", n_steps)

    def budgeted(r: str) -> Callable:
        kw, f = {**_budget(r, n_steps), **overrides}, _BY_NAME[r]
        return lambda k, m, p, x, y: _repaired(f(k, m, p, x, y, **kw))

    fs = [budgeted(r) for r in rounds]
    return fs[0] if len(fs) == 1 else compose(*fs)
