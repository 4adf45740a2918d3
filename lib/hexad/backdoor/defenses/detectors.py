"""Poison detectors on the training set the defender holds: AC and SS, as flaggers and as
repairs that retrain on the samples they keep (BackdoorBench retrains after detection).

The repairs ``ac`` and ``ss`` are ``defense(key, model, params, data, n_steps=DEFAULT_STEPS,
**settings) -> DefenseOutput`` and need ``data.x_train, data.y_train``; they train as
:mod:`.abl` does (from scratch by default, as BackdoorBench; ``retrain_factor * n_steps``
steps of BackdoorBench's SGD: ``lr`` 0.01, momentum 0.9, weight decay 5e-4, cosine decay).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hexad.backdoor.defenses._common import (
    DEFAULT_STEPS,
    budget,
    check_data,
    features,
    output,
    sgd,
    train,
)
from hexad.backdoor.defenses.abl import cycled, start


@jax.jit
def _two_means(z):
    """2-means on ``z`` ``[n, d]`` from the two points farthest along the first axis."""
    c = jnp.stack([z[jnp.argmin(z[:, 0])], z[jnp.argmax(z[:, 0])]])

    def body(_, c):
        lab = jnp.argmin(jnp.sum((z[:, None, :] - c[None]) ** 2, -1), -1)
        oh = jax.nn.one_hot(lab, 2, dtype=z.dtype)
        return (oh.T @ z) / jnp.maximum(oh.sum(0)[:, None], 1.0)

    c = jax.lax.fori_loop(0, 20, body, c)
    return jnp.argmin(jnp.sum((z[:, None, :] - c[None]) ** 2, -1), -1)


def activation_clustering(model, params, x, y, n_components=10, size_threshold=None):
    """Returns a ``[n]`` bool flag of suspected poisons by Activation Clustering (AC; Chen et
    al., arXiv 1811.03728).

    Per class, the penultimate activations are centred, projected on their top
    ``n_components`` principal directions (PCA, as BackdoorBench) and split by 2-means; the
    smaller cluster is flagged (BackdoorBench's ``cluster_analysis: smaller``), or, with
    ``size_threshold``, only when it holds less than that share of the class (the paper's
    relative-size rule).

    >>> from hexad.backdoor import SmallCNN
    >>> model = SmallCNN(num_classes=2, widths=(2,), hidden=4)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> x = jax.random.uniform(jax.random.key(1), (20 * 64,)).reshape(20, 8, 8, 1)
    >>> activation_clustering(model, params, x, jnp.arange(20) % 2).shape
    (20,)
    """
    _, feats = features(model, params, x)
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
        if size_threshold is None or sizes[small] / len(idx) < size_threshold:
            flags[idx[lab == small]] = True
    return flags


def spectral_signatures(model, params, x, y, eps=0.1):
    """Returns a ``[n]`` bool flag of suspected poisons by Spectral Signatures (SS; Tran et
    al., arXiv 1811.00636): per class, the ``1.5 eps n_c`` samples with the largest squared
    projection of their centred penultimate representation on its top singular vector.

    >>> from hexad.backdoor import SmallCNN
    >>> model = SmallCNN(num_classes=2, widths=(2,), hidden=4)
    >>> params = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> x = jax.random.uniform(jax.random.key(1), (20 * 64,)).reshape(20, 8, 8, 1)
    >>> int(spectral_signatures(model, params, x, jnp.arange(20) % 2, eps=0.2).sum())
    6
    """
    if not 0.0 < eps < 1.0:
        raise ValueError(f"eps: expected a poison-rate bound in (0, 1), got {eps!r}")
    _, feats = features(model, params, x)
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


def _retrain(key, model, params, data, flags, n, opt, retrain_factor, from_scratch, batch_size):
    keep = cycled(np.flatnonzero(~np.asarray(flags)), data.x_train.shape[0])
    k0, k1 = jax.random.split(key)
    p = start(k0, model, params, data.x_train, from_scratch)
    x, y = data.x_train[keep], data.y_train[keep]
    steps = int(retrain_factor) * n
    lr, momentum, weight_decay = opt
    p = train(k1, model, p, x, y, steps, sgd(lr, momentum, steps, weight_decay), batch_size)
    info = {"flags": flags, "n_flagged": int(np.sum(flags))}
    return output(params, p, info, retrains=bool(from_scratch))


def _opt(lr, momentum, weight_decay):
    return float(lr), float(momentum), float(weight_decay)


def ac(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    n_components=10,
    size_threshold=None,
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    retrain_factor=5,
    from_scratch=True,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: :func:`activation_clustering` on ``data.x_train``
    under ``params``, then training on the samples not flagged (BackdoorBench's ``ac``
    retrains a new model; the kept rows are repeated cyclically to the set's size, so one
    compile serves any number kept), by SGD at ``lr`` (``momentum``,
    ``weight_decay``, cosine decay). Budget: ``retrain_factor * n_steps`` steps. ``info``:
    ``flags [n]``, ``n_flagged``, ``acted``, ``retrains`` (``from_scratch``)."""
    check_data(model, params, data, need_train=True)
    n = budget(n_steps)
    flags = activation_clustering(
        model, params, data.x_train, data.y_train, n_components, size_threshold
    )
    opt = _opt(lr, momentum, weight_decay)
    return _retrain(
        key, model, params, data, flags, n, opt, retrain_factor, from_scratch, batch_size
    )


def ss(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    eps=0.1,
    lr=0.01,
    momentum=0.9,
    weight_decay=5e-4,
    retrain_factor=5,
    from_scratch=True,
    batch_size=64,
):
    """Returns :class:`DefenseOutput`: :func:`spectral_signatures` (``eps``: the assumed
    poison rate; ``1.5 eps = 0.15`` of each class flagged, BackdoorBench's ``percentile``
    85) on ``data.x_train``, then training on the samples kept, as :func:`ac`."""
    check_data(model, params, data, need_train=True)
    n = budget(n_steps)
    flags = spectral_signatures(model, params, data.x_train, data.y_train, eps)
    opt = _opt(lr, momentum, weight_decay)
    return _retrain(
        key, model, params, data, flags, n, opt, retrain_factor, from_scratch, batch_size
    )
