"""The benchmarks' peers and helpers: orbax's emergency CheckpointManager in two processes, the
fault worker's token passing, and the stall goal's report of ``kernels/cachex``."""

from __future__ import annotations

import subprocess

import pytest

from experiments import _cachex_faultworker as fw


def test_emergency_peer_saves_restores_and_survives_a_lost_local_tier(tmp_path):
    # Two jax.distributed processes: process 1 writes the local tier, process 0 the persistent.
    peer = fw.EmergencyPeer(tmp_path / "em", mib=0.25, timeout_s=120)
    try:
        for _ in range(2):
            stalls = peer.save()
            assert len(stalls) == 2 and all(s > 0 for s in stalls)
            persistent_s, local_s = peer.wait()
            assert persistent_s >= max(stalls[0], 0) and local_s >= stalls[1]
        assert sorted(p.name for p in (tmp_path / "em" / "local1").iterdir() if p.is_dir()) == [
            "0",
            "1",
        ]  # the local tier is written by the non-primary slice only
        assert not [p for p in (tmp_path / "em" / "local0").iterdir() if p.name.isdigit()]
        assert peer.restore() > 0
        peer.check()  # bit-exact, from the local tier
        peer.lose_local()
        assert not [p for p in (tmp_path / "em" / "local1").iterdir() if p.name.isdigit()]
        assert peer.restore() > 0
        peer.check()  # bit-exact, from the persistent tier
    finally:
        peer.close()


def test_emergency_summary_keys(tmp_path):
    s = fw.emergency_summary(tmp_path / "em", mib=0.25, n_saves=2)
    assert s["orbax_emergency_error"] is None
    for k in (
        "stall_ms",
        "stall_ms_median",
        "local_durable_s",
        "persistent_durable_s",
        "restore_local_s",
        "restore_local_lost_s",
    ):
        assert s[f"orbax_emergency_{k}"] > 0, k
    assert not (tmp_path / "em").exists()


def test_fault_worker_gets_its_token_from_the_environment_not_argv(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"], seen["env"] = cmd, kwargs.get("env") or {}
        return subprocess.CompletedProcess(cmd, -9, "", "")

    monkeypatch.setattr(fw.subprocess, "run", fake_run)
    monkeypatch.setattr(fw.time, "sleep", lambda s: None)
    token = "x" * 32
    fw.run_killed("kill_staging", tmp_path / "l", tmp_path / "p", ("127.0.0.1", 1), token, 2, 0)
    assert not any(token in str(a) for a in seen["cmd"])
    assert seen["env"]["HEXAD_CACHEX_TOKEN"] == token


def test_fault_worker_refuses_to_run_without_a_token(monkeypatch, tmp_path):
    monkeypatch.delenv("HEXAD_CACHEX_TOKEN", raising=False)
    with pytest.raises(SystemExit, match="HEXAD_CACHEX_TOKEN"):
        fw.main([str(tmp_path / "l"), str(tmp_path / "p"), "127.0.0.1", "1", "2", "x", "0"])


def test_stall_goal_report(monkeypatch):
    from kernels import cachex as kc

    def timed(ms):
        t = kc._Timed()
        t.times = [1.0] + [ms / 1e3] * 7  # a warm-up call, then 7 timed ones
        return t

    monkeypatch.setattr(
        kc,
        "_STALLS",
        [
            (4, timed(1.5), timed(0.5), 7),  # overhead 1 ms: met
            (32, timed(12.0), timed(8.0), 7),  # overhead 4 ms: missed
            (256, timed(120.0), timed(100.0), 7),  # overhead 20 ms, ratio 1.2: missed
            (256, timed(101.0), timed(100.0), 7),  # overhead 1 ms, ratio 1.01: met
        ],
    )
    monkeypatch.setattr(kc, "_LOOPS", {32: (timed(14.0), timed(11.0), 7)})
    rows = kc.stall_goal()
    assert [r["goal_met"] for r in rows] == [True, False, False, True]
    assert rows[0]["loop_overhead_ms"] is None  # no stall+steps row at 4 MiB
    assert rows[1]["loop_overhead_ms"] == pytest.approx(3.0)
    assert rows[1]["overhead_ms"] == pytest.approx(4.0)
    assert rows[2]["stall_over_copy"] == pytest.approx(1.2)
    assert rows[0]["copy_ms"] == pytest.approx(0.5) and rows[0]["stall_ms"] == pytest.approx(1.5)


def test_emergency_fault_run_names_an_unknown_fault(tmp_path):
    with pytest.raises(ValueError, match="fault: expected one of"):
        fw.emergency_fault_run("disk_full", tmp_path / "em", 2, 1.0)
    assert not (tmp_path / "em").exists()  # no job was started
