"""Behaviour policies trained online: one replay-buffer loop, and the data sets built on it.

:func:`train_online` is the loop: a host-side vector environment (:class:`OnlineEnv`) is
stepped with the behaviour policy (uniform random actions for the first ``start_steps``), every
transition goes into a replay buffer, and after each vector step a jitted ``lax.scan`` runs
``updates_per_step`` updates per env step of the online algorithm (SAC,
:func:`hexad.policy.sac`) on minibatches drawn uniformly from the buffer. Hooks see every
step, every ``snapshot_every`` env steps and every chunk's end; with a
:class:`hexad.cachex.CacheXManager` each chunk is checkpointed (state, buffer and the caller's
``aux``), so an interrupted run resumes at the last finished chunk and ends with exactly the
parameters of an uninterrupted one.

On it, the offline-RL data sets whose behaviour policies are trained here (the environments,
collection, evaluation, file formats and caching helpers live in :mod:`hexad.data.offline_rl`):

- :func:`generate_locomotion` / :func:`locomotion_dataset`: D4RL-style random / medium /
  expert / medium-replay levels of HalfCheetah, Hopper and Walker2d from the snapshots of one
  SAC run;
- :func:`train_ant_controller`: the direction-commanded ant of AntMaze, trained in chunks in
  :class:`hexad.data.offline_rl.AntCommandEnv` and cached as its CacheX checkpoint;
- :func:`antmaze_dataset`: the AntMaze-UMaze oracle data driven by that controller.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from hexad._base import check_int
from hexad.data import cache_dir
from hexad.data import offline_rl as D
from hexad.policy._networks import GaussianActor, TwinCritic, sample_action
from hexad.policy._offline import Batch
from hexad.policy._online import sac

__all__ = [
    "ANT_CONTROLLER_DEFAULTS",
    "REPLAY_FIELDS",
    "AntController",
    "OnlineEnv",
    "OnlineResult",
    "ant_controller_spec",
    "antmaze_dataset",
    "generate_locomotion",
    "locomotion_dataset",
    "train_ant_controller",
    "train_online",
]

REPLAY_FIELDS = Batch._fields
"""The replay buffer's fields, those of a :class:`Batch`."""


@runtime_checkable
class OnlineEnv(Protocol):
    """A host-side vector environment as :func:`train_online` steps it.

    ``reset(rng) -> obs [E, obs_dim]`` starts every environment; ``step(rng, act [E, act_dim])
    -> (transition, obs)`` returns a dict of ``[E, ...]`` arrays holding at least the
    ``REPLAY_FIELDS`` and the next observations the policy sees (after any autoreset). Both may
    draw from ``rng``, the loop's numpy generator. :class:`hexad.data.offline_rl.LocomotionEnv`
    and :class:`hexad.data.offline_rl.AntCommandEnv` are two.
    """

    num_envs: int
    obs_dim: int
    act_dim: int

    def reset(self, rng: np.random.Generator) -> np.ndarray: ...

    def step(self, rng: np.random.Generator, act: np.ndarray) -> tuple[dict, np.ndarray]: ...


class OnlineResult(NamedTuple):
    """What :func:`train_online` returns.

    Attributes:
      state: the algorithm state after the last chunk.
      key: the JAX key after the last trained step (``key`` itself when nothing was trained),
        so that a caller can go on drawing from the same stream.
      buffer: the replay buffer, ``{field: [capacity, ...] float32}`` for ``REPLAY_FIELDS``.
      aux: the caller's ``aux`` after the last chunk.
      trained_chunks: chunks this call trained (0 when it loaded a finished checkpoint).
    """

    state: Any
    key: jax.Array
    buffer: dict[str, np.ndarray]
    aux: dict
    trained_chunks: int


@functools.lru_cache(maxsize=32)
def _scan_updates(step: Callable) -> Callable:
    """``run(key, state, batches) -> state``: ``step`` over the leading axis in one jitted scan."""

    @jax.jit
    def run(key, state, batches):
        keys = jax.random.split(key, batches.rewards.shape[0])
        return jax.lax.scan(lambda s, kb: step(kb[0], s, kb[1]), state, (keys, batches))[0]

    return run


def train_online(
    key: jax.Array,
    env: OnlineEnv,
    algo,
    state,
    act: Callable,
    *,
    total_steps: int,
    batch_size: int,
    start_steps: int = 0,
    updates_per_step: int = 1,
    seed: int = 0,
    chunk_steps: int | None = None,
    snapshot_every: int | None = None,
    on_snapshot: Callable | None = None,
    on_step: Callable | None = None,
    aux: dict | None = None,
    on_chunk_end: Callable | None = None,
    manager=None,
    progress: Callable | None = None,
    desc: str = "online",
) -> OnlineResult:
    """Trains ``algo`` online in ``env`` from a replay buffer; returns :class:`OnlineResult`.

    Each vector step acts with uniform random actions in ``[-1, 1]`` while fewer than
    ``start_steps`` env steps have been taken, else with ``act(k, state, obs)``; writes the
    transition into the buffer; and, once at least ``max(start_steps, batch_size)`` rows are
    filled, runs ``updates_per_step * E`` updates ``algo.step`` in one jitted ``lax.scan`` on
    minibatches of ``batch_size`` rows drawn uniformly from the filled rows.

    Randomness: without ``chunk_steps`` the run is one stream, JAX keys split from ``key`` and
    numpy draws (random actions, minibatch rows, whatever ``env`` draws) from
    ``numpy.random.default_rng(seed)``. With ``chunk_steps`` chunk ``c`` starts from freshly
    reset environments, ``jax.random.fold_in(key, c)`` and ``default_rng([seed, c])``, so a
    resumed run is exact. The environments are reset at each chunk's start.

    Args:
      key: the JAX key of the run.
      env: the :class:`OnlineEnv` (the caller closes it).
      algo: an ``(init, step)`` pair whose ``step(key, state, Batch) -> (state, info)`` is one
        update (static).
      state: the initial algorithm state (ignored when a checkpoint is restored).
      act: ``act(key, state, obs [E, o]) -> actions [E, d]`` the behaviour policy (static).
      total_steps: env steps; without ``chunk_steps`` rounded up to a multiple of ``E``, with
        it a multiple of ``chunk_steps``. Also the buffer's capacity.
      batch_size: minibatch size.
      start_steps: initial env steps with uniform random actions and no updates.
      updates_per_step: updates per env step (the update-to-data ratio).
      seed: the numpy seed (``>= 0``).
      chunk_steps: env steps per chunk (a multiple of ``E``), or None for one chunk.
      snapshot_every: env steps between ``on_snapshot`` calls (a multiple of ``E``).
      on_snapshot: ``on_snapshot(env_steps, state)``, after the updates of every
        ``snapshot_every``-th env step, and with ``0`` before a fresh run starts.
      on_step: ``on_step(env_steps_before, transition)`` after each vector step.
      aux: a dict of arrays checkpointed with the state (keys other than ``"sac"`` and
        ``"buffer"``), e.g. a learning curve.
      on_chunk_end: ``on_chunk_end(chunk, state, aux, seconds) -> aux`` at each chunk's end,
        before its checkpoint; ``seconds`` is the chunk's wall time.
      manager: a :class:`hexad.cachex.CacheXManager`; with it, training resumes from its
        newest checkpoint and each chunk ``c`` is saved as step ``c``, as
        ``{"sac": state, "buffer": buffer, **aux}``.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.
      desc: the progress bar's label.

    Returns:
      ``OnlineResult(state, key, buffer, aux, trained_chunks)``.

    >>> from hexad.data.offline_rl import LocomotionEnv
    >>> from hexad.policy import GaussianActor, TwinCritic, sac, sample_action
    >>> actor = GaussianActor(3, (8,))
    >>> algo = sac(actor, TwinCritic((8,)), optax.adam(1e-3), optax.adam(1e-3), optax.adam(1e-3))
    >>> b = Batch(jnp.zeros((1, 11)), jnp.zeros((1, 3)), jnp.zeros(1), jnp.zeros((1, 11)),
    ...           jnp.zeros(1))
    >>> env = LocomotionEnv("Hopper-v5", 2, 10)
    >>> pi = lambda k, s, o: sample_action(k, actor.apply(s.actor_params, o))[0]
    >>> out = train_online(jax.random.key(0), env, algo, algo.init(jax.random.key(1), b), pi,
    ...                    total_steps=8, batch_size=4, start_steps=4)
    >>> env.close()
    >>> int(out.state.step), out.buffer["observations"].shape
    (6, (8, 11))
    """
    n_envs = check_int("env.num_envs", env.num_envs)
    total_steps = check_int("total_steps", total_steps)
    batch_size = check_int("batch_size", batch_size)
    start_steps = check_int("start_steps", start_steps, 0)
    updates_per_step = check_int("updates_per_step", updates_per_step)
    seed = check_int("seed", seed, 0)
    chunked = chunk_steps is not None
    if not chunked:
        n_chunks, chunk_steps = 1, -(-total_steps // n_envs) * n_envs
    else:
        chunk_steps = check_int("chunk_steps", chunk_steps)
        if chunk_steps % n_envs or total_steps % chunk_steps:
            raise ValueError(
                f"chunk_steps, total_steps: expected chunk_steps a multiple of n_envs={n_envs} "
                f"and total_steps a multiple of chunk_steps, got {chunk_steps}, {total_steps}"
            )
        n_chunks = total_steps // chunk_steps
    if snapshot_every is not None:
        snapshot_every = check_int("snapshot_every", snapshot_every)
        if snapshot_every % n_envs:
            raise ValueError(
                f"snapshot_every: expected a multiple of n_envs={n_envs}, got {snapshot_every}"
            )
    aux = dict(aux or {})
    if {"sac", "buffer"} & set(aux):
        raise ValueError(f"aux: expected keys other than 'sac' and 'buffer', got {sorted(aux)}")
    cap = n_chunks * chunk_steps
    dims = {"observations": (env.obs_dim,), "actions": (env.act_dim,),
            "next_observations": (env.obs_dim,)}  # fmt: skip
    buf = {f: np.zeros((cap, *dims.get(f, ())), np.float32) for f in REPLAY_FIELDS}
    first = 0
    if manager is not None:
        from hexad import cachex

        template = {"sac": jax.device_get(state), "buffer": buf, **aux}
        first, st = cachex.resume(manager, template)
        buf = {f: np.array(v, np.float32, copy=True) for f, v in st["buffer"].items()}
        aux = {k: np.array(st[k], copy=True) for k in aux}
        state = st["sac"]
    state = jax.tree.map(jnp.asarray, state)
    run = _scan_updates(algo.step)
    n_updates = updates_per_step * n_envs
    if first == 0 and snapshot_every is not None and on_snapshot is not None:
        on_snapshot(0, state)
    out_key = key
    for c in range(first, n_chunks):
        t0 = time.perf_counter()
        if chunked:
            rng, ckey = np.random.default_rng([seed, c]), jax.random.fold_in(key, c)
        else:
            rng, ckey = np.random.default_rng(seed), key
        obs = env.reset(rng)
        it = range(chunk_steps // n_envs)
        if progress is not None:
            it = progress(it, f"{desc} chunk {c + 1}/{n_chunks}" if chunked else desc)
        for t in it:
            n = c * chunk_steps + t * n_envs
            if n < start_steps:
                a = rng.uniform(-1.0, 1.0, (n_envs, env.act_dim)).astype(np.float32)
            else:
                ckey, k = jax.random.split(ckey)
                a = np.asarray(act(k, state, obs))
            tr, obs = env.step(rng, a)
            sl = slice(n, n + n_envs)
            for f in REPLAY_FIELDS:
                buf[f][sl] = tr[f]
            if on_step is not None:
                on_step(n, tr)
            filled = n + n_envs
            if filled >= max(start_steps, batch_size):
                ckey, k = jax.random.split(ckey)
                idx = rng.integers(0, filled, (n_updates, batch_size))
                state = run(k, state, Batch(*(jnp.asarray(buf[f][idx]) for f in REPLAY_FIELDS)))
            if snapshot_every is not None and on_snapshot is not None:
                if filled % snapshot_every == 0:
                    on_snapshot(filled, state)
        if on_chunk_end is not None:
            aux = dict(on_chunk_end(c, state, aux, time.perf_counter() - t0))
        if manager is not None:
            manager.save(c, {"sac": jax.device_get(state), "buffer": buf, **aux})
            manager.wait_until_finished()
        out_key = ckey
    return OnlineResult(state, out_key, buf, aux, n_chunks - first)


class _Kit(NamedTuple):
    actor: GaussianActor
    algo: Any
    example: Batch
    sample: Callable  # (key, actor params, obs) -> actions
    mean_action: Callable  # (actor params, obs) -> tanh(mean)


@functools.lru_cache(maxsize=16)
def _sac_kit(obs_dim: int, act_dim: int, hidden: int, lr: float) -> _Kit:
    """SAC with two ``hidden``-wide layers and Adam ``lr`` for actor, critics and temperature,
    with jitted functions compiled once per setting."""
    hid = (hidden, hidden)
    actor = GaussianActor(act_dim, hid)
    opt = optax.adam(lr)
    algo = sac(actor, TwinCritic(hid), opt, opt, opt)
    example = Batch(
        jnp.zeros((1, obs_dim)),
        jnp.zeros((1, act_dim)),
        jnp.zeros(1),
        jnp.zeros((1, obs_dim)),
        jnp.zeros(1),
    )
    return _Kit(
        actor,
        algo,
        example,
        jax.jit(lambda key, params, obs: sample_action(key, actor.apply(params, obs))[0]),
        jax.jit(lambda params, obs: jnp.tanh(actor.apply(params, obs).mean)),
    )


def _sample_actor(kit: _Kit) -> Callable:
    return lambda k, s, obs: kit.sample(k, s.actor_params, obs)


# --------------------------------------------------------------------------------------------
# Locomotion: D4RL-style levels from the snapshots of one SAC run
# --------------------------------------------------------------------------------------------


def generate_locomotion(
    env_id: str,
    total_steps: int = 20_000,
    seed: int = 0,
    n_envs: int = 4,
    hidden: int = 64,
    batch_size: int = 256,
    lr: float = 1e-3,
    start_steps: int = 2000,
    snapshot_every: int = 2000,
    n_eval_episodes: int = 2,
    eval_steps: int = 500,
    n_per_level: int = 20_000,
    episode_steps: int = 1000,
    chunk_steps: int | None = None,
    directory=None,
    progress=None,
) -> dict[str, dict[str, np.ndarray]]:
    """Trains SAC online on ``env_id`` and returns the four D4RL-style levels.

    :func:`train_online` runs SAC (one update per env step) with a deterministic evaluation
    (the tanh of the actor's mean, ``n_eval_episodes`` episodes of ``eval_steps`` steps) and a
    parameter snapshot every ``snapshot_every`` env steps and at the start.
    :func:`hexad.data.offline_rl.locomotion_levels` picks *random* (the initial policy),
    *expert* (the best snapshot) and *medium* from the snapshots' returns; each of them is
    ``n_per_level`` transitions of that snapshot's stochastic policy
    (:func:`hexad.data.offline_rl.collect_locomotion`, reset seed ``seed + 1 + snapshot``), and
    *medium-replay* is the replay buffer up to the medium snapshot (at least one vector step).

    **Resumable runs** (``chunk_steps``, for the long runs of at least 100k SAC steps): the
    SAC run goes in chunks of ``chunk_steps`` env steps (:func:`train_online`'s chunks, each
    starting from freshly reset environments, so every chunk's last step ends its
    trajectories), and with ``directory`` each chunk is checkpointed there through
    :class:`hexad.cachex.CacheXManager` with the replay buffer, the infos that medium-replay
    needs and the snapshots so far: an interrupted run resumes at its last finished chunk and
    ends with exactly the data of an uninterrupted one. ``snapshot_every`` must divide
    ``chunk_steps``; the collection's keys derive from ``seed`` alone. Without
    ``chunk_steps`` the run is one stream, as before (same data, bit for bit).

    Args:
      env_id: one of ``hexad.data.offline_rl.LOCOMOTION_ENVS``.
      total_steps: online environment steps (rounded up to a multiple of ``n_envs``; with
        ``chunk_steps``, a multiple of it).
      seed: seed of the environments, the networks and the sampling.
      n_envs: parallel training environments.
      hidden: width of the two hidden layers of the actor and of each critic.
      batch_size: SAC minibatch size.
      lr: Adam learning rate of actor, critic and temperature.
      start_steps: initial steps with uniform random actions (no updates before them).
      snapshot_every: env steps between snapshots (a multiple of ``n_envs``).
      n_eval_episodes: episodes per evaluation.
      eval_steps: steps per evaluation episode.
      n_per_level: transitions of each of random / medium / expert.
      episode_steps: episode length of the training and collection envs.
      chunk_steps: env steps per checkpointed chunk (a multiple of ``n_envs`` and of
        ``snapshot_every``), or None for one uncheckpointed stream.
      directory: the CacheX checkpoint folder of a chunked run (it holds ``spec.json``, the
        settings; a folder of another run is refused); None: no checkpoints.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      ``{level: data}`` for every level in ``LOCOMOTION_LEVELS`` (the fields listed in
      :mod:`hexad.data.offline_rl`), and ``"meta/snapshot_returns": [S]``.

    >>> out = generate_locomotion("Hopper-v5", 8, n_envs=4, hidden=8, start_steps=4,
    ...                           snapshot_every=4, eval_steps=5, n_per_level=8, batch_size=4)
    >>> out["medium"]["observations"].shape, out["meta/snapshot_returns"].shape
    ((8, 11), (3,))
    """
    D.check_env_id(env_id)
    for name, v in (("total_steps", total_steps), ("n_envs", n_envs), ("n_per_level", n_per_level)):
        check_int(name, v)
    if snapshot_every < n_envs or snapshot_every % n_envs:
        raise ValueError(
            f"snapshot_every: expected a multiple of n_envs={n_envs}, got {snapshot_every}"
        )
    if chunk_steps is not None:
        check_int("chunk_steps", chunk_steps)
        if chunk_steps % snapshot_every or total_steps % chunk_steps:
            raise ValueError(
                f"chunk_steps: expected a multiple of snapshot_every={snapshot_every} that "
                f"divides total_steps={total_steps}, got {chunk_steps}"
            )
    env = D.LocomotionEnv(env_id, n_envs, episode_steps, seed)
    kit = _sac_kit(env.obs_dim, env.act_dim, hidden, lr)
    k_init, key = jax.random.split(jax.random.key(seed))
    state = kit.algo.init(k_init, kit.example)

    def evaluate(params) -> float:
        res = D.evaluate_locomotion(
            lambda o, _: kit.mean_action(params, jnp.asarray(o, jnp.float32)),
            env_id,
            np.zeros((n_eval_episodes, 1)),
            10_000 + np.arange(n_eval_episodes),
            n_envs=n_eval_episodes,
            episode_steps=eval_steps,
        )
        return float(res["return"].mean())

    run = dict(
        total_steps=total_steps,
        batch_size=batch_size,
        start_steps=start_steps,
        seed=seed,
        snapshot_every=snapshot_every,
        progress=progress,
        desc=f"SAC {env_id}",
    )
    if chunk_steps is None:
        snapshots: list[tuple[int, Any, float]] = []
        steps: list[dict[str, np.ndarray]] = []

        def on_snapshot(n, s):
            snapshots.append((n, s.actor_params, evaluate(s.actor_params)))

        try:
            res = train_online(
                key,
                env,
                kit.algo,
                state,
                _sample_actor(kit),
                on_snapshot=on_snapshot,
                on_step=lambda n, tr: steps.append(tr),
                **run,
            )
        finally:
            env.close()
        collect_key = res.key

        def replay(m_step):
            return D.env_major(steps[: max(m_step // n_envs, 1)])

    else:
        spec = dict(env=env_id, n_envs=n_envs, hidden=hidden, lr=float(lr), version=1)
        spec |= dict(
            n_eval_episodes=n_eval_episodes, eval_steps=eval_steps, chunk_steps=chunk_steps
        )
        spec |= {k: run[k] for k in ("total_steps", "batch_size", "start_steps", "seed")}
        spec |= dict(snapshot_every=snapshot_every, episode_steps=episode_steps)
        snapshots, replay = _chunked_locomotion(
            env, kit, key, state, evaluate, run, chunk_steps, directory, spec
        )
        collect_key = jax.random.fold_in(jax.random.key(seed), 2**31 - 2)
    rets = np.array([r for _, _, r in snapshots])
    picks = D.locomotion_levels(rets)
    meta = {"meta/random_return": rets[0], "meta/expert_return": rets[picks["expert"]]}
    key = collect_key

    def stochastic(params):
        def policy(obs):
            nonlocal key
            key, k = jax.random.split(key)
            return kit.sample(k, params, obs)

        return policy

    out = {}
    for level, i in picks.items():
        step, params, ret = snapshots[i]
        d = D.collect_locomotion(
            stochastic(params),
            env_id,
            n_per_level,
            seed=seed + 1 + i,
            n_envs=n_envs,
            episode_steps=episode_steps,
        )
        out[level] = d | {"meta/policy_return": ret, "meta/snapshot_step": step} | meta
    m_step, _, m_ret = snapshots[picks["medium"]]
    out["medium-replay"] = replay(m_step) | {
        "meta/policy_return": m_ret,
        "meta/snapshot_step": m_step,
    }
    out["medium-replay"] |= meta
    for d in out.values():
        for k_ in [k_ for k_ in d if k_.startswith("meta/")]:
            d[k_] = np.asarray(d[k_], np.float64)
    out["meta/snapshot_returns"] = rets
    return out


# The per-transition infos a chunked run keeps beside its replay buffer (medium-replay's).
_REPLAY_INFOS = ("timeouts", "infos/x_velocity", "infos/reward_forward")


def _chunked_locomotion(env, kit, key, state, evaluate, run, chunk_steps, directory, spec):
    """The SAC run of :func:`generate_locomotion` in checkpointed chunks (in ``directory``,
    whose ``spec.json`` must be ``spec``): returns the snapshots ``[(step, actor params,
    return)]`` and ``replay(m_step) -> data``, the env-major replay buffer up to ``m_step``."""
    from hexad import cachex

    n_envs, total, every = env.num_envs, run["total_steps"], run["snapshot_every"]
    n_snap = total // every + 1
    leaves, treedef = jax.tree.flatten(jax.device_get(state.actor_params))
    aux = {
        f"snapshot/{i}": np.zeros((n_snap, *np.shape(x)), np.float32) for i, x in enumerate(leaves)
    }
    aux["snapshot/returns"] = np.zeros(n_snap)
    aux |= {f"replay/{k}": np.zeros(total) for k in _REPLAY_INFOS}
    pending: dict[str, list] = {"snapshots": [], "steps": []}

    def on_snapshot(n, s):
        params = jax.device_get(s.actor_params)
        pending["snapshots"].append((n // every, params, evaluate(params)))

    def on_chunk_end(c, s, aux, seconds):
        for i, params, ret in pending["snapshots"]:
            for j, x in enumerate(jax.tree.leaves(params)):
                aux[f"snapshot/{j}"][i] = x
            aux["snapshot/returns"][i] = ret
        for n, tr in pending["steps"]:
            for k in _REPLAY_INFOS:
                aux[f"replay/{k}"][n : n + n_envs] = tr[k]
        # the next chunk starts from reset environments: this chunk's last step ends them all
        n, tr = pending["steps"][-1]
        aux["replay/timeouts"][n : n + n_envs] = 1.0 - tr["terminals"]
        pending["snapshots"].clear()
        pending["steps"].clear()
        return aux

    args = dict(run, chunk_steps=chunk_steps, aux=aux, on_chunk_end=on_chunk_end)
    args |= dict(on_snapshot=on_snapshot, on_step=lambda n, tr: pending["steps"].append((n, tr)))
    act = _sample_actor(kit)
    try:
        if directory is None:
            res = train_online(key, env, kit.algo, state, act, **args)
        else:
            directory = Path(directory)
            spec_file = directory / "spec.json"
            if spec_file.is_file() and json.loads(spec_file.read_text()) != spec:
                raise ValueError(
                    f"directory: the SAC run under {directory} has the settings "
                    f"{spec_file.read_text()}, expected {json.dumps(spec, sort_keys=True)}"
                )
            with cachex.CacheXManager(directory, max_to_keep=1) as mngr:
                spec_file.write_text(json.dumps(spec, sort_keys=True))
                res = train_online(key, env, kit.algo, state, act, manager=mngr, **args)
    finally:
        env.close()
    got = res.aux
    snapshots = [
        (
            i * every,
            jax.tree.unflatten(
                treedef, [jnp.asarray(got[f"snapshot/{j}"][i]) for j in range(len(leaves))]
            ),
            float(got["snapshot/returns"][i]),
        )
        for i in range(n_snap)
    ]
    buf = res.buffer

    def replay(m_step):
        rows = max(m_step, n_envs)
        fields = {f: buf[f][:rows] for f in REPLAY_FIELDS}
        fields |= {k: got[f"replay/{k}"][:rows] for k in _REPLAY_INFOS}
        steps = [{k: v[t : t + n_envs] for k, v in fields.items()} for t in range(0, rows, n_envs)]
        return D.env_major(steps)

    return snapshots, replay


def locomotion_dataset(
    env_id: str,
    level: str,
    total_steps: int = 20_000,
    seed: int = 0,
    n_per_level: int = 20_000,
    hidden: int = 64,
    path_dir=None,
    progress=None,
    **kwargs,
) -> dict[str, np.ndarray]:
    """Returns one level of the locomotion data, generating and caching all four on first use.

    The files are named by a hash of the settings; of ``kwargs``, only those that differ from
    :func:`generate_locomotion`'s defaults take part, so passing a default explicitly reads the
    same files as leaving it out. With ``chunk_steps`` (a resumable run, for the long ones) the
    SAC run is checkpointed chunk by chunk in a folder beside the files
    (``<env>_sac_<tag>``, named by the SAC settings), so an interrupted generation resumes
    where it stopped on the next call; the level files are written once it is complete.

    Args:
      env_id: one of ``hexad.data.offline_rl.LOCOMOTION_ENVS``.
      level: one of ``hexad.data.offline_rl.LOCOMOTION_LEVELS``.
      total_steps, seed, n_per_level, hidden: see :func:`generate_locomotion`.
      path_dir: folder of the npz files; default ``hexad.data.cache_dir("offline_rl")``.
      progress: optional progress-bar wrapper, used only when generating.
      kwargs: :func:`generate_locomotion`'s other settings (``n_envs``, ``batch_size``, ``lr``,
        ``start_steps``, ``snapshot_every``, ``n_eval_episodes``, ``eval_steps``,
        ``episode_steps``, ``chunk_steps``).

    Returns:
      a dict with the D4RL fields and the extras listed in :mod:`hexad.data.offline_rl`; the
      snapshot returns of the whole SAC run are in ``meta/snapshot_returns`` (every level).

    >>> import tempfile
    >>> d = locomotion_dataset("Hopper-v5", "expert", 8, n_per_level=8, hidden=8,
    ...                        path_dir=tempfile.mkdtemp(), start_steps=4, snapshot_every=4,
    ...                        eval_steps=5, batch_size=4)
    >>> d["actions"].shape
    (8, 3)
    """
    D.check_env_id(env_id)
    if level not in D.LOCOMOTION_LEVELS:
        raise ValueError(f"level: expected one of {D.LOCOMOTION_LEVELS}, got {level!r}")
    defaults = {
        k: p.default
        for k, p in inspect.signature(generate_locomotion).parameters.items()
        if k
        not in ("env_id", "total_steps", "seed", "n_per_level", "hidden", "directory", "progress")
    }
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise TypeError(f"kwargs: expected names among {sorted(defaults)}, got {unknown}")
    # A default passed explicitly must not orphan the files its omission writes.
    kwargs = {k: v for k, v in kwargs.items() if v != defaults[k]}
    spec = {
        "env": env_id,
        "steps": int(total_steps),
        "seed": int(seed),
        "n": int(n_per_level),
        "hidden": int(hidden),
        "kw": {k: kwargs[k] for k in sorted(kwargs)},
        "version": 1,
    }
    tag = D.spec_tag(spec)
    folder = Path(path_dir) if path_dir is not None else cache_dir(D.CACHE_FOLDER)
    name = env_id.split("-")[0].lower()
    paths = {lv: folder / f"{name}_{lv}_{tag}.npz" for lv in D.LOCOMOTION_LEVELS}
    if not paths[level].is_file():
        if kwargs.get("chunk_steps") is not None:
            # the resumable SAC run's checkpoints, named by its settings (not n_per_level)
            sac = D.spec_tag({k: v for k, v in spec.items() if k != "n"})
            kwargs["directory"] = folder / f"{name}_sac_{sac}"
        gen = generate_locomotion(
            env_id,
            total_steps,
            seed=seed,
            n_per_level=n_per_level,
            hidden=hidden,
            progress=progress,
            **kwargs,
        )
        rets = gen.pop("meta/snapshot_returns")
        for lv, d in gen.items():
            D.save_offline_rl(paths[lv], d | {"meta/snapshot_returns": rets})
    return D.load_offline_rl(paths[level])


# --------------------------------------------------------------------------------------------
# AntMaze: the direction-commanded ant controller and the data set it drives
# --------------------------------------------------------------------------------------------


class AntController(NamedTuple):
    """The trained direction-commanded ant: call it on command features for actions.

    Attributes:
      params: the actor's parameters.
      hidden: width of the actor's two hidden layers.
      curve: ``[n_chunks, 4]`` per training chunk: env steps, mean velocity along the command
        over the chunk's stochastic steps, training seconds of the chunk, episodes ended by
        turning upside down.
      directory: the checkpoint folder.
    """

    params: Any
    hidden: int
    curve: np.ndarray
    directory: Path

    def __call__(self, features: np.ndarray) -> np.ndarray:
        """``[n, 8]`` float64 deterministic actions (tanh of the mean) for ``[n, 29]`` features."""
        kit = _sac_kit(D.ANT_INPUT_DIM, D.ANT_ACT_DIM, int(self.hidden), 1e-3)
        return np.asarray(kit.mean_action(self.params, features), np.float64)


def train_ant_controller(
    total_steps: int = 400_000,
    seed: int = 0,
    *,
    n_envs: int = 4,
    hidden: int = 128,
    batch_size: int = 256,
    lr: float = 1e-3,
    start_steps: int = 5000,
    episode_steps: int = 200,
    command_every: int = 100,
    ctrl_cost: float = 0.05,
    terminate_flipped: bool = True,
    chunk_steps: int = 50_000,
    directory=None,
    progress=None,
) -> AntController:
    r"""Trains (or resumes, or loads) the direction-commanded ant controller.

    SAC in :class:`hexad.data.offline_rl.AntCommandEnv` by :func:`train_online`, one update
    per env step, in chunks of ``chunk_steps`` env steps, each checkpointed through
    :class:`hexad.cachex.CacheXManager` into ``directory`` (with ``spec.json``, the settings).
    The finished checkpoint is the cache: a second call with the same settings loads it; a
    folder trained with other settings is refused.

    Args:
      total_steps: online env steps, a multiple of ``chunk_steps``.
      seed: seed of the environments, the networks and the sampling.
      n_envs: parallel ``Ant-v5`` environments (``SyncVectorEnv``).
      hidden: width of the two hidden layers of the actor and of each critic.
      batch_size: SAC minibatch size.
      lr: Adam learning rate of actor, critics and temperature.
      start_steps: initial env steps with uniform random actions and no updates.
      episode_steps: episode length (timeout) of the training envs.
      command_every: steps between command redraws.
      ctrl_cost: weight of :math:`\|a\|^2` in the reward.
      terminate_flipped: also end an episode as a termination (no healthy bonus, no
        bootstrap) when the torso turns upside down, so the controller is not paid for lying
        on its back.
      chunk_steps: env steps between checkpoints (a multiple of ``n_envs``).
      directory: the CacheX checkpoint folder; default a folder in
        ``hexad.data.cache_dir("offline_rl")`` named by the settings.
      progress: optional ``progress(iterable, desc)`` wrapper for a progress bar.

    Returns:
      the :class:`AntController`.

    >>> import tempfile
    >>> c = train_ant_controller(8, n_envs=2, hidden=8, batch_size=4, start_steps=4,
    ...                          episode_steps=5, chunk_steps=4, directory=tempfile.mkdtemp())
    >>> c.curve[:, 0].tolist(), c(np.zeros((1, 29), np.float32)).shape
    ([4.0, 8.0], (1, 8))
    """
    from hexad import cachex

    for name, v in (("total_steps", total_steps), ("n_envs", n_envs), ("hidden", hidden),
                    ("batch_size", batch_size), ("episode_steps", episode_steps),
                    ("command_every", command_every), ("chunk_steps", chunk_steps)):  # fmt: skip
        check_int(name, v)
    check_int("start_steps", start_steps, 0)
    if chunk_steps % n_envs or total_steps % chunk_steps:
        raise ValueError(
            f"chunk_steps, total_steps: expected chunk_steps a multiple of n_envs={n_envs} and "
            f"total_steps a multiple of chunk_steps, got {chunk_steps}, {total_steps}"
        )
    if not (lr > 0 and ctrl_cost >= 0):
        raise ValueError(f"lr, ctrl_cost: expected > 0 and >= 0, got {lr}, {ctrl_cost}")
    spec = ant_controller_spec(
        total_steps=total_steps, seed=seed, n_envs=n_envs, hidden=hidden,
        batch_size=batch_size, lr=lr, start_steps=start_steps, episode_steps=episode_steps,
        command_every=command_every, ctrl_cost=ctrl_cost, chunk_steps=chunk_steps,
        terminate_flipped=terminate_flipped,
    )  # fmt: skip
    if directory is None:
        directory = D.offline_rl_path("ant_controller", spec, suffix="")
    directory = Path(directory)
    spec_file = directory / "spec.json"
    if spec_file.is_file() and json.loads(spec_file.read_text()) != spec:
        raise ValueError(
            f"directory: the checkpoint under {directory} was trained with "
            f"{spec_file.read_text()}, expected {json.dumps(spec, sort_keys=True)}"
        )
    n_chunks = total_steps // chunk_steps
    kit = _sac_kit(D.ANT_INPUT_DIM, D.ANT_ACT_DIM, hidden, lr)
    base_key = jax.random.key(seed)
    state = kit.algo.init(jax.random.fold_in(base_key, 2**31 - 1), kit.example)
    stats = {"vel": [], "flips": 0}

    def on_step(n, tr):
        if n >= start_steps:
            stats["vel"].append(tr["infos/command_velocity"].mean())
        stats["flips"] += int(tr["infos/flipped"].sum())

    def on_chunk_end(c, _, aux, seconds):
        vel, curve = stats["vel"], aux["curve"]
        curve[c] = ((c + 1) * chunk_steps, np.mean(vel) if vel else 0.0, seconds, stats["flips"])
        stats.update(vel=[], flips=0)
        return {"curve": curve}

    with cachex.CacheXManager(directory, max_to_keep=1) as mngr:
        spec_file.write_text(json.dumps(spec, sort_keys=True))
        env = D.AntCommandEnv(n_envs, episode_steps, command_every, ctrl_cost, terminate_flipped)
        try:
            res = train_online(
                base_key,
                env,
                kit.algo,
                state,
                _sample_actor(kit),
                total_steps=total_steps,
                batch_size=batch_size,
                start_steps=start_steps,
                seed=seed,
                chunk_steps=chunk_steps,
                aux={"curve": np.zeros((n_chunks, 4))},
                on_step=on_step,
                on_chunk_end=on_chunk_end,
                manager=mngr,
                progress=progress,
                desc="SAC Ant",
            )
        finally:
            env.close()
    params = jax.tree.map(jnp.asarray, res.state.actor_params)
    return AntController(params, hidden, np.asarray(res.aux["curve"]), directory)


ANT_CONTROLLER_DEFAULTS = {
    k: p.default
    for k, p in inspect.signature(train_ant_controller).parameters.items()
    if k not in ("directory", "progress")
}
"""The default settings of :func:`train_ant_controller` (all but ``directory`` and ``progress``),
from which :func:`ant_controller_spec` names the controller's cache folder."""


def ant_controller_spec(**overrides) -> dict:
    """Returns the controller's full settings as the JSON dict that names its cache folder.

    :func:`train_ant_controller`'s defaults (``ANT_CONTROLLER_DEFAULTS``) updated with
    ``overrides``; ``terminate_flipped`` appears only when true.

    >>> ant_controller_spec(hidden=8)["hidden"], ant_controller_spec()["hidden"]
    (8, 128)
    """
    spec = dict(ANT_CONTROLLER_DEFAULTS)
    unknown = sorted(set(overrides) - set(spec))
    if unknown:
        raise ValueError(f"controller settings: unknown {unknown}; expected some of {sorted(spec)}")
    spec.update(overrides)
    spec = {k: (float(v) if isinstance(v, float) else v) for k, v in spec.items()}
    if not spec.pop("terminate_flipped"):
        return spec | {"version": 1}
    return spec | {"version": 1, "terminate_flipped": True}


def antmaze_dataset(
    n_transitions: int = 200_000,
    seed: int = 0,
    noise_std: float = 0.2,
    random_action_frac: float = 0.0,
    reset_flipped: bool = True,
    path=None,
    controller_kwargs: dict | None = None,
    progress=None,
) -> dict[str, np.ndarray]:
    """Returns the AntMaze-UMaze oracle data set, generating and caching it on first use.

    The controller comes from :func:`train_ant_controller` (``controller_kwargs``), itself
    cached: the first call trains it (about half an hour on a 2-core CPU at the defaults).

    Args:
      n_transitions, seed, noise_std, random_action_frac, reset_flipped: see
        :func:`hexad.data.offline_rl.generate_antmaze`.
      path: an explicit npz path; default a file in ``hexad.data.cache_dir("offline_rl")``
        named by the settings.
      controller_kwargs: keyword arguments of :func:`train_ant_controller`.
      progress: optional progress-bar wrapper, used only when training the controller.

    Returns:
      a dict with the D4RL fields, ``infos/goal``, ``infos/qpos``, ``infos/qvel``,
      ``task_goal`` and ``meta/controller_curve`` (the controller's learning curve).

    >>> import tempfile
    >>> tmp = Path(tempfile.mkdtemp())
    >>> ckw = dict(total_steps=8, n_envs=2, hidden=8, batch_size=4, start_steps=4,
    ...            episode_steps=5, chunk_steps=4, directory=tmp / "ant")
    >>> d = antmaze_dataset(6, controller_kwargs=ckw, path=tmp / "am.npz")
    >>> d["observations"].shape, d["meta/controller_curve"].shape
    ((6, 29), (2, 4))
    """
    ckw = dict(controller_kwargs or {})
    spec = {
        "env": D.ANTMAZE_ENV,
        "n": int(n_transitions),
        "seed": int(seed),
        "noise": float(noise_std),
        "rand": float(random_action_frac),
        "flip": bool(reset_flipped),
        "controller": ant_controller_spec(**{k: v for k, v in ckw.items() if k != "directory"}),
        "version": 1,
    }
    path = Path(path) if path is not None else D.offline_rl_path("antmaze_umaze", spec)
    if path.is_file():
        return D.load_offline_rl(path)
    controller = train_ant_controller(progress=progress, **ckw)
    data = D.generate_antmaze(
        controller,
        n_transitions,
        seed=seed,
        noise_std=noise_std,
        random_action_frac=random_action_frac,
        reset_flipped=reset_flipped,
    )
    data["meta/controller_curve"] = controller.curve
    D.save_offline_rl(path, data)
    return data
