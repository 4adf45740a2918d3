"""DTB: a defense-triggered backdoor implanted by bi-level optimisation.

The attacker implants a normally active *decoy* backdoor and a dormant *hidden* one, so that
sanitising the model (which suppresses the decoy) activates the hidden backdoor. Following the
"Defense-Triggered Backdoor" formulation (NeurIPS 2026), the outer problem is

    min_theta  w_c  CE(f_theta(x), y)                          clean task
             + w_d  CE(f_theta(T_d(x)), t_d)                   decoy active before
             + w_hp CE(f_theta(T_h(x)), y)                     hidden dormant before
             + w_hq (1/R) sum_r g_r CE(f_{theta_r}(T_h(x)), t_h)   hidden active after round r

where ``theta_r = S(theta_{r-1})``, ``theta_0 = theta``, is a differentiable surrogate of
sanitisation (the inner level): ``K`` unrolled SGD steps (heavy-ball momentum
``inner_momentum`` and minibatches of ``inner_batch`` rows, as FT's ``optax.sgd``) on the
defender's clean split of

    CE(f(x_c), y_c) + lambda_u U(f(T_d(x_c)), y_c)             clean fine-tuning + decoy unlearning

with ``U`` the cross-entropy (``unlearn="ce"``) or the bounded ``1 - p_{y_c}`` (``"bounded"``),
followed, optionally, by pruning the ``prune_frac`` least active channels of the last conv
layer (fine-pruning's criterion) and multiplicative weight noise of std ``noise_std``
(ANP's perturbation). The gate

    g_r = sigmoid((p_d(theta) - tau) / temp) * sigmoid((tau - p_d(theta_r)) / temp),

with ``p_d`` the mean softmax probability of the decoy target on decoy-triggered inputs,
switches the hidden term on only where the decoy's attack success has *fallen*: active before
sanitisation (``p_d(theta) > tau``) and suppressed after round ``r`` (``p_d(theta_r) < tau``).
The first factor keeps the hidden term off while the decoy is not yet implanted (early in
training a fresh model has ``p_d`` near ``1 / num_classes``, and a one-sided gate would then
train the hidden trigger towards its target at ``theta_r ~ theta``, i.e. *before*
sanitisation). The gate is held constant (stop-gradient) so that the attacker never learns
to resist decoy removal.

Hypergradients (``DTBConfig.hypergrad``):

- ``"unrolled"``: exact reverse-mode through all ``R * K`` inner steps (second order).
- ``"first_order"``: the inner Jacobian ``d theta_r / d theta`` is replaced by the identity
  (first-order MAML, arXiv 1703.03400, sec. 5.2), i.e. the gradient of the post-sanitisation
  loss at ``theta_r`` is applied to ``theta``. Its error is ``O(inner_lr * K)``.

The unrolled objective of a ReLU network is only piecewise smooth, and it *jumps*: an inner
step moves ``theta`` by ``inner_lr`` times a gradient that is discontinuous wherever a
pre-activation crosses zero. Measured in float64 on the quick-size CNN (K = 3, lr 0.05, no
momentum, CE unlearning): at the initialisation (zero biases; the digits' zero background puts
many pre-activations exactly on a kink) central differences grow as ``1 / eps`` (15.4, -0.44,
-96, -1098, -11115 for eps 1e-4 ... 1e-8, against the gradient 14.90: a jump of ~2e-4 at
theta); with random biases they are rough at eps 1e-4 ... 1e-6 (112, 38.7, -42.9) and agree
with the gradient (13.68155418) to 2e-9 at 1e-7 and 1e-8. Finite-difference checks of the
hypergradient therefore need points off the kinks and small steps (see the tests).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad._base import Algorithm, TrainState, check_int
from hexad.backdoor._models import apply_channel_mask, conv_layers
from hexad.backdoor._train import cross_entropy
from hexad.backdoor._triggers import apply_trigger, check_images

__all__ = [
    "DTBBatch",
    "DTBConfig",
    "DTBInfo",
    "DTBProblem",
    "dtb_objective",
    "implant",
    "make_dtb",
    "sanitise_surrogate",
    "surrogate_defense",
]


@dataclasses.dataclass(frozen=True)
class DTBConfig:
    """Static hyper-parameters of DTB (hashable; closed over by :func:`make_dtb`).

    The inner defaults are FT's optimiser (``optax.sgd(0.01, momentum=0.9)``) with bounded
    unlearning. Measured on the plain 16x16 BadNets model of ``experiments.backdoor_dtb``
    (not trained against any surrogate): 5 such steps on 32-row blocks of the defender's
    clean split give clean accuracy 0.975 and decoy ASR 0.49, against the real defenses'
    means of 0.95 and 0.64 (mean absolute gaps over FT, FP, NAD, NC, I-BAU, SAU, ANP, RNP,
    MCR, CLP, FT-SAM: 0.026 and 0.305); the former inner step (lr 0.05, no momentum, full
    batch, CE unlearning) gave 0.33 and 0.0 (gaps 0.62 and 0.64): it wrecked the model.

    Attributes:
      inner_steps: ``K``, unrolled SGD steps per sanitisation round.
      inner_lr: inner SGD step size.
      inner_momentum: heavy-ball momentum ``mu`` of the inner SGD (``optax.sgd``'s: the
        trace ``v <- g + mu v``, step ``-lr v``; FT/FP/NAD use 0.9).
      inner_batch: rows of the clean split per inner step (0: all of them every step).
        Step ``i`` of the ``R * K`` uses rows ``[i b, (i + 1) b)`` modulo the split's
        size ``n`` (consecutive blocks, wrapping round), so every row is used and each step
        sees fresh rows when ``n >= R * K * inner_batch``.
      unlearn_weight: ``lambda_u``, weight of decoy unlearning in the inner loss.
      unlearn: ``"ce"``: unlearning loss ``CE(f(T_d(x_c)), y_c)`` (unbounded: a fully
        active decoy gives it, and its gradient, a large scale); ``"bounded"``: the mean of
        ``1 - p_{y_c}(T_d(x_c))`` (the MAE loss, arXiv 1712.09482), in ``[0, 1]`` with a
        bounded gradient. Both pull decoy-triggered inputs towards their true label; neither
        is gradient ascent.
      prune_frac: fraction of last-conv channels pruned after each round (0 = off).
      noise_std: std of multiplicative weight noise after each round (0 = off).
      rounds: ``R``, sanitisation rounds composed in the surrogate.
      hypergrad: ``"first_order"`` or ``"unrolled"``.
      w_clean, w_decoy, w_hidden_pre, w_hidden_post: outer weights.
      gate: use the gate (False: ``g_r = 1``).
      gate_tau: decoy-target probability the decoy must exceed before and fall below after
        sanitisation for the hidden term to switch on.
      gate_temp: gate temperature.
    """

    inner_steps: int = 5
    inner_lr: float = 0.01
    inner_momentum: float = 0.9
    inner_batch: int = 0
    unlearn_weight: float = 1.0
    unlearn: str = "bounded"
    prune_frac: float = 0.0
    noise_std: float = 0.0
    rounds: int = 1
    hypergrad: str = "first_order"
    w_clean: float = 1.0
    w_decoy: float = 1.0
    w_hidden_pre: float = 1.0
    w_hidden_post: float = 1.0
    gate: bool = True
    gate_tau: float = 0.3
    gate_temp: float = 0.05

    def __post_init__(self):
        check_int("inner_steps", self.inner_steps, lo=0)
        check_int("rounds", self.rounds)
        if self.hypergrad not in ("first_order", "unrolled"):
            raise ValueError(
                f"hypergrad: expected 'first_order' or 'unrolled', got {self.hypergrad!r}"
            )
        if self.unlearn not in ("ce", "bounded"):
            raise ValueError(f"unlearn: expected 'ce' or 'bounded', got {self.unlearn!r}")
        if not 0.0 <= self.inner_momentum < 1.0:
            raise ValueError(
                f"inner_momentum: expected a number in [0, 1), got {self.inner_momentum!r}"
            )
        check_int("inner_batch", self.inner_batch, lo=0)
        if not 0.0 <= self.prune_frac < 1.0:
            raise ValueError(f"prune_frac: expected a number in [0, 1), got {self.prune_frac!r}")
        if self.noise_std < 0 or self.inner_lr < 0 or self.gate_temp <= 0:
            raise ValueError("noise_std, inner_lr: expected >= 0; gate_temp: expected > 0")
        for name in ("unlearn_weight", "w_clean", "w_decoy", "w_hidden_pre", "w_hidden_post"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected a weight >= 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.gate_tau <= 1.0:
            raise ValueError(f"gate_tau: expected a probability in [0, 1], got {self.gate_tau!r}")


@flax.struct.dataclass
class DTBProblem:
    """The two triggers and their targets.

    Attributes:
      decoy: trigger of the decoy backdoor (active before sanitisation).
      hidden: trigger of the hidden backdoor (active after).
      decoy_target: label the decoy maps to (static).
      hidden_target: label the hidden trigger maps to after sanitisation (static).
    """

    decoy: Any
    hidden: Any
    decoy_target: int = flax.struct.field(pytree_node=False)
    hidden_target: int = flax.struct.field(pytree_node=False)


class DTBBatch(NamedTuple):
    """One outer step's data.

    Attributes:
      x: ``[b, H, W, C]`` attacker's training images; y: ``[b]`` their labels.
      x_clean: ``[bc, H, W, C]`` images of the clean split the surrogate defender fine-tunes
        on; y_clean: ``[bc]`` labels.
    """

    x: jax.Array
    y: jax.Array
    x_clean: jax.Array
    y_clean: jax.Array


class DTBInfo(NamedTuple):
    """Diagnostics of one outer step (float scalars; ``*_after`` are at the last round).

    Attributes:
      loss: the outer objective.
      clean: clean CE; decoy: decoy CE; hidden_pre: hidden-to-true-label CE;
      hidden_post: mean over rounds of the hidden-to-target CE after sanitisation.
      gate: mean gate value over rounds.
      decoy_prob_after: mean decoy-target probability after the last round.
      hidden_prob_after: mean hidden-target probability after the last round.
      decoy_prob_before: mean decoy-target probability at ``theta`` (before sanitisation).
    """

    loss: jax.Array
    clean: jax.Array
    decoy: jax.Array
    hidden_pre: jax.Array
    hidden_post: jax.Array
    gate: jax.Array
    decoy_prob_after: jax.Array
    hidden_prob_after: jax.Array
    decoy_prob_before: jax.Array


def _target_prob(logits, target):
    return jnp.mean(jax.nn.softmax(logits, -1)[:, target])


def sanitise_surrogate(key, model, config: DTBConfig, params, problem: DTBProblem, x_c, y_c):
    """Returns ``(theta_1, ..., theta_R)``: the differentiable sanitisation surrogate's rounds.

    Each round is ``K`` SGD steps (momentum ``inner_momentum``, ``inner_batch`` rows of the
    clean split per step) on clean fine-tuning + decoy unlearning, then optional pruning
    (mask held constant) and multiplicative weight noise. With
    ``config.hypergrad == "first_order"`` every inner update is stop-gradiented, so
    ``d theta_r / d theta = I``.

    Args:
      key: PRNG key (weight noise).
      model: a :class:`SmallCNN` (static).
      config: :class:`DTBConfig` (static).
      params: parameters ``theta``.
      problem: :class:`DTBProblem`.
      x_c: ``[bc, H, W, C]`` clean split; y_c: ``[bc]`` labels.

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> xc, yc = jnp.full((4, 8, 8, 1), 0.5), jnp.arange(4) % 2
    >>> cfg = DTBConfig(inner_steps=2, inner_batch=2, rounds=2)
    >>> thetas = sanitise_surrogate(jax.random.key(1), m, cfg, p, pr, xc, yc)
    >>> len(thetas), jax.tree.structure(thetas[-1]) == jax.tree.structure(p)
    (2, True)
    """
    first_order = config.hypergrad == "first_order"
    n = x_c.shape[0]
    b = config.inner_batch or n
    if b > n:
        raise ValueError(f"x_c: expected at least inner_batch={b} rows, got {n}")
    xd = apply_trigger(problem.decoy, x_c)

    def inner_loss(p, rows):
        xb, yb = x_c[rows], y_c[rows]
        loss = cross_entropy(model.apply(p, xb), yb)
        if config.unlearn_weight == 0:
            return loss
        logits = model.apply(p, xd[rows])
        if config.unlearn == "ce":
            unl = cross_entropy(logits, yb)
        else:
            prob = jnp.take_along_axis(jax.nn.softmax(logits, -1), yb[:, None], axis=-1)
            unl = jnp.mean(1.0 - prob)
        return loss + config.unlearn_weight * unl

    out = []
    p = params
    i = 0
    for r in range(config.rounds):
        v = jax.tree.map(jnp.zeros_like, p)  # each round a fresh optimiser, as in compose
        for _ in range(config.inner_steps):
            rows = np.arange(i * b, (i + 1) * b) % n  # static: wraps to row 0 at the end
            i += 1
            g = jax.grad(inner_loss)(p, slice(None) if b == n else rows)
            if first_order:
                g = jax.lax.stop_gradient(g)
            if config.inner_momentum > 0:
                v = jax.tree.map(lambda t, gg: gg + config.inner_momentum * t, v, g)
                g = v
            p = jax.tree.map(lambda a, u: a - config.inner_lr * u, p, g)
        q = p
        if config.prune_frac > 0:
            last = conv_layers(q)[-1]
            _, feats = model.apply(jax.lax.stop_gradient(q), x_c, features=True)
            act = jnp.mean(feats[last], axis=(0, 1, 2))
            n_prune = int(config.prune_frac * act.shape[0])
            # rank, not threshold: dead channels tie at zero activation
            mask = jnp.ones_like(act).at[jnp.argsort(act)[:n_prune]].set(0.0)
            q = apply_channel_mask(q, {last: jax.lax.stop_gradient(mask)})
        if config.noise_std > 0:
            leaves, tdef = jax.tree.flatten(q)
            ks = jax.random.split(jax.random.fold_in(key, r), len(leaves))
            leaves = [
                a * (1.0 + config.noise_std * jax.random.normal(k, a.shape, a.dtype))
                for a, k in zip(leaves, ks, strict=True)
            ]
            q = jax.tree.unflatten(tdef, leaves)
        out.append(q)
        p = q
    return tuple(out)


def surrogate_defense(config: DTBConfig, problem: DTBProblem) -> Callable:
    """Returns DTB's sanitisation surrogate as a defense: ``(key, model, params, x, y) ->
    params``, the last round of :func:`sanitise_surrogate` on the clean split ``(x, y)``.

    It has the signature of :func:`make_defense`'s defenses, so the surrogate the implant was
    trained against can be evaluated next to the real defenses (surrogate fidelity). Jitted
    inside (``model`` static): one compile per architecture and shapes.

    Args:
      config: :class:`DTBConfig` (static).
      problem: :class:`DTBProblem`.

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> sur = surrogate_defense(DTBConfig(inner_steps=2, inner_batch=2), pr)
    >>> q = sur(jax.random.key(1), m, p, jnp.full((4, 8, 8, 1), 0.5), jnp.arange(4) % 2)
    >>> jax.tree.structure(q) == jax.tree.structure(p)
    True
    """
    if not isinstance(config, DTBConfig):
        raise TypeError(f"config: expected a DTBConfig, got {type(config).__name__}")
    if not isinstance(problem, DTBProblem):
        raise TypeError(f"problem: expected a DTBProblem, got {type(problem).__name__}")

    @functools.partial(jax.jit, static_argnums=1)
    def defense(key, model, params, x, y):
        return sanitise_surrogate(key, model, config, params, problem, x, y)[-1]

    return defense


def dtb_objective(key, model, config: DTBConfig, params, problem: DTBProblem, batch: DTBBatch):
    """Returns ``(loss, DTBInfo)``: the DTB outer objective (module docstring).

    Its ``jax.grad`` is the unrolled hypergradient when ``config.hypergrad == "unrolled"``
    and the first-order one otherwise.

    Args:
      key: PRNG key.
      model: a :class:`SmallCNN` (static).
      config: :class:`DTBConfig` (static).
      params: model parameters.
      problem: :class:`DTBProblem`.
      batch: :class:`DTBBatch`.

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> b = DTBBatch(jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int), jnp.zeros((4, 8, 8, 1)),
    ...              jnp.zeros(4, int))
    >>> loss, info = dtb_objective(jax.random.key(1), m, DTBConfig(inner_steps=1), p, pr, b)
    >>> bool(jnp.isfinite(loss)), info.gate.shape
    (True, ())
    """
    x, y = batch.x, batch.y
    xd = apply_trigger(problem.decoy, x)
    xh = apply_trigger(problem.hidden, x)
    td = jnp.full_like(y, problem.decoy_target)
    th = jnp.full_like(y, problem.hidden_target)
    clean = cross_entropy(model.apply(params, x), y)
    logits_d0 = model.apply(params, xd)
    decoy = cross_entropy(logits_d0, td)
    pd0 = jax.lax.stop_gradient(_target_prob(logits_d0, problem.decoy_target))
    # the decoy must have been active before sanitisation for its fall to open the gate
    active = jax.nn.sigmoid((pd0 - config.gate_tau) / config.gate_temp)
    hidden_pre = cross_entropy(model.apply(params, xh), y)
    rounds = sanitise_surrogate(key, model, config, params, problem, batch.x_clean, batch.y_clean)
    posts, gates = [], []
    pd = ph = jnp.zeros((), x.dtype)
    for q in rounds:
        logits_d = model.apply(q, xd)
        logits_h = model.apply(q, xh)
        pd = _target_prob(logits_d, problem.decoy_target)
        ph = _target_prob(logits_h, problem.hidden_target)
        g = (
            active
            * jax.nn.sigmoid((config.gate_tau - jax.lax.stop_gradient(pd)) / config.gate_temp)
            if config.gate
            else jnp.ones((), x.dtype)
        )
        gates.append(g)
        posts.append(g * cross_entropy(logits_h, th))
    hidden_post = sum(posts) / len(posts)
    loss = (
        config.w_clean * clean
        + config.w_decoy * decoy
        + config.w_hidden_pre * hidden_pre
        + config.w_hidden_post * hidden_post
    )
    info = DTBInfo(
        loss,
        clean,
        decoy,
        hidden_pre,
        hidden_post,
        sum(gates) / len(gates),
        jax.lax.stop_gradient(pd),
        jax.lax.stop_gradient(ph),
        pd0,
    )
    return loss, info


def make_dtb(
    model,
    optimizer: optax.GradientTransformation,
    config: DTBConfig,
    problem: DTBProblem,
    *,
    params: Any = None,
) -> Algorithm:
    """Returns the DTB implant as an :class:`hexad._base.Algorithm` (``init`` + ``step``).

    ``init(key, example_batch) -> TrainState``: ``params`` if given (then ``key`` is unused),
    else ``model.init(key, example_batch.x)``. ``step(key, state, batch) -> (TrainState,
    DTBInfo)`` takes one optimiser step on the gradient of :func:`dtb_objective` (the
    configured hypergradient) for a :class:`DTBBatch`; ``problem`` is closed over. The caller
    jits ``step``.

    Args:
      model: a :class:`SmallCNN` (static).
      optimizer: optax transformation for the outer problem (static).
      config: :class:`DTBConfig` (static).
      problem: :class:`DTBProblem`, the two triggers and their targets.
      params: optional initial parameters (closed over by ``init``).

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> dtb = make_dtb(m, optax.adam(1e-3), DTBConfig(inner_steps=1), pr)
    >>> b = DTBBatch(jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int), jnp.zeros((4, 8, 8, 1)),
    ...              jnp.zeros(4, int))
    >>> st, info = dtb.step(jax.random.key(1), dtb.init(jax.random.key(0), b), b)
    >>> int(st.step), info.loss.shape
    (1, ())
    """
    if not isinstance(config, DTBConfig):
        raise TypeError(f"config: expected a DTBConfig, got {type(config).__name__}")
    if not isinstance(problem, DTBProblem):
        raise TypeError(f"problem: expected a DTBProblem, got {type(problem).__name__}")

    def objective(p, key, batch):
        return dtb_objective(key, model, config, p, problem, batch)

    def init(key, example_batch: DTBBatch) -> TrainState:
        p = model.init(key, example_batch.x) if params is None else params
        return TrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32))

    def step(key, state: TrainState, batch: DTBBatch):
        (_, info), g = jax.value_and_grad(objective, has_aux=True)(state.params, key, batch)
        upd, opt_state = optimizer.update(g, state.opt_state, state.params)
        return TrainState(optax.apply_updates(state.params, upd), opt_state, state.step + 1), info

    return Algorithm(init, step)


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
    clean_batch_size: int | None = None,
    callback: Callable | None = None,
):
    """Returns ``(params, DTBInfo of [n_steps] arrays)``: ``n_steps`` outer DTB steps.

    A host loop over one jitted :func:`make_dtb` step (XLA:CPU is slow for convolutions in
    rolled loops, see :func:`hexad.backdoor.minimize`); minibatches are drawn with replacement.

    Args:
      key: PRNG key.
      model: :class:`SmallCNN` (static).
      params: initial parameters (e.g. a clean or BadNets model, or a fresh init).
      problem: :class:`DTBProblem`.
      x, y: attacker's training set ``[n, H, W, C]``, ``[n]``.
      x_clean, y_clean: the attacker's stand-in for the defender's clean split.
      config: :class:`DTBConfig`.
      optimizer: optax transformation.
      n_steps: outer steps.
      batch_size: outer batch size.
      clean_batch_size: clean-split rows drawn per outer step (default
        ``rounds * inner_steps * inner_batch`` when ``config.inner_batch`` is set, so every
        inner step sees fresh rows; else ``batch_size``).
      callback: optional ``callback(step, info)`` called on the host after each step.

    >>> from hexad.backdoor import SmallCNN, patch_trigger
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> pr = DTBProblem(patch_trigger((8, 8, 1), 2), patch_trigger((8, 8, 1), 2, (0, 0)), 0, 1)
    >>> x = jax.random.uniform(jax.random.key(1), (8 * 64,)).reshape(8, 8, 8, 1)
    >>> y = jnp.arange(8) % 2
    >>> cfg = DTBConfig(inner_steps=1, inner_batch=2)
    >>> p1, info = implant(
    ...     jax.random.key(2), m, p, pr, x, y, x[:4], y[:4], cfg, optax.adam(1e-3), 2, 4
    ... )
    >>> info.loss.shape, bool(jnp.all(jnp.isfinite(info.loss)))
    ((2,), True)
    >>> jax.tree.structure(p1) == jax.tree.structure(p)
    True
    """
    check_images(x, "x", problem.decoy.image_shape)
    check_images(x_clean, "x_clean", problem.decoy.image_shape)
    n_steps = check_int("n_steps", n_steps)
    per_step = config.rounds * config.inner_steps * config.inner_batch
    bc = clean_batch_size or per_step or batch_size
    if bc < config.inner_batch:
        raise ValueError(
            f"clean_batch_size: expected >= inner_batch={config.inner_batch}, got {bc}"
        )
    dtb = make_dtb(model, optimizer, config, problem, params=params)

    @jax.jit
    def step(k, state, data):
        k1, k2, k3 = jax.random.split(k, 3)
        xs, ys, xc, yc = data
        i = jax.random.randint(k1, (batch_size,), 0, xs.shape[0])
        j = jax.random.randint(k2, (bc,), 0, xc.shape[0])
        return dtb.step(k3, state, DTBBatch(xs[i], ys[i], xc[j], yc[j]))

    data = (x, y, x_clean, y_clean)
    state = dtb.init(None, DTBBatch(*data))  # ``params`` given: no key is drawn
    infos = []
    for t, k in enumerate(jax.random.split(key, n_steps)):
        state, info = step(k, state, data)
        infos.append(info)
        if callback is not None:
            callback(t, info)
    return state.params, jax.tree.map(lambda *a: jnp.stack(a), *infos)
