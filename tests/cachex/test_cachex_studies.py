"""Smoke tests of the CacheX studies at tiny sizes (summary keys and sanity of values)."""

import math

from experiments import cachex_bench


def test_cachex_bench_smoke(tmp_path):
    cfg = cachex_bench.STUDY.make_config(
        True, {"n_saves": 3, "state_mib": 0.25, "save_interval_s": 0.05, "hidden": 64}
    )
    s = cachex_bench.STUDY.execute(cfg, out_dir=tmp_path, show_progress=False)
    for k in (
        "stall_ratio_vs_orbax",
        "stage_ms_cachex",
        "replica_vs_pfs_durable_ratio",
        "replica_vs_pfs_durable_ratio_save",
        "replica_durable_gib_s_per_node",
        "variability_ratio_vs_orbax",
        "spread_iqr_s_orbax",
        "pfs_drained_fraction",
        "variability_save_cachex",
        "variability_save_orbax",
        "variability_t1t2_cachex",
        "variability_model_pfs",
        "health_max_durability_lag_steps",
    ):
        assert k in s and math.isfinite(s[k]), k
    assert s["curve_sigma"] == [0.5, 0.8]  # pfs_sigma and the quick curve
    assert len(s["curve_variability_ratio_vs_orbax"]) == 2
    assert s["pfs_drained_fraction"] > 0  # the last save always reaches the PFS
    assert s["health_drainer_restarts"] == 0 and s["health_drainer_down_samples"] == 0
    assert s["stage_ms_cachex"] <= s["stall_ms_cachex"]  # the copy is part of the blocked time
    # orbax's emergency CheckpointManager (two jax.distributed processes) as the peer
    assert s["orbax_emergency_error"] is None
    for k in ("stall_ms", "local_durable_s", "persistent_durable_s", "restore_local_lost_s"):
        assert s[f"orbax_emergency_{k}"] > 0, k
    assert (tmp_path / "write_time_cdf.png").exists()
    assert not (tmp_path / "storage").exists() or not any((tmp_path / "storage").iterdir())


def test_cachex_durability_smoke(tmp_path):
    from experiments import cachex_durability

    cfg = cachex_durability.STUDY.make_config(
        True,
        {
            "faults": (
                "kill_after_replica_ack",
                "bit_flip",
                "node_wiped",
                "kill_before_rename",
                "pfs_down",
                "rollback_reuse",
            ),
            "emergency_faults": ("node_lost", "bit_flip_local"),
            "n_good": 2,
            "model_saves": 200,
        },
    )
    s = cachex_durability.STUDY.execute(cfg, out_dir=tmp_path, show_progress=False)
    # orbax's emergency manager under two of the same faults: its persistent tier survives a
    # lost node; a flipped bit in its local tier comes back as data (it keeps no checksum)
    assert s["orbax_emergency_faults_tried"] == 2 and s["orbax_emergency_fault_runs"] == 2
    assert s["orbax_emergency_node_lost_exact"] == 1
    assert s["orbax_emergency_node_lost_steps_lost"] == 0
    assert s["orbax_emergency_bit_flip_local_corrupt"] == 1
    assert s["orbax_emergency_bit_flip_local_false_claims"] == 1
    assert s["orbax_emergency_steps_lost"] == 2  # n_good = 2: steps 0 and 1, none came back
    assert s["fault_runs"] == 6
    assert s["fault_corrupt_restores"] == 0
    assert s["fault_exact_restores"] == 6
    # the done-when of issue 47 item 6, here on a subset of the faults
    assert s["faults_tried"] == 6
    assert s["steps_lost"] == 0 and s["false_durable_claims"] == 0
    assert s["rollback_reuse_false_claims"] == 0 and s["rollback_reuse_exact"] == 1
    assert s["pfs_down_lost_vs_orbax"] == 0  # undrained steps stay pinned locally
    assert s["node_wiped_lost_vs_orbax"] < 0  # orbax alone loses the wiped node's steps
    assert s["pfs_down_max_lag_steps"] >= 1  # health(): the undrained steps are the exposure
    for k in ("c_star_p99_n64", "model_mu_fit", "t_stage_p99_s", "stage_path_chosen"):
        assert k in s
    # The fit recovers the PFS model's lognormal body (200 x 64 draws: SE(mu) = 0.004).
    assert abs(s["model_mu_fit"] - s["model_mu_true"]) < 0.03
    assert (tmp_path / "c_star.png").exists()
