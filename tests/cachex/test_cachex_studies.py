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
        "replica_vs_pfs_durable_ratio",
        "variability_ratio_vs_orbax",
        "stall_ms_cachex_uncontended",
        "pfs_drained_fraction",
    ):
        assert k in s and math.isfinite(s[k]), k
    assert s["pfs_drained_fraction"] > 0  # the last save always reaches the PFS
    assert (tmp_path / "write_time_cdf.png").exists()
    assert not (tmp_path / "storage").exists() or not any((tmp_path / "storage").iterdir())
