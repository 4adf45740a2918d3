"""Generation is deterministic and cache names are stable: two runs into two fresh cache
folders write the same file names with byte-identical contents."""

import hashlib

import jax
import numpy as np
import pytest

from hexad import policy as P
from hexad.data import cache_dir
from hexad.data import offline_rl as D

# A tiny Hopper run in which SAC updates do run (batch 8 from step 16 on).
TINY_LOCOMOTION = dict(
    total_steps=32,
    hidden=8,
    n_per_level=24,
    start_steps=16,
    snapshot_every=16,
    eval_steps=8,
    batch_size=8,
)


def _generate_all():
    D.pointmaze_dataset(64, seed=1, noise_std=0.3)
    for lv in D.LOCOMOTION_LEVELS:
        P.locomotion_dataset("Hopper-v5", lv, **TINY_LOCOMOTION)
    # AntMaze with a fixed linear controller (a trained one is tested in tests/policy).
    w = np.random.default_rng(0).normal(size=(29, 8)) / 10.0
    d = D.generate_antmaze(lambda f: np.tanh(f @ w), 40, seed=1, n_envs=2, episode_steps=30)
    D.save_offline_rl(D.offline_rl_path("antmaze_test", {"n": 40}), d)


def _digests(root):
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    roots = [tmp_path_factory.mktemp("cache_a"), tmp_path_factory.mktemp("cache_b")]
    mp = pytest.MonkeyPatch()
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound
    try:
        for root in roots:
            mp.setenv("HEXAD_CACHE", str(root))
            assert cache_dir() == root
            _generate_all()
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
        mp.undo()
    return [_digests(r) for r in roots]


def test_two_runs_write_identical_files(two_runs):
    a, b = two_runs
    assert len(a) == 6 and a == b


def test_cache_file_names_are_stable(two_runs):
    # The names are sha1 hashes of the settings (spec_tag); a change to a spec, to its
    # hashing or to a prefix would orphan every existing cache.
    names = sorted(two_runs[0])
    tag = "24e9c787eb70"
    assert names == sorted(
        [
            "offline_rl/antmaze_test_" + D.spec_tag({"n": 40}) + ".npz",
            f"offline_rl/hopper_expert_{tag}.npz",
            f"offline_rl/hopper_medium-replay_{tag}.npz",
            f"offline_rl/hopper_medium_{tag}.npz",
            f"offline_rl/hopper_random_{tag}.npz",
            "offline_rl/pointmaze_umaze_bb20c87398cd.npz",
        ]
    )
