"""Smoke tests of the cvxclust studies (tiny overrides, at most about a minute each)."""

import json

import numpy as np
import pytest

from experiments import _cvxclust, cvxclust_phase, cvxclust_planetoid
from experiments._verdicts import OUTCOMES


def test_phase_study_smoke(tmp_path):
    study = cvxclust_phase.STUDY
    over = {"n": 16, "dpq": (0.0, 0.8), "sep": (0.0, 6.0), "trials": 2, "max_iters": 800}
    s = study.execute(study.make_config(True, over), out_dir=tmp_path, show_progress=False)
    programs = ("graph", "node", "joint", "joint_nograph", "linear")
    assert tuple(s["programs"]) == programs
    for regime in ("fixed", "tuned"):
        for sfx in ("", "_exact"):
            key = f"{regime}{sfx}"
            assert isinstance(s[f"synergy_cells_{key}"], int)
            assert isinstance(s[f"synergy_cells_{key}_holm"], int)
            assert len(s[f"synergy_cell_list_{key}"]) == s[f"synergy_cells_{key}"]
            p = np.asarray(s[f"synergy_p_{key}"])  # [panel][dpq][sep][graph, nograph, node]
            assert p.shape == (1, 2, 2, 3) and ((0 <= p) & (p <= 1)).all()
        for p in programs:
            for tail in ("recovery", "lo", "hi", "exact"):
                grid = s[f"{regime}_{p}_{tail}"]
                assert len(grid) == 1 and len(grid[0]) == 2 and len(grid[0][0]) == 2
            lo, r, hi = (s[f"{regime}_{p}_{t}"][0][1][1] for t in ("lo", "recovery", "hi"))
            assert 0.0 <= lo <= r <= hi <= 1.0
    for p in programs:
        allowed = s["eps_grid"] if p.startswith("joint") else s["grid"]
        assert {v for row in s[f"tuned_{p}_choice"][0] for v in row} <= set(allowed)
    assert s["eps_fixed"] == 10.0 and s["eps_grid"] == [10.0, 100.0]
    for key in ("verdict", "verdict_exact", "verdict_tuned"):
        assert s[key] in OUTCOMES
    # p = 0.9, q = 0.1 on 16 nodes: the PSD-hard graph program recovers the draws; p = q: none.
    # The graph draw does not depend on sep: one solve serves both columns.
    assert s["fixed_graph_recovery"][0][1] == [1.0, 1.0]
    assert s["fixed_graph_recovery"][0][0] == [0.0, 0.0]
    assert s["positive_control"] == [1.0] and s["verdict"] != "not tested"
    # the dense threshold at n = 16 (0.541) puts neither row within [t - 0.2, t + 0.1]
    assert s["trials_per_cell"] == [[[2, 2], [2, 2]]]
    assert s["graph_threshold"] == [pytest.approx(_cvxclust.graph_threshold(16, 2))]
    assert s["max_min_eig_violation"] >= -1e-5  # float32 solves
    assert isinstance(s["uncertified_solves"], int)
    assert sum(s["uncertified_by_program"].values()) == s["uncertified_solves"]
    assert (tmp_path / "phase_fixed.png").exists() and (tmp_path / "phase_tuned.png").exists()


def test_planetoid_study_smoke_karate(tmp_path, monkeypatch):
    study = cvxclust_planetoid.STUDY
    kw = {"checkpoint_dir": tmp_path / "ckpt", "show_progress": False}
    s = study.execute(study.make_config(True), out_dir=tmp_path / "a", **kw)
    # --resume restores every grid value's figures: no program is solved again.
    from experiments import _cvxclust

    def no_solve(*args, **kwargs):
        raise AssertionError("a finished solve ran again")

    monkeypatch.setattr(_cvxclust, "predict", no_solve)
    again = study.execute(study.make_config(True), out_dir=tmp_path / "b", resume=True, **kw)
    s.pop("runtime_s"), again.pop("runtime_s")
    assert again == s and isinstance(s["karate_graph_certified"], bool)
    for p in ("graph", "node", "joint", "linear"):
        for tail in ("acc", "coverage", "covered_acc", "val_acc", "choice", "certified"):
            assert f"karate_{p}_{tail}" in s
        assert 0.0 <= s[f"karate_{p}_acc"] <= s[f"karate_{p}_coverage"] <= 1.0
    # Two labelled members and the graph: most of the club (16 test members) is classified.
    assert s["karate_graph_acc"] >= 0.8 and s["karate_lp_acc"] >= 0.8


def test_phase_study_resumes_cell_by_cell(tmp_path):
    # A resumed run restores every solved cell from its checkpoint instead of solving it again,
    # and its summary is the uninterrupted run's.
    study = cvxclust_phase.STUDY
    over = {"n": 12, "dpq": (0.8,), "sep": (0.0, 6.0), "trials": 2, "max_iters": 300,
            "tune_trials": 2, "grid": (1.0,), "eps_grid": (10.0,)}  # fmt: skip
    cfg = study.make_config(True, over)
    kw = {"checkpoint_dir": tmp_path / "ckpt", "show_progress": False}
    first = study.execute(cfg, out_dir=tmp_path / "a", **kw)
    again = study.execute(cfg, out_dir=tmp_path / "b", resume=True, **kw)
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["restored"] for x in lines)
    first.pop("runtime_s"), again.pop("runtime_s")
    assert again == first
    # Another setting or seed shares no cell with it; a run of fewer panels shares them all.
    for extra, seed in (({"trials": 3}, 0), ({}, 1)):
        study.execute(study.make_config(True, over | extra), out_dir=tmp_path / "c",
                      seed=seed, resume=True, **kw)  # fmt: skip
        lines = (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()[-2:]
        assert not any(json.loads(x)["restored"] for x in lines)
    two = study.execute(study.make_config(True, over | {"dims": (1, 2)}), out_dir=tmp_path / "d",
                        resume=True, **kw)  # fmt: skip
    lines = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    assert [x["restored"] for x in lines] == [True, True, False, False]
    assert two["fixed_graph_recovery"][0] == first["fixed_graph_recovery"][0]
    # The same two panels run as two parts (each its own folder; here restored) join to the
    # two-panel run's summary: Holm over both panels' cells, the verdicts decided again.
    d2 = study.execute(study.make_config(True, over | {"dims": (2,)}), out_dir=tmp_path / "e",
                       resume=True, **kw)  # fmt: skip
    joined = _cvxclust.join_panels([first, d2], cvxclust_phase.CONTROL, cvxclust_phase.VERDICTS)
    two.pop("runtime_s")
    assert joined == {k: v for k, v in two.items() if k in joined}
    assert set(two) - set(joined) == set()
    with pytest.raises(ValueError, match="different designs"):
        _cvxclust.join_panels([first, {**d2, "trials": 3}], 0.25, {})
    with pytest.raises(ValueError, match="more than one part"):
        _cvxclust.join_panels([first, first], 0.25, {})


def test_phase_solves_continue_until_certified():
    # A loose first solve (tol 1e-2) of a noisy graph program stops above the 1e-3 gap; the
    # study's continuation resumes it at tol 1e-3, then 1e-4, until its gap certifies it. A
    # solve already certified is returned as it is (same iterations).
    import jax
    import numpy as np

    from experiments import _cvxclust
    from hexad import cvxclust as cc

    g = cc.contextual_sbm(np.random.default_rng(3), 16, 0.7, 0.3, 0.0, 1, 4, 0.0)
    p = cc.graph_problem(g.adjacency, 1.0)
    gap = lambda p, o: cc.nuclear_certificate(p, o.l, o.rho * o.dual).rel_gap  # noqa: E731
    warm = lambda o: (o.l, o.dual, o.rho)  # noqa: E731
    ladder = [cc.NuclearSolver(tol=t, max_iters=2000) for t in (1e-2, 1e-3, 1e-4)]
    first = ladder[0](p)
    assert float(gap(p, first)) > 1e-3  # the precondition: the loose solve is not certified
    out, conv, g1 = jax.jit(_cvxclust._refined(ladder, gap, warm, 1e-3))(p)
    assert float(g1) <= 1e-3 and bool(conv) and int(out.n_iters) > 0
    np.testing.assert_allclose(float(g1), float(gap(p, out)), rtol=1e-6)
    again, _, g2 = jax.jit(_cvxclust._refined(ladder, gap, warm, 1.0))(p)
    assert int(again.n_iters) == int(first.n_iters)
    np.testing.assert_allclose(float(g2), float(gap(p, first)), rtol=1e-9)
    # Planetoid's certificate is that of out.l, the matrix its labels are read from: a loose
    # l beside a certified low_rank iterate is not certified.
    good = out._replace(converged=conv)
    assert _cvxclust.certify(p, good, 1e-3)["certified"]
    loose = good._replace(l=first.l, low_rank=good.l)
    rep = _cvxclust.certify(p, loose, 1e-3)
    assert not rep["certified"] and rep["rel_gap"] > 1e-3


def test_graph_threshold_is_the_dense_two_sided_condition():
    import math

    from experiments import _cvxclust

    for n, k in ((60, 2), (60, 3), (200, 4)):
        d = _cvxclust.graph_threshold(n, k)
        p, q = (1 + d) / 2, (1 - d) / 2
        bc = math.sqrt(p * q) + math.sqrt((1 - p) * (1 - q))
        # the defining condition (2 n / K)(-log BC) = log n holds at the threshold
        assert abs((2 * n / k) * -math.log(bc) - math.log(n)) < 1e-9
    # the review's values at the study's size (the sparse formula gave 0.504 and 0.606)
    assert abs(_cvxclust.graph_threshold(60, 2) - 0.357) < 1e-3
    assert abs(_cvxclust.graph_threshold(60, 3) - 0.430) < 1e-3
