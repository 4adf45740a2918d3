"""Tests of the experiment runner (experiments/_runner.py) and the demo (experiments/demo.py)."""

import dataclasses
import json
import subprocess
import sys
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


def _run(cfg, ctx):
    for i in ctx.progress(range(3), desc="chunks"):
        ctx.log(step=i, loss=1.0 / (i + 1))
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1], [cfg.n, cfg.lr])
    ctx.save_plot(fig, "curve")
    return {"n": cfg.n, "lr": cfg.lr, "sizes": cfg.sizes}


STUDY = _runner.Study("toy", _Cfg, _run, quick={"n": 2})


def test_overrides_convert_each_type():
    cfg = _runner.apply_overrides(
        _Cfg(),
        _runner.parse_set(
            ["n=5", "lr=1e-3", "name=b", "flag=true", "sizes=3,4,5", "mode=y", "limit=none"]
        ),
    )
    assert cfg == _Cfg(5, 1e-3, "b", True, (3, 4, 5), "y", None)
    assert _runner.apply_overrides(_Cfg(), {"limit": "7"}).limit == 7


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
    assert "No study is registered" in demo.render_report({}, tmp_path)


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
