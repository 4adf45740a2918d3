"""Glue the policy studies share.

Two designs. The maze diagnostic (:func:`run_maze`, used by ``experiments.policy_antmaze``): a
table of method rows (PoE and additive sweeps, KL-budget alphas, guided steering, SF + GPI)
evaluated on one set of episodes. The decisive design (:func:`run_decisive_seed` and
:func:`decide`, used by ``experiments.policy_pointmaze`` and ``experiments.policy_locomotion``):
priors by kind, two likelihood spaces, a KL-budget sweep, every chosen quantity selected on
held-out episodes and reported on separate test episodes with paired bootstrap verdicts pooled
over seeds.

The method itself (PoE and its selectors, steering, SF + GPI, prior kinds, bootstrap and
verdict rules) is :mod:`hexad.policy`; this module only wires it to data, the runner and the
evaluators.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import _runner
from hexad import policy
from hexad.data import offline_rl
from hexad.policy import Method, Row

PRIORS = ("good", "degraded", "random")
ACTORS = ("", "incompetent_")  # the maze studies' summary prefixes: competent, incompetent
# The --quick network width, alpha sweep and KL-selection states of every composition study.
QUICK = {"hidden": 64, "alphas": (0.0, 0.25, 0.5, 0.75, 1.0), "n_kl_states": 512}


@dataclasses.dataclass(frozen=True)
class CompositionConfig:
    """The settings of the maze diagnostic; the defaults are its full study."""

    hidden: int = 256
    iql_steps: int = 10_000
    train_chunk: int = 100
    bc_steps: int = 10_000
    batch_size: int = 256
    lr: float = 3e-4
    expectile: float = 0.9
    temperature: float = 10.0
    alphas: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
    kl_budget: float = 1.0
    n_kl_states: int = 2048
    degrade_scale: float = 1.0
    n_episodes: int = 10
    episode_steps: int = 300
    n_envs: int = 48
    guide_cql_steps: int = 5000
    guide_action_samples: int = 4
    guide_steps: int = 10
    guide_step_size: float = 1.0
    guide_shifts: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    sf_steps: int = 5000
    sf_batch_size: int = 128
    sf_discount: float = 0.99
    sf_ridge: float = 1e-4

    def __post_init__(self):
        _runner.at_least(self, 1, "hidden", "iql_steps", "train_chunk", "bc_steps", "batch_size")
        _runner.at_least(self, 1, "n_kl_states", "n_episodes", "episode_steps", "n_envs")
        _runner.at_least(self, 1, "guide_cql_steps", "guide_action_samples", "sf_steps")
        _runner.at_least(self, 1, "sf_batch_size")
        _runner.positive(self, "kl_budget")
        _runner.at_least(self, 0, "degrade_scale", "temperature", "guide_steps")
        _runner.at_least(self, 0, "guide_shifts", "sf_ridge")
        _runner.positive(self, "lr", "guide_step_size")
        _runner.in_unit(self, "expectile", lo_open=True, hi_open=True)
        _runner.in_unit(self, "alphas")
        _runner.in_unit(self, "sf_discount", hi_open=True)
        _runner.require(
            0.0 in self.alphas and 1.0 in self.alphas,
            "alphas",
            f"alphas must contain 0.0 (the actor) and 1.0 (the prior alone), got {self.alphas}",
        )


# --------------------------------------------------------------------------------------------
# Training the frozen networks
# --------------------------------------------------------------------------------------------


def train(ctx, cfg, algo, data, n_steps, key, tag, batch_size=None, snapshot_at=0):
    """Trains ``algo`` for ``n_steps`` updates in jitted chunks of ``cfg.train_chunk`` (one
    ``metrics.jsonl`` line each, named ``tag``); returns ``(state, info, snapshot)``, the
    snapshot being the state after ``snapshot_at`` updates (None unless a chunk ends there)."""
    chunk = cfg.train_chunk
    step = jax.jit(policy.make_train(algo, min(chunk, n_steps), batch_size or cfg.batch_size))
    snapshot = {}

    def keep(c, state):
        if (c + 1) * chunk == snapshot_at:
            snapshot["state"] = state

    state, info = ctx.train_chunks(
        lambda st, k: step(k, st, data),
        algo.init(key, data),
        max(n_steps // chunk, 1),
        key,
        tag=tag,
        on_chunk=keep,
    )
    return state, info, snapshot.get("state")


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
    """The CQL-guided baseline's goal-conditioned critic (with an actor of the prior's shape)."""
    opt = optax.adam(cfg.lr)
    critic = policy.TwinCritic((cfg.hidden, cfg.hidden))
    return policy.cql(prior_net, critic, opt, opt, n_action_samples=cfg.guide_action_samples)


def priors(cfg, prior_net, good, keys, example_obs) -> tuple:
    """``(good, degraded, random)``: the trained prior, it with weight noise, an untrained one."""
    degraded = policy.degrade_params(keys[0], good, cfg.degrade_scale)
    return good, degraded, prior_net.init(keys[1], example_obs)


def train_sf(ctx, cfg, sf_net, library, sf_data, key, tag):
    """Successor features of every member of ``library``, by TD on ``sf_data``."""
    sf = policy.sf_td(sf_net, optax.adam(cfg.lr), library.actions, discount=cfg.sf_discount)
    return train(ctx, cfg, sf, sf_data, cfg.sf_steps, key, tag, cfg.sf_batch_size)


class Nets(NamedTuple):
    """The networks of a composition study: actor, prior, guide critic, successor features."""

    actor: nn.Module
    prior: nn.Module
    critic: nn.Module
    sf: nn.Module


def make_nets(cfg, act_dim: int, n_members: int, n_features: int) -> Nets:
    hid = (cfg.hidden, cfg.hidden)
    actor, prior = policy.GaussianActor(act_dim, hid), policy.GaussianActor(act_dim, hid)
    sf = policy.SuccessorFeatures(n_members, n_features, hid)
    return Nets(actor, prior, policy.TwinCritic(hid), sf)


def train_frozen(ctx, cfg, nets, data, gdata, sf_data, goals, keys, guides, tag, stages, snap=0):
    """Trains (or, with ``--resume``, restores from ``checkpoint_dir / tag``) the frozen set.

    The IQL actor on ``data`` (key ``keys[0]``; with ``snap``, also its snapshot after ``snap``
    updates as a second, incompetent actor), the BC prior on ``gdata`` (``keys[1]``), its
    degraded and random versions (``keys[2]``, ``keys[3]``), each guide critic
    ``guides[name] = (algorithm, data, n_steps, key, stage)``, and the successor features of the
    whole library commanded with ``goals`` (``keys[-1]``); ``stages`` names the metrics of the
    actor, prior and SF runs. Returns ``(frozen, library)``: ``frozen`` is
    ``{"actors", "priors", "guides", "sf", "diag"}``, ``diag`` the final IQL critic loss, prior
    NLL and SF TD loss, and ``library`` the :class:`hexad.policy.ExpertLibrary` of its actors
    and priors commanded with ``goals``.
    """
    obs, g_obs, act = data.observations[:1], gdata.observations[:1], data.actions[:1]
    init = {
        "actors": (nets.actor.init(keys[0], obs),) * (2 if snap else 1),
        "priors": (nets.prior.init(keys[1], g_obs),) * len(PRIORS),
        "guides": {k: nets.critic.init(g[3], g_obs, act) for k, g in guides.items()},
        "sf": nets.sf.init(keys[-1], obs, act),
        "diag": jnp.zeros(3),
    }
    with ctx.checkpointed(tag, init) as (start, frozen, save):
        if start > 0:
            return frozen, library(nets, frozen, goals)
        # The incompetent actor is the same IQL run, snapshotted after ``snap`` updates.
        algo, n = iql(cfg, nets.actor), cfg.iql_steps
        strong, iql_info, weak = train(ctx, cfg, algo, data, n, keys[0], stages[0], None, snap)
        bc = policy.bc(nets.prior, optax.adam(cfg.lr))
        prior, prior_info, _ = train(ctx, cfg, bc, gdata, cfg.bc_steps, keys[1], stages[1])
        critics = {k: train(ctx, cfg, *g)[0].critic_params for k, g in guides.items()}
        actors = (strong.actor_params, weak.actor_params) if snap else (strong.actor_params,)
        p_params = priors(cfg, nets.prior, prior.params, keys[2:4], g_obs)
        lib = policy.ExpertLibrary(nets.actor, nets.prior, actors, p_params, goals)
        sf_state, sf_info, _ = train_sf(ctx, cfg, nets.sf, lib, sf_data, keys[-1], stages[2])
        losses = [iql_info.critic_loss[-1], prior_info.loss[-1], sf_info.loss[-1]]
        frozen = {"actors": actors, "priors": p_params, "guides": critics, "sf": sf_state.params}
        frozen["diag"] = jnp.stack(losses)
        save(0, frozen)
    return frozen, library(nets, frozen, goals)


def library(nets, frozen, goals) -> policy.ExpertLibrary:
    """The expert library of :func:`train_frozen`'s actors and priors, commanded with ``goals``."""
    return policy.ExpertLibrary(nets.actor, nets.prior, frozen["actors"], frozen["priors"], goals)


def deploy(cfg, lib, nets, frozen, guides, obs_fn, prior_obs, task_weights) -> Callable:
    """Returns the jitted ``act(obs [B, o], goal, row, random_action) -> [B, d]`` of a table.

    Row ``b`` acts by :func:`hexad.policy.compose` with actor ``row.actor``, prior
    ``row.prior`` at ``prior_obs(obs_fn(obs), goal)``, the guide critics ``{Method: name in
    frozen["guides"]}`` on the prior's input, and GPI with ``task_weights(goal)``.
    """
    q_fn = {m: min_q(nets.critic, frozen["guides"][k]) for m, k in guides.items()}

    def psi_fn(s, a):
        return nets.sf.apply(frozen["sf"], s, a)

    @jax.jit
    def act(obs, goal, row, random_action=None):
        o = obs_fn(obs)
        og = prior_obs(o, goal)
        return policy.compose(
            row.method,
            lib.actor_dist(o, row.actor),
            lib.prior_dist(og, row.prior),
            row.alpha,
            kl_budget=cfg.kl_budget,
            q_fn=q_fn,
            q_obs=og,
            step_size=cfg.guide_step_size,
            n_steps=cfg.guide_steps,
            gpi_action=lib.gpi(psi_fn, o, task_weights(goal), row.actor, row.prior),
            random_action=random_action,
        )

    return act


def min_q(critic_net, params) -> Callable:
    """``q_fn(obs, act) -> [B]``: the smaller of a twin critic's two heads."""
    return lambda s, a: jnp.minimum(*critic_net.apply(params, s, a))


def diagnostics(frozen, pre="") -> dict:
    """The final training losses of :func:`train_frozen`'s networks."""
    names = ("iql_final_critic_loss", "prior_final_nll", "sf_final_loss")
    return {pre + k: float(v) for k, v in zip(names, frozen["diag"], strict=True)}


# --------------------------------------------------------------------------------------------
# The table of method rows, its summary and its plot
# --------------------------------------------------------------------------------------------


def guided_rows(actor: int, method: Method, shifts: Sequence[float]) -> list[Row]:
    """One guided method over its trust-region sweep."""
    return [Row(actor, 0, method, sh) for sh in shifts]


def pair_rows(actor: int, prior: int, alphas: Sequence[float], kl_alpha: float) -> list[Row]:
    """One (actor, prior) pair: SF + GPI, the PoE and additive sweeps, both at the KL-budget
    alpha, and PoE at the per-state KL-budget alpha."""
    rows = [Row(actor, prior, Method.SFGPI, 0.0)]
    rows += [Row(actor, prior, Method.POE, a) for a in alphas]
    rows += [Row(actor, prior, Method.ADDITIVE, a) for a in alphas]
    rows += [Row(actor, prior, m, kl_alpha) for m in (Method.POE, Method.ADDITIVE)]
    return rows + [Row(actor, prior, Method.KL_STATE, 0.0)]


def method_rows(n_actors, guided, shifts, alphas, kl_alpha) -> list[Row]:
    """Per actor: each guided method over ``shifts``, then each prior's :func:`pair_rows`
    (``kl_alpha[actor, prior]``)."""
    rows = []
    for ai in range(n_actors):
        for m in guided:
            rows += guided_rows(ai, m, shifts)
        for pi in range(len(PRIORS)):
            rows += pair_rows(ai, pi, alphas, kl_alpha[ai, pi])
    return rows


class Table:
    """A list of rows, each evaluated on ``n_episodes`` episodes, method-major.

    ``specs`` (``[R n_episodes, 1]``, each episode's row index) is what the evaluators pass back
    to the policy, which turns a slice of it into a :class:`hexad.policy.Row` of arrays with
    :meth:`batch`; :meth:`mean` averages a result over one row's episodes.
    """

    def __init__(self, rows: Sequence[Row], n_episodes: int):
        self.rows = list(rows)
        self.stacked = policy.stack_rows(self.rows)
        self.specs = np.repeat(np.arange(len(self.rows)), n_episodes)[:, None]
        self.episode = np.tile(np.arange(n_episodes), len(self.rows))

    def batch(self, specs) -> Row:
        return jax.tree.map(lambda x: x[np.asarray(specs)[:, 0]], self.stacked)

    def mean(self, values, row: Row) -> float:
        hits = [i for i, r in enumerate(self.rows) if r == row]
        if not hits:
            raise KeyError(f"row {row} is not in the table")
        return float(np.mean(np.asarray(values)[np.isin(self.specs[:, 0], hits)]))

    def stat(self, results, names=None, score=None) -> Callable:
        """``stat(metric, row) -> float``: the mean of ``results[metric]`` over a row's episodes.

        ``names`` maps a metric to its key in ``results`` (e.g. ``{"return":
        "shifted_return"}``); with ``score = (zero_row, ideal)`` the metric ``"score"`` is the
        normalised return ``100 (R - R_zero) / (ideal - R_zero)``, ``R_zero`` the return of
        ``zero_row``.
        """
        names = names or {}

        def stat(metric, row):
            if metric == "score" and score is not None:
                r_zero = stat("return", score[0])
                return 100.0 * (stat("return", row) - r_zero) / (score[1] - r_zero)
            return self.mean(results[names.get(metric, metric)], row)

        return stat

    def best(self, key: Callable) -> Row:
        """The row with the largest ``key(row)`` among the learned methods (neither
        :attr:`Method.RANDOM` nor :attr:`Method.ZERO`); the first one on a tie."""
        learned = [r for r in self.rows if r.method not in (Method.RANDOM, Method.ZERO)]
        return max(learned, key=key)

    def policy(self, act, act_dim: int | None = None, rng=None) -> Callable:
        """The evaluators' host policy ``(obs, [goal,] specs) -> actions`` over this table.

        Each call turns ``specs`` into a row of arrays (:meth:`batch`) and calls the jitted
        ``act(obs, goal, row, random_action)`` of :func:`deploy` on float32 inputs (``goal``
        None when the evaluator passes none). With ``rng``, a batch that holds a
        :attr:`Method.RANDOM` row gets uniform ``[-1, 1]`` draws ``[B, act_dim]`` from it (any
        other batch zeros, so the generator advances only for such batches); without,
        ``random_action`` is None.
        """
        f32 = jnp.float32

        def run(obs, *goal_and_specs):
            *goal, specs = goal_and_specs
            row = self.batch(specs)
            g = jnp.asarray(goal[0], f32) if goal else None
            u = None
            if rng is not None:
                shape = (len(obs), act_dim)
                rand = np.any(row.method == Method.RANDOM)
                u = jnp.asarray(rng.uniform(-1, 1, shape) if rand else np.zeros(shape), f32)
            return act(jnp.asarray(obs, f32), g, row, u)

        return run


def evaluate_table(ctx, cfg, table, evaluate, act, task, **kwargs) -> dict:
    """Runs every episode of ``table`` through ``evaluate`` and returns its results.

    ``evaluate(act, task, specs, seeds, n_envs, episode_steps, progress=..., **kwargs)`` is an
    evaluator of :mod:`hexad.data.offline_rl` (``task`` its environment id or per-episode
    goals); episode ``i`` of a row is reset with seed ``1000 seed + i``, so every row sees the
    same starts, and ``cfg.n_envs`` environments at most run together.
    """
    ep = table.episode
    n_envs, steps = min(cfg.n_envs, len(ep)), cfg.episode_steps
    seeds = 1000 * ctx.seed + ep
    return evaluate(act, task, table.specs, seeds, n_envs, steps, progress=ctx.progress, **kwargs)


def named_summary(stat, named, metrics, pre="", suffix="") -> dict:
    """``{pre}{name}_{metric}{suffix}``: ``stat(metric, row)`` for each ``name: row`` of
    ``named`` and each of ``metrics``."""
    return {f"{pre}{k}_{m}{suffix}": stat(m, row) for k, row in named.items() for m in metrics}


def guided_summary(stat, actor, method, name, shifts, metrics, rank, pre="") -> dict:
    """``{name}_{rank}_curve`` over the shifts, the best shift by ``rank`` and its ``metrics``."""
    curve = [stat(rank, Row(actor, 0, method, sh)) for sh in shifts]
    best = shifts[int(np.argmax(curve))]
    out = {f"{pre}{name}_{rank}_curve": curve, f"{pre}{name}_shift": best}
    return out | {f"{pre}{name}_{m}": stat(m, Row(actor, 0, method, best)) for m in metrics}


def pair_summary(
    stat, actor, prior, alphas, kl_alpha, metrics, rank, curves, pre="", extra=None
) -> dict:
    """The summary keys of one (actor, prior) pair, for Q = ``PRIORS[prior]``.

    ``stat(metric, row) -> float``; the oracle alphas are the sweeps' best by ``rank``;
    ``curves`` lists the ``(poe | additive, metric)`` sweeps reported as lists; ``extra``
    ``{metric: names}`` reports a further metric for some of the named rows only.
    """
    q, mix = PRIORS[prior], {"poe": Method.POE, "additive": Method.ADDITIVE}

    def sweep(kind, metric):
        return [stat(metric, Row(actor, prior, mix[kind], a)) for a in alphas]

    best = alphas[int(np.argmax(sweep("poe", rank)))]
    best_add = alphas[int(np.argmax(sweep("additive", rank)))]
    named = {
        "poe_kl_budget": (Method.POE, kl_alpha),
        "poe_kl_state": (Method.KL_STATE, 0.0),
        "oracle": (Method.POE, best),
        "additive": (Method.ADDITIVE, kl_alpha),
        "additive_oracle": (Method.ADDITIVE, best_add),
        "prior_only": (Method.POE, 1.0),
        "sfgpi": (Method.SFGPI, 0.0),
    }
    named = {key: Row(actor, prior, *row) for key, row in named.items()}
    out = named_summary(stat, named, metrics, pre, f"_{q}")
    for m, keys in (extra or {}).items():
        out |= named_summary(stat, {k: named[k] for k in keys if k in named}, (m,), pre, f"_{q}")
    out[f"{pre}poe_kl_budget_alpha_{q}"] = kl_alpha
    out[f"{pre}oracle_alpha_{q}"] = best
    out[f"{pre}additive_oracle_alpha_{q}"] = best_add
    return out | {f"{pre}{k}_{m}_curve_{q}": sweep(k, m) for k, m in curves}


def actor_summary(
    stat, actor, cfg, kl_alpha, guided, metrics, rank, curves, pre="", extra=None
) -> dict:
    """The summary keys of one actor's rows: the actor alone, each guided method
    (``guided[method]`` names its keys) and each prior's :func:`pair_summary`; ``extra``
    ``{metric: names}`` reports a further metric only for the named rows (``"actor"`` the
    actor alone, or :func:`pair_summary`'s names)."""
    row = Row(actor, 0, Method.POE, 0.0)
    out = {f"{pre}actor_{m}": stat(m, row) for m in metrics}
    for m, name in guided.items():
        out |= guided_summary(stat, actor, m, name, cfg.guide_shifts, metrics, rank, pre)
    for pi in range(len(PRIORS)):
        ka = kl_alpha[actor, pi]
        out |= pair_summary(stat, actor, pi, cfg.alphas, ka, metrics, rank, curves, pre, extra)
    extra = extra or {}
    return out | {f"{pre}actor_{m}": stat(m, row) for m, keys in extra.items() if "actor" in keys}


def plot_alpha_curves(ctx, name, alphas, out, panels, metric, ylabel, actors=(("", "-", ""),)):
    """One row of panels per ``(key prefix, title prefix)`` in ``panels``, one panel per prior:
    the PoE and additive ``metric`` curves of each ``(prefix, line style, label)`` actor, the
    KL-budget alpha and the oracle alpha."""
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(n, 3, figsize=(12.6, 3.3 * n), squeeze=False, sharey="row")
    for row, (pre, title) in zip(axes, panels, strict=True):
        for ax, q in zip(row, PRIORS, strict=True):
            for who, style, label in actors:
                for kind, mark, c, text in (
                    ("poe", "o", "C0", "PoE"),
                    ("additive", "s", "C1", "additive"),
                ):
                    curve = out[f"{pre}{who}{kind}_{metric}_curve_{q}"]
                    ax.plot(alphas, curve, mark + style, c=c, label=text + label)
            ax.axvline(
                out[f"{pre}poe_kl_budget_alpha_{q}"], c="C2", ls="--", label="KL-budget alpha"
            )
            oracle = (out[f"{pre}oracle_alpha_{q}"], out[f"{pre}oracle_{metric}_{q}"])
            ax.plot(*oracle, "*", c="C3", ms=14, label="oracle alpha")
            ax.set_title(f"{title}{q} prior")
            ax.set_xlabel("alpha")
        row[0].set_ylabel(ylabel)
    axes[0, -1].legend(fontsize=7)
    ctx.save_plot(fig, name)


# --------------------------------------------------------------------------------------------
# The maze diagnostic (PointMaze, AntMaze)
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MazeConfig(CompositionConfig):
    """The maze diagnostic's settings, which AntMaze's config extends."""

    n_transitions: int = 100_000
    noise_std: float = 0.3
    incompetent_steps: int = 100
    goal_shift: float = 1.0
    guide_iql_steps: int = 10_000

    def __post_init__(self):
        super().__post_init__()
        _runner.at_least(self, 1, "n_transitions", "incompetent_steps", "guide_iql_steps")
        _runner.at_least(self, 0, "noise_std", "goal_shift")
        _runner.require(
            self.incompetent_steps % self.train_chunk == 0
            and self.incompetent_steps <= self.iql_steps,
            ("incompetent_steps", "train_chunk", "iql_steps"),
            f"incompetent_steps must be a multiple of train_chunk={self.train_chunk} in "
            f"(0, iql_steps={self.iql_steps}], got {self.incompetent_steps}",
        )


# The maze diagnostic's --quick, which AntMaze's extends.
MAZE_QUICK = {
    **QUICK,
    "n_transitions": 20_000,
    "iql_steps": 2000,
    "guide_iql_steps": 2000,
    "guide_cql_steps": 2000,
    "sf_steps": 2000,
    "bc_steps": 2000,
    "n_episodes": 3,
    "n_envs": 32,
}


@dataclasses.dataclass(frozen=True)
class Maze:
    """What the diagnostic needs from a maze: its data, geometry, evaluator and scripted oracle.

    ``evaluate`` has :func:`hexad.data.offline_rl.evaluate_pointmaze`'s signature;
    ``oracle(obs, goal) -> actions`` is the data's noiseless scripted oracle (the reference
    row); goals are drawn at least ``goal_margin`` from every wall.
    """

    raw: dict
    geom: offline_rl.MazeGeometry
    evaluate: Callable
    oracle: Callable
    goal_margin: float


def anchor_goals(geom: offline_rl.MazeGeometry) -> np.ndarray:
    """``[J, 2]`` the centres of the maze's free cells: the SF library's fixed goals."""
    return np.stack([geom.cell_center(rc) for rc in geom.free]).astype(np.float32)


def maze_features(next_obs, anchors):
    """``[N, J + 1]`` phi(s'): ``exp(-|xy(s') - c_j|)`` per anchor ``c_j``, and a constant 1."""
    d = jnp.linalg.norm(next_obs[:, None, :2] - anchors[None], axis=-1)
    return jnp.concatenate([jnp.exp(-d), jnp.ones((next_obs.shape[0], 1), d.dtype)], -1)


def run_maze(cfg: MazeConfig, ctx: _runner.Context, maze: Maze) -> dict:
    """The whole diagnostic (``experiments.policy_antmaze``'s docstring) on ``maze``."""
    raw = maze.raw
    data = policy.batch_from_dataset(raw)
    goals_data = jnp.asarray(raw["infos/goal"], jnp.float32)
    keys = jax.random.split(ctx.key(), 8)
    anchors = jnp.asarray(anchor_goals(maze.geom))
    n_anchor = anchors.shape[0]
    n_lib = len(PRIORS) * n_anchor + len(ACTORS)
    nets = make_nets(cfg, data.actions.shape[1], n_lib, n_anchor + 1)
    gdata = policy.goal_conditioned(data, goals_data)
    # The guides: goal-conditioned critics, reward 1 (and terminal) on reaching the goal.
    reached = jnp.linalg.norm(data.next_observations[:, :2] - goals_data, axis=-1) <= 0.5
    reached = reached.astype(jnp.float32)
    gc_data = gdata._replace(rewards=reached, terminals=reached)
    phi = maze_features(data.next_observations, anchors)
    sf_data = policy.SFBatch.from_batch(data, phi)
    guides = {
        "iql": (iql(cfg, nets.actor), gc_data, cfg.guide_iql_steps, keys[4], "gc_iql"),
        "cql": (cql(cfg, nets.prior), gc_data, cfg.guide_cql_steps, keys[5], "gc_cql"),
    }
    stages, snap = ("iql", "gcbc", "sf"), cfg.incompetent_steps
    frozen, lib = train_frozen(
        ctx, cfg, nets, data, gdata, sf_data, anchors, keys[:7], guides, "frozen", stages, snap
    )
    actor_net, prior_net = nets.actor, nets.prior

    rng = np.random.default_rng(ctx.seed)
    ep_goals = offline_rl.sample_free_goals(
        rng, raw["task_goal"], cfg.goal_shift, cfg.n_episodes, maze.goal_margin, maze.geom
    )
    # Global KL-budget alpha per (actor, prior): data states paired with deployment goals.
    idx = rng.choice(data.observations.shape[0], cfg.n_kl_states, replace=False)
    s = data.observations[idx]
    g = jnp.asarray(ep_goals[rng.integers(0, cfg.n_episodes, cfg.n_kl_states)], jnp.float32)
    select = jax.jit(
        lambda ap, pp: policy.kl_budget_alpha(
            actor_net.apply(ap, s), prior_net.apply(pp, jnp.concatenate([s, g], -1)), cfg.kl_budget
        )
    )
    kl_alpha = {
        (ai, pi): float(select(ap, pp))
        for ai, ap in enumerate(lib.actor_params)
        for pi, pp in enumerate(lib.prior_params)
    }
    # SF task weights of a goal g: least squares of exp(-|xy(s') - g|) on phi(s') over
    # n_kl_states data transitions, w(g) = M r_g with M = (Phi^T Phi + ridge n I)^-1 Phi^T.
    phi_ls = maze_features(data.next_observations[idx], anchors)  # [n, F]
    n_ls, n_f = phi_ls.shape
    ls_map = jnp.linalg.solve(phi_ls.T @ phi_ls + cfg.sf_ridge * n_ls * jnp.eye(n_f), phi_ls.T)
    xy_ls = data.next_observations[idx, :2]

    def goal_rewards(goal):  # [B, 2] -> [B, n]
        return jnp.exp(-jnp.linalg.norm(xy_ls[None] - goal[:, None], axis=-1))

    r_eval = goal_rewards(jnp.asarray(ep_goals, jnp.float32))  # [n_episodes, n]
    fit = r_eval @ ls_map.T @ phi_ls.T
    r_dev = r_eval - r_eval.mean(1, keepdims=True)
    ls_r2 = 1.0 - jnp.sum(jnp.square(r_eval - fit), 1) / jnp.sum(jnp.square(r_dev), 1)
    act = deploy(
        cfg,
        lib,
        nets,
        frozen,
        {Method.IQL_GUIDED: "iql", Method.CQL_GUIDED: "cql"},
        lambda o: o,
        lambda o, goal: jnp.concatenate([o, goal], -1),
        lambda goal: goal_rewards(goal) @ ls_map.T,
    )
    guided = {Method.IQL_GUIDED: "iql_guided", Method.CQL_GUIDED: "cql_guided"}
    rows = method_rows(len(ACTORS), guided, cfg.guide_shifts, cfg.alphas, kl_alpha)
    table = Table(rows, cfg.n_episodes)
    res = evaluate_table(ctx, cfg, table, maze.evaluate, table.policy(act), ep_goals[table.episode])
    ref = maze.evaluate(
        lambda o, gl, sp: maze.oracle(o, gl),
        ep_goals,
        np.zeros((cfg.n_episodes, 1)),
        1000 * ctx.seed + np.arange(cfg.n_episodes),
        min(cfg.n_envs, cfg.n_episodes),
        cfg.episode_steps,
    )

    stat = table.stat(res)
    out = {
        "alphas": list(cfg.alphas),
        "kl_budget": cfg.kl_budget,
        "scripted_oracle_success": float(ref["success"].mean()),
        "scripted_oracle_return": float(ref["return"].mean()),
        "dataset_reward_frac": float(raw["rewards"].mean()),
        **diagnostics(frozen),
        "sf_reward_fit_r2": float(jnp.mean(ls_r2)),
        "sf_library_size": n_anchor + 1,
        "return_se": _runner.mean_se(res["return"], len(rows)),
        "success_se": _runner.mean_se(res["success"], len(rows)),
    }
    metrics, curves = ("success", "return"), (("poe", "return"), ("poe", "success"))
    curves += (("additive", "return"),)
    for ai, pre in enumerate(ACTORS):
        out |= actor_summary(stat, ai, cfg, kl_alpha, guided, metrics, "return", curves, pre)
    plot_alpha_curves(
        ctx,
        "return_vs_alpha",
        cfg.alphas,
        out,
        [("", "")],
        "return",
        "return (sum exp(-distance))",
        actors=(("", "-", ", competent"), ("incompetent_", ":", ", incompetent")),
    )
    return out


# --------------------------------------------------------------------------------------------
# The decisive design (PointMaze, locomotion): priors by kind, two likelihood spaces, a
# KL-budget sweep, selection and test episodes, paired bootstrap verdicts pooled over seeds
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecisiveConfig:
    """The settings of :func:`run_decisive_seed`; the defaults are PointMaze's full study."""

    hidden: int = 128
    iql_steps: int = 5000
    bc_steps: int = 5000
    train_chunk: int = 500
    batch_size: int = 256
    lr: float = 3e-4
    expectile: float = 0.9
    temperature: float = 10.0
    alphas: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
    kl_budgets: tuple[float, ...] = (0.03, 0.1, 0.3, 1.0, 3.0)  # nats per action dimension
    kl_budget_verdict: float = 0.3
    contrast_alpha: float = 0.5  # the common weight of the PoE-vs-additive contrast
    priors: tuple[str, ...] = policy.PRIOR_KINDS
    spaces: tuple[str, ...] = policy.SPACES
    n_seeds: int = 3
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
    n_boot: int = 2000

    def __post_init__(self):
        _runner.at_least(self, 1, "hidden", "iql_steps", "bc_steps", "train_chunk", "batch_size")
        _runner.at_least(self, 1, "n_seeds", "n_select", "n_test", "n_kl_states", "n_envs")
        _runner.at_least(self, 1, "episode_steps", "guide_iql_steps", "guide_cql_steps")
        _runner.at_least(self, 1, "guide_action_samples", "n_boot")
        _runner.at_least(self, 0, "degrade_scale", "temperature", "guide_steps")
        _runner.positive(self, "lr", "guide_step_size", "kl_budgets", "guide_shifts")
        _runner.in_unit(self, "expectile", lo_open=True, hi_open=True)
        _runner.in_unit(self, "alphas")
        _runner.one_of(self, policy.PRIOR_KINDS, "priors")
        _runner.one_of(self, policy.SPACES, "spaces")
        _runner.one_of(self, ("iql", "cql"), "guides")
        _runner.require(0.0 in self.alphas and 1.0 in self.alphas, "alphas", "needs 0 and 1")
        _runner.require(
            self.kl_budget_verdict in self.kl_budgets,
            "kl_budget_verdict",
            f"expected one of kl_budgets={self.kl_budgets}, got {self.kl_budget_verdict}",
        )
        _runner.require(self.n_select <= 500, "n_select", "at most 500 (seeds 1000 s + 500 + i)")
        _runner.require(
            self.contrast_alpha in self.alphas and 0.0 < self.contrast_alpha < 1.0,
            "contrast_alpha",
            f"expected one of alphas={self.alphas} strictly between 0 and 1, "
            f"got {self.contrast_alpha}",
        )


# The --quick sizes of a decisive study.
DECISIVE_QUICK = {
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
    """What :func:`run_decisive` needs from one study seed.

    ``actor_data``: ``{level: Batch}`` each actor's offline data; ``gdata`` / ``gdata_bad``:
    the prior's goal-conditioned BC data with true / shuffled goals; ``guide_data``: the guide
    critics' goal-conditioned data (goal reward); ``kl_obs [n, o]`` / ``kl_obs_goal [n, o + g]``:
    the KL-selection states, paired with selection goals (with ``task_per_level``, a tuple of
    one such array per actor level); ``obs_fn(obs) -> o`` the networks' view of the
    environment's observation, ``prior_obs(o, goal, level) -> [B, o + g]`` (``level [B]`` the
    rows' actor levels); ``evaluate(policy, specs, episodes, split, levels) -> [M]`` the
    per-episode metric of episodes ``episodes`` of ``split`` ("select", "test", "own": the
    actor's own task on the test starts), ``policy(obs, [goal,] specs)``, ``levels [M]`` each
    episode's actor level. ``task_per_level``: each actor level has its own shifted task (its
    own prior command and metric), so the prior alone and the zero action are evaluated per
    level rather than once.
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
        """The KL-selection states with the prior's inputs for actor level ``level``."""
        return self.kl_obs_goal[level] if self.task_per_level else self.kl_obs_goal


def _nets(cfg, space, d):
    hid = (cfg.hidden, cfg.hidden)
    return policy.actor_for_space(space, d, hid), policy.actor_for_space(space, d, hid)


def _marginal_std(actions, space):
    a = np.asarray(actions)
    if space == "pretanh":
        a = np.arctanh(np.clip(a, -1 + 1e-6, 1 - 1e-6))
    return np.maximum(a.std(0), 1e-3).astype(np.float32)


def train_decisive(ctx, cfg, setup, key, tag) -> dict:
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
            st = fit(algo, setup.guide_data, n, keys[2], f"{tag}_guide_{g}")
            params["guides"][g] = st.critic_params
        save(0, params)
    return params


def _pick(dists, index):
    i = jnp.asarray(index)
    return jax.tree.map(
        lambda *xs: jnp.take_along_axis(jnp.stack(xs), i[None, :, None], 0)[0], *dists
    )


_GUIDE_METHOD = {"iql": Method.IQL_GUIDED, "cql": Method.CQL_GUIDED}


def run_decisive_seed(ctx, cfg, setup, key, tag) -> dict:
    """One study seed: train, select on the selection episodes, evaluate on the test ones.

    Rows are ``(space, level, prior, method, alpha)`` tuples (indices into ``cfg.spaces``,
    ``setup.actor_data`` and ``cfg.priors``). Returns ``{"test": {row: [n_test]}, "own":
    {(space, level): [n_test]}, "chosen": {...}, "stats": {...}}``.
    """
    params = train_decisive(ctx, cfg, setup, key, tag)
    d = setup.gdata.actions.shape[1]
    levels, nq = list(setup.actor_data), len(cfg.priors)
    keys = jax.random.split(jax.random.fold_in(key, 7), nq)
    actor_fns, prior_fns = [], []
    for space in cfg.spaces:
        an, pn = _nets(cfg, space, d)
        p = params[space]
        actor_fns += [partial_apply(an, p["actors"][lv]) for lv in levels]
        std = _marginal_std(setup.gdata.actions, space)
        prior_fns += [
            policy.make_prior(
                q,
                pn,
                p["good"],
                keys[i],
                setup.kl_goal(0)[:1],
                corrupted_params=p["bad"],
                marginal_std=std,
                degrade_scale=cfg.degrade_scale,
            )
            for i, q in enumerate(cfg.priors)
        ]
    critic = policy.TwinCritic((cfg.hidden, cfg.hidden))
    q_fns = {g: min_q(critic, params["guides"][g]) for g in cfg.guides}
    n_lv = len(levels)
    squashed = jnp.asarray([sp == "pretanh" for sp in cfg.spaces])

    @jax.jit
    def act(obs, goal, rows):
        o = setup.obs_fn(obs)
        sp, lv, pr, method, alpha = rows
        og = setup.prior_obs(o, goal, lv)
        a = _pick([f(o) for f in actor_fns], sp * n_lv + lv)
        p = _pick([f(og) for f in prior_fns], sp * nq + pr)
        mix = jnp.where(method <= Method.ADDITIVE, alpha, 0.0)
        add = (method == Method.ADDITIVE)[:, None]
        mean = jnp.where(add, policy.additive(a, p, mix).mean, policy.poe(a, p, mix).mean)
        out = policy.deterministic_action(mean, squashed[sp])
        shift = jnp.where(method >= Method.IQL_GUIDED, alpha, 1.0)
        for g, fn in q_fns.items():
            steered = policy.q_steer(fn, og, a.mean, cfg.guide_step_size, cfg.guide_steps, shift)
            out = jnp.where((method == _GUIDE_METHOD[g])[:, None], steered, out)
        return jnp.where((method == Method.ZERO)[:, None], 0.0, out)

    per_level = setup.task_per_level

    def evaluate(rows, split, n):
        rows = list(dict.fromkeys(canon(r, per_level) for r in rows))
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

        res = np.asarray(setup.evaluate(host, specs, episodes, split, stacked[1][specs[:, 0]]))
        return {r: res[specs[:, 0] == i] for i, r in enumerate(rows)}

    def mean_of(res):
        return lambda r: float(res[canon(r, per_level)].mean())

    # KL selection, spreads and precision ratios on the selection states.
    stats, chosen = {}, {}
    kl_fn = kl_stats(cfg, d)
    for si in range(len(cfg.spaces)):
        for li in range(n_lv):
            a = actor_fns[si * n_lv + li](setup.kl_obs)
            stats[si, li, "actor_std"] = policy.std_quantiles(a)
            for qi in range(nq):
                p = prior_fns[si * nq + qi](setup.kl_goal(li))
                k = (si, li, qi)
                stats[k, "prior_std"] = policy.std_quantiles(p)
                stats[k, "precision"] = float(np.median(policy.precision_ratio(a, p)))
                full, mean, kl, kl_mean = (np.asarray(x).tolist() for x in kl_fn(a, p))
                stats[k, "kl"], stats[k, "kl_mean"] = kl, kl_mean
                chosen[k, "budget", False], chosen[k, "budget", True] = full, mean
    # Selection episodes: the alpha sweeps and the guides' trust regions.
    grid = [(si, li) for si in range(len(cfg.spaces)) for li in range(n_lv)]
    zero_rows = [(0, li if per_level else 0, 0, Method.ZERO, 0.0) for li in range(n_lv)]
    sel = [(si, li, 0, Method.POE, 0.0) for si, li in grid] + zero_rows
    for si, li in grid:
        for qi in range(nq):
            sel += [
                (si, li, qi, m, al) for m in (Method.POE, Method.ADDITIVE) for al in cfg.alphas[1:]
            ]
    pre = cfg.spaces.index("pretanh") if "pretanh" in cfg.spaces else None
    for g in cfg.guides if pre is not None else ():
        sel += [(pre, li, 0, _GUIDE_METHOD[g], sh) for li in range(n_lv) for sh in cfg.guide_shifts]
    s_res = mean_of(evaluate(sel, "select", cfg.n_select))
    chosen["zero_select"] = [s_res(z) for z in zero_rows]  # per actor level
    for si, li in grid:
        chosen[si, li, "actor_select"] = s_res((si, li, 0, Method.POE, 0.0))

    def curve(si, li, qi, m):
        return [s_res((si, li, qi, m, al)) for al in cfg.alphas]

    test = [(si, li, 0, Method.POE, 0.0) for si, li in grid]
    for si, li in grid:
        for qi in range(nq):
            k = (si, li, qi)
            for m, name in ((Method.POE, "oracle"), (Method.ADDITIVE, "additive")):
                c = curve(si, li, qi, m)
                chosen[k, name] = cfg.alphas[int(np.argmax(c))]
                chosen[k, name + "_curve"] = c
                test.append((si, li, qi, m, chosen[k, name]))
            test.append((si, li, qi, Method.POE, 1.0))
            test += [(si, li, qi, m, cfg.contrast_alpha) for m in (Method.POE, Method.ADDITIVE)]
            test += [
                (si, li, qi, Method.POE, al)
                for mo in (False, True)
                for al in chosen[k, "budget", mo]
            ]
    for g in cfg.guides if pre is not None else ():
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
    }


def kl_stats(cfg, d: int) -> Callable:
    """The jitted ``(actor, prior) -> (alpha_full [n_b], alpha_mean_only [n_b], kl [n_a],
    kl_mean_only [n_a])``: the KL-budget alphas for the budgets ``cfg.kl_budgets`` x d nats and
    the mean KL of PoE at each alpha of ``cfg.alphas`` over the states."""
    budgets = jnp.asarray([b * d for b in cfg.kl_budgets], jnp.float32)
    alphas = jnp.asarray(cfg.alphas, jnp.float32)

    @jax.jit
    def stats(a, p):
        def sel(mo):
            return jax.vmap(lambda b: policy.kl_budget_alpha(a, p, b, mean_only=mo))(budgets)

        def curve(fn):
            return jax.vmap(lambda al: fn(a, p, al).mean())(alphas)

        kls = curve(policy.poe_kl_to_actor), curve(policy.poe_mean_kl_to_actor)
        return (sel(False), sel(True), *kls)

    return stats


def canon(row, per_level: bool = False) -> tuple:
    """A row in its canonical form, so equal policies share one evaluation: alpha 0 (either
    mix) is the actor (prior 0), additive at alpha 1 is PoE at alpha 1 (the prior alone), which
    does not depend on the actor (level 0) unless each level has its own task
    (``per_level``: the prior is commanded and scored for that level's task).

    >>> canon((1, 2, 3, Method.ADDITIVE, 1.0)), canon((1, 2, 3, Method.ADDITIVE, 1.0), True)
    ((1, 0, 3, 0, 1.0), (1, 2, 3, 0, 1.0))
    """
    si, li, qi, m, al = row
    m, al = int(m), float(al)
    if m in (Method.POE, Method.ADDITIVE) and al == 0.0:
        return (si, li, 0, int(Method.POE), 0.0)
    if m in (Method.POE, Method.ADDITIVE) and al == 1.0:
        return (si, li if per_level else 0, qi, int(Method.POE), 1.0)
    return (si, li, qi, m, al)


def partial_apply(net, params) -> Callable:
    """``f(x) = net.apply(params, x)``."""
    return lambda x: net.apply(params, x)


def _se(x) -> float:
    return float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0


NOT_TESTED = "not tested: the prior alone is not below the actor"


def _exclusion(worth: bool, excluded: str | None) -> str | None:
    """The verdict that replaces every rule's, or None: ``excluded`` first, then the
    zero-action precondition."""
    if excluded:
        return f"excluded: {excluded}"
    return None if worth else "excluded: the actor does not beat the zero action"


def verdicts(g_ci, p_ci, c_ci, margin, s_ci, s_margin, worth=True, excluded=None) -> tuple:
    """The pre-stated rules of the decisive studies for one (space, level, prior): returns the
    verdicts ``(graceful, additive_below_poe, selector)``.

    Intervals are ``(mean, lo, hi)``: ``g_ci`` of PoE-KL - actor, ``p_ci`` of the prior alone -
    actor, ``c_ci`` of additive - PoE at the contrast alpha, ``s_ci`` of PoE-KL - oracle.
    Graceful degradation and the contrast are tested only for a prior whose ``p_ci`` lies below
    ``-margin``; every verdict is excluded when the actor does not beat the zero action on the
    selection episodes (``worth`` false) or for the reason ``excluded``.

    >>> verdicts((0, -1, 1), (-9, -10, -8), (-3, -4, -2), 2.0, (0, -1, 1), 2.0)
    ('holds', 'holds', 'holds')
    >>> verdicts((0, -1, 1), (0, -1, 1), (-3, -4, -2), 2.0, (0, -1, 1), 2.0)[0]
    'not tested: the prior alone is not below the actor'
    >>> verdicts((0, -1, 1), (-9, -10, -8), (-3, -4, -2), 2.0, (0, -1, 1), 2.0, worth=False)[2]
    'excluded: the actor does not beat the zero action'
    """
    if reason := _exclusion(worth, excluded):
        return (reason,) * 3
    v_s = policy.verdict(s_ci, s_margin)
    if not p_ci[2] < -margin:
        return NOT_TESTED, NOT_TESTED, v_s
    v_c = "holds" if c_ci[2] < 0 else "fails" if c_ci[1] > 0 else "undecided"
    return policy.verdict(g_ci, margin), v_c, v_s


def cell(ci_: Sequence[float], margin: float, worth: bool = True, excluded=None) -> str:
    """The Help / Frozen / Hurt class of one (actor, prior) cell from the interval ``ci_`` of
    (composition - actor): ``"help"`` if it lies above ``margin``, ``"hurt"`` if below
    ``-margin``, ``"frozen"`` otherwise; excluded as :func:`verdicts`.

    >>> cell((5, 3, 7), 2.0), cell((-5, -7, -3), 2.0), cell((1, -1, 3), 2.0)
    ('help', 'hurt', 'frozen')
    """
    if reason := _exclusion(worth, excluded):
        return reason
    return "help" if ci_[1] > margin else "hurt" if ci_[2] < -margin else "frozen"


def decide(cfg, runs: Sequence[dict], levels: Sequence[str], excluded: str | None = None) -> dict:
    """The summary of :func:`run_decisive_seed` over seeds: test means, paired bootstrap
    intervals pooled over seeds (stratified by seed), and the verdicts of the rules stated in
    the studies' docstrings (``excluded``: a reason that replaces every verdict)."""
    budgets = [b * runs[0]["d"] for b in cfg.kl_budgets]
    vb = cfg.kl_budgets.index(cfg.kl_budget_verdict)
    out = {
        "alphas": list(cfg.alphas),
        "kl_budgets_nats": budgets,
        "kl_budget_verdict_nats": budgets[vb],
        "n_seeds": len(runs),
        "n_select": cfg.n_select,
        "n_test": cfg.n_test,
    }

    per_level = runs[0]["per_level"]

    def pooled(si, li, qi, m, al, key="test", alpha_of=None):
        xs = []
        for run in runs:
            a = al if alpha_of is None else alpha_of(run["chosen"])
            xs.append(run[key][canon((si, li, qi, m, a), per_level)])
        return np.concatenate(xs)

    strata = np.repeat(np.arange(len(runs)), cfg.n_test)

    def ci(x):
        return list(policy.paired_bootstrap_ci(x, strata, cfg.n_boot))

    def avg(f):
        return np.mean([f(run) for run in runs], 0).tolist()

    zero_sel = np.mean([run["chosen"]["zero_select"] for run in runs], 0)  # per level
    n_zero = len(levels) if per_level else 1
    out |= level_keys(levels[:n_zero], "zero_select_return", zero_sel[:n_zero])
    for si, space in enumerate(cfg.spaces):
        for li, level in enumerate(levels):
            pre = ("" if si == 0 else f"{space}_") + ("" if li == 0 else f"{level}_")
            actor_sel = float(np.mean([run["chosen"][si, li, "actor_select"] for run in runs]))
            worth = actor_sel > float(zero_sel[li])
            out[pre + "actor_select_return"] = actor_sel
            out[pre + "actor_beats_zero"] = worth
            actor = pooled(si, li, 0, Method.POE, 0.0)
            cells = {}
            own = pooled(si, li, 0, Method.POE, 0.0, key="own")
            out |= {
                pre + "actor_return": float(actor.mean()),
                pre + "actor_return_se": _se(actor),
                pre + "actor_own_task_return": float(own.mean()),
                pre + "actor_own_task_return_se": _se(own),
                pre + "actor_std_quantiles": avg(lambda r: r["stats"][si, li, "actor_std"]),
            }
            for g in cfg.guides if space == "pretanh" else ():
                x = pooled(si, li, 0, _GUIDE_METHOD[g], None, alpha_of=lambda c: c[g, li])
                out[pre + f"{g}_guided_return"] = float(x.mean())
                out[pre + f"{g}_guided_shift"] = [run["chosen"][g, li] for run in runs]
                out[pre + f"{g}_guided_minus_actor_ci"] = ci(x - actor)
            margin = 2.0 * _se(actor)
            for qi, q in enumerate(cfg.priors):
                k = (si, li, qi)

                def rows_at(name, m=Method.POE, k=k):
                    return pooled(*k, m, None, alpha_of=lambda c: c[k, name])

                kl_rows = [
                    [
                        pooled(
                            *k,
                            Method.POE,
                            None,
                            alpha_of=lambda c, j=j, mo=mo: c[k, "budget", mo][j],
                        )
                        for j in range(len(budgets))
                    ]
                    for mo in (False, True)
                ]
                sel, oracle = kl_rows[0][vb], rows_at("oracle")
                add, prior_only = rows_at("additive", Method.ADDITIVE), pooled(*k, Method.POE, 1.0)
                g_ci, a_ci, p_ci = ci(sel - actor), ci(add - actor), ci(prior_only - actor)
                s_margin = max(2.0 * _se(oracle), 0.05 * abs(float(oracle.mean())))
                s_ci = ci(sel - oracle)
                poe_c = pooled(*k, Method.POE, cfg.contrast_alpha)
                add_c = pooled(*k, Method.ADDITIVE, cfg.contrast_alpha)
                c_ci = ci(add_c - poe_c)
                v_g, v_c, v_s = verdicts(g_ci, p_ci, c_ci, margin, s_ci, s_margin, worth, excluded)
                o_ci = ci(oracle - actor)
                cells[q] = cell(g_ci, margin, worth, excluded)
                out[pre + "cell_oracle_" + q] = cell(o_ci, margin, worth, excluded)
                out[pre + "oracle_minus_actor_ci_" + q] = o_ci
                sfx = f"_{q}"
                out |= {
                    pre + "verdict_graceful" + sfx: v_g,
                    pre + "verdict_additive_below_poe" + sfx: v_c,
                    pre + "additive_minus_poe_ci" + sfx: c_ci,
                    pre + "poe_contrast_return" + sfx: float(poe_c.mean()),
                    pre + "additive_contrast_return" + sfx: float(add_c.mean()),
                    pre + "graceful_ci" + sfx: g_ci,
                    pre + "graceful_margin" + sfx: margin,
                    pre + "additive_minus_actor_ci" + sfx: a_ci,
                    pre + "prior_only_minus_actor_ci" + sfx: p_ci,
                    pre + "verdict_selector" + sfx: v_s,
                    pre + "selector_ci" + sfx: s_ci,
                    pre + "selector_margin" + sfx: s_margin,
                    pre + "poe_kl_budget_return" + sfx: float(sel.mean()),
                    pre + "oracle_return" + sfx: float(oracle.mean()),
                    pre + "additive_return" + sfx: float(add.mean()),
                    pre + "prior_only_return" + sfx: float(prior_only.mean()),
                    pre + "oracle_alpha" + sfx: [run["chosen"][k, "oracle"] for run in runs],
                    pre + "additive_alpha" + sfx: [run["chosen"][k, "additive"] for run in runs],
                    pre + "poe_select_curve" + sfx: avg(lambda r: r["chosen"][k, "oracle_curve"]),
                    pre + "additive_select_curve" + sfx: avg(
                        lambda r: r["chosen"][k, "additive_curve"]
                    ),
                    pre + "kl_curve" + sfx: avg(lambda r: r["stats"][k, "kl"]),
                    pre + "kl_mean_curve" + sfx: avg(lambda r: r["stats"][k, "kl_mean"]),
                    pre + "kl_budget_alphas" + sfx: avg(lambda r: r["chosen"][k, "budget", False]),
                    pre + "kl_mean_budget_alphas" + sfx: avg(
                        lambda r: r["chosen"][k, "budget", True]
                    ),
                    pre + "kl_budget_return" + sfx: [float(x.mean()) for x in kl_rows[0]],
                    pre + "kl_mean_budget_return" + sfx: [float(x.mean()) for x in kl_rows[1]],
                    pre + "precision_ratio_median" + sfx: float(
                        np.mean([r["stats"][k, "precision"] for r in runs])
                    ),
                    pre + "prior_std_quantiles" + sfx: avg(lambda r: r["stats"][k, "prior_std"]),
                }
            out[pre + "cells"] = cells
            out[pre + "cell_counts"] = {
                c: sum(v == c for v in cells.values()) for c in ("help", "frozen", "hurt")
            }
    return out


def plot_decisive(ctx, cfg, out, name="selection_curves") -> None:
    """Per space and prior: the PoE and additive selection-episode curves over alpha and the
    KL (full and mean-only) of PoE at each alpha."""
    import matplotlib.pyplot as plt

    n_s, n_q = len(cfg.spaces), len(cfg.priors)
    fig, axes = plt.subplots(n_s, n_q, figsize=(2.6 * n_q, 2.8 * n_s), squeeze=False)
    for si, space in enumerate(cfg.spaces):
        pre = "" if si == 0 else f"{space}_"
        for ax, q in zip(axes[si], cfg.priors, strict=True):
            ax.plot(cfg.alphas, out[f"{pre}poe_select_curve_{q}"], "o-", label="PoE")
            ax.plot(cfg.alphas, out[f"{pre}additive_select_curve_{q}"], "s-", label="additive")
            tw = ax.twinx()
            tw.plot(cfg.alphas, out[f"{pre}kl_curve_{q}"], "k:", label="KL")
            tw.plot(cfg.alphas, out[f"{pre}kl_mean_curve_{q}"], "k--", label="mean-only KL")
            tw.set_yscale("symlog")
            ax.set_title(f"{space}, {q}", fontsize=8)
            ax.set_xlabel("alpha")
    axes[0, 0].legend(fontsize=6)
    ctx.save_plot(fig, name)


def run_seeds(cfg, ctx, setup_fn: Callable) -> tuple[list, dict]:
    """Runs :func:`run_decisive_seed` for the study seeds ``ctx.seed + i``, ``i <
    cfg.n_seeds``: ``setup_fn(seed, key) -> (Setup, extra)`` builds each seed's data (data seed
    = study seed). Returns the runs and the mean over seeds of each ``extra`` figure."""
    runs, extras = [], []
    for i in range(cfg.n_seeds):
        seed = ctx.seed + i
        key = jax.random.fold_in(ctx.key(), i)
        st, extra = setup_fn(seed, jax.random.fold_in(key, 1))
        runs.append(run_decisive_seed(ctx, cfg, st, key, f"seed{seed}"))
        extras.append(extra)
    return runs, {k: float(np.mean([e[k] for e in extras])) for k in extras[0]}


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
    level's without a prefix (the summary's convention)."""
    pairs = zip(levels, values, strict=True)
    return {("" if i == 0 else f"{lv}_") + name: float(v) for i, (lv, v) in enumerate(pairs)}


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
