"""DTB: a defense-triggered backdoor implanted by bi-level optimisation.

The attacker implants a normally active *decoy* backdoor (target ``t_d``) and a dormant
*hidden* one (target ``t_h != t_d``), so that sanitising the model, which suppresses the
decoy, activates the hidden backdoor. A surrogate of sanitisation ``S_b`` (drawn each outer
step from ``DTBConfig.family``) is followed along a *path* of ``P = path_points`` iterates
``theta_1 .. theta_P = S_b(theta)`` (its inner iterates after steps ``ceil(j T / P)`` of its
``T`` inner steps; all equal to the start when ``T = 0``). The outer problem is

    min_theta  w_c  CE(f_theta(x~), y~)                          task + decoy at an ordinary rate
             + w_hp CE(f_theta(T_h(x)), y)                       hidden dormant before
             + w_cq mean_j CE(f_{theta_j}(x), y)                 the task kept along the path
             + w_dq U(theta_P)                                   the decoy removed at the end
             + w_hq mean_j [g_j CE(f_{theta_j}(T_h(x)), t_h)     hidden active where the decoy
                            + (1 - g_j) CE(f_{theta_j}(T_h(x)), y)]  fell, dormant where it holds

where ``(x~, y~)`` is the batch with ``decoy_rate`` of its rows decoy-triggered and relabelled
``t_d`` (BadNets poisoning: the decoy is an ordinary backdoor, removable like one),
``U(theta) = -log(1 - p_{t_d}(f_theta(T_d(x))))`` over the rows not of class ``t_d``, and the
gate ``g_j = sigmoid((tau - p_d(theta_j)) / temperature)`` (stop-gradient; ``p_d`` the mean
decoy-target probability on decoy-triggered rows not of class ``t_d``; ``tau =
gate_threshold``) ties the hidden backdoor to the decoy's *state* along the path: dormant
while the decoy is active, active once it is suppressed (``gate="always"``: ``g = 1``, a
backdoor that fires after the operator whatever the decoy does, the compression-artifact
control). The post-sanitisation clean term makes a collapse of the sanitised model (every
input to ``t_h``) costly: without it such a collapse removes the decoy and fires the hidden
target at once, and is what an objective with only the hidden term learns. The members:

- ``"ft"``: ``K`` SGD steps (momentum, consecutive ``inner_batch``-row blocks of the
  defender-like clean split) on ``CE(f(x_c), y_c) + lambda_u U`` (fine-tuning + unlearning);
- ``"prune_ft"``: prune the ``prune_frac`` least active channels of the last conv layer
  (fine-pruning's criterion), then ``"ft"`` with the mask held;
- ``"noise_ft"``: multiplicative weight noise of std ``noise_std`` (ANP's perturbation),
  then ``"ft"``;
- ``"ft2"``: two rounds of ``"ft"`` (compositional sanitisation);
- ``"mask_ft"``: the channel masks given in the batch (e.g. the real fine-pruning mask at
  ``theta``: the oracle control), then ``"ft"`` with them held;
- ``"delta"``: a real defense's own path, first-order: the batch carries displacements
  ``delta_j`` (``DTBBatch.deltas``, leading axis ``P``) that a real defense run made from a
  recent ``theta`` (refreshed by the caller as training goes, e.g. every few outer steps),
  and ``theta_j = mask(theta + delta_j)`` with the batch's masks (none: no mask).

The inner steps' loss is the clean cross-entropy, plus ``unlearn_weight`` times a decoy
unlearning loss; the default ``unlearn_weight = 0``: a defender does not hold the decoy's
trigger, and an inner loss that uses it is an "oracle unlearning" ablation. That loss:
``"log1m"``: ``-log(1 - p_{t_d}(T_d(x_c)))`` over the rows not of class ``t_d`` (SAU's
``L_sar`` form; its logit gradient is ``p_{t_d}``, which stays near 1 while the decoy is
active, so it does not vanish on a confident decoy); ``"bounded"``: ``1 - p_{y_c}``
(gradient ``p (1 - p)``: vanishes on a saturated decoy, kept as an ablation); ``"ce"``.

An earlier form weighted a single endpoint term by the fraction of the decoy removed; a
surrogate that wrecks the model removes all of it, so that objective rewarded a collapse to
``t_h`` (a review measured it: every member of the displacement-matched surrogate took a
BadNets model to chance accuracy). The path gate and the post-sanitisation clean and decoy
terms replace it.

Augmentation (``DTBConfig.pad``): BackdoorBench trains the attacked model and fine-tunes it
in defense with RandomCrop(padding), the trigger stamped before the crop so that it moves
with the image. With ``pad > 0`` every outer image (clean, decoy- and hidden-triggered rows;
trigger first, one crop per image shared by its copies) and every inner surrogate step's
rows (clean and decoy-triggered, as the real fine-tuning defenses shift theirs) are shifted
by up to ``pad`` pixels; ``pad = 0`` draws nothing and is the unaugmented objective.

Hypergradients (``DTBConfig.hypergrad``): ``"unrolled"``, exact reverse-mode through the
inner steps (each inner step's vjp a Hessian-vector product, forward-over-reverse);
``"first_order"``, the inner updates stop-gradiented, so ``d theta_r / d theta`` is the
identity (times the held mask or the noise factor; first-order MAML, arXiv 1703.03400). A
ReLU network's unrolled objective is only piecewise smooth: finite differences need points
off the kinks (random biases) and small steps (see the tests).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from hexad import sharding
from hexad._base import DATA_AXIS, Algorithm, TrainState, check_int
from hexad.backdoor._models import apply_channel_mask, head_activation, head_input_layer
from hexad.backdoor._train import _batch_spec, _place_rows, cross_entropy
from hexad.backdoor._triggers import apply_trigger, check_images, shift
from hexad.backdoor._types import DefenseOutput

__all__ = [
    "FAMILY",
    "DTBBatch",
    "DTBConfig",
    "DTBInfo",
    "DTBProblem",
    "ImplantInfo",
    "dtb_objective",
    "implant",
    "make_dtb",
    "sanitise_surrogate",
    "surrogate_defense",
    "surrogate_path",
    "weight_displacement",
]

FAMILY = ("ft", "prune_ft", "noise_ft", "ft2", "mask_ft", "delta")
"""The surrogate family's members (module docstring)."""


@dataclasses.dataclass(frozen=True)
class DTBConfig:
    """Static hyper-parameters of DTB (hashable; closed over by :func:`make_dtb`).

    Attributes:
      inner_steps: ``K``, SGD steps per sanitisation round.
      inner_lr, inner_momentum: inner SGD (``optax.sgd``'s heavy ball); match the real
        defenses' weight displacement with :func:`weight_displacement`.
      inner_batch: clean-split rows per inner step (0: all every step); step ``i`` uses
        rows ``[i b, (i + 1) b)`` modulo the split's size.
      unlearn_weight: ``lambda_u`` (default 0: no unlearning with the decoy's true trigger,
        which a defender does not hold); unlearn: ``"log1m"``, ``"bounded"`` or ``"ce"``.
      family: surrogate members drawn uniformly each outer step (names in :data:`FAMILY`).
      prune_frac: channels pruned by ``"prune_ft"``, in (0, 1).
      noise_std: weight noise of ``"noise_ft"`` (> 0).
      hypergrad: ``"first_order"`` or ``"unrolled"``.
      decoy_rate: fraction of each outer batch carrying the decoy, in (0, 1).
      w_clean, w_hidden_pre, w_clean_post, w_decoy_post, w_hidden_post: outer weights
        (module docstring).
      path_points: ``P``, the iterates of the surrogate's path the post terms are taken at
        (an int >= 1; 1: the endpoint only).
      gate: ``"decoy"`` (the hidden target where the decoy fell, the true label where it
        holds) or ``"always"`` (the hidden target at every path point).
      gate_threshold: ``tau``, the decoy-target probability below which the decoy counts as
        suppressed, in (0, 1); gate_temperature: the gate's softness (> 0).
      pad: random-shift augmentation of the outer batch and the inner steps' rows by up to
        ``pad`` pixels (module docstring), an int >= 0; 0: none.
    """

    inner_steps: int = 10
    inner_lr: float = 0.01
    inner_momentum: float = 0.9
    inner_batch: int = 32
    unlearn_weight: float = 0.0
    unlearn: str = "log1m"
    family: tuple[str, ...] = ("ft", "prune_ft", "noise_ft", "ft2")
    prune_frac: float = 0.3
    noise_std: float = 0.05
    hypergrad: str = "first_order"
    decoy_rate: float = 0.1
    w_clean: float = 1.0
    w_hidden_pre: float = 1.0
    w_hidden_post: float = 1.0
    w_clean_post: float = 1.0
    w_decoy_post: float = 1.0
    path_points: int = 2
    gate: str = "decoy"
    gate_threshold: float = 0.2
    gate_temperature: float = 0.05
    pad: int = 0

    def __post_init__(self):
        check_int("inner_steps", self.inner_steps, lo=0)
        check_int("pad", self.pad, lo=0)
        check_int("inner_batch", self.inner_batch, lo=0)
        check_int("path_points", self.path_points, lo=1)
        if self.gate not in ("decoy", "always"):
            raise ValueError(f"gate: expected 'decoy' or 'always', got {self.gate!r}")
        if not 0.0 < self.gate_threshold < 1.0:
            raise ValueError(
                f"gate_threshold: expected a probability in (0, 1), got {self.gate_threshold!r}"
            )
        if not self.gate_temperature > 0:
            raise ValueError(
                f"gate_temperature: expected a number > 0, got {self.gate_temperature!r}"
            )
        if self.hypergrad not in ("first_order", "unrolled"):
            raise ValueError(
                f"hypergrad: expected 'first_order' or 'unrolled', got {self.hypergrad!r}"
            )
        if self.unlearn not in ("log1m", "bounded", "ce"):
            raise ValueError(f"unlearn: expected 'log1m', 'bounded' or 'ce', got {self.unlearn!r}")
        fam = tuple(self.family)
        if not fam or any(f not in FAMILY for f in fam):
            raise ValueError(f"family: expected a non-empty tuple of {FAMILY}, got {fam!r}")
        object.__setattr__(self, "family", fam)
        if not 0.0 <= self.inner_momentum < 1.0:
            raise ValueError(
                f"inner_momentum: expected a number in [0, 1), got {self.inner_momentum!r}"
            )
        if not 0.0 < self.decoy_rate < 1.0:
            raise ValueError(
                f"decoy_rate: expected a poison rate in (0, 1), got {self.decoy_rate!r}"
            )
        if not 0.0 < self.prune_frac < 1.0:
            raise ValueError(f"prune_frac: expected a number in (0, 1), got {self.prune_frac!r}")
        if not self.noise_std > 0:
            raise ValueError(f"noise_std: expected a number > 0, got {self.noise_std!r}")
        weights = ("w_clean", "w_hidden_pre", "w_hidden_post", "w_clean_post", "w_decoy_post")
        for name in ("inner_lr", "unlearn_weight", *weights):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")


@flax.struct.dataclass
class DTBProblem:
    """The two triggers and their (different) targets.

    Attributes:
      decoy: trigger of the decoy backdoor (active before sanitisation).
      hidden: trigger of the hidden backdoor (active after).
      decoy_target: label the decoy maps to (static).
      hidden_target: label the hidden trigger maps to after sanitisation (static); must
        differ from ``decoy_target`` (use :func:`check_problem`).
    """

    decoy: Any
    hidden: Any
    decoy_target: int = flax.struct.field(pytree_node=False)
    hidden_target: int = flax.struct.field(pytree_node=False)


def check_problem(problem, allow_same_target: bool = False) -> DTBProblem:
    """Raises unless ``problem`` is a :class:`DTBProblem` with distinct targets."""
    if not isinstance(problem, DTBProblem):
        raise TypeError(f"problem: expected a DTBProblem, got {type(problem).__name__}")
    if not allow_same_target and int(problem.hidden_target) == int(problem.decoy_target):
        raise ValueError(
            f"hidden_target: expected a target other than decoy_target={problem.decoy_target}, "
            f"got {problem.hidden_target}"
        )
    return problem


class DTBBatch(NamedTuple):
    """One outer step's data.

    Attributes:
      x: ``[b, H, W, C]`` attacker's images (clean; the decoy is stamped on ``decoy_rate``
        of them inside the objective); y: ``[b]`` their labels.
      x_clean: ``[bc, H, W, C]`` rows the surrogate defender fine-tunes on; y_clean: ``[bc]``.
      masks: optional layer -> ``[c]`` channel masks for the ``"mask_ft"`` and ``"delta"``
        members.
      deltas: optional displacements for the ``"delta"`` member: a pytree like the
        parameters with a leading axis of ``path_points``.
    """

    x: jax.Array
    y: jax.Array
    x_clean: jax.Array
    y_clean: jax.Array
    masks: Any = None
    deltas: Any = None


class DTBInfo(NamedTuple):
    """Diagnostics of one outer step (float scalars).

    Attributes:
      loss, clean, hidden_pre, hidden_post, clean_post, decoy_post: the objective and its
        terms (unweighted; the post terms as in the objective, means over the path or at
        its end).
      gate: the mean gate ``g`` over the path.
      member: index into ``config.family`` of the surrogate drawn.
      decoy_prob_before, decoy_prob_after: mean decoy-target probability at theta / at the
        path's end.
      hidden_prob_after: mean hidden-target probability on hidden-triggered rows not of
        class ``t_h`` at the path's end.
      collapse_after: the share of clean rows not of class ``t_h`` that the path's end
        classifies as ``t_h`` (a collapse towards the hidden target, not a backdoor).
    """

    loss: jax.Array
    clean: jax.Array
    hidden_pre: jax.Array
    hidden_post: jax.Array
    clean_post: jax.Array
    decoy_post: jax.Array
    gate: jax.Array
    member: jax.Array
    decoy_prob_before: jax.Array
    decoy_prob_after: jax.Array
    hidden_prob_after: jax.Array
    collapse_after: jax.Array


def weight_displacement(params, other) -> jax.Array:
    """Returns the global L2 norm of ``other - params`` (how far a defense moved a model).

    >>> float(weight_displacement({"a": jnp.zeros(2)}, {"a": jnp.array([3.0, 4.0])}))
    5.0
    """
    d = jax.tree.map(jnp.subtract, other, params)
    return jnp.sqrt(sum(jnp.sum(a.astype(jnp.float32) ** 2) for a in jax.tree.leaves(d)))


def _grad_with_hvp_vjp(f: Callable) -> Callable:
    """``jax.grad(f)`` whose reverse-mode derivative is a Hessian-vector product taken
    forward-over-reverse (``jvp`` of the gradient; the Hessian is symmetric, so this is the
    vjp), rather than reverse-over-reverse, which is what plain ``jax.grad`` through
    ``jax.grad`` builds: the same derivative, and on XLA:CPU about half the time of an
    unrolled outer step (``python -m kernels``, ``backdoor/dtb unrolled``). ``f`` must
    depend on nothing differentiated but its argument: its closed-over arrays (data,
    held masks) get no cotangent."""
    grad = jax.grad(f)

    @jax.custom_vjp
    def g(p):
        return grad(p)

    def fwd(p):
        return grad(p), p

    def bwd(p, ct):
        return (jax.jvp(grad, (p,), (ct,))[1],)

    g.defvjp(fwd, bwd)
    return g


def _sgd_round(model, config, problem, p, x_c, y_c, xd, masks, start, key=None, keep=()):
    """``K`` inner SGD steps from ``p`` (fresh momentum) on consecutive row blocks from
    block ``start``; ``masks`` held as channel scales; with ``config.pad`` each step's rows
    shifted (``key``; the same crop for a row's clean and decoy-triggered copy). Returns
    ``(p, next block, kept)``, ``kept`` the iterates after the steps numbered in ``keep``
    (1-based; 0: the start)."""
    n = x_c.shape[0]
    b = config.inner_batch or n
    first_order = config.hypergrad == "first_order"
    pad = config.pad
    keys = jax.random.split(key, config.inner_steps) if pad and config.inner_steps else None

    def inner_loss(q, rows, k):
        xb, yb = shift(k, x_c[rows], pad), y_c[rows]  # pad 0: no shift, k is None
        loss = cross_entropy(model.apply(q, xb, masks, masks), yb)
        if config.unlearn_weight == 0:
            return loss
        logits = model.apply(q, shift(k, xd[rows], pad), masks, masks)
        if config.unlearn == "ce":
            unl = cross_entropy(logits, yb)
        elif config.unlearn == "bounded":
            prob = jnp.take_along_axis(jax.nn.softmax(logits, -1), yb[:, None], axis=-1)
            unl = jnp.mean(1.0 - prob)
        else:  # -log(1 - p_td) = logsumexp(all) - logsumexp(all but t_d): stable
            keep = jnp.arange(logits.shape[-1]) != problem.decoy_target
            rest = jax.nn.logsumexp(jnp.where(keep, logits, -jnp.inf), axis=-1)
            w = (yb != problem.decoy_target).astype(logits.dtype)  # rows of other classes
            per = jax.nn.logsumexp(logits, axis=-1) - rest
            unl = jnp.sum(w * per) / jnp.maximum(jnp.sum(w), 1.0)
        return loss + config.unlearn_weight * unl

    v = jax.tree.map(jnp.zeros_like, p)
    i = start
    kept = [p] * sum(1 for s_ in keep if s_ == 0)
    for j in range(config.inner_steps):
        rows = np.arange(i * b, (i + 1) * b) % n  # static: wraps to row 0 at the end
        i += 1
        k = None if keys is None else keys[j]
        r = slice(None) if b == n else rows
        if first_order:
            g = jax.lax.stop_gradient(jax.grad(inner_loss)(p, r, k))
        else:
            g = _grad_with_hvp_vjp(lambda q, r=r, k=k: inner_loss(q, r, k))(p)
        if config.inner_momentum > 0:
            v = jax.tree.map(lambda t, gg: gg + config.inner_momentum * t, v, g)
            g = v
        p = jax.tree.map(lambda a, u: a - config.inner_lr * u, p, g)
        kept += [p] * sum(1 for s_ in keep if s_ == j + 1)
    return p, i, kept


def _path_steps(total: int, points: int) -> list[int]:
    """The inner steps after which the path's ``points`` iterates are taken: ``ceil(j total /
    points)`` for ``j = 1..points`` (all 0, the start, when ``total`` is 0)."""
    return [-(-j * total // points) for j in range(1, points + 1)]


def _prune_mask(model, config, p, x_c):
    last = head_input_layer(p)  # fine-pruning's layer: the head's input features
    _, feats = model.apply(jax.lax.stop_gradient(p), x_c, features=True)
    act = head_activation(feats, last)
    n_prune = int(config.prune_frac * act.shape[0])
    # rank, not threshold: dead channels tie at zero activation
    return {last: jnp.ones_like(act).at[jnp.argsort(act)[:n_prune]].set(0.0)}


def _member(name, key, model, config, problem, params, x_c, y_c, masks, deltas=None):
    """The member's path: ``config.path_points`` iterates, stacked on a leading axis."""
    stack = lambda ps: jax.tree.map(lambda *a: jnp.stack(a), *ps)
    k_steps = config.inner_steps
    if name == "delta":
        if deltas is None:
            raise ValueError("deltas: the 'delta' member needs DTBBatch.deltas, got None")
        n = {int(a.shape[0]) for a in jax.tree.leaves(deltas)}
        if n != {config.path_points}:
            raise ValueError(
                f"deltas: expected a leading axis of path_points={config.path_points}, got {n}"
            )
        moved = jax.tree.map(lambda a, d: a[None] + jax.lax.stop_gradient(d), params, deltas)
        if masks is None:
            return moved
        return jax.vmap(lambda q: apply_channel_mask(q, jax.lax.stop_gradient(masks)))(moved)
    xd = apply_trigger(problem.decoy, x_c)
    ka = None
    if config.pad:  # pad 0 draws nothing: the noise key is the unaugmented objective's
        key, ka = jax.random.split(key)
    steps = _path_steps(2 * k_steps if name == "ft2" else k_steps, config.path_points)

    def run(p, m, s=0, k=ka, offset=0, first=True):  # keep: this round's steps of the path
        keep = [t - offset for t in steps if offset < t <= offset + k_steps or (first and t == 0)]
        return _sgd_round(model, config, problem, p, x_c, y_c, xd, m, s, k, keep)

    if name == "ft":
        return stack(run(params, None)[2])
    if name == "ft2":
        k1, k2 = jax.random.split(ka) if config.pad else (None, None)
        p, i, kept = run(params, None, 0, k1)
        return stack(kept + run(p, None, i, k2, k_steps, first=False)[2])
    if name == "noise_ft":
        leaves, tdef = jax.tree.flatten(params)
        ks = jax.random.split(key, len(leaves))
        noisy = [
            a * (1.0 + config.noise_std * jax.random.normal(k, a.shape, a.dtype))
            for a, k in zip(leaves, ks, strict=True)
        ]
        return stack(run(jax.tree.unflatten(tdef, noisy), None)[2])
    m = _prune_mask(model, config, params, x_c) if name == "prune_ft" else masks
    if m is None:
        raise ValueError("masks: the 'mask_ft' member needs DTBBatch.masks, got None")
    m = jax.lax.stop_gradient(m)
    kept = run(apply_channel_mask(params, m), m)[2]
    return stack([apply_channel_mask(q, m) for q in kept])


def sanitise_surrogate(
    key,
    model,
    config: DTBConfig,
    params,
    problem: DTBProblem,
    x_c,
    y_c,
    member=None,
    masks=None,
    deltas=None,
):
    """Returns the parameters after one surrogate member (traced index ``member`` into
    ``config.family``; ``None``: drawn uniformly from ``key``): the end of its path
    (:func:`surrogate_path`).

    Args:
      key: PRNG key (member draw, weight noise, shifts).
      model: a flax classifier with channel scales (static).
      config: :class:`DTBConfig` (static).
      params: parameters ``theta``.
      problem: :class:`DTBProblem`.
      x_c: ``[bc, H, W, C]`` clean rows; y_c: ``[bc]``.
      member: optional int index of the member.
      masks: channel masks for ``"mask_ft"`` (and ``"delta"``).
      deltas: displacements for ``"delta"`` (:class:`DTBBatch`).

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> xc, yc = jnp.full((4, 8, 8, 1), 0.5), jnp.arange(4) % 2
    >>> cfg = DTBConfig(inner_steps=2, inner_batch=2, family=("ft",))
    >>> q = jax.jit(lambda k, p: sanitise_surrogate(k, m, cfg, p, pr, xc, yc))(
    ...     jax.random.key(1), p)
    >>> jax.tree.structure(q) == jax.tree.structure(p)
    True
    """
    path = surrogate_path(key, model, config, params, problem, x_c, y_c, member, masks, deltas)
    return jax.tree.map(lambda a: a[-1], path)


def surrogate_path(
    key,
    model,
    config: DTBConfig,
    params,
    problem: DTBProblem,
    x_c,
    y_c,
    member=None,
    masks=None,
    deltas=None,
):
    """Returns one surrogate member's path: its ``config.path_points`` iterates (module
    docstring), a pytree like ``params`` with that leading axis; the arguments of
    :func:`sanitise_surrogate`."""
    b = config.inner_batch or x_c.shape[0]
    if config.inner_steps > 0 and b > x_c.shape[0]:
        raise ValueError(f"x_c: expected at least inner_batch={b} rows, got {x_c.shape[0]}")
    k1, k2 = jax.random.split(key)
    fam = config.family
    if member is None:
        member = jax.random.randint(k1, (), 0, len(fam))
    kw = {"x_c": x_c, "y_c": y_c, "masks": masks, "deltas": deltas}
    branches = [functools.partial(_member, f, k2, model, config, problem, **kw) for f in fam]
    if len(branches) == 1:
        return branches[0](params)
    return jax.lax.switch(member, branches, params)


def _with_inner_lr(config: DTBConfig, inner_lr) -> DTBConfig:
    """``config`` with ``inner_lr`` set to a (traced) value, past the checks, so that one
    compile keyed on ``config`` serves every step size (pass the config with a placeholder)."""
    cfg = copy.copy(config)
    object.__setattr__(cfg, "inner_lr", inner_lr)
    return cfg


@functools.partial(jax.jit, static_argnums=(1, 2, 7))
def _surrogate_jit(key, model, config, params, problem, x, y, member, masks, inner_lr, deltas):
    cfg = _with_inner_lr(config, inner_lr)
    return sanitise_surrogate(key, model, cfg, params, problem, x, y, member, masks, deltas)


def surrogate_defense(config: DTBConfig, problem: DTBProblem, member: str = "ft") -> Callable:
    """Returns one surrogate member as a defense ``(key, model, params, data) ->
    DefenseOutput`` on the clean split of ``data`` (surrogate fidelity and displacement next
    to the real defenses); module-level jit, ``model`` static.

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> from hexad.backdoor.defenses import DefenseData
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> sur = surrogate_defense(DTBConfig(inner_steps=2, inner_batch=2), pr)
    >>> d = DefenseData(jnp.full((4, 8, 8, 1), 0.5), jnp.arange(4) % 2)
    >>> out = sur(jax.random.key(1), m, p, d)
    >>> jax.tree.structure(out.params) == jax.tree.structure(p)
    True
    """
    if not isinstance(config, DTBConfig):
        raise TypeError(f"config: expected a DTBConfig, got {type(config).__name__}")
    check_problem(problem, allow_same_target=True)
    if member not in FAMILY:
        raise ValueError(f"member: expected one of {FAMILY}, got {member!r}")
    cfg = dataclasses.replace(config, family=(member,), inner_lr=0.0)  # lr traced
    lr = jnp.asarray(config.inner_lr, jnp.float32)

    def defense(key, model, params, data, masks=None, deltas=None):
        n = data.x_clean.shape[0]  # a split smaller than inner_batch: full-batch steps
        c = cfg if cfg.inner_batch <= n else dataclasses.replace(cfg, inner_batch=0)
        x, y = data.x_clean, data.y_clean
        q = _surrogate_jit(key, model, c, params, problem, x, y, 0, masks, lr, deltas)
        return DefenseOutput(q, {"acted": True})

    return defense


def _objective_keys(key, n_members: int):
    """``(member index, surrogate key)``: what :func:`dtb_objective` draws from its key."""
    k1, k2 = jax.random.split(key)
    return jax.random.randint(k1, (), 0, n_members), k2


def dtb_objective(key, model, config: DTBConfig, params, problem: DTBProblem, batch: DTBBatch):
    """Returns ``(loss, DTBInfo)``: the DTB outer objective (module docstring).

    Its ``jax.grad`` is the unrolled or first-order hypergradient (``config.hypergrad``).

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> b = DTBBatch(jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int), jnp.zeros((4, 8, 8, 1)),
    ...              jnp.zeros(4, int))
    >>> cfg = DTBConfig(inner_steps=1, inner_batch=2, family=("ft",))
    >>> loss, info = jax.jit(lambda k, p: dtb_objective(k, m, cfg, p, pr, b))(jax.random.key(1), p)
    >>> bool(jnp.isfinite(loss)), 0.0 <= float(info.gate) <= 1.0
    (True, True)
    """
    x, y = batch.x, batch.y
    n_dec = max(1, int(round(config.decoy_rate * x.shape[0])))
    is_dec = jnp.arange(x.shape[0]) < n_dec
    xd = apply_trigger(problem.decoy, x)
    xh = apply_trigger(problem.hidden, x)
    x_mix = jnp.where(is_dec[:, None, None, None], xd, x)
    y_mix = jnp.where(is_dec, jnp.asarray(problem.decoy_target, y.dtype), y)
    th = jnp.full_like(y, problem.hidden_target)
    member, k2 = _objective_keys(key, len(config.family))
    xc = x
    if config.pad:  # pad 0 draws nothing: the unaugmented objective's keys
        k2, ka = jax.random.split(k2)
        # the triggers are stamped, then the images cropped; one key, so one crop per image
        # shared by its clean, decoy- and hidden-triggered copies
        x_mix, xh, xd, xc = (shift(ka, a, config.pad) for a in (x_mix, xh, xd, xc))
    clean = cross_entropy(model.apply(params, x_mix), y_mix)
    hidden_pre = cross_entropy(model.apply(params, xh), y)
    not_d, not_h = (y != problem.decoy_target), (y != problem.hidden_target)
    wmean = lambda v, w: jnp.sum(jnp.where(w, v, 0)) / jnp.maximum(jnp.sum(w), 1)
    pd0 = jax.lax.stop_gradient(
        wmean(jax.nn.softmax(model.apply(params, xd), -1)[:, problem.decoy_target], not_d)
    )
    path = surrogate_path(
        k2, model, config, params, problem, batch.x_clean, batch.y_clean, member, batch.masks,
        batch.deltas,
    )  # fmt: skip
    b = x.shape[0]
    rows = jnp.concatenate([xc, xd, xh])  # one forward pass per path point

    def at(q):
        lc, ld, lh = jnp.split(model.apply(q, rows), [b, 2 * b])
        # -log(1 - p_td) = logsumexp(all) - logsumexp(all but t_d): stable
        keep = jnp.arange(ld.shape[-1]) != problem.decoy_target
        unl = jax.nn.logsumexp(ld, -1) - jax.nn.logsumexp(jnp.where(keep, ld, -jnp.inf), -1)
        pd = jax.lax.stop_gradient(wmean(jax.nn.softmax(ld, -1)[:, problem.decoy_target], not_d))
        if config.gate == "always":
            g = jnp.ones((), jnp.float32)
        else:
            g = jax.nn.sigmoid((config.gate_threshold - pd) / config.gate_temperature)
        hid = g * cross_entropy(lh, th) + (1.0 - g) * cross_entropy(lh, y)
        ph = jax.lax.stop_gradient(wmean(jax.nn.softmax(lh, -1)[:, problem.hidden_target], not_h))
        col = jax.lax.stop_gradient(wmean(jnp.argmax(lc, -1) == problem.hidden_target, not_h))
        return cross_entropy(lc, y), wmean(unl, not_d), hid, g, pd, ph, col

    n_path = jax.tree.leaves(path)[0].shape[0]
    per = [at(jax.tree.map(lambda a, j=j: a[j], path)) for j in range(n_path)]
    clean_post = jnp.mean(jnp.stack([v[0] for v in per]))
    hidden_post = jnp.mean(jnp.stack([v[2] for v in per]))
    gate = jnp.mean(jnp.stack([v[3] for v in per]))
    _, decoy_post, _, _, pd, ph, collapse = per[-1]
    loss = (
        config.w_clean * clean
        + config.w_hidden_pre * hidden_pre
        + config.w_clean_post * clean_post
        + config.w_decoy_post * decoy_post
        + config.w_hidden_post * hidden_post
    )
    info = DTBInfo(
        loss, clean, hidden_pre, hidden_post, clean_post, decoy_post, gate, member, pd0, pd, ph,
        collapse,
    )  # fmt: skip
    return loss, info


def make_dtb(
    model,
    optimizer: optax.GradientTransformation,
    config: DTBConfig,
    problem: DTBProblem,
    *,
    params: Any = None,
    mesh: Mesh | None = None,
    axis: str = DATA_AXIS,
) -> Algorithm:
    """Returns the DTB implant as an :class:`hexad._base.Algorithm` (``init`` + ``step``).

    ``init(key, example_batch) -> TrainState``: ``params`` if given (``key`` unused), else
    ``model.init(key, example_batch.x)``. ``step(key, state, batch) -> (TrainState,
    DTBInfo)``: one optimiser step on the gradient of :func:`dtb_objective`. The caller jits.
    With ``mesh`` (any axis types; converted to Auto axes) the batch's outer rows and clean
    rows are each split along ``axis`` (both counts divisible by its size): the outer terms
    and every inner surrogate step run data-parallel, gradients all-reduced.

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> cfg = DTBConfig(inner_steps=1, inner_batch=2, family=("ft",))
    >>> dtb = make_dtb(m, optax.adam(1e-3), cfg, pr)
    >>> b = DTBBatch(jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int), jnp.zeros((4, 8, 8, 1)),
    ...              jnp.zeros(4, int))
    >>> st, info = jax.jit(dtb.step)(jax.random.key(1), dtb.init(jax.random.key(0), b), b)
    >>> int(st.step), info.loss.shape
    (1, ())
    """
    if not isinstance(config, DTBConfig):
        raise TypeError(f"config: expected a DTBConfig, got {type(config).__name__}")
    check_problem(problem, allow_same_target=config.w_hidden_post == 0)
    rows = _batch_spec(mesh, axis)

    def objective(p, key, batch):
        return dtb_objective(key, model, config, p, problem, batch)

    def init(key, example_batch: DTBBatch) -> TrainState:
        p = model.init(key, example_batch.x) if params is None else params
        return TrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32))

    def step(key, state: TrainState, batch: DTBBatch):
        if rows is not None:
            sharding.check_divisible(rows.mesh, axis, batch.x.shape[0], "batch.x")
            sharding.check_divisible(rows.mesh, axis, batch.x_clean.shape[0], "batch.x_clean")
            x, y, xc, yc = _place_rows((batch.x, batch.y, batch.x_clean, batch.y_clean), rows)
            batch = batch._replace(x=x, y=y, x_clean=xc, y_clean=yc)
        (_, info), g = jax.value_and_grad(objective, has_aux=True)(state.params, key, batch)
        upd, opt_state = optimizer.update(g, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, upd), opt_state, state.step + 1), info

    return Algorithm(init, step)


def _implant_body(dtb_step, batch_size, clean_size, k, state, data, masks, deltas=None):
    """One outer step of ``dtb_step`` on rows drawn from ``data`` (what :func:`implant` runs)."""
    k1, k2, k3 = _implant_keys(k)
    xs, ys, xc, yc = data
    i = jax.random.randint(k1, (batch_size,), 0, xs.shape[0])
    j = jax.random.randint(k2, (clean_size,), 0, xc.shape[0])
    return dtb_step(k3, state, DTBBatch(xs[i], ys[i], xc[j], yc[j], masks, deltas))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4), static_argnames=("mesh", "axis"))
def _member_step(model, optimizer, config, batch_size, clean_size, k, state, problem, data,
                 masks, inner_lr, deltas=None, *, mesh=None, axis=DATA_AXIS):  # fmt: skip
    """:func:`_implant_body` of one member's :func:`make_dtb` step, module-level: the
    triggers (``problem``) and the step size ``inner_lr`` are traced, so that one compile
    per member serves every seed and matched step size of a study (``config.inner_lr`` is a
    placeholder)."""
    cfg = _with_inner_lr(config, inner_lr)
    step = make_dtb(model, optimizer, cfg, problem, mesh=mesh, axis=axis).step
    return _implant_body(step, batch_size, clean_size, k, state, data, masks, deltas)


def _implant_keys(k):
    """``(outer rows key, clean rows key, step key)`` of one :func:`_implant_body`."""
    return jax.random.split(k, 3)


@functools.partial(jax.jit, static_argnums=1)
def _draw_member(k, n):
    """The member index :func:`dtb_objective` draws in :func:`_implant_body`'s step."""
    return _objective_keys(_implant_keys(k)[2], n)[0]


class ImplantInfo(NamedTuple):
    """What :func:`implant` reports.

    Attributes:
      steps: :class:`DTBInfo` of ``[n_steps]`` arrays, one entry per outer step.
      held_step: ``[e]`` int, the outer steps after which the held-out objective was
        evaluated (0: the initial parameters); empty without held-out data.
      held_objective: ``[e]`` float, the held-out objective at those steps.
      best_step: int scalar, the step whose parameters :func:`implant` returned (``n_steps``,
        the last, without held-out data).
    """

    steps: DTBInfo
    held_step: jax.Array
    held_objective: jax.Array
    best_step: jax.Array


class _Best(NamedTuple):
    """The best parameters seen so far (the selection's loop state): ``params``, their
    held-out objective ``value`` (float scalar) and ``step`` (int scalar)."""

    params: Any
    value: jax.Array
    step: jax.Array


@jax.jit
def _keep_best(best: _Best, params, value, step) -> _Best:
    """``best`` updated with ``(params, value, step)`` when ``value`` is strictly lower (a
    NaN objective, a diverged model, is never kept); pure, so the loop carries no host
    copies and never waits on the device."""
    better = value < best.value
    pick = lambda a, b: jnp.where(better, a, b)
    return _Best(
        jax.tree.map(pick, params, best.params),
        pick(value, best.value),
        pick(jnp.asarray(step, best.step.dtype), best.step),
    )


@functools.partial(jax.jit, static_argnums=(0, 1))
def _held_objective(model, configs, key, params, problem, held, inner_lr):
    """The mean over the single-member ``configs`` of :func:`dtb_objective` on the held-out
    batch ``held`` (a :class:`DTBBatch`), one ``key`` for all: the attacker's objective in
    expectation over the uniform member draw, the surrogate's noise held fixed (common random
    numbers, so two checkpoints are compared under the same draw)."""
    vals = [
        dtb_objective(key, model, _with_inner_lr(c, inner_lr), params, problem, held)[0]
        for c in configs
    ]
    return jnp.mean(jnp.stack(vals))


def implant(
    key,
    model,
    params,
    problem: DTBProblem,
    x,
    y,
    x_clean,
    y_clean,
    config: DTBConfig,
    optimizer: optax.GradientTransformation,
    n_steps: int,
    batch_size: int,
    mask_fn: Callable | None = None,
    mask_every: int = 20,
    callback: Callable | None = None,
    held: tuple | None = None,
    eval_every: int = 20,
    delta_fn: Callable | None = None,
    mesh: Mesh | None = None,
    axis: str = DATA_AXIS,
):
    """Returns ``(params, ImplantInfo)``: ``n_steps`` outer DTB steps, and with ``held`` the
    parameters of the evaluated step with the lowest held-out objective.

    A host loop over jitted :func:`make_dtb` steps, one per family member (the member drawn
    on the host, as :func:`dtb_objective` would draw it); minibatches drawn with replacement.
    Each member's step compiles once per ``model``, ``optimizer`` (pass the same object),
    config and shapes: later calls with other parameters, triggers or ``inner_lr`` reuse it.
    Each step draws ``R K inner_batch`` clean rows (``R`` = 2 when ``"ft2"`` is in the
    family), so every inner step sees fresh rows.

    Checkpoint selection (``held``). The criterion is the attacker's own objective, the value
    :func:`dtb_objective` minimises (clean and decoy task, hidden trigger dormant at theta,
    the post-sanitisation terms along the surrogate's path), on the attacker's
    held-out images alone: the outer batch is every held-out row, the surrogate fine-tunes on
    them too, and the value is the mean over the family's members under one fixed key (the
    expectation over the uniform member draw, with common random numbers across
    checkpoints), without augmentation (``pad`` 0, as test metrics are). It is evaluated on
    the initial parameters, every ``eval_every`` steps and after the last; the lowest wins
    (the earliest on ties; a NaN never), so a run whose clean accuracy collapses late
    returns its best earlier state. The best parameters ride in the loop state through a
    jitted pure update (no host copy, no device sync); the training steps' keys and draws
    are those of a run without ``held``. ``held`` must be disjoint from ``x`` and
    ``x_clean`` (the caller's split): neither the defender's clean split nor
    test data, which the attacker does not hold.

    Args:
      key: PRNG key.
      model: a flax classifier (static).
      params: initial parameters (a fresh init or a pre-trained model).
      problem: :class:`DTBProblem`.
      x, y: attacker's clean training images ``[n, H, W, C]`` and labels ``[n]``.
      x_clean, y_clean: the attacker's stand-in for the defender's clean split.
      config: :class:`DTBConfig`; optimizer: optax transformation.
      n_steps: outer steps; batch_size: outer batch size.
      mask_fn: optional host ``mask_fn(params) -> masks`` for ``"mask_ft"`` and ``"delta"``
        (e.g. the real fine-pruning mask), recomputed every ``mask_every`` steps.
      delta_fn: host ``delta_fn(params, masks) -> deltas`` for ``"delta"``: a real
        defense's path displacements from ``params`` (:class:`DTBBatch`), recomputed with
        the masks every ``mask_every`` steps (the operator refreshed as training goes).
      callback: optional ``callback(step, info)`` after each step.
      held: optional ``(x_held [h, H, W, C], y_held [h])``, the attacker's held-out images
        (fewer than ``inner_batch``: full-batch inner steps); ``None``: no selection, the
        last parameters.
      eval_every: outer steps between two held-out evaluations (each costs about one outer
        step per family member).
      mesh: optional data-parallel mesh (:func:`make_dtb`'s): each step's outer rows
        (``batch_size``) and clean rows (``R K inner_batch``) split along ``axis``, both
        divisible by its size; the held-out evaluation and the host's draws are unchanged,
        so a run on a mesh follows the same draws as one without.
      axis: the mesh axis of the rows (static).

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> x = jax.random.uniform(jax.random.key(1), (12 * 64,)).reshape(12, 8, 8, 1)
    >>> y = jnp.arange(12) % 2
    >>> cfg = DTBConfig(inner_steps=1, inner_batch=2, family=("ft",))
    >>> p1, info = implant(jax.random.key(2), m, p, pr, x[:8], y[:8], x[:4], y[:4], cfg,
    ...                    optax.adam(1e-3), 4, 4, held=(x[8:], y[8:]), eval_every=2)
    >>> info.steps.loss.shape, info.held_step.tolist(), int(info.best_step) in (0, 2, 4)
    ((4,), [0, 2, 4], True)
    """
    check_images(x, "x", problem.decoy.image_shape)
    check_images(x_clean, "x_clean", problem.decoy.image_shape)
    n_steps = check_int("n_steps", n_steps)
    mask_every = check_int("mask_every", mask_every)
    eval_every = check_int("eval_every", eval_every)
    if "mask_ft" in config.family and mask_fn is None:
        raise ValueError("mask_fn: the 'mask_ft' member needs a mask function, got None")
    if "delta" in config.family and delta_fn is None:
        raise ValueError("delta_fn: the 'delta' member needs a displacement function, got None")
    if held is not None:
        xh, yh = held
        check_images(xh, "held", problem.decoy.image_shape)
        if tuple(yh.shape) != tuple(xh.shape[:1]) or xh.shape[0] < 1:
            raise ValueError(
                f"held: expected (x [h, H, W, C], y [h]) with h >= 1, got shapes "
                f"{tuple(xh.shape)}, {tuple(yh.shape)}"
            )
    rounds = 2 if "ft2" in config.family else 1
    bc = max(rounds * config.inner_steps * config.inner_batch, config.inner_batch, 1)
    bc = bc if config.inner_batch else min(batch_size, x_clean.shape[0])
    if mesh is not None:  # the Auto-axes mesh once, not per step; errors named here
        mesh = _batch_spec(mesh, axis).mesh
        sharding.check_divisible(mesh, axis, batch_size, "batch_size")
        sharding.check_divisible(mesh, axis, bc, "config.inner_batch (the clean rows)")
    # One jitted step per family member, the member drawn on the host from the key that
    # dtb_objective would draw it from (the same draws as the traced lax.switch, which
    # XLA:CPU runs as a conditional where convolutions are ~13x slower than straight-line).
    fam = config.family
    state = make_dtb(model, optimizer, config, problem, params=params).init(None, None)
    members = [dataclasses.replace(config, family=(f,), inner_lr=0.0) for f in fam]
    small = held is not None and xh.shape[0] < config.inner_batch  # full-batch inner steps
    # the held-out objective is evaluated without augmentation (pad 0): a deterministic
    # criterion, as test metrics are
    held_kw = {"pad": 0, **({"inner_batch": 0} if small else {})}
    held_cfgs = tuple(dataclasses.replace(c, **held_kw) for c in members)
    lr = jnp.asarray(config.inner_lr, jnp.float32)
    data = (x, y, x_clean, y_clean)
    k_held = jax.random.fold_in(key, n_steps)  # the training keys are a run's without held
    infos, masks, deltas, evals = [], None, None, []
    best = _Best(params, jnp.asarray(jnp.inf, jnp.float32), jnp.asarray(n_steps, jnp.int32))

    def evaluate(step, p, best):
        batch = DTBBatch(xh, yh, xh, yh, masks, deltas)
        v = _held_objective(model, held_cfgs, k_held, p, problem, batch, lr)
        evals.append((step, v))
        return _keep_best(best, p, v.astype(jnp.float32), step)

    for t, k in enumerate(jax.random.split(key, n_steps)):
        if t % mask_every == 0:
            masks = masks if mask_fn is None else mask_fn(state.params)
            deltas = deltas if delta_fn is None else delta_fn(state.params, masks)
        if held is not None and t == 0:
            best = evaluate(0, state.params, best)
        m = int(_draw_member(k, len(fam))) if len(fam) > 1 else 0
        state, info = _member_step(
            model,
            optimizer,
            members[m],
            batch_size,
            bc,
            k,
            state,
            problem,
            data,
            masks,
            lr,
            deltas,
            mesh=mesh,
            axis=axis,
        )
        info = info._replace(member=jnp.asarray(m, info.member.dtype))
        infos.append(info)
        if callback is not None:
            callback(t, info)
        if held is not None and ((t + 1) % eval_every == 0 or t + 1 == n_steps):
            best = evaluate(t + 1, state.params, best)
    steps = jax.tree.map(lambda *a: jnp.stack(a), *infos)
    if held is None:
        empty = jnp.zeros((0,), jnp.int32)
        return state.params, ImplantInfo(steps, empty, empty.astype(jnp.float32), best.step)
    held_step = jnp.asarray([e[0] for e in evals], jnp.int32)
    held_obj = jnp.stack([e[1] for e in evals]).astype(jnp.float32)
    return best.params, ImplantInfo(steps, held_step, held_obj, best.step)
