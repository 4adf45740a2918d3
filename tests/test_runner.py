"""Tests of the experiment runner (experiments/_runner.py) and the demo (experiments/demo.py)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from experiments import _runner, demo


@dataclasses.dataclass(frozen=True)
class _Cfg:
    n: int = 10
    lr: float = 0.1
    name: str = "a"
    flag: bool = False
    sizes: tuple[int, ...] = (1, 2)
    mode: Literal["x", "y"] = "x"
    limit: int | None = None
    tags: tuple[str, ...] = ("a",)


def _run(cfg, ctx):
    for i in ctx.progress(range(3), desc="chunks"):
        ctx.log(step=i, loss=1.0 / (i + 1))
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [cfg.n, cfg.lr])
    ctx.save_plot(fig, "curve")
    return {"n": cfg.n, "lr": cfg.lr, "sizes": cfg.sizes}


STUDY = _runner.Study("toy", _Cfg, _run, quick={"n": 2})


@dataclasses.dataclass(frozen=True)
class _Ranged:
    num_chains: int = 4
    p: float = 0.5
    lr: float = 1e-3
    ks: tuple[int, ...] = (1, 3)
    burn_in: int = 10
    num_steps: int = 20
    mode: str = "a"

    def __post_init__(self):
        _runner.at_least(self, 1, "num_chains", "ks")
        _runner.in_unit(self, "p")
        _runner.positive(self, "lr")
        _runner.one_of(self, ("a", "b"), "mode")
        _runner.require(
            self.burn_in < self.num_steps, ("burn_in", "num_steps"), "burn_in must be < num_steps"
        )


RANGED = _runner.Study("ranged", _Ranged, _run, quick={"num_steps": 12})


def test_overrides_convert_each_type():
    cfg = _runner.apply_overrides(
        _Cfg(),
        _runner.parse_set(
            ["n=5", "lr=1e-3", "name=b", "flag=true", "sizes=3,4,5", "mode=y", "limit=none"]
        ),
    )
    assert cfg == _Cfg(5, 1e-3, "b", True, (3, 4, 5), "y", None)
    assert _runner.apply_overrides(_Cfg(), {"limit": "7"}).limit == 7
    for text in ('["p", "q"]', "('p', 'q')", "p,q"):
        assert _runner.apply_overrides(_Cfg(), {"tags": text}).tags == ("p", "q")


@pytest.mark.parametrize(
    ("item", "match"),
    [
        ("bogus=1", "unknown config key 'bogus'"),
        ("n=1.5", "n.*expected an int"),
        ("lr=abc", "lr.*expected a float"),
        ("flag=maybe", "flag.*expected a bool"),
        ("mode=z", "mode.*expected one of"),
        ("lr=nan", "lr.*finite"),
    ],
)
def test_overrides_reject_bad_values(item, match):
    with pytest.raises(ValueError, match=match):
        _runner.apply_overrides(_Cfg(), _runner.parse_set([item]))


def test_parse_set_needs_key_value():
    with pytest.raises(ValueError, match="key=value"):
        _runner.parse_set(["novalue"])


def test_study_requires_frozen_config():
    @dataclasses.dataclass
    class Mutable:
        n: int = 1

    with pytest.raises(TypeError, match="frozen"):
        _runner.Study("bad", Mutable, _run)
    with pytest.raises(ValueError, match="unknown config keys"):
        _runner.Study("bad", _Cfg, _run, quick={"nope": 1})


def test_main_writes_contract_files(tmp_path, capsys):
    out = tmp_path / "run"
    summary = STUDY.main(["--quick", "--out", str(out), "--seed", "3", "--set", "lr=0.5"])
    assert summary["n"] == 2 and summary["lr"] == 0.5 and summary["sizes"] == [1, 2]
    config = json.loads((out / "config.json").read_text())
    prov = config.pop("provenance")
    # Called from Python, not as `python -m experiments.toy`: the equivalent command is stored.
    assert prov["command"] == "python -m experiments.toy --quick --seed 3"
    assert prov["commit"] is None or len(prov["commit"]) == 40  # None outside a git clone
    assert prov["machine"]["cores"] >= 1 and prov["machine"]["backend"] == "cpu"
    assert prov["date"].endswith("Z")
    assert config == {
        "study": "toy",
        "seed": 3,
        "quick": True,
        "config": {
            "n": 2,
            "lr": 0.5,
            "name": "a",
            "flag": False,
            "sizes": [1, 2],
            "mode": "x",
            "limit": None,
            "tags": ["a"],
        },
    }
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
    assert json.loads((out / "summary.json").read_text())["n"] == 2
    assert (out / "curve.png").stat().st_size > 0
    assert '"n": 2' in capsys.readouterr().out


def test_main_exits_2_on_unknown_key(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        STUDY.main(["--out", str(tmp_path), "--set", "bogus=1"])
    assert e.value.code == 2
    assert "unknown config key 'bogus'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("num_chains=-4", "--set num_chains=-4: num_chains must be >= 1, got -4"),
        ("p=1.5", "--set p=1.5: p must be in [0, 1], got 1.5"),
        ("lr=0", "--set lr=0: lr must be > 0, got 0.0"),
        ("ks=1,0", "--set ks=1,0: each entry of ks must be >= 1, got (1, 0)"),
        ("mode=c", "--set mode=c: mode must be one of ['a', 'b'], got 'c'"),
        ("burn_in=12", "--set burn_in=12: burn_in must be < num_steps"),  # quick: 12 steps
    ],
)
def test_main_exits_2_on_a_value_out_of_range(tmp_path, capsys, item, message):
    with pytest.raises(SystemExit) as e:
        RANGED.main(["--quick", "--out", str(tmp_path / "run"), "--set", item])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not (tmp_path / "run").exists()  # nothing ran


def test_ranges_are_checked_however_the_config_is_built():
    with pytest.raises(_runner.ConfigError, match="num_chains must be >= 1") as e:
        _Ranged(num_chains=0)
    assert e.value.keys == ("num_chains",)
    with pytest.raises(_runner.ConfigError, match=r"--set num_steps=5: burn_in must be < num_st"):
        RANGED.make_config(False, {"num_steps": 5})  # a cross-field check names the --set key
    assert RANGED.make_config(True, {"p": "1", "ks": "2"}) == _Ranged(p=1.0, ks=(2,), num_steps=12)


def test_in_range_bounds_open_and_closed():
    @dataclasses.dataclass(frozen=True)
    class C:
        x: float = 0.0

    _runner.in_range(C(), 0, 1, "x")
    with pytest.raises(_runner.ConfigError, match=r"x must be in \(0, 1\)"):
        _runner.in_range(C(), 0, 1, "x", lo_open=True, hi_open=True)
    _runner.at_least(C(x=None), 1, "x")  # an optional field left unset is not checked


def test_every_study_config_passes_its_own_checks():
    # Cheap: builds the configs only. Each study's Config checks its ranges in __post_init__.
    import importlib

    names = demo.registered_studies()
    assert len(names) >= 14
    for name in names:
        study = importlib.import_module(f"experiments.{name}").STUDY
        cfg = study.make_config(False)
        assert hasattr(type(cfg), "__post_init__"), f"{name}: its Config has no range checks"
        study.make_config(True)


@pytest.mark.parametrize(
    ("study", "item", "key"),
    [
        ("prefmh_mixture", "num_chains=-4", "num_chains"),
        ("prefmh_mixture", "ar_shrink=1", "ar_shrink"),
        ("policy_pointmaze", "alphas=0,1.5", "alphas"),
        ("policy_antmaze", "controller_steps=0", "controller_steps"),
        ("rwefm_synthetic", "lr=-1e-3", "lr"),
        ("cvxclust_phase", "label_noise=2", "label_noise"),
        ("cachex_durability", "runs_per_fault=0", "runs_per_fault"),
        ("backdoor_dtb", "poison_rate=1.5", "poison_rate"),
        ("backdoor_dtb", "train_pad=-1", "train_pad"),
    ],
)
def test_study_cli_exits_2_naming_the_key(study, item, key):
    # A real study's CLI, in a subprocess: the range error comes before any work.
    proc = subprocess.run(
        [sys.executable, "-m", f"experiments.{study}", "--quick", "--set", item],
        capture_output=True,
        text=True,
        cwd=_runner.REPO_ROOT,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --set {item}: ") and key in last and "must be" in last


def test_to_jsonable_handles_arrays_and_nonfinite():
    import numpy as np

    got = _runner.to_jsonable({"a": np.float32(1.5), "b": np.arange(3), "c": float("nan")})
    assert got == {"a": 1.5, "b": [0, 1, 2], "c": None}


def test_demo_discovers_by_parsing(tmp_path):
    (tmp_path / "has_study.py").write_text("import nothing_importable\nSTUDY = object()\n")
    (tmp_path / "plain.py").write_text("X = 1\n")
    (tmp_path / "_private.py").write_text("STUDY = 1\n")
    assert demo.registered_studies(tmp_path) == ["has_study"]


def test_demo_report_lists_summaries(tmp_path):
    report = demo.render_report(
        {"toy": {"status": "ok", "seconds": 1.0, "summary": {"acc": 0.5}, "plots": []}}, tmp_path
    )
    assert "| toy | ok | 1.0 |" in report and "| acc | 0.5 |" in report
    assert "| total | 1/1 ok | 1.0 |" in report
    assert "No study is registered" in demo.render_report({}, tmp_path)
    failed = {"status": "failed (exit 1)", "seconds": 2.0, "summary": {}, "plots": [],
              "cache": "x", "stderr_tail": ["Traceback", "ValueError: boom"],
              "command": "cd /r && python -m experiments.toy --quick"}  # fmt: skip
    report = demo.render_report({"toy": failed}, tmp_path)
    assert "ValueError: boom" in report and "python -m experiments.toy --quick" in report


def test_demo_says_what_a_study_generated_in_the_cache(tmp_path):
    root = tmp_path / "cache"
    before = demo.snapshot(root)
    assert before == {}
    (root / "offline_rl" / "ctrl").mkdir(parents=True)
    (root / "offline_rl" / "ctrl" / "a.bin").write_bytes(b"x" * 2048)
    (root / "offline_rl" / "ctrl" / "b.bin").write_bytes(b"y")
    (root / "offline_rl" / "set.npz").write_bytes(b"z")
    after = demo.snapshot(root)
    text = demo.describe_cache(before, after)
    assert text.startswith("generated 3 files") and "offline_rl/ctrl (2 files)" in text
    assert "offline_rl/set.npz" in text
    assert demo.describe_cache(after, after).startswith("nothing generated")


def test_demo_runs_a_failing_study_and_says_how_to_rerun_it(tmp_path, monkeypatch, capsys):
    pkg = tmp_path / "experiments"
    monkeypatch.setattr(demo, "registered_studies", lambda: ["broken"])
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))

    def fake_run(cmd, timeout):
        assert cmd[1:4] == ["-m", "experiments.broken", "--quick"]
        (tmp_path / "cache").mkdir()
        (tmp_path / "cache" / "made.npz").write_bytes(b"1")
        return "failed (exit 1)", ["Traceback (most recent call last):", "RuntimeError: boom"]

    monkeypatch.setattr(demo, "run_study", fake_run)
    assert demo.main(["--out", str(pkg)]) == 1
    out, err = capsys.readouterr()
    assert "RuntimeError: boom" in err and "rerun it alone: cd " in err
    assert "experiments.broken --quick --no-progress --out" in err
    assert "cache: generated 1 file," in out and "total" in out
    report = (pkg / "report.md").read_text()
    assert "RuntimeError: boom" in report and "generated 1 file," in report


def test_demo_run_study_reports_exit_status_and_stderr_tail():
    ok, _ = demo.run_study([sys.executable, "-c", "pass"], timeout=60)
    assert ok == "ok"
    code = "import sys; print('line1', file=sys.stderr); sys.exit(3)"
    status, tail = demo.run_study([sys.executable, "-c", code], timeout=60)
    assert status == "failed (exit 3)" and tail == ["line1"]
    status, _ = demo.run_study([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert status == "timed out after 1 s"


def test_demo_cli_help():
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.demo", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "report.md" in proc.stdout


def test_checkpoint_root_follows_env(tmp_path, monkeypatch):
    seen = {}

    def run(cfg, ctx):
        seen["ckpt"] = ctx.checkpoint_dir
        return {}

    study = _runner.Study("toyckpt", _Cfg, run)
    monkeypatch.setenv("HEXAD_CHECKPOINTS", str(tmp_path / "ck"))
    study.execute(study.make_config(True, {}), out_dir=tmp_path / "r1", show_progress=False)
    assert seen["ckpt"] == tmp_path / "ck" / "toyckpt" / "r1"
    monkeypatch.delenv("HEXAD_CHECKPOINTS")
    assert _runner.checkpoint_root() == _runner.REPO_ROOT / "checkpoints"
    study.execute(
        study.make_config(True, {}),
        out_dir=tmp_path / "r2",
        checkpoint_dir=tmp_path / "mine",
        show_progress=False,
    )
    assert seen["ckpt"] == tmp_path / "mine"


def test_relative_out_and_checkpoint_dirs_are_made_absolute(tmp_path, monkeypatch):
    # orbax refuses relative checkpoint paths: `--out results/x` must reach a study absolute.
    seen = {}

    def run(cfg, ctx):
        seen["out"], seen["ckpt"] = ctx.out_dir, ctx.checkpoint_dir
        return {}

    study = _runner.Study("toyrel", _Cfg, run)
    monkeypatch.chdir(tmp_path)
    study.execute(
        study.make_config(True, {}),
        out_dir=Path("rel/out"),
        checkpoint_dir=Path("rel/ck"),
        show_progress=False,
    )
    assert seen["out"].is_absolute() and seen["ckpt"].is_absolute()
    assert seen["out"] == (tmp_path / "rel" / "out").resolve()
    assert (tmp_path / "rel" / "out" / "summary.json").is_file()


def _count_chunk():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def chunk(state, key):
        x = state + jax.random.uniform(key, ())
        return x, {"x": jnp.stack([state, x])}

    return chunk


def test_train_chunks_resumes_to_the_uninterrupted_result(tmp_path):
    import jax

    chunk, key = _count_chunk(), jax.random.key(3)
    ctx = _runner.Context("t", tmp_path, checkpoint_dir=tmp_path / "ck", show_progress=False)
    whole, info = ctx.train_chunks(chunk, jax.numpy.zeros(()), 5, key, tag="a", ckpt_every=2)
    # An interrupted run: 3 of 5 chunks, then --resume finishes from the durable step.
    ctx2 = _runner.Context("t", tmp_path, checkpoint_dir=tmp_path / "ck2", show_progress=False)
    ctx2.train_chunks(chunk, jax.numpy.zeros(()), 3, key, tag="b", ckpt_every=1)
    ctx2.resume = True
    seen = []
    resumed, info2 = ctx2.train_chunks(
        chunk,
        jax.numpy.zeros(()),
        5,
        key,
        tag="b",
        ckpt_every=1,
        on_chunk=lambda c, s: seen.append(c),
    )
    assert seen == [3, 4]
    assert float(resumed) == float(whole) and float(info2["x"][-1]) == float(info["x"][-1])
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [d["chunk"] for d in lines if d["stage"] == "a"] == [0, 1, 2, 3, 4]
    assert lines[0]["x"] == float(jax.random.uniform(jax.random.fold_in(key, 0), ()))


def test_a_fresh_run_replaces_the_checkpoints_of_an_earlier_run(tmp_path):
    # Without --resume, a second run into the same checkpoint folder starts over and saves its
    # own steps (CacheX refuses a step at or below one already saved, so the old ones must go).
    import jax

    chunk, key = _count_chunk(), jax.random.key(3)
    for _ in range(2):
        ctx = _runner.Context("t", tmp_path, checkpoint_dir=tmp_path / "ck", show_progress=False)
        seen = []
        ctx.train_chunks(chunk, jax.numpy.zeros(()), 2, key, tag="a", ckpt_every=1,
                         on_chunk=lambda c, s: seen.append(c))  # fmt: skip
        assert seen == [0, 1]


def test_train_chunks_rejects_bad_counts(tmp_path):
    import jax

    ctx = _runner.Context("t", tmp_path, show_progress=False)
    with pytest.raises(ValueError, match="n_chunks: expected an int >= 1"):
        ctx.train_chunks(_count_chunk(), jax.numpy.zeros(()), 0, jax.random.key(0), tag="a")
    with pytest.raises(ValueError, match="ckpt_every"):
        ctx.train_chunks(
            _count_chunk(), jax.numpy.zeros(()), 2, jax.random.key(0), tag="a", ckpt_every=0
        )


def test_mean_se_is_the_mean_of_per_group_standard_errors():
    assert _runner.mean_se([1.0, 3.0, 2.0, 2.0], 2) == 0.5
    assert _runner.mean_se([1.0, 2.0], 2) is None


def test_provenance_keeps_no_machine_paths(monkeypatch):
    root = str(_runner.REPO_ROOT)
    argv = ["experiments/toy.py", "--out", f"{root}/results/toy", "--ckpt=/scratch/u/ck", "--quick"]
    monkeypatch.setattr(sys, "argv", argv)
    prov = _runner.provenance("toy")
    assert prov["command"] == (
        "python -m experiments.toy --out results/toy --ckpt=.../u/ck --quick"
    )


def test_resume_restores_only_checkpoints_of_the_same_settings(tmp_path):
    # A study whose one checkpointed part records the settings it was trained with: --resume
    # restores it under the same seed and settings, or when only a resume_shared field (one
    # that picks the parts to run) differs; any other setting or seed starts afresh.
    import numpy as np

    def run(cfg, ctx):
        with ctx.checkpointed("part", {"n": np.zeros(())}) as (start, state, save):
            if start == 0:
                state = {"n": np.asarray(float(cfg.n))}
                save(0, state)
        return {"restored": start > 0, "trained_n": float(state["n"])}

    study = _runner.Study("toyresume", _Cfg, run, resume_shared=("sizes",))

    def go(resume, seed=0, **over):
        cfg = study.make_config(False, over)
        kw = {"checkpoint_dir": tmp_path / "ck", "show_progress": False, "seed": seed}
        out = study.execute(cfg, out_dir=tmp_path / "out", resume=resume, **kw)
        return out["restored"], out["trained_n"]

    assert go(False) == (False, 10.0)
    assert go(True) == (True, 10.0)
    assert go(True, sizes=(3,)) == (True, 10.0)  # a resume_shared field: the same checkpoint
    assert go(True, n=11) == (False, 11.0)  # other settings: trained afresh, not restored
    assert go(True, seed=1) == (False, 10.0)
    assert go(True, n=11) == (True, 11.0)  # its own settings' checkpoint, written just above
    with pytest.raises(ValueError, match="resume_shared: unknown config keys"):
        _runner.Study("bad", _Cfg, run, resume_shared=("nope",))


def test_memo_keeps_types_and_refuses_a_bad_file(tmp_path):
    import numpy as np

    ctx = _runner.Context("t", tmp_path, checkpoint_dir=tmp_path / "ckpt", settings="s")
    fig = {"acc": np.float32(0.5), "iters": np.int64(7), "certified": np.bool_(True)}
    out = ctx.memo("a", lambda: fig)
    assert out == {"acc": 0.5, "iters": 7, "certified": True}
    assert [type(v) for v in out.values()] == [float, int, bool]
    ctx.resume = True
    assert ctx.memo("a", lambda: {"acc": 1.0}) == out  # restored, with the same types
    path = tmp_path / "ckpt" / "s" / "a.json"
    for bad in ("{not json", '{"acc": "0.5"}', "[1, 2]", "\udcff"):
        path.write_text(bad, encoding="utf-8", errors="surrogateescape")
        with pytest.raises(ValueError, match="a.json"):
            ctx.memo("a", lambda: {"acc": 1.0})
    # without --resume the figures are computed again; without a folder nothing is kept
    ctx.resume = False
    assert ctx.memo("a", lambda: {"acc": 1.0}) == {"acc": 1.0}
    bare = _runner.Context("t", tmp_path)
    assert bare.memo("a", lambda: {"x": 2}) == {"x": 2}


@dataclasses.dataclass(frozen=True)
class _Tuples:
    xs: tuple[float, ...] = (0.0, 1.0)
    pair: tuple[float, float] = (0.0, 1.0)
    ns: tuple[int, ...] = (1,)
    words: tuple[str, ...] = ("a",)

    def __post_init__(self):
        _runner.at_least(self, 0, "xs", "pair")


TUPLES = _runner.Study("tuples", _Tuples, lambda cfg, ctx: {"xs": cfg.xs})


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("xs=0,inf", "config key 'xs': expected finite numbers, got (0.0, inf)"),
        ("xs=nan,1", "config key 'xs': expected finite numbers, got (nan, 1.0)"),
        ("pair=(1, -inf)", "config key 'pair': expected finite numbers, got (1.0, -inf)"),
        ("xs=0,,2", "--set xs='0,,2': expected comma-separated values, got an empty item"),
        ("ns=1,,", "--set ns='1,,': expected comma-separated values, got an empty item"),
        ("ns=(,1)", "--set ns='(,1)': expected comma-separated values, got an empty item"),
        ("words=a,,b", "--set words='a,,b': expected comma-separated values, got an empty"),
        ("xs=", "--set xs='': expected at least one comma-separated value, got none"),
        ("xs=()", "--set xs='()': expected at least one comma-separated value, got none"),
        ("ns=[ ]", "--set ns='[ ]': expected at least one comma-separated value, got none"),
    ],
)
def test_tuple_values_must_be_finite_nonempty_items(tmp_path, capsys, item, message):
    with pytest.raises(ValueError) as e:
        _runner.apply_overrides(_Tuples(), _runner.parse_set([item]))
    assert str(e.value).startswith(message)
    with pytest.raises(SystemExit) as e:
        TUPLES.main(["--out", str(tmp_path / "run"), "--no-progress", "--set", item])
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {message}")
    assert not (tmp_path / "run").exists()  # nothing ran


def test_tuple_values_as_python_writes_them():
    # one trailing comma is allowed, as in Python's (3,)
    for text in ("0.5,2", "(0.5, 2)", "[0.5, 2,]", "0.5, 2,"):
        assert _runner.apply_overrides(_Tuples(), {"xs": text}).xs == (0.5, 2.0)
    assert _runner.apply_overrides(_Tuples(), {"ns": "(3,)"}).ns == (3,)
    with pytest.raises(ValueError, match="config key 'xs': expected finite numbers"):
        _runner.apply_overrides(_Tuples(), {"xs": (1.0, float("inf"))})  # from Python


@pytest.mark.parametrize("seed", ["-1", str(2**32), str(2**40)])
def test_main_exits_2_on_a_seed_out_of_range(tmp_path, capsys, seed):
    with pytest.raises(SystemExit) as e:
        STUDY.main(["--out", str(tmp_path / "run"), "--no-progress", "--seed", seed])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --seed") and seed in err and "2**32" in err
    assert not (tmp_path / "run").exists()  # nothing ran, no config.json
    with pytest.raises(ValueError, match="seed: expected an int in"):
        STUDY.execute(_Cfg(), out_dir=tmp_path / "run", seed=int(seed), show_progress=False)
    assert not (tmp_path / "run").exists()


def test_largest_seed_runs(tmp_path):
    STUDY.main(["--out", str(tmp_path), "--no-progress", "--seed", str(2**32 - 1)])
    assert json.loads((tmp_path / "config.json").read_text())["seed"] == 2**32 - 1


def test_resume_needs_out_or_ckpt(tmp_path, monkeypatch, capsys):
    # without --out and --ckpt the checkpoint folder is named by a fresh timestamp: nothing
    # to resume from. (REPO_ROOT points into tmp_path, so a run that starts writes there.)
    monkeypatch.setattr(_runner, "REPO_ROOT", tmp_path)
    with pytest.raises(SystemExit) as e:
        STUDY.main(["--quick", "--resume", "--no-progress"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume needs --out DIR") and "--ckpt DIR" in err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="resume: needs out_dir or checkpoint_dir"):
        STUDY.execute(_Cfg(), resume=True, show_progress=False)
    assert not (tmp_path / "runs").exists()
    STUDY.main(["--resume", "--out", str(tmp_path / "a"), "--no-progress"])  # either will do
    STUDY.main(["--resume", "--ckpt", str(tmp_path / "ck"), "--no-progress"])
    assert len(list((tmp_path / "runs" / "toy").iterdir())) == 1


def _crashing_run(cfg, ctx):
    for i in range(cfg.n):
        ctx.log(step=i)
    if cfg.flag:
        raise RuntimeError("crash")
    return {"n": cfg.n}


def test_a_run_into_an_old_out_folder_leaves_none_of_the_old_results(tmp_path):
    study = _runner.Study("toycrash", _Cfg, _crashing_run)

    def go(resume=False, **over):
        cfg = study.make_config(False, {k: str(v) for k, v in over.items()})
        kw = {"checkpoint_dir": tmp_path / "ck", "show_progress": False, "resume": resume}
        return study.execute(cfg, out_dir=tmp_path / "out", **kw)

    def steps():
        lines = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["step"] for x in lines]

    go(n=3)
    assert steps() == [0, 1, 2]
    go(n=2)  # a new run: its own metrics, not appended to the old ones
    assert steps() == [0, 1]
    with pytest.raises(RuntimeError, match="crash"):
        go(n=1, flag=True)  # a crashed run leaves no summary of an earlier run
    assert steps() == [0]
    assert not (tmp_path / "out" / "summary.json").exists()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["config"]["n"] == 1
    go(resume=True, n=2)  # --resume keeps the earlier lines and appends
    assert steps() == [0, 0, 1]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["n"] == 2
    with pytest.raises(RuntimeError, match="crash"):
        go(resume=True, n=1, flag=True)  # ... but no summary outlives a crashed resume either
    assert not (tmp_path / "out" / "summary.json").exists()


def test_memo_writers_of_one_tag_do_not_collide(tmp_path, monkeypatch):
    # Another process computing the same tag writes its file while this one is between its
    # write and its rename (simulated by a nested memo inside the first write): each must
    # rename its own temporary file (a shared name made the outer rename fail).
    ctx = _runner.Context("t", tmp_path, checkpoint_dir=tmp_path / "ck")
    real = Path.write_text
    nested = []

    def write_text(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        if not nested:
            nested.append(1)
            other = _runner.Context("t", tmp_path, checkpoint_dir=tmp_path / "ck")
            assert other.memo("a", lambda: {"x": 2.0}) == {"x": 2.0}
        return out

    monkeypatch.setattr(Path, "write_text", write_text)
    assert ctx.memo("a", lambda: {"x": 1.0}) == {"x": 1.0}
    assert json.loads((tmp_path / "ck" / "a.json").read_text()) == {"x": 1.0}
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["a.json"]  # no temporary left
