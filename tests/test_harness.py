"""Tests of the kernel bench harness (kernels/_harness.py) and its CLI."""

import json
import subprocess
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

from kernels import __main__ as kernels_main
from kernels import _harness


@pytest.fixture(scope="module")
def roofline():
    return _harness.Roofline(peak_flops=1e11, bandwidth=1e10, backend="cpu")


def test_time_call_counts_runs_and_compiles():
    calls = []

    def f(x):
        calls.append(1)  # runs at trace time only
        return x * 2

    compile_s, times = _harness.time_call(f, (jnp.ones(4),), jit=True, repeats=3, warmup=1)
    assert compile_s is not None and compile_s > 0
    assert len(times) == 5  # at least five timed runs, even if fewer are asked for
    assert len(calls) == 1  # traced once: the compiled executable is what gets timed


def test_setup_runs_before_every_call_and_is_not_timed():
    import time

    log = []

    def setup():
        log.append("setup")
        time.sleep(0.2)  # would dominate a 1 ms call if it were timed

    def f():
        log.append("call")
        time.sleep(0.001)

    _, times = _harness.time_call(f, (), jit=False, repeats=5, warmup=1, setup=setup)
    assert log == ["setup", "call"] * 6  # one warm-up, five timed calls
    assert max(times) < 0.2


def test_time_case_ratio_against_peer(roofline):
    x = np.ones((64, 64), np.float32)
    case = _harness.Case(
        name="t/sleepy",
        fn=lambda v: v,
        args=(x,),
        jit=False,
        flops=1e6,
        bytes=1e5,
        items=10,
        unit="things",
        peer=lambda v: (v @ v) @ v,
        peer_jit=False,
        peer_name="numpy",
    )
    row = _harness.time_case(case, roofline)
    assert row.runs >= 5 and row.compile_s is None
    assert row.ratio == pytest.approx(row.median_s / row.peer_median_s)
    assert row.throughput == pytest.approx(10 / row.median_s)
    assert row.roofline_frac == pytest.approx(max(1e6 / 1e11, 1e5 / 1e10) / row.median_s)


def test_peer_calls_interleave_with_ours_unless_the_case_opts_out(roofline):
    # Ours and the peer alternate (a drift of the host falls on both); each side's setup runs
    # before each of its own calls. interleave=False times one side after the other.
    def case(log, interleave):
        def side(name):
            return lambda: log.append(name)

        return _harness.Case(
            name="t/order",
            fn=side("f"),
            jit=False,
            peer=side("p"),
            peer_jit=False,
            repeats=5,
            warmup=1,
            setup=side("s"),
            peer_setup=side("ps"),
            interleave=interleave,
        )

    log = []
    row = _harness.time_case(case(log, True), roofline)
    assert log == ["s", "f", "ps", "p"] * 6 and row.runs == 5  # one warm-up, five timed each
    log = []
    _harness.time_case(case(log, False), roofline)
    assert log == ["s", "f"] * 6 + ["ps", "p"] * 6


def test_roofline_measurement_is_sane():
    r = _harness.measure_roofline(quick=True)
    # Any machine that runs JAX does more than 100 MFLOP/s and 100 MB/s, and no CPU or
    # single accelerator here reaches 10 PFLOP/s or 100 TB/s: a unit slip would break these.
    assert 1e8 < r.peak_flops < 1e16
    assert 1e8 < r.bandwidth < 1e14
    assert r.bound(2e9, 0) == pytest.approx(2e9 / r.peak_flops)


def test_table_and_jsonl(tmp_path, roofline):
    row = _harness.time_case(
        _harness.Case(name="t/id", fn=lambda v: v + 1, args=(jnp.ones(3),)), roofline
    )
    table = _harness.format_table([row])
    assert "t/id" in table and "ratio" in table.splitlines()[0]
    path = tmp_path / "rows.jsonl"
    _harness.write_jsonl([row, row], path, {"jax": "x"})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(lines) == 2 and lines[0]["name"] == "t/id" and lines[0]["jax"] == "x"


def test_cli_lists_and_rejects_unknown(capsys):
    assert kernels_main.main(["--list"]) == 0
    assert "roofline" in capsys.readouterr().out.split()
    with pytest.raises(SystemExit):
        kernels_main.main(["no_such_kernel"])


def _cli_quick(tmp_path, module: str, timeout: float) -> tuple[str, list[dict]]:
    """``python -m kernels <module> --quick --json``: its table and its JSON rows."""
    out = tmp_path / "bench.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "kernels", module, "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, [json.loads(x) for x in out.read_text().splitlines()]


def test_cli_roofline_quick(tmp_path):
    table, rows = _cli_quick(tmp_path, "roofline", 300)
    assert "roofline/matmul" in table and "GFLOP/s" in table
    assert {r["name"].split(" ")[0] for r in rows} == {"roofline/matmul", "roofline/stream"}
    assert all(r["median_s"] > 0 and r["ratio"] > 0 for r in rows)


def test_every_kind_of_bound(roofline):
    x = np.ones((32, 32), np.float32)

    def case(**kw):
        return _harness.Case(name="t/b", fn=lambda v: v + 1, args=(x,), jit=False, **kw)

    fixed = _harness.time_case(case(bound_s=1e-3, bound_note="disk"), roofline)
    assert fixed.bound_s == 1e-3 and fixed.bound_note == "disk"
    assert fixed.bound_frac == pytest.approx(1e-3 / fixed.median_s)

    def ref(v):
        return v * 2

    work = _harness.time_case(case(bound_fn=ref, bound_work=3.0, bound_jit=False), roofline)
    assert work.bound_s > 0 and work.bound_note == "3 x ref"

    peer = _harness.time_case(case(peer=ref, peer_jit=False, bound_fn=ref), roofline)
    assert peer.bound_s == pytest.approx(peer.peer_median_s)  # reused, not timed again

    roof = _harness.time_case(case(flops=1e6, bytes=1e5), roofline)
    assert roof.bound_s == pytest.approx(max(1e6 / 1e11, 1e5 / 1e10))
    assert roof.bound_note == "roofline" and roof.bound_frac == pytest.approx(roof.roofline_frac)

    none = _harness.time_case(case(), roofline)
    assert none.bound_s is None and none.bound_frac is None
    assert "of bound" in _harness.format_table([fixed, none]).splitlines()[0]


@pytest.fixture
def stub_timing(monkeypatch):
    """Stubs the roofline measurement and ``time_case`` so that a CLI test runs in seconds.

    Returns the list of the names of the cases timed, in order.
    """
    timed = []

    def time_case(case, roofline):
        timed.append(case.name)
        return _harness.Row(case.name, "", "f32", "cpu", None, 1.0, 1.0, 5, 1.0, "x", None, 1.0)

    monkeypatch.setattr(
        _harness, "measure_roofline", lambda quick=False: _harness.Roofline(1e12, 1e11, "cpu")
    )
    monkeypatch.setattr(_harness, "time_case", time_case)
    return timed


@pytest.mark.parametrize(
    "names", [["roofline", "roofline/matmul"], ["roofline/matmul", "roofline"]]
)
def test_cli_module_name_beside_a_prefix_selects_the_whole_module(stub_timing, capsys, names):
    assert kernels_main.main([*names, "--quick"]) == 0
    assert [n.split(" ")[0] for n in stub_timing] == ["roofline/matmul", "roofline/stream"]


@pytest.mark.parametrize("names", [["roofline/mtamul"], ["roofline/matmul", "roofline/mtamul"]])
def test_cli_rejects_a_prefix_that_matches_no_case_before_timing(stub_timing, capsys, names):
    with pytest.raises(SystemExit) as exc:
        kernels_main.main([*names, "--quick"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'roofline/mtamul'" in err
    assert "roofline/matmul" in err and "roofline/stream" in err  # the cases it could name
    assert stub_timing == []  # rejected before anything was timed


def test_cli_broken_module_is_reported_and_does_not_hide_the_others(
    stub_timing, monkeypatch, tmp_path, capsys
):
    def broken_cases(quick):
        raise ImportError("a peer's package is missing")

    monkeypatch.setitem(sys.modules, "kernels.backdoor", types.SimpleNamespace(cases=broken_cases))
    monkeypatch.setitem(sys.modules, "kernels.cachex", None)  # import_module raises
    good = types.SimpleNamespace(cases=lambda quick: [_harness.Case(name="prefmh/ok", fn=None)])
    monkeypatch.setitem(sys.modules, "kernels.prefmh", good)
    out = tmp_path / "rows.jsonl"
    rc = kernels_main.main(["backdoor", "cachex/some case", "prefmh", "--json", str(out)])
    assert rc == 1  # as for a broken case
    assert stub_timing == ["prefmh/ok"]
    assert [json.loads(x)["name"] for x in out.read_text().splitlines()] == ["prefmh/ok"]
    failed = capsys.readouterr().err.splitlines()[-1]
    assert "backdoor" in failed and "cachex" in failed and "prefmh" not in failed


@pytest.mark.slow
def test_cli_scaling_quick_has_every_row(tmp_path):
    # Worker processes (4 host devices; a 2-process job) step on command; each row is timed
    # against the 1-device step with the perfect-scaling bound. 100 s on 2 busy cores.
    rows = {r["name"]: r for r in _cli_quick(tmp_path, "scaling", 600)[1]}
    want = {f"scaling/{f} {w} {d}" for f, w in (("rwefm", "step"), ("prefmh", "chains"))
            for d in ("d=2", "d=4", "2 proc x 2")}  # fmt: skip
    assert set(rows) == want
    for r in rows.values():
        assert r["median_s"] > 0 and r["peer_median_s"] > 0
        d = 2 if r["name"].endswith("d=2") else 4
        assert abs(r["bound_s"] - r["peer_median_s"] / d) < 1e-12
