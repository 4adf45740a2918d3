"""Deployment-time composition: the methods, a table's rows, an expert library, one dispatcher.

At deployment a frozen actor ``pi_A`` meets a new objective. Each way of acting on it is a
:class:`Method`: the closed forms of :mod:`hexad.policy._gaussian` (PoE, additive, PoE at the
per-state KL-budget alpha), critic-guided steering (:func:`q_steer`), SF + GPI over an
:class:`ExpertLibrary` (:func:`gpi`), and the zero and uniform-random references that a
normalised score needs. A study evaluates a table of :class:`Row` s, each one (actor, prior,
method, alpha), and :func:`compose` acts for a batch whose rows may all differ, so one jitted
call serves every row of the table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from hexad._base import is_traced
from hexad.policy._gaussian import (
    DiagGaussian,
    _check_pair,
    additive,
    kl_budget_alpha,
    kl_budget_alpha_per_state,
    poe,
)
from hexad.policy._sf import gpi
from hexad.policy._steering import q_steer

__all__ = ["ExpertLibrary", "Method", "Row", "compose", "stack_rows"]


class Method(enum.IntEnum):
    r"""How one row of a deployment table acts; the integer codes are what traced code sees.

    Attributes:
      POE: the product of experts :math:`\pi_A^{1 - \alpha} p^\alpha` (:func:`poe`);
        :math:`\alpha = 0` is the actor, :math:`\alpha = 1` the prior alone.
      ADDITIVE: the precision-blind blend :math:`(1 - \alpha) \mu_A + \alpha \mu_P`
        (:func:`additive`).
      KL_STATE: PoE at each state's own KL-budget alpha (:func:`kl_budget_alpha_per_state`).
      IQL_GUIDED: the actor's action steered by an IQL critic (:func:`q_steer`); the row's
        alpha is the trust-region half-width.
      CQL_GUIDED: the same with a CQL critic.
      SFGPI: generalised policy improvement over an expert library (:meth:`ExpertLibrary.gpi`).
      ZERO: the zero action (a reference).
      RANDOM: uniform random actions (a reference; the caller draws them).
    """

    POE = 0
    ADDITIVE = 1
    KL_STATE = 2
    IQL_GUIDED = 3
    CQL_GUIDED = 4
    SFGPI = 5
    ZERO = 6
    RANDOM = 7


_GUIDED = (Method.IQL_GUIDED, Method.CQL_GUIDED)
_MIXED = (Method.POE, Method.ADDITIVE, Method.KL_STATE)


class Row(NamedTuple):
    """One row of a deployment table: who acts, how, with which coefficient.

    A table is a list of rows (each field a Python scalar, hashable, so rows can be looked up
    and de-duplicated exactly); :func:`stack_rows` turns it into one ``Row`` of ``[R]`` arrays
    for traced code.

    Attributes:
      actor: index of the frozen actor.
      prior: index of the prior (and, for :attr:`Method.SFGPI`, of the prior's library members).
      method: a :class:`Method`.
      alpha: the coefficient of :attr:`Method.POE` and :attr:`Method.ADDITIVE`, the trust-region
        half-width of the guided methods; unused (0) otherwise.
    """

    actor: int
    prior: int
    method: Method
    alpha: float

    def label(self, prior_names: Sequence[str]) -> str:
        """Returns the row in words, naming its prior ``prior_names[self.prior]``.

        The method's lower-case name (``poe_kl_state`` for :attr:`Method.KL_STATE`), then the
        row's coefficient where the method has one (``shift=`` for the guided methods, which
        use no prior, ``alpha=`` for PoE and additive), then the prior for the methods that
        use one. The actor is not named.

        >>> Row(0, 1, Method.POE, 0.25).label(("good", "degraded"))
        'poe alpha=0.25 degraded'
        """
        method = Method(self.method)
        name = "poe_kl_state" if method == Method.KL_STATE else method.name.lower()
        if method in _GUIDED:
            return f"{name} shift={self.alpha:g}"
        if method in (Method.ZERO, Method.RANDOM):
            return name
        if not 0 <= self.prior < len(prior_names):
            raise ValueError(
                f"prior_names: expected a name for prior {self.prior} (the row's), got "
                f"{list(prior_names)}"
            )
        if method in (Method.KL_STATE, Method.SFGPI):
            return f"{name} {prior_names[self.prior]}"
        return f"{name} alpha={self.alpha:g} {prior_names[self.prior]}"


def stack_rows(rows: Sequence[Row]) -> Row:
    """Returns a ``Row`` of arrays: ``actor``, ``prior``, ``method`` int32 ``[R]``, ``alpha``
    float32 ``[R]``.

    >>> t = stack_rows([Row(0, 1, Method.POE, 0.5), Row(1, 0, Method.ZERO, 0.0)])
    >>> t.prior.tolist(), t.method.tolist(), t.alpha.dtype
    ([1, 0], [0, 6], dtype('float32'))
    """
    rows = list(rows)
    if not rows or not all(isinstance(r, Row) for r in rows):
        raise ValueError(f"rows: expected a non-empty sequence of Row, got {rows!r}")
    for r in rows:
        Method(r.method)  # raises ValueError naming the unknown code
    cols = list(zip(*rows, strict=True))
    return Row(*(np.asarray(c, np.int32) for c in cols[:3]), np.asarray(cols[3], np.float32))


def _pick(dists: Sequence[DiagGaussian], index) -> DiagGaussian:
    """Row ``b`` of the result is row ``b`` of ``dists[index[b]]``."""
    if len(dists) == 1:  # the only valid index is 0: no gather, the network's output as it is
        return dists[0]
    i = jnp.asarray(index)
    return jax.tree.map(
        lambda *xs: jnp.take_along_axis(jnp.stack(xs), i[None, :, None], 0)[0], *dists
    )


@flax.struct.dataclass
class ExpertLibrary:
    """Frozen actors and goal-conditioned priors, and the library of deterministic policies
    they span: each prior commanded with each of ``J`` fixed goals, then each actor.

    The library's ``K = n_priors J + n_actors`` members, in :meth:`actions` order, are the
    policies whose successor features SF + GPI learns (Barreto et al. 2017, arXiv 1606.05312).

    Attributes:
      actor: the actors' network, ``actor.apply(params, obs [B, o]) -> DiagGaussian`` (static).
      prior: the priors' network on ``[obs, goal]``, ``[B, o + g]`` (static).
      actor_params: a tuple of the actors' parameters.
      prior_params: a tuple of the priors' parameters.
      goals: ``[J, g]`` the goals the priors are commanded with.
    """

    actor: nn.Module = flax.struct.field(pytree_node=False)
    prior: nn.Module = flax.struct.field(pytree_node=False)
    actor_params: tuple
    prior_params: tuple
    goals: jax.Array

    @property
    def n_members(self) -> int:
        """``K = n_priors J + n_actors``."""
        return len(self.prior_params) * self.goals.shape[0] + len(self.actor_params)

    def actions(self, obs) -> jax.Array:
        """Returns ``[B, K, d]`` every member's deterministic action ``tanh(mean)`` at ``obs``.

        Args:
          obs: ``[B, o]`` observations.

        >>> from hexad.policy import GaussianActor
        >>> net = GaussianActor(2, (4,))
        >>> ap = net.init(jax.random.key(0), jnp.zeros((1, 3)))
        >>> pp = net.init(jax.random.key(1), jnp.zeros((1, 4)))
        >>> lib = ExpertLibrary(net, net, (ap,), (pp, pp), jnp.zeros((5, 1)))
        >>> lib.actions(jnp.zeros((7, 3))).shape, lib.n_members
        ((7, 11, 2), 11)
        """
        if jnp.ndim(obs) != 2:
            raise ValueError(f"obs: expected shape [B, o], got {jnp.shape(obs)}")
        if jnp.ndim(self.goals) != 2:
            raise ValueError(f"goals: expected shape [J, g], got {jnp.shape(self.goals)}")
        b, j = obs.shape[0], self.goals.shape[0]
        og = jnp.concatenate(
            [
                jnp.broadcast_to(obs[:, None, :], (b, j, obs.shape[-1])),
                jnp.broadcast_to(self.goals[None], (b, j, self.goals.shape[-1])),
            ],
            -1,
        )
        acts = [jnp.tanh(self.prior.apply(pp, og).mean) for pp in self.prior_params]
        acts += [jnp.tanh(self.actor.apply(ap, obs).mean)[:, None, :] for ap in self.actor_params]
        return jnp.concatenate(acts, axis=1)

    def members(self, actor: int, prior: int | None) -> np.ndarray:
        """Returns the ``[K]`` bool mask of one pair's members: the prior at each goal, the actor.

        ``prior=None`` gives the actor alone.

        >>> from hexad.policy import GaussianActor
        >>> net = GaussianActor(1)
        >>> lib = ExpertLibrary(net, net, (0, 0), (0, 0), jnp.zeros((2, 1)))
        >>> lib.members(1, 0).astype(int).tolist()
        [1, 1, 0, 0, 0, 1]
        """
        n_a, n_p, j = len(self.actor_params), len(self.prior_params), self.goals.shape[0]
        if not 0 <= actor < n_a or (prior is not None and not 0 <= prior < n_p):
            raise ValueError(
                f"actor, prior: expected indices in [0, {n_a}) and [0, {n_p}) (or None), got "
                f"{actor}, {prior}"
            )
        mask = np.zeros(self.n_members, bool)
        if prior is not None:
            mask[prior * j : (prior + 1) * j] = True
        mask[n_p * j + actor] = True
        return mask

    def actor_dist(self, obs, index) -> DiagGaussian:
        """Returns ``[B, d]`` each row's actor at ``obs [B, o]``: actor ``index[b]`` for row ``b``.

        >>> from hexad.policy import GaussianActor
        >>> net = GaussianActor(1, ())
        >>> ps = tuple(net.init(jax.random.key(i), jnp.zeros((1, 2))) for i in range(2))
        >>> lib = ExpertLibrary(net, net, ps, (), jnp.zeros((0, 1)))
        >>> mean = lib.actor_dist(jnp.ones((2, 2)), jnp.array([1, 0])).mean
        >>> bool(jnp.all(mean[0] == net.apply(ps[1], jnp.ones((1, 2))).mean[0]))
        True
        """
        return _pick([self.actor.apply(p, obs) for p in self.actor_params], index)

    def prior_dist(self, obs_goal, index) -> DiagGaussian:
        """Returns ``[B, d]`` each row's prior at ``obs_goal [B, o + g]``: prior ``index[b]``.

        >>> from hexad.policy import GaussianActor
        >>> net = GaussianActor(1, ())
        >>> p = net.init(jax.random.key(0), jnp.zeros((1, 3)))
        >>> lib = ExpertLibrary(net, net, (), (p,), jnp.zeros((1, 1)))
        >>> lib.prior_dist(jnp.ones((4, 3)), jnp.zeros(4, int)).mean.shape
        (4, 1)
        """
        return _pick([self.prior.apply(p, obs_goal) for p in self.prior_params], index)

    def kl_budget_alpha_fn(self, actor: int, obs, obs_goal, budget) -> Callable:
        """Returns ``alpha(prior_params) -> scalar``: a prior's global KL-budget alpha.

        :func:`kl_budget_alpha` of the prior network with ``prior_params`` at ``obs_goal``
        against actor ``actor`` at ``obs``: a pure function of the prior's parameters (jit it
        once and call it for each prior, or vmap it over stacked parameters); the actor's
        parameters and the states are closed over.

        Args:
          actor: index of the actor.
          obs: ``[n, o]`` states.
          obs_goal: ``[n, o + g]`` the same states with the goal the prior is commanded with.
          budget: scalar ``> 0``, nats.

        >>> from hexad.policy import GaussianActor
        >>> net = GaussianActor(1, ())
        >>> p = net.init(jax.random.key(0), jnp.zeros((1, 2)))
        >>> lib = ExpertLibrary(net, net, (p,), (p,), jnp.zeros((1, 0)))
        >>> s = jnp.ones((4, 2))
        >>> round(float(lib.kl_budget_alpha_fn(0, s, s, 0.5)(p)), 4)  # the prior is the actor
        1.0
        """
        if not 0 <= actor < len(self.actor_params):
            raise ValueError(
                f"actor: expected an index in [0, {len(self.actor_params)}), got {actor}"
            )
        params = self.actor_params[actor]

        def alpha(prior_params):
            a, p = self.actor.apply(params, obs), self.prior.apply(prior_params, obs_goal)
            return kl_budget_alpha(a, p, budget)

        return alpha

    def gpi(self, psi_fn: Callable, obs, w, actor_index, prior_index) -> jax.Array:
        """Returns ``[B, d]`` the GPI action of each row over its own pair's members.

        Row ``b`` acts by :func:`gpi` over the candidate actions of
        ``members(actor_index[b], prior_index[b])``, with those members' successor features.

        Args:
          psi_fn: ``psi_fn(obs [M, o], act [M, d]) -> [M, K, F]``, whose ``K`` policies are
            this library's members in :meth:`actions` order.
          obs: ``[B, o]`` observations.
          w: ``[F]`` task weights, or ``[B, F]`` one task per row.
          actor_index: ``[B]`` int, each row's actor.
          prior_index: ``[B]`` int, each row's prior.

        >>> from hexad.policy import GaussianActor
        >>> net = GaussianActor(1, ())
        >>> p = net.init(jax.random.key(0), jnp.zeros((1, 2)))
        >>> lib = ExpertLibrary(net, net, (p,), (), jnp.zeros((0, 1)))
        >>> psi = lambda s, a: a[:, None, :]  # one member, F = d
        >>> act = lib.gpi(psi, jnp.ones((3, 2)), jnp.ones(1), jnp.zeros(3, int), jnp.zeros(3, int))
        >>> bool(jnp.allclose(act, lib.actions(jnp.ones((3, 2)))[:, 0]))
        True
        """
        lib = self.actions(obs)
        out = jnp.zeros((lib.shape[0], lib.shape[2]), lib.dtype)
        a_id, p_id = jnp.asarray(actor_index), jnp.asarray(prior_index)
        priors = range(len(self.prior_params)) if self.prior_params else [None]
        for ai in range(len(self.actor_params)):
            for pi in priors:
                mask = self.members(ai, pi)
                act, _ = gpi(psi_fn, obs, lib[:, mask], w, policy_mask=mask)
                hit = (a_id == ai) if pi is None else (a_id == ai) & (p_id == pi)
                out = jnp.where(hit[:, None], act, out)
        return out


def _check_codes(method: np.ndarray, alpha: np.ndarray | None, **lacking: tuple) -> None:
    """Raises a ValueError for an unknown code, for a row whose method lacks its argument
    (``lacking``: argument name -> the methods it was not given for) and, when ``alpha`` is
    concrete, for a guided row whose trust-region half-width ``alpha`` is not ``> 0``."""
    valid = np.isin(method, [int(m) for m in Method])
    if not np.all(valid):
        raise ValueError(
            f"method: expected codes of hexad.policy.Method, got {sorted(set(method[~valid]))}"
        )
    for name, methods in lacking.items():
        rows = [m for m in methods if np.any(method == int(m))]
        if rows:
            names = ", ".join(m.name for m in rows)
            raise ValueError(f"{name}: expected an argument for the {names} rows, got none")
    if alpha is not None:
        guided = np.isin(method, [int(m) for m in _GUIDED])
        bad = guided & ~(alpha > 0)
        if np.any(bad):
            raise ValueError(
                f"alpha: expected a trust-region half-width > 0 on the guided rows, got "
                f"{sorted(set(alpha[bad].tolist()))}"
            )


def compose(
    method,
    actor: DiagGaussian,
    prior: DiagGaussian,
    alpha,
    *,
    kl_budget,
    q_fn: Callable | Mapping[Method, Callable] | None = None,
    q_obs=None,
    step_size: float = 0.1,
    n_steps: int = 10,
    gpi_action=None,
    random_action=None,
) -> jax.Array:
    """Returns each row's deterministic action under its own :class:`Method`.

    Row ``b`` gets exactly what its method's closed form gives on its own: ``tanh`` of the mean
    of :func:`poe` or :func:`additive` at ``alpha[b]``; :func:`poe` at
    :func:`kl_budget_alpha_per_state`; :func:`q_steer` from the actor's pre-tanh mean within a
    trust region of half-width ``alpha[b]``; ``gpi_action[b]``; zero; ``random_action[b]``. All
    methods are computed for the whole batch and selected per row, so a batch may mix them
    freely and one trace serves a whole table. Under a trace, a row whose method lacks its
    argument (``q_fn``, ``gpi_action``, ``random_action``) is NaN; with concrete ``method`` it
    raises.

    Args:
      method: ``[B]`` int :class:`Method` codes, or one ``Method`` for every row.
      actor: the rows' actors, pre-tanh ``DiagGaussian`` ``[B, d]``.
      prior: the rows' priors, ``[B, d]``.
      alpha: scalar or ``[B]``: the coefficient (POE, ADDITIVE) or the trust-region half-width
        (guided rows, ``> 0``); ignored by the other methods.
      kl_budget: scalar ``> 0``, nats: the per-state KL budget of the KL_STATE rows.
      q_fn: the guided rows' critic, ``q_fn(q_obs [B, o'], action [B, d]) -> [B]``: one
        callable for both guided methods, or a mapping from ``Method.IQL_GUIDED`` /
        ``Method.CQL_GUIDED`` to a callable each.
      q_obs: ``[B, o']`` the critic's observations (needed with ``q_fn``).
      step_size: :func:`q_steer`'s ascent step (static).
      n_steps: :func:`q_steer`'s number of steps (static).
      gpi_action: ``[B, d]`` the SFGPI rows' actions, e.g. from :meth:`ExpertLibrary.gpi`.
      random_action: ``[B, d]`` the RANDOM rows' actions in ``[-1, 1]``, drawn by the caller.

    Returns:
      ``[B, d]`` actions in ``[-1, 1]``.

    >>> a = DiagGaussian(jnp.zeros((3, 1)), jnp.ones((3, 1)))
    >>> p = DiagGaussian(jnp.full((3, 1), 2.0), jnp.ones((3, 1)))
    >>> m = jnp.array([Method.POE, Method.ADDITIVE, Method.ZERO])
    >>> compose(m, a, p, jnp.array([0.5, 0.5, 0.0]), kl_budget=1.0).round(3)
    Array([[0.762],
           [0.762],
           [0.   ]], dtype=float32)
    """
    _check_pair(actor, prior)
    shape = jnp.shape(actor.mean)
    if len(shape) != 2 or jnp.shape(prior.mean) != shape:
        raise ValueError(
            f"prior: expected actor and prior of one shape [B, d], got {shape} and "
            f"{jnp.shape(prior.mean)}"
        )
    b = shape[0]
    method = jnp.broadcast_to(jnp.asarray(method), (b,))
    alpha = jnp.broadcast_to(jnp.asarray(alpha), (b,))
    if callable(q_fn):
        q_fns = dict.fromkeys(_GUIDED, q_fn)
    else:
        q_fns = dict(q_fn or {})
        if not set(q_fns) <= set(_GUIDED):
            raise ValueError(f"q_fn: expected keys among {list(_GUIDED)}, got {list(q_fns)}")
    if q_fns and (q_obs is None or jnp.shape(q_obs)[:1] != (b,)):
        got = None if q_obs is None else jnp.shape(q_obs)
        raise ValueError(f"q_obs: expected shape [{b}, o'] with q_fn, got {got}")
    for name, x in (("gpi_action", gpi_action), ("random_action", random_action)):
        if x is not None and jnp.shape(x) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {jnp.shape(x)}")
    if not is_traced(method):
        _check_codes(
            np.asarray(method),
            None if is_traced(alpha) else np.asarray(alpha),
            q_fn=tuple(m for m in _GUIDED if m not in q_fns),
            gpi_action=(Method.SFGPI,) if gpi_action is None else (),
            random_action=(Method.RANDOM,) if random_action is None else (),
        )

    def is_(methods):
        return jnp.isin(method, jnp.asarray([int(m) for m in methods]))

    a = jnp.where(
        method == Method.KL_STATE, kl_budget_alpha_per_state(actor, prior, kl_budget), alpha
    )
    # Guided rows carry a trust-region width in alpha: keep it out of the mixtures' range check.
    mix = jnp.where(is_(_MIXED), a, 0.0)
    mean = jnp.where(
        (method == Method.ADDITIVE)[:, None],
        additive(actor, prior, mix).mean,
        poe(actor, prior, mix).mean,
    )
    out = jnp.tanh(mean)
    shift = jnp.where(is_(_GUIDED), a, 1.0)
    steered = {}
    for m in _GUIDED:
        fn = q_fns.get(m)
        if fn is None:
            act = jnp.full(shape, jnp.nan, out.dtype)
        else:
            if id(fn) not in steered:
                steered[id(fn)] = q_steer(fn, q_obs, actor.mean, step_size, n_steps, shift)
            act = steered[id(fn)]
        out = jnp.where((method == m)[:, None], act, out)
    for m, act in ((Method.SFGPI, gpi_action), (Method.ZERO, 0.0), (Method.RANDOM, random_action)):
        act = jnp.nan if act is None else act
        out = jnp.where((method == m)[:, None], act, out)
    return out
