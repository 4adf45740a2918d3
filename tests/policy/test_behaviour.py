"""train_online, the one online replay-buffer loop: start_steps and the buffer, update counts,
determinism, exact resume through CacheX, no retracing; and the ant controller built on it."""

import json
import shutil

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hexad import cachex
from hexad import policy as P
from hexad.data.offline_rl import _antmaze as A  # for monkeypatching the upright test


class Interrupted(Exception):
    pass


class ToyEnv:
    """A 2-d point pushed by its actions; reward -|x|^2; resets draw the start from ``rng``."""

    num_envs, obs_dim, act_dim = 2, 2, 2

    def reset(self, rng):
        self.x = rng.uniform(-1, 1, (2, 2)).astype(np.float32)
        return self.x

    def step(self, rng, act):
        nxt = np.clip(self.x + 0.1 * act, -1, 1).astype(np.float32)
        tr = {
            "observations": self.x,
            "actions": act,
            "rewards": -np.sum(nxt * nxt, 1),
            "next_observations": nxt,
            "terminals": np.zeros(2, np.float32),
        }
        self.x = nxt
        return tr, nxt


@pytest.fixture(scope="module")
def toy():
    actor = P.GaussianActor(2, (8,))
    opt = optax.adam(1e-3)
    algo = P.sac(actor, P.TwinCritic((8,)), opt, opt, opt)
    z = jnp.zeros((1, 2))
    state = algo.init(jax.random.key(0), P.Batch(z, z, jnp.zeros(1), z, jnp.zeros(1)))
    calls = []

    def act(k, s, obs):
        calls.append(np.asarray(obs).copy())
        return P.sample_action(k, actor.apply(s.actor_params, obs))[0]

    return algo, state, act, calls


def _run(toy, **kw):
    algo, state, act, calls = toy
    calls.clear()
    args = dict(total_steps=16, batch_size=4, start_steps=8, seed=3) | kw
    return P.train_online(jax.random.key(1), ToyEnv(), algo, state, act, **args)


def _same(a, b):
    return all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(x, y), a, b)))


def test_start_steps_buffer_and_update_count(toy):
    seen = []
    out = _run(toy, on_step=lambda n, tr: seen.append(n))
    calls = toy[3]
    assert seen == list(range(0, 16, 2))
    # Uniform random actions for the first 8 env steps (4 vector steps), drawn first from
    # default_rng(seed) after the reset's draw; the policy acts in the last 4 vector steps.
    rng = np.random.default_rng(3)
    rng.uniform(-1, 1, (2, 2))  # ToyEnv.reset
    want = np.concatenate([rng.uniform(-1, 1, (2, 2)) for _ in range(4)]).astype(np.float32)
    np.testing.assert_array_equal(out.buffer["actions"][:8], want)
    assert len(calls) == 4
    # The buffer rows are the transitions in order: next_observations[t] = observations[t + E].
    np.testing.assert_array_equal(
        out.buffer["next_observations"][:-2], out.buffer["observations"][2:]
    )
    # Updates from the vector step that fills max(start_steps, batch_size) = 8 rows: 5 vector
    # steps of E = 2 updates each.
    assert int(out.state.step) == 10
    assert int(_run(toy, updates_per_step=3).state.step) == 30
    assert int(_run(toy, start_steps=0, batch_size=6).state.step) == 2 * 6  # from 6 rows on
    assert out.trained_chunks == 1


def test_deterministic_for_a_fixed_key(toy):
    a, b = _run(toy), _run(toy)
    assert _same(a.state, b.state) and _same(a.buffer, b.buffer)
    assert np.array_equal(jax.random.key_data(a.key), jax.random.key_data(b.key))
    c = _run(toy, seed=4)
    assert not np.array_equal(a.buffer["actions"], c.buffer["actions"])


def test_snapshots_and_chunk_hooks(toy):
    snaps, ends = [], []
    _run(toy, snapshot_every=4, on_snapshot=lambda n, s: snaps.append((n, int(s.step))))
    assert snaps == [(0, 0), (4, 0), (8, 2), (12, 6), (16, 10)]

    def end(c, s, aux, seconds):
        ends.append(c)
        return {"log": aux["log"] + 1.0}

    out = _run(toy, chunk_steps=8, aux={"log": np.zeros(2)}, on_chunk_end=end)
    assert ends == [0, 1] and out.aux["log"].tolist() == [2.0, 2.0]


def test_resume_equals_uninterrupted(toy, tmp_path):
    kw = dict(chunk_steps=8, aux={"n": np.zeros(1)})

    def count(c, s, aux, seconds):
        return {"n": np.asarray(aux["n"] + 1)}

    with cachex.CacheXManager(tmp_path / "full", max_to_keep=1) as m:
        full = _run(toy, manager=m, on_chunk_end=count, **kw)

    def crash(c, s, aux, seconds):
        if c == 1:
            raise Interrupted  # killed before the second chunk's checkpoint
        return count(c, s, aux, seconds)

    with cachex.CacheXManager(tmp_path / "part", max_to_keep=1) as m:
        with pytest.raises(Interrupted):
            _run(toy, manager=m, on_chunk_end=crash, **kw)
    with cachex.CacheXManager(tmp_path / "part", max_to_keep=1) as m:
        resumed = _run(toy, manager=m, on_chunk_end=count, **kw)
    assert resumed.trained_chunks == 1
    assert _same(full.state, resumed.state) and _same(full.buffer, resumed.buffer)
    assert resumed.aux["n"].tolist() == [2.0]
    with cachex.CacheXManager(tmp_path / "full", max_to_keep=1) as m:
        loaded = _run(toy, manager=m, on_chunk_end=count, **kw)  # finished: trains nothing
    assert loaded.trained_chunks == 0 and _same(full.state, loaded.state)


def test_no_retracing(toy):
    algo, state, act, _ = toy
    algo = algo._replace(step=chex.assert_max_traces(algo.step, n=1))
    for seed in (0, 1):
        P.train_online(
            jax.random.key(seed), ToyEnv(), algo, state, act, total_steps=12, batch_size=4
        )


def test_argument_checks(toy):
    with pytest.raises(ValueError, match="chunk_steps"):
        _run(toy, chunk_steps=5)
    with pytest.raises(ValueError, match="snapshot_every"):
        _run(toy, snapshot_every=3, on_snapshot=print)
    with pytest.raises(ValueError, match="start_steps"):
        _run(toy, start_steps=-1)
    with pytest.raises(ValueError, match="aux"):
        _run(toy, aux={"buffer": np.zeros(1)})
    assert isinstance(ToyEnv(), P.OnlineEnv)


# ------------------------------------------------------------------------------------------
# The ant controller: a tiny SAC run checks the chunked training, its resume and its cache.
# ------------------------------------------------------------------------------------------

TINY = dict(
    total_steps=64,
    chunk_steps=32,
    n_envs=4,
    start_steps=16,
    batch_size=8,
    hidden=8,
    episode_steps=5,  # every env times out in the same step: info then has no x_velocity
    command_every=3,
)


@pytest.fixture(scope="module")
def tiny_controller(tmp_path_factory):
    root = tmp_path_factory.mktemp("ant")
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound
    try:
        full = P.train_ant_controller(directory=root / "full", **TINY)
        # An interrupted run: the second chunk's checkpoint is lost, so a rerun resumes there.
        P.train_ant_controller(directory=root / "part", **TINY)
        shutil.rmtree(root / "part" / "steps" / "1")
        resumed = P.train_ant_controller(directory=root / "part", **TINY)
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    return root, full, resumed


def test_controller_resume_is_exact(tiny_controller):
    _, full, resumed = tiny_controller
    assert _same(full.params, resumed.params)
    np.testing.assert_array_equal(full.curve[:, 0], [32, 64])
    np.testing.assert_array_equal(full.curve[:, :2], resumed.curve[:, :2])
    feats = np.zeros((3, 29), np.float32)
    act = full(feats)
    assert act.shape == (3, 8) and act.dtype == np.float64 and np.all(np.abs(act) <= 1)


def test_controller_cache_and_refusals(tiny_controller):
    root, full, _ = tiny_controller
    spec = json.loads((root / "full" / "spec.json").read_text())
    assert spec == P.ant_controller_spec(**TINY)
    again = P.train_ant_controller(directory=root / "full", **TINY)  # loads, trains nothing
    np.testing.assert_array_equal(again.curve, full.curve)
    with pytest.raises(ValueError, match="directory"):
        P.train_ant_controller(directory=root / "full", **(TINY | {"hidden": 16}))
    with pytest.raises(ValueError, match="chunk_steps"):
        P.train_ant_controller(directory=root / "x", **(TINY | {"chunk_steps": 30}))
    with pytest.raises(ValueError, match="n_envs"):
        P.train_ant_controller(directory=root / "x", **(TINY | {"n_envs": 0}))
    with pytest.raises(ValueError, match="controller settings"):
        P.antmaze_dataset(10, controller_kwargs={"widht": 8}, path=root / "x.npz")


def test_controller_spec_names_the_default_folder():
    # The full study's controller folder: changing the defaults or the spec orphans it.
    from hexad.data import offline_rl as D

    assert P.ANT_CONTROLLER_DEFAULTS["total_steps"] == 400_000
    assert D.spec_tag(P.ant_controller_spec()) == "fe5fb2171e35"
    assert "terminate_flipped" not in P.ant_controller_spec(terminate_flipped=False)


def test_flipped_episodes_are_counted(monkeypatch, tmp_path):
    monkeypatch.setattr(A, "upright", lambda o: -np.ones(o.shape[0]))  # always on its back
    out = P.train_ant_controller(directory=tmp_path / "c", **TINY)
    np.testing.assert_array_equal(out.curve[:, 3], [32, 32])  # every step ends its episode


def test_antmaze_dataset_with_the_tiny_controller(tiny_controller, tmp_path):
    root, full, _ = tiny_controller
    ckw = TINY | {"directory": root / "full"}
    d = P.antmaze_dataset(20, seed=1, path=tmp_path / "am.npz", controller_kwargs=ckw)
    np.testing.assert_array_equal(d["meta/controller_curve"], full.curve)
    assert d["observations"].shape == (20, 29)
    again = P.antmaze_dataset(20, seed=1, path=tmp_path / "am.npz", controller_kwargs=ckw)
    np.testing.assert_array_equal(again["actions"], d["actions"])
