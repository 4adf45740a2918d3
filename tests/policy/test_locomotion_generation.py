"""The resumable locomotion data (generate_locomotion with chunk_steps): an interrupted SAC run
resumes at its last checkpointed chunk and gives exactly the data of an uninterrupted one;
chunk boundaries end trajectories; the cache names the run by its settings."""

import numpy as np
import pytest

from hexad import policy as P
from hexad.data import offline_rl as D

# SAC updates run from step 16 on (batch 8); two chunks of 16 steps, a snapshot per chunk.
TINY = dict(
    total_steps=32,
    hidden=8,
    n_per_level=24,
    start_steps=16,
    snapshot_every=16,
    chunk_steps=16,
    eval_steps=8,
    batch_size=8,
    episode_steps=6,  # episodes end inside chunks too
)


class Interrupted(Exception):
    pass


def _stop_at_second_chunk(it, desc):
    if "chunk 2/" in desc:
        raise Interrupted
    return it


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import jax

    root = tmp_path_factory.mktemp("loco")
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # compile-bound
    try:
        full = P.generate_locomotion("Hopper-v5", directory=root / "full", **TINY)
        with pytest.raises(Interrupted):  # killed after the first chunk's checkpoint
            P.generate_locomotion(
                "Hopper-v5", directory=root / "part", progress=_stop_at_second_chunk, **TINY
            )
        resumed = P.generate_locomotion("Hopper-v5", directory=root / "part", **TINY)
    finally:
        jax.config.update("jax_disable_most_optimizations", before)
    return root, full, resumed


def test_a_resumed_run_gives_the_data_of_an_uninterrupted_one(runs):
    _, full, resumed = runs
    np.testing.assert_array_equal(full["meta/snapshot_returns"], resumed["meta/snapshot_returns"])
    assert full["meta/snapshot_returns"].shape == (3,)  # steps 0, 16, 32
    for lv in D.LOCOMOTION_LEVELS:
        assert sorted(full[lv]) == sorted(resumed[lv])
        for k in full[lv]:
            np.testing.assert_array_equal(full[lv][k], resumed[lv][k], err_msg=f"{lv} {k}")


def test_chunk_boundaries_end_the_replay_trajectories(runs):
    _, full, _ = runs
    for lv, d in ((lv, full[lv]) for lv in D.LOCOMOTION_LEVELS):
        assert not np.any((d["terminals"] > 0) & (d["timeouts"] > 0)), lv
        assert d["terminals"][-1] + d["timeouts"][-1] == 1.0, lv
        # next_observations[t] == observations[t + 1] inside a trajectory: the chunk's reset
        # between two rows of one env would break this unless the chunk's end is a timeout
        cont = (d["terminals"][:-1] + d["timeouts"][:-1]) == 0
        np.testing.assert_allclose(d["next_observations"][:-1][cont], d["observations"][1:][cont])
    replay = full["medium-replay"]
    assert replay["observations"].shape[0] == max(int(replay["meta/snapshot_step"]), 4)


def test_the_checkpoint_folder_refuses_other_settings(runs):
    root, _, _ = runs
    with pytest.raises(ValueError, match="directory"):
        P.generate_locomotion("Hopper-v5", directory=root / "full", **(TINY | {"lr": 1e-2}))
    with pytest.raises(ValueError, match="chunk_steps"):
        P.generate_locomotion("Hopper-v5", **(TINY | {"chunk_steps": 24}))


def test_the_cached_data_set_names_its_resumable_run(tmp_path, fast_compile):
    folder = tmp_path / "offline_rl"
    d = P.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **TINY)
    sac = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert len(sac) == 1 and sac[0].startswith("hopper_sac_")
    assert (folder / sac[0] / "spec.json").is_file()
    files = sorted(p.name for p in folder.glob("*.npz"))
    assert len(files) == 4 and all(f.startswith("hopper_") for f in files)
    # a second call reads the files; another chunk size is another run, with other names
    again = P.locomotion_dataset("Hopper-v5", "medium", path_dir=folder, **TINY)
    np.testing.assert_array_equal(d["actions"], again["actions"])
    unchunked = {k: v for k, v in TINY.items() if k != "chunk_steps"}
    P.locomotion_dataset("Hopper-v5", "random", path_dir=folder, **unchunked)
    assert len(list(folder.glob("*.npz"))) == 8
