"""Adversarial-unlearning defenses: I-BAU and SAU.

Each is ``defense(key, model, params, data, n_steps=DEFAULT_STEPS, **settings) ->
DefenseOutput`` on the clean split; ``n_steps`` stands for BackdoorBench's 100 epochs
(:mod:`hexad.backdoor.defenses`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

from hexad.backdoor._train import cross_entropy, minimize
from hexad.backdoor.defenses._common import (
    DEFAULT_STEPS,
    adam,
    bb_epochs,
    budget,
    check_data,
    output,
)


@dataclasses.dataclass(frozen=True)
class _IBAULoss:
    model: Any
    inner_steps: int
    inner_lr: float
    reg: float
    unrolled: bool

    def __call__(self, p, k, batch):
        del k
        xb, yb = batch
        adv = lambda q, d: cross_entropy(self.model.apply(q, xb + d[None]), yb)
        # the inner problem sees the parameters as constants unless unrolled
        q_in = p if self.unrolled else jax.lax.stop_gradient(p)
        obj = lambda d: adv(q_in, d) - self.reg * jnp.sum(d**2)
        d = jnp.zeros(xb.shape[1:], xb.dtype)
        for _ in range(self.inner_steps):
            d = d + self.inner_lr * jax.grad(obj)(d)
        return 0.5 * cross_entropy(self.model.apply(p, xb), yb) + 0.5 * adv(p, d)


def ibau(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    n_rounds=5,
    inner_steps=5,
    inner_lr=10.0,
    reg=1e-3,
    lr=1e-4,
    batch_size=64,
    unrolled=False,
):
    r"""Returns :class:`DefenseOutput`: Implicit Backdoor Adversarial Unlearning-style
    minimax (I-BAU; Zeng et al., arXiv 2110.03735), with BackdoorBench's ``i-bau`` settings.

    Outer: :math:`\min_\theta \frac{1}{2} \mathrm{CE}(f(x), y) + \frac{1}{2} \mathrm{CE}(f(x +
    \delta^*), y)` (BackdoorBench stamps :math:`\delta^*` on 1% of each batch of 256, two images;
    at batch 64 that is none, so every image is taken clean and perturbed); inner: a
    batch-universal perturbation :math:`\delta^*`
    from ``inner_steps`` gradient-ascent steps of ``inner_lr`` (BackdoorBench: one SGD step
    of lr 10 per batch over its split each round; ``K`` 5 fixed-point iterations for the
    hypergradient) on :math:`\mathrm{CE} - \text{reg} \|\delta\|^2` (L2 regulariser 1e-3, no
    projection). The
    hypergradient: by default the outer gradient at the fixed ``delta*`` (Danskin's theorem;
    at an inner optimum it differs from the paper's implicit hypergradient by a term
    proportional to ``reg``, since there :math:`\nabla_\delta \mathrm{CE} = 2\, \text{reg}\,
    \delta^*`), about a third of
    the cost of ``unrolled=True``, reverse-mode through the inner steps (the paper's unrolled
    alternative). Adam at ``lr`` on the outer problem. Budget: ``n_rounds`` of
    BackdoorBench's epochs of outer steps (``n_steps`` standing for 100 of them; each of its
    rounds is one pass over the clean split). ``info``: ``acted``, ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    xy = (data.x_clean, data.y_clean)
    loss = _IBAULoss(model, int(inner_steps), float(inner_lr), float(reg), bool(unrolled))
    steps = bb_epochs(n, n_rounds)
    p, _ = minimize(key, params, loss, xy, adam(float(lr)), steps, min(batch_size, xy[0].shape[0]))
    return output(params, p)


@dataclasses.dataclass(frozen=True)
class _SAULoss:
    model: Any
    eps: float
    adv_lr: float
    adv_steps: int
    beta_1: float
    beta_2: float
    lmd_1: float
    lmd_2: float
    lmd_3: float

    def _shared_pert(self, p, ref, xb, yb):
        f = self.model.apply
        lab, lab_ref = jnp.argmax(f(p, xb), -1), jnp.argmax(f(ref, xb), -1)
        ce_ = optax.softmax_cross_entropy_with_integer_labels

        def obj(d):
            lg, lg_ref = f(p, xb + d), f(ref, xb + d)
            pl, pl_ref = jnp.argmax(lg, -1), jnp.argmax(lg_ref, -1)
            succ, succ_ref = pl != lab, pl_ref != lab_ref
            shared = succ & succ_ref & (pl == pl_ref)
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
            return self.beta_1 * adv + self.beta_2 * share

        d = jnp.full_like(xb, self.eps)
        for _ in range(self.adv_steps):
            d = jnp.clip(d - self.adv_lr * jnp.sign(jax.grad(obj)(d)), -self.eps, self.eps)
        return jax.lax.stop_gradient(d)

    def __call__(self, p, k, batch, ref):
        del k
        xb, yb = batch
        f = self.model.apply
        xa = xb + self._shared_pert(jax.lax.stop_gradient(p), ref, xb, yb)
        logits, per_logits = f(p, xb), f(p, xa)
        lab_ref = jnp.argmax(f(ref, xb), -1)
        pl_ref = jnp.argmax(f(ref, xa), -1)
        fooled = (pl_ref != yb) & (pl_ref != lab_ref)
        pos = jnp.take_along_axis(jax.nn.softmax(per_logits, -1), pl_ref[:, None], -1)[:, 0]
        # the reference code's two numerically different forms of -log(1 - pos), averaged
        terms = -jnp.log(1e-6 + jnp.minimum(1.0 - pos, 0.999)) - jnp.log(
            1.0 + 1e-6 - jnp.maximum(pos, 0.001)
        )
        l_sar = jnp.sum(jnp.where(fooled, terms, 0.0)) / 2 / xb.shape[0]
        return (
            self.lmd_1 * cross_entropy(logits, yb)
            + self.lmd_2 * cross_entropy(per_logits, yb)
            + self.lmd_3 * l_sar
        )


def sau(
    key,
    model,
    params,
    data,
    n_steps=DEFAULT_STEPS,
    eps=0.2,
    adv_lr=0.2,
    adv_steps=5,
    beta_1=0.01,
    beta_2=1.0,
    lmd_1=1.0,
    lmd_2=0.0,
    lmd_3=1.0,
    lr=1e-4,
    batch_size=64,
):
    r"""Returns :class:`DefenseOutput`: Shared Adversarial Unlearning (SAU; Wei et al.,
    NeurIPS 2023, arXiv 2307.10562).

    Each step finds shared adversarial examples of the frozen backdoored model ``h0`` and
    the model being purified :math:`h` (``adv_steps`` signed steps of ``adv_lr`` in the
    :math:`L_\infty` ball ``eps``, minimising :math:`\beta_1 L_{\text{adv}} + \beta_2
    L_{\text{share}}`), then one Adam step on :math:`\lambda_1 \mathrm{CE}(h(x)) + \lambda_2
    \mathrm{CE}(h(x + \delta)) + \lambda_3 L_{\text{sar}}` with :math:`L_{\text{sar}}` the mean
    over samples :math:`h_0` is fooled on of :math:`-\log(1 - p_h(y_0' \mid x + \delta))`
    (paper eq. 9).
    BackdoorBench's ``sau`` settings (its Adam is AMSGrad). Budget: ``n_steps`` steps
    (BackdoorBench's ``n_rounds`` 100 epochs). ``info``: ``acted``, ``retrains``.
    """
    check_data(model, params, data)
    n = budget(n_steps)
    xy = (data.x_clean, data.y_clean)
    loss = _SAULoss(
        model,
        *(float(v) for v in (eps, adv_lr)),
        int(adv_steps),
        *(float(v) for v in (beta_1, beta_2, lmd_1, lmd_2, lmd_3)),
    )
    p, _ = minimize(
        key, params, loss, xy, adam(float(lr)), n, min(batch_size, xy[0].shape[0]), consts=params
    )
    return output(params, p)
