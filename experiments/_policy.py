"""The one driver of the PoE / KL policy studies (``policy_pointmaze``, ``policy_locomotion``,
``policy_antmaze``): each gives it a :class:`PolicyConfig` and a per-seed :class:`Setup` (its
data, tasks, episodes and evaluator), and :func:`run` does the rest.

Per study seed (:func:`run_seed`), in each likelihood space of ``spaces``: IQL trains one
frozen actor per level of ``Setup.actor_data`` and goal-conditioned BC the good and the
data-corrupted priors (checkpointed). On them the priors are built: the kinds of ``priors``
(:func:`hexad.policy.make_prior`), the random-perturbation ``control`` of the good prior
(:func:`hexad.policy.perturbation_prior`) and the precision-ratio family ``r<r>`` for ``r`` in
``precision_ratios`` (:func:`hexad.policy.precision_prior`, mean error ``precision_error``
actor stds). On the KL states the budget is calibrated on each actor alone
(:func:`hexad.policy.calibrate_kl_budget`, ``kl_budget_fraction``) and the KL-budget alpha of
each prior found (:func:`hexad.policy.kl_budget_alpha`). Selection episodes choose the oracle
alphas and the guides' trust regions; test episodes report every row.

Over seeds (:func:`summarise`) each claim stated in the studies' docstrings is decided from
paired differences (the same seed and test episode under both arms) by
:mod:`experiments._verdicts` alone: this module computes no interval and no test of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner, _verdicts
from hexad import policy
from hexad.data import offline_rl
from hexad.policy import Method

CONTROL = "control"  # the random-perturbation control of the good prior
_GUIDE_METHOD = {"iql": Method.IQL_GUIDED, "cql": Method.CQL_GUIDED}
_MIXES = (Method.POE, Method.ADDITIVE)


def family_name(r: float) -> str:
    """The name of the precision-ratio prior of ratio ``r``: ``"r0.25"``, ``"r1"``, ...

    >>> family_name(0.25), family_name(1.0)
    ('r0.25', 'r1')
    """
    return f"r{r:g}"


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """The settings every policy study shares; the defaults are PointMaze's full study."""

    hidden: int = 128
    iql_steps: int = 5000
    bc_steps: int = 5000
    train_chunk: int = 500
    batch_size: int = 256
    lr: float = 3e-4
    expectile: float = 0.9
    temperature: float = 10.0
    alphas: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
    regret_range: tuple[float, ...] = (0.1, 0.9)  # the oracle alpha of the regrets
    fixed_alpha: float = 0.5  # the non-search rule
    contrast_alpha: float = 0.5  # the common weight of PoE against additive
    kl_budget_fraction: float = 0.5  # of the actor's own between-state KL
    kl_budgets: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0, 3.0)  # nats / dim, reported only
    priors: tuple[str, ...] = policy.PRIOR_KINDS
    precision_ratios: tuple[float, ...] = policy.PRECISION_RATIOS
    precision_error: float = 2.0  # the family's mean error, in actor stds
    spaces: tuple[str, ...] = policy.SPACES
    margin_per_step: float = 0.01  # the practical margin: this times episode_steps
    stat_alpha: float = 0.05
    n_seeds: int = 5
    n_select: int = 10
    n_test: int = 20
    n_kl_states: int = 2048
    degrade_scale: float = 1.0
    episode_steps: int = 300
    n_envs: int = 48
    guides: tuple[str, ...] = ("iql", "cql")
    guide_iql_steps: int = 5000
    guide_cql_steps: int = 5000
    guide_action_samples: int = 10
    guide_steps: int = 10
    guide_step_size: float = 1.0
    guide_shifts: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)

    def __post_init__(self):
        _runner.at_least(self, 1, "hidden", "iql_steps", "bc_steps", "train_chunk", "batch_size")
        _runner.at_least(self, 1, "n_seeds", "n_select", "n_test", "n_kl_states", "n_envs")
        _runner.at_least(self, 1, "episode_steps", "guide_iql_steps", "guide_cql_steps")
        _runner.at_least(self, 1, "guide_action_samples")
        _runner.at_least(self, 0, "degrade_scale", "temperature", "guide_steps", "precision_error")
        _runner.positive(self, "lr", "guide_step_size", "kl_budgets", "guide_shifts")
        _runner.positive(self, "kl_budget_fraction", "precision_ratios", "margin_per_step")
        _runner.in_unit(self, "expectile", lo_open=True, hi_open=True)
        _runner.in_unit(self, "alphas", "regret_range")
        _runner.in_unit(self, "stat_alpha", lo_open=True, hi_open=True)
        _runner.one_of(self, policy.PRIOR_KINDS, "priors")
        _runner.one_of(self, policy.SPACES, "spaces")
        _runner.one_of(self, ("iql", "cql"), "guides")
        _runner.require(0.0 in self.alphas and 1.0 in self.alphas, "alphas", "needs 0 and 1")
        _runner.require(len(self.precision_ratios) > 0, "precision_ratios", "needs a ratio")
        _runner.require(self.n_select <= 500, "n_select", "at most 500 (seeds 1000 s + 500 + i)")
        _runner.require(self.stat_alpha < 0.5, "stat_alpha", "needs 0 < stat_alpha < 0.5")
        lo_hi = self.regret_range
        _runner.require(
            len(lo_hi) == 2 and lo_hi[0] <= lo_hi[1] and bool(self.mid_alphas()),
            "regret_range",
            f"expected (lo, hi) with lo <= hi holding at least one of alphas={self.alphas}, "
            f"got {lo_hi}",
        )
        for name in ("contrast_alpha", "fixed_alpha"):
            a = getattr(self, name)
            _runner.require(
                a in self.alphas and 0.0 < a < 1.0,
                name,
                f"expected one of alphas={self.alphas} strictly between 0 and 1, got {a}",
            )

    def margin(self) -> float:
        """The practical margin in return units: ``margin_per_step * episode_steps``."""
        return self.margin_per_step * self.episode_steps

    def mid_alphas(self) -> tuple[float, ...]:
        """The alphas the regrets' oracle may choose: those in ``regret_range``."""
        lo, hi = self.regret_range[0], self.regret_range[-1]
        return tuple(a for a in self.alphas if lo <= a <= hi)

    def prior_names(self) -> tuple[str, ...]:
        """Every prior a seed builds: ``priors``, the control, then the precision family."""
        return (*self.priors, CONTROL, *(family_name(r) for r in self.precision_ratios))


# The --quick sizes of every policy study (each adds its own data sizes).
QUICK = {
    "hidden": 64,
    "iql_steps": 1000,
    "bc_steps": 1000,
    "guide_iql_steps": 500,
    "guide_cql_steps": 500,
    "guide_action_samples": 4,
    "train_chunk": 250,
    "alphas": (0.0, 0.3, 0.5, 1.0),
    "n_seeds": 1,
    "n_select": 2,
    "n_test": 3,
    "n_kl_states": 512,
    "guide_shifts": (0.5,),
}


class Setup(NamedTuple):
    """What :func:`run_seed` needs from one study seed.

    ``actor_data``: ``{level: Batch}`` each actor's offline data; ``gdata`` / ``gdata_bad``:
    the prior's goal-conditioned BC data with true / shuffled goals; ``guide_data``: the guide
    critics' goal-conditioned data (goal reward); ``kl_obs [n, o]`` / ``kl_obs_goal [n, o + g]``:
    the KL states, paired with selection goals (with ``task_per_level``, a tuple of one such
    array per actor level); ``obs_fn(obs) -> o`` the networks' view of the environment's
    observation, ``prior_obs(o, goal, level) -> [B, o + g]`` (``level [B]`` the rows' actor
    levels); ``evaluate(policy, specs, episodes, split, levels) -> {metric: [M]}`` the
    per-episode metrics (``"return"``, the decisions' metric, and any others to report) of
    episodes ``episodes`` of ``split`` ("select", "test", "own": the actor's own task on the
    test starts), ``policy(obs, [goal,] specs)``, ``levels [M]`` each episode's actor level.
    ``task_per_level``: each actor level has its own shifted task (its own prior command and
    metric), so the prior alone and the zero action are evaluated per level.
    """

    actor_data: dict
    gdata: Any
    gdata_bad: Any
    guide_data: Any
    kl_obs: Any
    kl_obs_goal: Any
    obs_fn: Callable
    prior_obs: Callable
    evaluate: Callable
    task_per_level: bool = False

    def kl_goal(self, level: int):
        """The KL states with the prior's inputs for actor level ``level``."""
        return self.kl_obs_goal[level] if self.task_per_level else self.kl_obs_goal


# --------------------------------------------------------------------------------------------
# Networks and priors
# --------------------------------------------------------------------------------------------


def iql(cfg, actor_net):
    """The offline actor's IQL."""
    opt, hid = optax.adam(cfg.lr), (cfg.hidden, cfg.hidden)
    critic, value = policy.TwinCritic(hid), policy.ValueNet(hid)
    return policy.iql(
        actor_net,
        critic,
        value,
        opt,
        opt,
        opt,
        expectile=cfg.expectile,
        temperature=cfg.temperature,
    )


def cql(cfg, prior_net):
    """The CQL guide's goal-conditioned critic (with an actor of the prior's shape)."""
    opt = optax.adam(cfg.lr)
    critic = policy.TwinCritic((cfg.hidden, cfg.hidden))
    return policy.cql(prior_net, critic, opt, opt, n_action_samples=cfg.guide_action_samples)


def partial_apply(net, params) -> Callable:
    """``f(x) = net.apply(params, x)``."""
    return lambda x: net.apply(params, x)


def min_q(critic_net, params) -> Callable:
    """``q_fn(obs, act) -> [B]``: the smaller of a twin critic's two heads."""
    return lambda s, a: jnp.minimum(*critic_net.apply(params, s, a))


def _nets(cfg, space, d):
    hid = (cfg.hidden, cfg.hidden)
    return policy.actor_for_space(space, d, hid), policy.actor_for_space(space, d, hid)


def _marginal_std(actions, space):
    a = np.asarray(actions)
    if space == "pretanh":
        a = np.arctanh(np.clip(a, -1 + 1e-6, 1 - 1e-6))
    return np.maximum(a.std(0), 1e-3).astype(np.float32)


def train_networks(ctx, cfg, setup, key, tag) -> dict:
    """Trains (or restores, with ``--resume``) per space: an IQL actor per level and the good
    and data-corrupted BC priors; and the pretanh guide critics. Returns the parameters."""
    d = setup.gdata.actions.shape[1]
    obs, og = setup.kl_obs[:1], setup.kl_goal(0)[:1]
    act = setup.gdata.actions[:1]
    levels = list(setup.actor_data)
    keys = jax.random.split(key, 4 + len(levels))
    init = {}
    for space in cfg.spaces:
        an, pn = _nets(cfg, space, d)
        init[space] = {
            "actors": {lv: an.init(keys[0], obs) for lv in levels},
            "good": pn.init(keys[1], og),
            "bad": pn.init(keys[1], og),
        }
    critic = policy.TwinCritic((cfg.hidden, cfg.hidden))
    init["guides"] = {g: critic.init(keys[2], og, act) for g in cfg.guides}
    steps = {}

    def fit(algo, data, n, k, name):  # one jitted chunk per algorithm, reused across data sets
        chunk = min(cfg.train_chunk, n)
        if (id(algo), chunk) not in steps:
            steps[id(algo), chunk] = jax.jit(policy.make_train(algo, chunk, cfg.batch_size))
        step = steps[id(algo), chunk]
        run = ctx.train_chunks(
            lambda st, kk: step(kk, st, data), algo.init(k, data), max(n // chunk, 1), k, tag=name
        )
        return run[0]

    with ctx.checkpointed(tag, init) as (start, params, save):
        if start > 0:
            return params
        params = {}
        for space in cfg.spaces:
            an, pn = _nets(cfg, space, d)
            algo, bc = iql(cfg, an), policy.bc(pn, optax.adam(cfg.lr))
            actors = {
                lv: fit(
                    algo, data, cfg.iql_steps, keys[4 + i], f"{tag}_{space}_{lv}_iql"
                ).actor_params
                for i, (lv, data) in enumerate(setup.actor_data.items())
            }
            good = fit(bc, setup.gdata, cfg.bc_steps, keys[1], f"{tag}_{space}_bc").params
            bad = fit(bc, setup.gdata_bad, cfg.bc_steps, keys[3], f"{tag}_{space}_bad").params
            params[space] = {"actors": actors, "good": good, "bad": bad}
        an, pn = _nets(cfg, "pretanh", d)
        algos = {
            "iql": (iql(cfg, an), cfg.guide_iql_steps),
            "cql": (cql(cfg, pn), cfg.guide_cql_steps),
        }
        params["guides"] = {}
        for g in cfg.guides:
            algo, n = algos[g]
            params["guides"][g] = fit(
                algo, setup.guide_data, n, keys[2], f"{tag}_guide_{g}"
            ).critic_params
        save(0, params)
    return params


def make_priors(cfg, net, params, keys, example, marginal_std) -> list[Callable]:
    """Every prior of :meth:`PolicyConfig.prior_names` in one space, as ``prior(a, og) ->
    DiagGaussian``: ``a`` the actor's Gaussians and ``og [B, o + g]`` the prior's inputs at the
    same states (the control and the family are built on the actor; the others ignore it).
    ``keys``: one per kind of ``priors``, then the control's and the family's noise."""
    out = []
    for i, q in enumerate(cfg.priors):
        f = policy.make_prior(
            q,
            net,
            params["good"],
            keys[i],
            example,
            corrupted_params=params["bad"],
            marginal_std=marginal_std,
            degrade_scale=cfg.degrade_scale,
        )
        out.append(lambda a, og, f=f: f(og))
    good = partial_apply(net, params["good"])
    d = marginal_std.shape[0]
    control = policy.state_noise(keys[-2], example.shape[-1], d)
    out.append(lambda a, og: policy.perturbation_prior(a, good(og), control(og)))
    noise = policy.state_noise(keys[-1], example.shape[-1], d)  # one error for every ratio
    for r in cfg.precision_ratios:
        out.append(lambda a, og, r=r: policy.precision_prior(a, noise(og), r, cfg.precision_error))
    return out


def _pick(dists, index):
    i = jnp.asarray(index)
    return jax.tree.map(
        lambda *xs: jnp.take_along_axis(jnp.stack(xs), i[None, :, None], 0)[0], *dists
    )


def canon(row, per_level: bool = False, on_actor: Sequence[int] = ()) -> tuple:
    """A row ``(space, level, prior, method, alpha)`` in its canonical form, so equal policies
    share one evaluation: alpha 0 (either mix) is the actor (prior 0), additive at alpha 1 is
    PoE at alpha 1 (the prior alone), which does not depend on the actor level (level 0)
    unless each level has its own task (``per_level``) or the prior is built on the actor
    (its index in ``on_actor``: the control and the precision family).

    >>> canon((1, 2, 3, Method.ADDITIVE, 1.0)), canon((1, 2, 3, Method.ADDITIVE, 1.0), True)
    ((1, 0, 3, 0, 1.0), (1, 2, 3, 0, 1.0))
    """
    si, li, qi, m, al = row
    m, al = int(m), float(al)
    if m in _MIXES and al == 0.0:
        return (si, li, 0, int(Method.POE), 0.0)
    if m in _MIXES and al == 1.0:
        keep = per_level or qi in on_actor
        return (si, li if keep else 0, qi, int(Method.POE), 1.0)
    return (si, li, qi, m, al)


# --------------------------------------------------------------------------------------------
# One seed
# --------------------------------------------------------------------------------------------


def kl_stats(cfg, d: int) -> Callable:
    """The jitted ``(actor, prior, budget) -> (alpha, sweep alphas [n_b], kl [n_a],
    mean-only kl [n_a])``: the KL-budget alpha at ``budget`` nats, those at the reported
    budgets ``cfg.kl_budgets`` x d nats, and the mean KL of PoE at each alpha of
    ``cfg.alphas`` over the states."""
    budgets = jnp.asarray([b * d for b in cfg.kl_budgets], jnp.float32)
    alphas = jnp.asarray(cfg.alphas, jnp.float32)

    @jax.jit
    def stats(a, p, budget):
        def curve(fn):
            return jax.vmap(lambda al: fn(a, p, al).mean())(alphas)

        sweep = jax.vmap(lambda b: policy.kl_budget_alpha(a, p, b))(budgets)
        kls = curve(policy.poe_kl_to_actor), curve(policy.poe_mean_kl_to_actor)
        return (policy.kl_budget_alpha(a, p, budget), sweep, *kls)

    return stats


def run_seed(ctx, cfg, setup, key, tag) -> dict:
    """One study seed: train, select on the selection episodes, evaluate on the test ones.

    Rows are ``(space, level, prior, method, alpha)`` tuples (indices into ``cfg.spaces``,
    ``setup.actor_data`` and :meth:`PolicyConfig.prior_names`). Returns ``{"test": {row:
    {metric: [n_test]}}, "own": {row: ...}, "chosen": {...}, "stats": {...}, "d", "per_level",
    "on_actor"}``.
    """
    params = train_networks(ctx, cfg, setup, key, tag)
    d = setup.gdata.actions.shape[1]
    levels, names = list(setup.actor_data), cfg.prior_names()
    n_lv, nq, nk = len(levels), len(names), len(cfg.priors)
    keys = jax.random.split(jax.random.fold_in(key, 7), nk + 2)
    actor_fns, prior_fns = [], []
    for space in cfg.spaces:
        an, pn = _nets(cfg, space, d)
        p = params[space]
        actor_fns += [partial_apply(an, p["actors"][lv]) for lv in levels]
        std = _marginal_std(setup.gdata.actions, space)
        prior_fns += make_priors(cfg, pn, p, keys, setup.kl_goal(0)[:1], std)
    critic = policy.TwinCritic((cfg.hidden, cfg.hidden))
    q_fns = {g: min_q(critic, params["guides"][g]) for g in cfg.guides}
    squashed = jnp.asarray([sp == "pretanh" for sp in cfg.spaces])

    @jax.jit
    def act(obs, goal, rows):
        o = setup.obs_fn(obs)
        sp, lv, pr, method, alpha = rows
        og = setup.prior_obs(o, goal, lv)
        a = _pick([f(o) for f in actor_fns], sp * n_lv + lv)
        p = _pick([f(a, og) for f in prior_fns], sp * nq + pr)
        mix = jnp.where(method <= Method.ADDITIVE, alpha, 0.0)
        add = (method == Method.ADDITIVE)[:, None]
        mean = jnp.where(add, policy.additive(a, p, mix).mean, policy.poe(a, p, mix).mean)
        out = policy.deterministic_action(mean, squashed[sp])
        shift = jnp.where(method >= Method.IQL_GUIDED, alpha, 1.0)
        for g, fn in q_fns.items():
            steered = policy.q_steer(fn, og, a.mean, cfg.guide_step_size, cfg.guide_steps, shift)
            out = jnp.where((method == _GUIDE_METHOD[g])[:, None], steered, out)
        return jnp.where((method == Method.ZERO)[:, None], 0.0, out)

    per_level, on_actor = setup.task_per_level, tuple(range(nk, nq))

    def evaluate(rows, split, n):
        rows = list(dict.fromkeys(canon(r, per_level, on_actor) for r in rows))
        stacked = [np.asarray([r[i] for r in rows], np.int32) for i in range(4)]
        stacked.append(np.asarray([r[4] for r in rows], np.float32))
        specs = np.repeat(np.arange(len(rows)), n)[:, None]
        episodes = np.tile(np.arange(n), len(rows))

        def host(obs, *goal_and_specs):
            *goal, sp = goal_and_specs
            idx = np.asarray(sp)[:, 0]
            r = tuple(jnp.asarray(c[idx]) for c in stacked)
            g = jnp.asarray(goal[0], jnp.float32) if goal else None
            return act(jnp.asarray(obs, jnp.float32), g, r)

        res = setup.evaluate(host, specs, episodes, split, stacked[1][specs[:, 0]])
        res = {m: np.asarray(v, np.float64) for m, v in res.items()}
        return {r: {m: v[specs[:, 0] == i] for m, v in res.items()} for i, r in enumerate(rows)}

    def mean_of(res):
        return lambda r: float(res[canon(r, per_level, on_actor)]["return"].mean())

    # The KL states: calibrated budgets, KL-budget alphas, spreads and precision ratios.
    stats, chosen = {}, {}
    kl_fn = kl_stats(cfg, d)
    grid = [(si, li) for si in range(len(cfg.spaces)) for li in range(n_lv)]
    for si, li in grid:
        a = actor_fns[si * n_lv + li](setup.kl_obs)
        budget = policy.calibrate_kl_budget(a, cfg.kl_budget_fraction)
        stats[si, li, "budget"] = float(budget)
        stats[si, li, "actor_std"] = np.quantile(np.asarray(a.std), (0.1, 0.5, 0.9)).tolist()
        for qi in range(nk):
            p = prior_fns[si * nq + qi](a, setup.kl_goal(li))
            k = (si, li, qi)
            stats[*k, "prior_std"] = np.quantile(np.asarray(p.std), (0.1, 0.5, 0.9)).tolist()
            stats[*k, "precision"] = float(np.median(policy.precision_ratio(a, p)))
            alpha, sweep, kl, kl_mean = (np.asarray(x) for x in kl_fn(a, p, budget))
            chosen[*k, "kl"] = float(alpha)
            stats[*k, "sweep"], stats[*k, "kl"] = sweep.tolist(), kl.tolist()
            stats[*k, "kl_mean"] = kl_mean.tolist()
    # Selection episodes: the PoE alpha sweeps and the guides' trust regions.
    zero_rows = [(0, li if per_level else 0, 0, Method.ZERO, 0.0) for li in range(n_lv)]
    sel = [(si, li, 0, Method.POE, 0.0) for si, li in grid] + zero_rows
    for si, li in grid:
        sel += [(si, li, qi, Method.POE, al) for qi in range(nk) for al in cfg.alphas[1:]]
    pre = cfg.spaces.index("pretanh") if "pretanh" in cfg.spaces else None
    guides = cfg.guides if pre is not None else ()
    sel += [
        (pre, li, 0, _GUIDE_METHOD[g], sh)
        for g in guides
        for li in range(n_lv)
        for sh in cfg.guide_shifts
    ]
    s_res = mean_of(evaluate(sel, "select", cfg.n_select))
    chosen["zero_select"] = [s_res(z) for z in zero_rows]  # per actor level
    mid = [i for i, a in enumerate(cfg.alphas) if a in cfg.mid_alphas()]
    good = cfg.priors.index("good") if "good" in cfg.priors else None
    test = []
    for si, li in grid:
        chosen[si, li, "actor_select"] = s_res((si, li, 0, Method.POE, 0.0))
        test.append((si, li, 0, Method.POE, 0.0))
        for qi in range(nk):
            k = (si, li, qi)
            c = [s_res((si, li, qi, Method.POE, al)) for al in cfg.alphas]
            chosen[*k, "curve"] = c
            chosen[*k, "oracle"] = cfg.alphas[int(np.argmax(c))]
            chosen[*k, "oracle_mid"] = cfg.alphas[mid[int(np.argmax([c[i] for i in mid]))]]
            for name in ("kl", "oracle", "oracle_mid"):
                test.append((si, li, qi, Method.POE, chosen[*k, name]))
            test.append((si, li, qi, Method.POE, 1.0))
            test += [(si, li, qi, Method.POE, cfg.fixed_alpha)]
            test += [(si, li, qi, m, cfg.contrast_alpha) for m in _MIXES]
        if good is not None:  # the control at the good prior's oracle alpha
            test.append((si, li, nk, Method.POE, chosen[si, li, good, "oracle"]))
        for j in range(len(cfg.precision_ratios)):
            test += [(si, li, nk + 1 + j, m, cfg.contrast_alpha) for m in _MIXES]
        test.append((si, li, nk + 1, Method.POE, 1.0))  # the family's mean alone (any ratio)
    for g in guides:
        for li in range(n_lv):
            c = [s_res((pre, li, 0, _GUIDE_METHOD[g], sh)) for sh in cfg.guide_shifts]
            chosen[g, li] = cfg.guide_shifts[int(np.argmax(c))]
            test.append((pre, li, 0, _GUIDE_METHOD[g], chosen[g, li]))
    t_res = evaluate(test, "test", cfg.n_test)
    own = evaluate([(si, li, 0, Method.POE, 0.0) for si, li in grid], "own", cfg.n_test)
    return {
        "test": t_res,
        "own": own,
        "chosen": chosen,
        "stats": stats,
        "d": d,
        "per_level": per_level,
        "on_actor": on_actor,
    }


# --------------------------------------------------------------------------------------------
# Over seeds: the claims, decided by experiments._verdicts
# --------------------------------------------------------------------------------------------

#: How a claim reads the shared module's outcome. A bound (non-inferiority or
#: non-superiority, :func:`experiments._verdicts.noninferior`) holds when it is shown; a
#: difference (:func:`experiments._verdicts.decide`) holds when it is shown beyond 0, and
#: "no advantage" (equivalent within the margin) refutes it like a difference of the other sign.
_AS_CLAIM = {
    "reproduced": "holds",
    "not reproduced": "fails",
    "no advantage": "fails",
    "undecided": "undecided",
}
TOO_FEW = "fewer than two paired units"


def _minus(a: Callable, b: Callable) -> Callable:
    return lambda run: a(run) - b(run)


class Claims:
    """Writes claims and figures into the summary ``out``.

    Each is computed from a paired difference ``fn(run) -> [n_test]`` (one value per test
    episode of a seed, the same episode under both arms), reduced to paired *units*: the
    per-seed means with two or more seeds (so the intervals carry the seed-to-seed variation
    as well as the episodes'), the episodes of the one seed otherwise; then decided by
    :mod:`experiments._verdicts` at the margin and level of ``cfg``.
    """

    def __init__(self, cfg, runs: Sequence[dict], out: dict):
        self.margin, self.alpha, self.runs, self.out = cfg.margin(), cfg.stat_alpha, runs, out

    def units(self, fn: Callable) -> list[float]:
        per = [np.asarray(fn(run), np.float64) for run in self.runs]
        return [float(x.mean()) for x in per] if len(per) >= 2 else per[0].tolist()

    def _verdict(self, units, rule, direction, failed=()):
        if len(units) < 2:
            return None
        fn = _verdicts.noninferior if rule == "bound" else _verdicts.decide
        m, a = self.margin, self.alpha
        return fn(units, margin=m, direction=direction, alpha=a, failed=[f for f in failed if f])

    def figure(self, name: str, fn: Callable, direction: str = "greater") -> str:
        """``name`` (the mean of the units), ``name_ci_low`` / ``_ci_high`` (the (1 - alpha)
        interval), ``name_outcome`` (:func:`experiments._verdicts.decide` at the margin,
        claiming ``direction``) and ``name_diffs`` (the units); returns the outcome ("too few
        units" without two)."""
        u = self.units(fn)
        v, nan = self._verdict(u, "difference", direction), float("nan")
        self.out |= {
            name: float(np.mean(u)),
            f"{name}_ci_low": v.ci_low if v else nan,
            f"{name}_ci_high": v.ci_high if v else nan,
            f"{name}_outcome": v.outcome if v else "too few units",
            f"{name}_diffs": u,
        }
        return v.outcome if v else "too few units"

    def worse(self, name: str, fn: Callable) -> bool:
        """The gate of a bad prior: :meth:`figure` ``name``, and whether
        :func:`experiments._verdicts.noninferior` shows the difference below ``-margin``
        (its outcome "not reproduced", written as ``name_bound_outcome``)."""
        self.figure(name, fn)
        v = self._verdict(self.units(fn), "bound", "greater")
        self.out[f"{name}_bound_outcome"] = v.outcome if v else "too few units"
        return v is not None and v.outcome == "not reproduced"

    def claim(self, name: str, fn: Callable, rule: str, direction: str, failed=()) -> str:
        """``verdict_<name>`` ("holds" / "fails" / "undecided" / "not tested: <why>") with
        ``<name>_ci_low`` / ``_ci_high`` (the interval the rule reads, at ``_ci_level``),
        ``_margin``, ``_mean``, ``_outcome`` (the shared module's word), ``_seeds_needed``,
        ``_diffs`` (the paired units) and ``_rule`` ("bound greater" / "bound less":
        :func:`experiments._verdicts.noninferior`; "difference greater" / "difference less":
        :func:`experiments._verdicts.decide`), so that parts can be joined and decided again."""
        u = self.units(fn)
        v, nan = self._verdict(u, rule, direction, failed), float("nan")
        if v is None:
            verdict, lo, hi = f"not tested: {TOO_FEW}", nan, nan
        else:
            lo, hi = (v.eq_low, v.eq_high) if rule == "bound" else (v.ci_low, v.ci_high)
            why = "; ".join(f for f in failed if f)
            verdict = _AS_CLAIM.get(v.outcome) or f"not tested: {why}"
        self.out |= {
            f"verdict_{name}": verdict,
            f"{name}_ci_low": lo,
            f"{name}_ci_high": hi,
            f"{name}_ci_level": 1 - (2 if rule == "bound" else 1) * self.alpha,
            f"{name}_margin": self.margin,
            f"{name}_mean": float(np.mean(u)),
            f"{name}_outcome": v.outcome if v else "not tested",
            f"{name}_seeds_needed": v.seeds_needed if v else None,
            f"{name}_diffs": u,
            f"{name}_rule": f"{rule} {direction}",
        }
        return verdict


class _Cell:
    """One (space, level) of every seed's runs: :meth:`arm` gives ``run -> [n_test]``."""

    def __init__(self, runs: Sequence[dict], si: int, li: int):
        self.runs, self.si, self.li = runs, si, li
        self.per_level, self.on_actor = runs[0]["per_level"], runs[0]["on_actor"]

    def chosen(self, run, qi: int, name: str):
        return run["chosen"][self.si, self.li, qi, name]

    def arm(self, qi: int, alpha, method=Method.POE, metric="return", key="test") -> Callable:
        """The per-episode ``metric`` of one row; ``alpha``: a number, a name of the seed's
        chosen alphas of prior ``qi`` ("kl", "oracle", "oracle_mid") or ``run -> alpha``."""

        def f(run):
            al = self.chosen(run, qi, alpha) if isinstance(alpha, str) else alpha
            al = al(run) if callable(al) else al
            row = canon((self.si, self.li, qi, method, al), self.per_level, self.on_actor)
            return run[key][row][metric]

        return f

    @property
    def actor(self) -> Callable:
        return self.arm(0, 0.0)

    @property
    def metrics(self) -> list[str]:
        """The reported metrics besides the decisions' ``return`` (e.g. success, length)."""
        row = canon((self.si, self.li, 0, Method.POE, 0.0), self.per_level, self.on_actor)
        return [m for m in self.runs[0]["test"][row] if m != "return"]

    def mean(self, fn: Callable) -> float:
        """The mean over seeds of a row's test mean."""
        return float(np.mean([fn(run).mean() for run in self.runs]))

    def avg(self, fn: Callable) -> list:
        """The mean over seeds of a per-seed figure (a number or a list)."""
        return np.mean([fn(run) for run in self.runs], 0).tolist()


def _prior_claims(cfg, C: Claims, cell: _Cell, sfx: str, gates: list) -> list[str]:
    """Per prior Q of ``priors``: graceful degradation and additive below PoE (tested on a
    prior decidedly worse than the actor), and the test means, alphas and KL figures."""
    out, claims, metrics = C.out, [], cell.metrics
    s = (cell.si, cell.li)
    for qi, q in enumerate(cfg.priors):
        n = f"_{q}{sfx}"
        sel, alone = cell.arm(qi, "kl"), cell.arm(qi, 1.0)
        poe_c = cell.arm(qi, cfg.contrast_alpha)
        add_c = cell.arm(qi, cfg.contrast_alpha, Method.ADDITIVE)
        bad = C.worse(f"prior_only_minus_actor{n}", _minus(alone, cell.actor))
        why = [*gates, "" if bad else "the prior alone is not decidedly worse than the actor"]
        C.claim(f"graceful{n}", _minus(sel, cell.actor), "bound", "greater", why)
        C.claim(f"additive_below_poe{n}", _minus(add_c, poe_c), "difference", "less", why)
        claims += [f"graceful{n}", f"additive_below_poe{n}"]
        arms = {
            "poe_kl": sel,
            "oracle": cell.arm(qi, "oracle"),
            "oracle_mid": cell.arm(qi, "oracle_mid"),
            "fixed": cell.arm(qi, cfg.fixed_alpha),
            "prior_only": alone,
            "poe_contrast": poe_c,
            "additive_contrast": add_c,
        }
        out |= {f"{k}_return{n}": cell.mean(f) for k, f in arms.items()}
        for m in metrics:
            out[f"poe_kl_{m}{n}"] = cell.mean(cell.arm(qi, "kl", metric=m))
            out[f"prior_only_{m}{n}"] = cell.mean(cell.arm(qi, 1.0, metric=m))
        for name in ("oracle", "oracle_mid", "kl"):
            out[f"{name}_alpha{n}"] = [cell.chosen(r, qi, name) for r in cell.runs]
        out[f"poe_select_curve{n}"] = cell.avg(lambda r, qi=qi: cell.chosen(r, qi, "curve"))
        for k, name in (("sweep", "kl_budget_alphas"), ("kl", "kl_curve"),
                        ("kl_mean", "kl_mean_curve"), ("precision", "precision_ratio_median"),
                        ("prior_std", "prior_std_quantiles")):  # fmt: skip
            out[f"{name}{n}"] = cell.avg(lambda r, qi=qi, k=k: r["stats"][*s, qi, k])
    return claims


def _selector_claims(cfg, C: Claims, cell: _Cell, sfx: str, gates: list, regrets: dict):
    """The KL selector: its regret against the oracle alpha over ``regret_range`` and the
    non-search rules' (fixed alpha, the actor alone), averaged over the priors; the claim that
    it is near the oracle (regret below the margin)."""
    nk = len(cfg.priors)
    rules = {
        "selector": lambda qi: cell.arm(qi, "kl"),
        "fixed": lambda qi: cell.arm(qi, cfg.fixed_alpha),
        "actor": lambda qi: cell.actor,
    }

    def regret(rule):
        pairs = [(cell.arm(qi, "oracle_mid"), rule(qi)) for qi in range(nk)]
        return lambda run: np.mean([o(run) - r(run) for o, r in pairs], 0)

    reg = {name: regret(rule) for name, rule in rules.items()}
    for name, fn in reg.items():
        C.figure(f"{name}_regret{sfx}", fn)
        regrets.setdefault((cell.si, name), []).append(fn)
    C.figure(f"selector_minus_fixed{sfx}", _minus(reg["fixed"], reg["selector"]))
    C.figure(f"selector_minus_actor{sfx}", _minus(reg["actor"], reg["selector"]))
    C.claim(f"selector{sfx}", lambda run: -reg["selector"](run), "bound", "greater", gates)
    return [f"selector{sfx}"]


def _ceiling_claims(cfg, C: Claims, cell: _Cell, sfx: str, gates: list) -> list[str]:
    """Capped (a competent actor: the good prior at its oracle alpha helps by less than the
    margin) and responsive (a weak actor: it helps), each gated on the good prior alone and on
    the random-perturbation control, which must not help."""
    if "good" not in cfg.priors:
        return []
    g, nk = cfg.priors.index("good"), len(cfg.priors)
    best, alone = cell.arm(g, "oracle"), cell.arm(g, 1.0)
    control = cell.arm(nk, lambda run: cell.chosen(run, g, "oracle"))
    beats = C.figure(f"good_prior_minus_actor{sfx}", _minus(alone, cell.actor))
    helps = C.figure(f"control_minus_actor{sfx}", _minus(control, cell.actor))
    C.out[f"control_return{sfx}"] = cell.mean(control)
    c_gate = "the random-perturbation control helps" if helps == "reproduced" else ""
    comp = "the good prior alone beats the actor: not competent on this task"
    weak = "the good prior alone does not decidedly beat the actor"
    d = _minus(best, cell.actor)
    C.claim(
        f"capped{sfx}", d, "bound", "less", [*gates, c_gate, comp if beats == "reproduced" else ""]
    )
    C.claim(
        f"responsive{sfx}",
        d,
        "difference",
        "greater",
        [*gates, c_gate, "" if beats == "reproduced" else weak],
    )
    return [f"capped{sfx}", f"responsive{sfx}"]


def _precision_prediction(cfg, C: Claims, cell: _Cell, sfx: str, gates: list) -> str:
    """The precision-ratio prediction: additive - PoE at ``contrast_alpha`` on the family lies
    below 0 for every r < 1 and above 0 for every r > 1; r = 1, where the two coincide, is the
    control."""
    nk = len(cfg.priors)
    family = cell.arm(nk + 1, 1.0)  # the family's mean alone, the same for every ratio
    why = list(gates)
    if not C.worse(f"precision_family_minus_actor{sfx}", _minus(family, cell.actor)):
        why.append("the family's mean alone is not decidedly worse than the actor")
    outcomes = []
    for j, r in enumerate(cfg.precision_ratios):
        c = cfg.contrast_alpha
        d = _minus(cell.arm(nk + 1 + j, c, Method.ADDITIVE), cell.arm(nk + 1 + j, c))
        o = C.figure(f"precision_contrast_{family_name(r)}{sfx}", d, "less" if r < 1 else "greater")
        if r != 1.0:
            outcomes.append(o)
        elif o in ("reproduced", "not reproduced"):
            why.append("the r = 1 control (PoE and additive coincide) differs")
    why = [w for w in why if w]
    if why:
        return "not tested: " + "; ".join(why)
    if "too few units" in outcomes:
        return f"not tested: {TOO_FEW}"
    if outcomes and all(o == "reproduced" for o in outcomes):
        return "holds"
    return "fails" if "not reproduced" in outcomes else "undecided"


def _combine(verdicts: Sequence[str]) -> str:
    """One verdict from several: "fails" if any fails, "holds" if every tested one holds,
    "undecided" otherwise; "not tested" when none was tested.

    >>> _combine(["holds", "not tested: x"]), _combine(["holds", "undecided"])
    ('holds', 'undecided')
    """
    tested = [v for v in verdicts if not v.startswith("not tested")]
    if not tested:
        return "not tested: no space or actor level passed its gates"
    if "fails" in tested:
        return "fails"
    return "holds" if all(v == "holds" for v in tested) else "undecided"


def summarise(cfg, runs: Sequence[dict], levels: Sequence[str], failed: Sequence[str] = ()) -> dict:
    """The summary of :func:`run_seed` over seeds: test means, and each claim of the rules
    stated in the studies' docstrings, decided by :mod:`experiments._verdicts` (``failed``:
    the study's own failed gates, which make every claim "not tested")."""
    per_level = runs[0]["per_level"]
    out = {
        "alphas": list(cfg.alphas),
        "priors": list(cfg.priors),
        "spaces": list(cfg.spaces),
        "levels": list(levels),
        "precision_ratios": list(cfg.precision_ratios),
        "margin": cfg.margin(),
        "stat_alpha": cfg.stat_alpha,
        "stat_unit": "seed" if len(runs) >= 2 else "episode",
        "kl_budget_fraction": cfg.kl_budget_fraction,
        "kl_budgets_nats": [b * runs[0]["d"] for b in cfg.kl_budgets],
        "n_seeds": len(runs),
        "n_select": cfg.n_select,
        "n_test": cfg.n_test,
    }
    C = Claims(cfg, runs, out)
    claims, predictions, regrets = [], [], {}
    zero_sel = np.mean([run["chosen"]["zero_select"] for run in runs], 0)
    out |= level_keys(levels[: len(levels) if per_level else 1], "zero_select_return", zero_sel)
    for si, space in enumerate(cfg.spaces):
        for li, level in enumerate(levels):
            cell = _Cell(runs, si, li)
            sfx = ("" if len(levels) == 1 else f"_{level}") + f"_{space}"
            actor_sel = float(np.mean([r["chosen"][si, li, "actor_select"] for r in runs]))
            worth = actor_sel > float(zero_sel[li if per_level else 0])
            gates = [*failed, "" if worth else "the actor does not beat the zero action"]
            out |= {
                f"actor_select_return{sfx}": actor_sel,
                f"actor_beats_zero{sfx}": worth,
                f"actor_return{sfx}": cell.mean(cell.actor),
                f"actor_own_task_return{sfx}": cell.mean(cell.arm(0, 0.0, key="own")),
                f"actor_std_quantiles{sfx}": cell.avg(
                    lambda r, s=si, v=li: r["stats"][s, v, "actor_std"]
                ),
                f"kl_budget_nats{sfx}": [r["stats"][si, li, "budget"] for r in runs],
            }
            for m in cell.metrics:
                out[f"actor_{m}{sfx}"] = cell.mean(cell.arm(0, 0.0, metric=m))
            claims += _prior_claims(cfg, C, cell, sfx, gates)
            claims += _selector_claims(cfg, C, cell, sfx, gates, regrets)
            claims += _ceiling_claims(cfg, C, cell, sfx, gates)
            predictions.append(_precision_prediction(cfg, C, cell, sfx, gates))
            out[f"precision_ratio_prediction{sfx}"] = predictions[-1]
            for g in cfg.guides if space == "pretanh" else ():
                arm = cell.arm(0, lambda r, g=g, v=li: r["chosen"][g, v], _GUIDE_METHOD[g])
                out[f"{g}_guided_return{sfx}"] = cell.mean(arm)
                out[f"{g}_guided_shift{sfx}"] = [r["chosen"][g, li] for r in runs]
                C.figure(f"{g}_guided_minus_actor{sfx}", _minus(arm, cell.actor))
    if len(levels) > 1:  # the regrets over every actor level as well
        for (si, name), fns in regrets.items():
            fn = lambda run, fns=fns: np.mean([f(run) for f in fns], 0)  # noqa: E731
            C.figure(f"{name}_regret_{cfg.spaces[si]}", fn)
    out["precision_ratio_prediction"] = _combine(predictions)
    out["claims"] = claims
    return out


def plot_curves(ctx, cfg, out, levels, name="selection_curves") -> None:
    """Per space (and actor level) and prior: the PoE selection-episode curve over alpha, the
    KL (full and mean-only) of PoE at each alpha, and the selector's alpha."""
    import matplotlib.pyplot as plt

    rows = [(sp, lv) for sp in cfg.spaces for lv in levels]
    n_r, n_q = len(rows), len(cfg.priors)
    fig, axes = plt.subplots(n_r, n_q, figsize=(3.2 * n_q, 2.6 * n_r), squeeze=False)
    for ax_row, (space, level) in zip(axes, rows, strict=True):
        sfx = ("" if len(levels) == 1 else f"_{level}") + f"_{space}"
        for ax, q in zip(ax_row, cfg.priors, strict=True):
            ax.plot(cfg.alphas, out[f"poe_select_curve_{q}{sfx}"], "o-", label="PoE (selection)")
            for al in out[f"kl_alpha_{q}{sfx}"]:
                ax.axvline(al, c="C2", ls="--", lw=0.8)
            tw = ax.twinx()
            tw.plot(cfg.alphas, out[f"kl_curve_{q}{sfx}"], "k:", label="KL")
            tw.plot(cfg.alphas, out[f"kl_mean_curve_{q}{sfx}"], "k--", label="mean-only KL")
            tw.set_yscale("symlog")
            tw.tick_params(labelsize=5)
            ax.tick_params(labelsize=6)
            ax.set_title(f"{space}{'' if len(levels) == 1 else ', ' + level}, {q}", fontsize=7)
            ax.set_xlabel("alpha")
    axes[0, 0].legend(fontsize=6)
    fig.tight_layout()
    ctx.save_plot(fig, name)


def run(cfg, ctx, setup_fn: Callable, levels: Sequence[str], failed: Sequence[str] = ()) -> dict:
    """The whole study: :func:`run_seed` for the study seeds ``ctx.seed + i``, ``i <
    cfg.n_seeds`` (``setup_fn(seed, key) -> (Setup, extra)`` builds each seed's data, tasks
    and evaluator), then :func:`summarise` and :func:`plot_curves`. ``extra``'s figures are
    averaged over the seeds into the summary."""
    runs, extras = [], []
    for i in range(cfg.n_seeds):
        seed = ctx.seed + i
        key = jax.random.fold_in(ctx.key(), i)
        st, extra = setup_fn(seed, jax.random.fold_in(key, 1))
        runs.append(run_seed(ctx, cfg, st, key, f"seed{seed}"))
        extras.append(extra)
    out = summarise(cfg, runs, levels, failed)
    out |= {k: float(np.mean([e[k] for e in extras])) for k in extras[0]}
    plot_curves(ctx, cfg, out, levels)
    return out


# --------------------------------------------------------------------------------------------
# The studies' set-ups: mazes (PointMaze, AntMaze) and locomotion
# --------------------------------------------------------------------------------------------


def maze_setup(cfg, ctx, seed, key, raw, geom, evaluator, oracle, goal_margin) -> tuple:
    """One seed's :class:`Setup` on a maze data set ``raw`` (goal-conditioned, D4RL fields
    with ``infos/goal`` and ``task_goal``): the actor on the data's task, the prior on
    (observation, goal), selection and test episodes with their own goals within
    ``cfg.goal_shift`` of the task goal (at least ``goal_margin`` from a wall), and the
    scripted ``oracle(obs, goal)`` on the test goals as a reference. ``evaluator`` has
    :func:`hexad.data.offline_rl.evaluate_pointmaze`'s signature; its ``return`` decides and
    its ``success`` is reported."""
    data = policy.batch_from_dataset(raw)
    goals = np.asarray(raw["infos/goal"], np.float32)
    ends = policy.trajectory_ends(raw["terminals"], raw["timeouts"])
    bad = policy.shuffle_goals_across_trajectories(key, goals, ends)
    gdata = policy.goal_conditioned(data, goals)
    reached = jnp.linalg.norm(data.next_observations[:, :2] - goals, axis=-1) <= 0.5
    reached = reached.astype(jnp.float32)
    rng = np.random.default_rng(seed)
    ep_goals = {
        sp: offline_rl.sample_free_goals(
            rng, raw["task_goal"], cfg.goal_shift, n, goal_margin, geom
        )
        for sp, n in (("select", cfg.n_select), ("test", cfg.n_test))
    }
    ep_goals["own"] = np.tile(np.asarray(raw["task_goal"], np.float32), (cfg.n_test, 1))
    seeds = {"select": 1000 * seed + 500 + np.arange(cfg.n_select)}
    seeds["test"] = seeds["own"] = 1000 * seed + np.arange(cfg.n_test)
    policy.check_disjoint(seeds["select"], seeds["test"])
    idx = rng.choice(data.observations.shape[0], cfg.n_kl_states, replace=False)
    s = data.observations[idx]
    g = jnp.asarray(ep_goals["select"][rng.integers(0, cfg.n_select, cfg.n_kl_states)])

    def evaluate(host, specs, episodes, split, levels):  # one actor, one task
        res = evaluator(
            host,
            ep_goals[split][episodes],
            specs,
            seeds[split][episodes],
            min(cfg.n_envs, len(episodes)),
            cfg.episode_steps,
            progress=ctx.progress,
        )
        return {"return": res["return"], "success": res["success"]}

    st = Setup(
        actor_data={"task": data},
        gdata=gdata,
        gdata_bad=policy.goal_conditioned(data, bad),
        guide_data=gdata._replace(rewards=reached, terminals=reached),
        kl_obs=s,
        kl_obs_goal=jnp.concatenate([s, g], -1),
        obs_fn=lambda o: o,
        prior_obs=lambda o, goal, level: jnp.concatenate([o, goal], -1),
        evaluate=evaluate,
    )
    ref = evaluator(
        lambda o, gl, sp: oracle(o, gl),
        ep_goals["test"],
        np.zeros((cfg.n_test, 1)),
        seeds["test"],
        min(cfg.n_envs, cfg.n_test),
        cfg.episode_steps,
    )
    extra = {"scripted_oracle_return": float(ref["return"].mean())}
    return st, extra | {"scripted_oracle_success": float(ref["success"].mean())}


#: The data sets behind each locomotion actor level.
LEVEL_PARTS = {
    "medium": ("medium",),
    "medium_replay": ("medium-replay",),
    "medium_expert": ("medium", "expert"),
}


def level_targets(raw: dict, levels: Sequence[str], frac: float, floor: str = "") -> np.ndarray:
    """``[len(levels)]`` the shifted task's ``v*`` per actor level: ``frac`` times the mean x
    velocity of the level's own data (:data:`LEVEL_PARTS`), or of the level ``floor``'s data
    where that is faster (``""``: no floor)."""

    def mean_velocity(lv):
        return np.concatenate([raw[p]["infos/x_velocity"] for p in LEVEL_PARTS[lv]]).mean()

    v = np.asarray([mean_velocity(lv) for lv in levels])
    return frac * (np.maximum(v, mean_velocity(floor)) if floor else v)


def joined_parts(raw: dict, batches: dict, parts: Sequence[str]) -> tuple[dict, Any]:
    """The locomotion data sets ``parts`` joined: their per-transition fields of ``raw``
    concatenated (each part's last transition marked as a timeout, so that no trajectory runs
    on into the next part) and their ``batches`` concatenated."""
    n = len(raw[parts[0]]["rewards"])
    keys = [k for k, v in raw[parts[0]].items() if np.ndim(v) >= 1 and len(v) == n]

    def field(p, k):
        v = np.asarray(raw[p][k])
        return np.concatenate([v[:-1], np.ones_like(v[-1:])]) if k == "timeouts" else v

    joined = {k: np.concatenate([field(p, k) for p in parts]) for k in keys}
    batch = jax.tree.map(lambda *xs: jnp.concatenate(xs), *(batches[p] for p in parts))
    return joined, batch


def level_keys(levels: Sequence[str], name: str, values) -> dict:
    """``{name: values[0], "<level>_<name>": values[i]}``: one figure per actor level, the first
    level's without a prefix.

    >>> level_keys(["a", "b"], "x", [1, 2])
    {'x': 1.0, 'b_x': 2.0}
    """
    pairs = zip(levels, values, strict=True)
    return {("" if i == 0 else f"{lv}_") + name: float(v) for i, (lv, v) in enumerate(pairs)}


def locomotion_setup(cfg, ctx, raw: dict, seed: int, key) -> tuple[Setup, dict]:
    """One seed's :class:`Setup` on the locomotion levels ``raw`` (see the docstring of
    ``experiments.policy_locomotion``): an actor per level of ``cfg.levels`` on its own data,
    the velocity-conditioned priors and guide on ``cfg.prior_data``, each level's shifted task
    ``v*``, the selection and test episodes, and the zero action on every level's task."""
    norm = policy.Normaliser.fit(np.concatenate([r["observations"] for r in raw.values()]))
    b = {lv: norm.batch(policy.batch_from_dataset(r)) for lv, r in raw.items()}
    levels = locomotion_levels(raw, b)
    rep_raw, rep = joined_parts(raw, b, cfg.prior_data)  # the priors' and guide's
    vg = policy.velocity_goals(rep_raw, cfg.velocity_horizon)
    ends = policy.trajectory_ends(rep_raw["terminals"], rep_raw["timeouts"])
    bad = policy.shuffle_goals_across_trajectories(key, np.asarray(vg.inputs(vg.goals)), ends)
    own_goal = jnp.asarray(offline_rl.tracking_reward(rep_raw, vg.goals), jnp.float32)
    gdata = policy.goal_conditioned(rep, vg.inputs(vg.goals), own_goal)
    v_star = level_targets(raw, cfg.levels, cfg.target_velocity_frac, cfg.target_floor)
    g_star = vg.inputs(v_star)  # [levels, 1]

    def prior_obs(o, goal, level):  # a row commands the prior with its actor level's v*
        return jnp.concatenate([o, g_star[level]], -1)

    obs = b["medium"].observations
    s = obs[np.random.default_rng(seed).choice(obs.shape[0], cfg.n_kl_states, replace=False)]
    seeds = {"select": 1000 * seed + 500 + np.arange(cfg.n_select)}
    seeds["test"] = seeds["own"] = 1000 * seed + np.arange(cfg.n_test)
    policy.check_disjoint(seeds["select"], seeds["test"])

    def evaluate(host, specs, episodes, split, levels):
        res = offline_rl.evaluate_locomotion(
            host,
            cfg.env,
            specs,
            seeds[split][episodes],
            min(cfg.n_envs, len(episodes)),
            cfg.episode_steps,
            target_velocity=v_star[levels],
            progress=ctx.progress,
        )
        return {
            "return": res["return" if split == "own" else "shifted_return"],
            "length": res["length"],
        }

    st = Setup(
        actor_data={lv: levels[lv] for lv in cfg.levels},
        gdata=gdata,
        gdata_bad=policy.goal_conditioned(rep, bad, own_goal),
        guide_data=gdata,
        kl_obs=s,
        kl_obs_goal=tuple(prior_obs(s, None, np.full(len(s), li)) for li in range(len(cfg.levels))),
        obs_fn=norm,
        prior_obs=prior_obs,
        evaluate=evaluate,
        task_per_level=True,
    )
    n_lv = len(cfg.levels)
    zero_policy = lambda o, sp: np.zeros((len(o), b["medium"].actions.shape[1]))  # noqa: E731
    rows = np.tile(np.arange(cfg.n_test), n_lv), "test", np.repeat(np.arange(n_lv), cfg.n_test)
    zero = evaluate(zero_policy, np.zeros((cfg.n_test * n_lv, 1)), *rows)["return"]
    m = raw["medium"]
    extra = level_keys(cfg.levels, "target_velocity", v_star)
    extra |= level_keys(cfg.levels, "zero_return", zero.reshape(n_lv, -1).mean(1))
    extra["reward_scale"] = policy.return_range_scale(m["rewards"], m["terminals"], m["timeouts"])
    return st, extra


def locomotion_levels(raw: dict, batches: dict) -> dict:
    """The actors' data per level: ``medium``, ``medium_replay`` and ``medium_expert`` (medium
    and expert together, :data:`LEVEL_PARTS`), each with rewards scaled by
    :func:`hexad.policy.return_range_scale` of its own trajectories (the IQL reference's MuJoCo
    normalisation)."""
    out = {}
    for name, lvs in LEVEL_PARTS.items():
        b = jax.tree.map(lambda *xs: jnp.concatenate(xs), *(batches[lv] for lv in lvs))
        fields = ("rewards", "terminals", "timeouts")
        scale = policy.return_range_scale(
            *(np.concatenate([raw[lv][f] for lv in lvs]) for f in fields)
        )
        out[name] = b._replace(rewards=b.rewards * scale)
    return out
