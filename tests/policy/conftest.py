"""Shared fixtures of the policy tests: one tiny generated Hopper data set for the session."""

import pytest

from hexad import policy
from hexad.data import offline_rl

# Settings the locomotion study can also name (its data_* fields), so the study's smoke test
# reads these cached files instead of training SAC again: a resumable run (chunk_steps, as the
# study generates its data). With 32 online steps and SAC's batch of 256 no update runs here;
# SAC's update is tested in test_online.py.
TINY_HOPPER = dict(
    total_steps=32,
    hidden=8,
    n_per_level=64,
    start_steps=16,
    snapshot_every=16,
    chunk_steps=16,
    eval_steps=10,
)


@pytest.fixture(scope="session")
def tiny_hopper_cache(tmp_path_factory):
    """``(HEXAD_CACHE root, {level: data}, settings)``: tiny Hopper levels generated once."""
    import jax

    root = tmp_path_factory.mktemp("hexad_cache")
    folder = root / "offline_rl"
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound, as below
    try:
        data = {
            lv: policy.locomotion_dataset("Hopper-v5", lv, path_dir=folder, **TINY_HOPPER)
            for lv in offline_rl.LOCOMOTION_LEVELS
        }
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    return root, data, TINY_HOPPER
