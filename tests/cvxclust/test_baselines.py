"""The label-spreading baseline and the balanced graph weights, against closed forms."""

import numpy as np
import pytest

from hexad import cvxclust as cc


def _graph(seed=0, n=30, p_in=0.4, p_out=0.03):
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1, 2], n // 3)
    prob = np.where(y[:, None] == y[None, :], p_in, p_out)
    a = np.triu(rng.random((n, n)) < prob, 1)
    return np.argwhere(a), y


def _dense_spreading(edges, y, labeled, k, alpha, iters):
    n = len(y)
    a = np.zeros((n, n))
    np.add.at(a, (edges[:, 0], edges[:, 1]), 1.0)
    np.add.at(a, (edges[:, 1], edges[:, 0]), 1.0)
    deg = a.sum(1)
    dinv = np.where(deg > 0, 1 / np.sqrt(np.maximum(deg, 1)), 0.0)
    s = dinv[:, None] * a * dinv[None, :]
    y0 = np.eye(k)[y] * labeled[:, None]
    f = y0
    for _ in range(iters):
        f = alpha * s @ f + (1 - alpha) * y0
    return f, s, y0


def test_label_propagation_matches_dense_iteration_and_its_fixed_point():
    edges, y = _graph()
    labeled = np.zeros(30, bool)
    labeled[[0, 1, 10, 11, 20, 21]] = True
    f, s, y0 = _dense_spreading(edges, y, labeled, 3, 0.9, 200)
    pred = np.asarray(cc.label_propagation(edges, y, labeled, 3, alpha=0.9))
    np.testing.assert_array_equal(pred, f.argmax(1))
    # Zhou et al.'s closed form: the iteration converges to (1 - alpha) (I - alpha S)^-1 Y
    # (alpha^200 ~ 7e-10 away); on this well-separated SBM it recovers the blocks.
    fixed = 0.1 * np.linalg.solve(np.eye(30) - 0.9 * s, y0)
    np.testing.assert_array_equal(pred, fixed.argmax(1))
    assert (pred == y).mean() >= 0.9


def test_duplicated_rows_weigh_twice_and_unreached_nodes_get_class_0():
    edges = np.array([[0, 1], [1, 2], [2, 3], [0, 1], [4, 5]])
    y = np.array([0, 0, 0, 1, 1, 1])
    labeled = np.array([True, False, False, True, False, False])
    f, _, _ = _dense_spreading(edges, y, labeled, 2, 0.99, 50)
    pred = np.asarray(cc.label_propagation(edges, y, labeled, 2, num_iters=50))
    np.testing.assert_array_equal(pred, f.argmax(1))
    assert pred[4] == 0 and pred[5] == 0  # no label reaches the component {4, 5}


def test_label_propagation_bad_input_raises():
    edges, y = _graph()
    labeled = np.ones(30, bool)
    with pytest.raises(ValueError, match="self loops"):
        cc.label_propagation(np.array([[0, 0]]), y, labeled, 3)
    with pytest.raises(ValueError, match=r"alpha: expected a value in \[0, 1\)"):
        cc.label_propagation(edges, y, labeled, 3, alpha=1.0)
    with pytest.raises(ValueError, match="labels, labeled"):
        cc.label_propagation(edges, y, labeled[:10], 3)
    with pytest.raises(TypeError, match="labels"):
        cc.label_propagation(edges, y.astype(float), labeled, 3)


def test_balanced_weights_put_equal_total_weight_on_edges_and_non_edges():
    edges, _ = _graph(seed=1)
    a = cc.adjacency_from_edges(edges, 30)
    c_a, c_ac = cc.balanced_weights(a)
    n_edges = a.sum()  # ordered pairs
    n_non = 30 * 29 - n_edges
    assert c_a + c_ac == pytest.approx(1.0, abs=1e-7)
    assert c_a * n_edges == pytest.approx(c_ac * n_non, rel=1e-6)
    with pytest.raises(ValueError, match="at least 2 nodes"):
        cc.balanced_weights(np.zeros((1, 1)))


def test_contextual_sbm_has_the_planted_densities_labels_and_feature_means():
    rng = np.random.default_rng(0)
    g = cc.contextual_sbm(rng, 200, 0.3, 0.05, 4.0, 3, 10, 0.0)
    a, y = g.adjacency, g.truth
    assert (a == a.T).all() and (np.diag(a) == 0).all() and np.isin(a, (0, 1)).all()
    same = (y[:, None] == y[None, :]) & ~np.eye(200, dtype=bool)
    # ~9900 pairs each way: 4 binomial standard errors.
    for mask, prob in ((same, 0.3), (y[:, None] != y[None, :], 0.05)):
        k = mask.sum()
        assert abs(a[mask].mean() - prob) < 4 * np.sqrt(prob * (1 - prob) / k)
    # Class means at -+ sep / 2 on the first coordinate, 0 elsewhere (4 standard errors).
    for c, m in ((0, -2.0), (1, 2.0)):
        np.testing.assert_allclose(g.features[y == c].mean(0), [m, 0, 0], atol=4 / np.sqrt(100))
    # No label noise: 5 labelled nodes per class, with their true labels.
    assert np.bincount(y[g.labeled]).tolist() == [5, 5]
    np.testing.assert_array_equal(g.labels[g.labeled], y[g.labeled])
    # With two labels flipped at rate 1/2, half the draws leave one class: it is restored.
    for seed in range(20):
        g = cc.contextual_sbm(np.random.default_rng(seed), 8, 0.5, 0.5, 0.0, 1, 2, 0.5)
        assert sorted(g.labels[g.labeled].tolist()) == [0, 1]
    with pytest.raises(ValueError, match="even"):
        cc.contextual_sbm(rng, 21, 0.5, 0.5, 0.0, 1, 2, 0.1)
    with pytest.raises(ValueError, match=r"n_labeled: expected an int in \[2, 20\]"):
        cc.contextual_sbm(rng, 20, 0.5, 0.5, 0.0, 1, 1, 0.1)
