"""The study runner in a jax.distributed job (BUILD.md, "Several processes"): 2 local processes
on loopback run one study with ``--distributed``; process 0 alone writes ``--out``, each
process checkpoints into its own folder, and the summary is the one-process run's; processes
with different settings, and a coordinator that never answers, are clear errors."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import _jobs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("_dist_study.py")


def _job(
    tmp_path: Path, args_of, timeout_s: float = 240, study=(str(SCRIPT),), kill_when=None
) -> list[subprocess.CompletedProcess]:
    """Runs a study (the tiny one by default) as the 2 processes of one job; ``args_of(i)``
    gives process i's command-line arguments. Output goes to files (a worker blocked on a full
    pipe would stall the whole job). ``kill_when()``, polled while the job runs, kills process
    1 (a lost node) once it holds."""
    port, procs, logs = _jobs.port(), [], []
    tmp_path.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        env = _jobs.env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(i), HEXAD_DISTRIBUTED_TIMEOUT_S="60")  # fmt: skip
        out, err = tmp_path / f"p{i}.out", tmp_path / f"p{i}.err"
        logs.append((out, err))
        with open(out, "w") as o, open(err, "w") as e:
            cmd = [sys.executable, *study, "--distributed", "--no-progress", *args_of(i)]
            procs.append(subprocess.Popen(cmd, stdout=o, stderr=e, env=env, cwd=ROOT))
    deadline, lost = time.monotonic() + timeout_s, None
    while any(p.poll() is None for p in procs):
        if kill_when is not None and procs[1].poll() is None and kill_when():
            procs[1].kill()
            kill_when = None
        if lost is None and any(p.poll() not in (None, 0) for p in procs):
            lost = time.monotonic()  # a process died: the job is torn down, as a launcher does
        if lost is not None and time.monotonic() > lost + 5.0:
            for p in procs:
                p.kill()
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
                p.wait()
            pytest.fail("job timed out: " + " | ".join(e.read_text()[-800:] for _, e in logs))
        time.sleep(0.1)
    return [
        subprocess.CompletedProcess(p.args, p.returncode, o.read_text(), e.read_text())
        for p, (o, e) in zip(procs, logs, strict=True)
    ]


def test_two_processes_write_one_output_and_match_one_process(tmp_path):
    single = subprocess.run(
        [sys.executable, str(SCRIPT), "--no-progress", "--out", str(tmp_path / "one")],
        capture_output=True, text=True, env=_jobs.env(), cwd=ROOT, timeout=240,
    )  # fmt: skip
    assert single.returncode == 0, single.stderr[-2000:]
    out, ckpt = tmp_path / "two", tmp_path / "ckpt"
    runs = _job(tmp_path, lambda i: ["--out", str(out), "--ckpt", str(ckpt)])
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    two = json.loads((out / "summary.json").read_text())
    assert one["process_count"] == 1 and two["process_count"] == 2
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)
    # process 0 alone wrote the output folder: one metrics line per step, one plot
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "metrics.jsonl", "summary.json", "w.png"]
    )
    # every process printed the same summary and checkpointed into its own folder
    printed = [json.loads(r.stdout[r.stdout.index("{") :]) for r in runs]
    assert printed[0]["loss"] == printed[1]["loss"]
    folders = sorted(p.name for p in ckpt.glob("*/train/process*"))
    assert folders == ["process0", "process1"]


def test_a_job_that_lost_a_process_resumes_at_one_agreed_step(tmp_path):
    whole = _job(tmp_path / "a", lambda i: ["--out", str(tmp_path / "whole"), "--set", "steps=6"])
    assert all(r.returncode == 0 for r in whole), whole[0].stderr[-2000:]
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    args = ["--out", str(out), "--ckpt", str(ckpt), "--set", "steps=6", "--set", "crash_at=3"]
    crashed = _job(tmp_path / "b", lambda i: args)
    assert crashed[1].returncode == 3  # process 1 lost with its step 3 commit in flight
    resumed = _job(tmp_path / "c", lambda i: [*args, "--resume"])
    assert all(r.returncode == 0 for r in resumed), resumed[0].stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    # both restored step 2, the newest both hold; process 0 discarded its own step 3
    assert s["start"] == 3
    assert s["loss"] == json.loads((tmp_path / "whole" / "summary.json").read_text())["loss"]
    events = [json.loads(x) for f in ckpt.glob("*/train/process0/**/events.jsonl")
              for x in f.read_text().splitlines()]  # fmt: skip
    assert [e["steps"] for e in events if e["event"] == "discarded_steps"] == [[3]]


def test_processes_with_different_configs_are_refused_by_name(tmp_path):
    runs = _job(tmp_path, lambda i: ["--out", str(tmp_path / "o"), "--set", f"lr={0.1 + i}"])
    assert all(r.returncode != 0 for r in runs)
    assert any("differ in lr" in r.stderr for r in runs), runs[0].stderr[-2000:]
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_coordinator_that_never_answers_is_a_clear_error(tmp_path):
    env = _jobs.env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_jobs.port()}", JAX_NUM_PROCESSES="2",
               JAX_PROCESS_ID="1", HEXAD_DISTRIBUTED_TIMEOUT_S="5")  # fmt: skip
    r = subprocess.run([sys.executable, str(SCRIPT), "--distributed", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)  # fmt: skip
    assert r.returncode == 2
    assert "error: --distributed: could not join the job's coordinator 127.0.0.1:" in r.stderr


@pytest.mark.slow
def test_a_quick_study_that_lost_a_process_resumes_to_the_uninterrupted_summary(tmp_path):
    # prefmh_digits --quick checkpoints each finished rule: process 1 is killed once it has
    # committed its first, and the job's --resume gives the uninterrupted job's summary.
    # About 6 minutes on 2 cores (three jobs of two processes).
    study = ("-m", "experiments.prefmh_digits", "--quick")
    whole = _job(tmp_path / "a", lambda i: ["--out", str(tmp_path / "whole")], 900, study)
    assert all(r.returncode == 0 for r in whole), whole[0].stderr[-2000:]
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    args = ["--out", str(out), "--ckpt", str(ckpt)]

    def committed():  # process 1's first rule is durable: a step folder in its rules/ tier
        return any(p.is_dir() for p in ckpt.glob("*/rules/process1/**/0"))

    crashed = _job(tmp_path / "b", lambda i: args, 900, study, kill_when=committed)
    assert crashed[1].returncode != 0 and not (out / "summary.json").exists()
    resumed = _job(tmp_path / "c", lambda i: [*args, "--resume"], 900, study)
    assert all(r.returncode == 0 for r in resumed), resumed[0].stderr[-2000:]
    logged = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(x.get("resumed") for x in logged)  # the rules committed before were restored
    a = json.loads((tmp_path / "whole" / "summary.json").read_text())
    b = json.loads((out / "summary.json").read_text())
    drop = {"runtime_s"}
    assert {k: v for k, v in b.items() if k not in drop} == {
        k: v for k, v in a.items() if k not in drop}  # fmt: skip
