"""The phase study's design (experiments/cvxclust_phase.py, experiments/_cvxclust.py): the
joint program's weights from eps, the no-graph arm, tuning draws apart from scored ones, and
the paired McNemar verdict, each checked without running the full study."""

import dataclasses

import jax
import numpy as np
import pytest

from experiments import _cvxclust, cvxclust_phase
from experiments._verdicts import mcnemar
from hexad import cvxclust as cc

FULL = cvxclust_phase.Config()


@pytest.mark.parametrize(("n", "k"), [(60, 2), (60, 3), (24, 2)])
@pytest.mark.parametrize("mult", [1.0, 10.0, 100.0])
def test_eps_sets_mu0_mu1_and_the_label_weight_as_stated(n, k, mult):
    eps, force, lw = mult * n / k, FULL.node_weight * n, 0.7
    mu0, mu1, w = _cvxclust.joint_weights(eps, n, k, force, lw)
    nc = n / k
    assert 2 * mu0 / mu1 == pytest.approx(eps, rel=1e-12)  # eps = 2 mu0 / mu1
    assert mu1 * nc / (nc + eps) == pytest.approx(force, rel=1e-12)  # the force on a node
    assert mu1 * w == pytest.approx(lw * force, rel=1e-12)  # the labels' weight
    # the problems the study builds carry exactly these weights
    g = cc.contextual_sbm(np.random.default_rng(0), n, 0.6, 0.4, 3.0, 1, 2 * k, 0.1, k)
    cfg = dataclasses.replace(FULL, n=n, label_weight=lw)
    index = cfg.eps_grid.index(mult)
    for arm in ("joint", "joint_nograph"):
        p = _cvxclust.build(cfg, g, k, arm, index)
        np.testing.assert_allclose([float(p.mu0), float(p.mu1)], [mu0, mu1], rtol=1e-6)
        on = np.asarray(g.labeled)
        np.testing.assert_allclose(np.asarray(p.label_weight)[on], w, rtol=1e-6)
        assert not np.asarray(p.label_weight)[~on].any()


def test_the_fixed_rule_is_eps_10_n_over_k_for_both_joint_arms_and_factor_1_else():
    assert FULL.eps_fixed == 10.0 and FULL.eps_grid == (1.0, 10.0, 100.0)
    assert len(FULL.grid) == len(FULL.eps_grid)  # the same tuning budget for every arm
    for arm in _cvxclust.PHASE_PROGRAMS:
        value = _cvxclust.grid_value(FULL, arm, _cvxclust.fixed_index(FULL, arm))
        assert value == (10.0 if arm.startswith("joint") else 1.0)
    # the review's eps = 300 at K = 2 and eps = 200 at K = 3 (n = 60)
    g = cc.contextual_sbm(np.random.default_rng(1), 60, 0.6, 0.4, 3.0, 1, 6, 0.1, 3)
    p = _cvxclust.build(FULL, g, 3, "joint", _cvxclust.fixed_index(FULL, "joint"))
    assert 2 * float(p.mu0) / float(p.mu1) == pytest.approx(200.0, rel=1e-6)


def test_the_no_graph_arm_is_the_joint_program_with_zero_graph_weight():
    # On a tiny draw: the no-graph arm's problem has no graph cost and every other leaf of the
    # joint's; solved, it matches the joint program built with both graph weights set to 0.
    cfg = dataclasses.replace(FULL, n=8, ks=(2,))
    g = cc.contextual_sbm(np.random.default_rng(2), 8, 0.8, 0.2, 3.0, 1, 4, 0.0)
    index = _cvxclust.fixed_index(cfg, "joint")
    joint = _cvxclust.build(cfg, g, 2, "joint", index)
    nograph = _cvxclust.build(cfg, g, 2, "joint_nograph", index)
    assert float(np.abs(np.asarray(joint.cost)).sum()) > 0
    assert not np.asarray(nograph.cost).any()
    for leaf in ("x", "y", "label_weight", "mu0", "mu1"):
        np.testing.assert_array_equal(getattr(joint, leaf), getattr(nograph, leaf))
    zero = cc.shared_atom_problem(
        float(joint.mu0),
        float(joint.mu1),
        adjacency=g.adjacency,
        edge_weight=0.0,
        nonedge_weight=0.0,
        features=g.features,
        labels=g.labels,
        labeled=g.labeled,
        num_classes=2,
        label_weight=float(np.asarray(joint.label_weight).max()),
    )
    assert not np.asarray(zero.cost).any()
    solve = jax.jit(cc.SharedAtomSolver(tol=1e-5, max_iters=5000))
    a, b = solve(nograph), solve(zero)
    np.testing.assert_allclose(np.asarray(a.l), np.asarray(b.l), atol=1e-4)
    np.testing.assert_allclose(np.asarray(a.u), np.asarray(b.u), atol=1e-4)
    # and its objective ignores the graph: the certificates agree on the same iterate
    ca = cc.shared_atom_certificate(nograph, a.l, a.u, a.rho * a.dual)
    cb = cc.shared_atom_certificate(zero, a.l, a.u, a.rho * a.dual)
    np.testing.assert_allclose([float(ca.primal), float(ca.dual)],
                               [float(cb.primal), float(cb.dual)], rtol=1e-5)  # fmt: skip


def test_tuning_draws_are_disjoint_from_scored_draws():
    cfg = dataclasses.replace(FULL, n=24)
    scored = _cvxclust.draw_cell(cfg, 0, 2, 1, 2, 0.3, 4.0, 12)
    tuning = _cvxclust.draw_cell(cfg, 0, 2, 1, 2, 0.3, 4.0, 12, tune=True)
    for t in tuning:
        for s in scored:
            assert not np.array_equal(t.adjacency, s.adjacency)
            assert not np.allclose(t.features, s.features)
    # within each stream a row's graph is the same for every sep and d (paired comparisons)
    other = _cvxclust.draw_cell(cfg, 0, 2, 5, 2, 0.3, 0.0, 12, tune=True)
    for a, b in zip(tuning, other, strict=True):
        np.testing.assert_array_equal(a.adjacency, b.adjacency)
    # the scored draws are the earlier study's (generator (seed, K, row, trial))
    old = cc.contextual_sbm(np.random.default_rng([0, 2, 2, 3]), 24, 0.65, 0.35, 4.0, 1, 6,
                            cfg.label_noise, num_classes=2)  # fmt: skip
    np.testing.assert_array_equal(old.adjacency, scored[3].adjacency)


def test_phase_cell_tunes_on_the_tuning_draws_and_scores_the_others(monkeypatch):
    # phase_cell solves every grid value on the tuning draws only, and the scored draws only at
    # the fixed value and the tuned one; solve_draws is replaced by a recorder.
    cfg = dataclasses.replace(FULL, n=24, tune_trials=3, trials=4, trials_near=5)
    calls = []
    best = {"graph": 2, "node": 1, "joint": 0, "joint_nograph": 1, "linear": 1}

    def fake(cfg_, draws, k, plan):
        calls.append(([np.asarray(g.adjacency) for g in draws], dict(plan)))
        out = {}
        for p, idx in plan.items():
            hit = np.array([[i == best[p]] * len(draws) for i in idx])
            out[p] = {"recovered": hit, "exact": hit, "certified": np.ones_like(hit),
                      "min_eig": np.zeros(hit.shape)}  # fmt: skip
        return out

    monkeypatch.setattr(_cvxclust, "solve_draws", fake)
    rec = _cvxclust.phase_cell(cfg, 0, 2, 1, 2, 0.3, 3.0, _cvxclust.PHASE_PROGRAMS)
    (tune_adj, tune_plan), (score_adj, score_plan) = calls
    assert len(tune_adj) == 3 and len(score_adj) == _cvxclust.cell_trials(cfg, 2, 0.3) == 5
    assert all(not np.array_equal(a, b) for a in tune_adj for b in score_adj)
    assert all(v == (0, 1, 2) for v in tune_plan.values())  # every value, every arm
    for p in _cvxclust.PHASE_PROGRAMS:
        fixed = _cvxclust.fixed_index(cfg, p)
        assert int(rec[p]["choice"][0]) == best[p]
        assert score_plan[p] == ((fixed, best[p]) if best[p] != fixed else (fixed,))
        # rows (fixed, tuned) of the scored record
        assert rec[p]["recovered"].shape == (2, 5)
        assert rec[p]["recovered"][1].all() and rec[p]["recovered"][0].all() == (best[p] == fixed)
        assert rec[p]["tune_recovered"].shape == (3, 3)


def test_choose_keeps_the_fixed_value_on_ties():
    assert _cvxclust.choose([2, 2, 1], fixed=1) == 1
    assert _cvxclust.choose([3, 2, 3], fixed=1) == 0  # the fixed value is not among the best
    assert _cvxclust.choose([0, 0, 0], fixed=2) == 2
    assert _cvxclust.choose([0, 1, 4], fixed=1) == 2


def test_cells_near_the_dense_threshold_get_more_draws():
    t2, t3 = (_cvxclust.graph_threshold(60, k) for k in (2, 3))  # 0.357, 0.430
    near = {k: [d for d in FULL.dpq if _cvxclust.cell_trials(FULL, k, d) == FULL.trials_near]
            for k in (2, 3)}  # fmt: skip
    assert near == {2: [0.2, 0.3, 0.4], 3: [0.3, 0.4, 0.5]}
    assert t2 - FULL.near_below <= 0.2 and 0.5 > t2 + FULL.near_above
    assert t3 - FULL.near_below > 0.2 and 0.5 <= t3 + FULL.near_above
    assert 30 <= FULL.trials_near <= 40 and 10 <= FULL.trials <= 20


def test_holm_matches_the_step_down_rule():
    # m = 4, alpha = 0.05: thresholds 0.0125, 0.0167, 0.025, 0.05. p = 0.01, 0.015, 0.03,
    # 0.04: the first two are rejected, the third (0.03 > 0.025) stops the procedure.
    p = np.array([[0.03, 0.01], [0.04, 0.015]])
    np.testing.assert_array_equal(_cvxclust.holm(p, 0.05), [[False, True], [False, True]])
    assert _cvxclust.holm([0.001, 0.002, 0.003], 0.05).all()
    assert not _cvxclust.holm([0.03, 0.04], 0.05).any()  # 0.03 > 0.05 / 2
    assert _cvxclust.holm([0.02, 0.04], 0.05).all()  # 0.02 < 0.05 / 2, then 0.04 < 0.05


def _fake_cell(scenario):
    """A stand-in for phase_cell: at dpq 0.3 the graph recovers 2 of 40 draws (30, 31) and,
    at sep 4, the joint 30 (0-29), its no-graph arm 4 (0-3) and convex clustering 12 (0-11);
    at dpq 0.9 everything recovers; nothing else does, and nothing exactly."""

    def fake(cfg, seed, k, d, i, dpq, sep, programs):
        trials = _cvxclust.cell_trials(cfg, k, dpq)
        hit = {p: np.zeros(trials, bool) for p in _cvxclust.PHASE_PROGRAMS}
        if dpq > 0.5:
            hit = {p: np.ones(trials, bool) for p in hit}
            if scenario == "control fails":
                hit["graph"][:] = False
        else:
            hit["graph"][30:32] = True  # the graph draw is the same for every sep
            if sep > 0:
                hit["joint"][:30] = True
                hit["joint_nograph"][:4] = True
                hit["node"][:12] = True
        out = {}
        for p in programs:
            cert = np.ones((2, trials), bool)
            if scenario == "uncertified" and p == "joint_nograph" and dpq < 0.5 and sep > 0:
                cert[:, 5] = False
            grid = len(cfg.grid)
            out[p] = {
                "recovered": np.stack([hit[p], hit[p]]),
                "exact": np.zeros((2, trials), bool),
                "certified": cert,
                "min_eig": np.zeros((2, trials)),
                "tune_recovered": np.zeros((grid, cfg.tune_trials), bool),
                "tune_exact": np.zeros((grid, cfg.tune_trials), bool),
                "tune_certified": np.ones((grid, cfg.tune_trials), bool),
                "tune_min_eig": np.zeros((grid, cfg.tune_trials)),
                "choice": np.array([_cvxclust.fixed_index(cfg, p)], np.int32),
            }
        return out

    return fake


@pytest.mark.parametrize(
    ("scenario", "verdict", "cells"),
    [("synergy", "reproduced", 1), ("uncertified", "undecided", 0),
     ("control fails", "not tested", 1)],
)  # fmt: skip
def test_the_verdict_is_the_paired_mcnemar_rule(tmp_path, monkeypatch, scenario, verdict, cells):
    monkeypatch.setattr(_cvxclust, "phase_cell", _fake_cell(scenario))
    study = cvxclust_phase.STUDY
    over = {"n": 16, "dpq": (0.3, 0.9), "sep": (0.0, 4.0), "trials": 10, "trials_near": 40,
            "near_below": 0.3, "tune_trials": 2}  # fmt: skip
    s = study.execute(study.make_config(True, over), out_dir=tmp_path, show_progress=False)
    assert s["trials_per_cell"] == [[[40, 40], [10, 10]]]
    # joint vs graph: b = 30 (joint only), c = 2 (graph only); vs its no-graph part: b = 26,
    # c = 0; vs convex clustering: b = 18, c = 0
    want = [mcnemar(30, 2).p_value, mcnemar(26, 0).p_value, mcnemar(18, 0).p_value]
    for regime in ("fixed", "tuned"):
        np.testing.assert_allclose(s[f"synergy_p_{regime}"][0][0][1], want, rtol=1e-12)
        assert s[f"synergy_p_{regime}"][0][0][0] == [1.0, 1.0, 1.0]  # no discordant pair
        assert s[f"candidate_cells_{regime}"] == 1
        assert s[f"synergy_cells_{regime}"] == cells
        assert s[f"synergy_cells_{regime}_holm"] == cells
        assert s[f"synergy_cell_list_{regime}"] == [["K2_d1", 0.3, 4.0]] * cells
        # the exact criterion: the joint never recovers exactly, so no candidate at all
        assert s[f"synergy_cells_{regime}_exact"] == s[f"candidate_cells_{regime}_exact"] == 0
    assert s["verdict"] == s["verdict_tuned"] == verdict
    expected_exact = "not tested" if scenario == "control fails" else "not reproduced"
    assert s["verdict_exact"] == expected_exact
    assert s["fixed_joint_nograph_recovery"][0][0] == [0.0, 0.1]
