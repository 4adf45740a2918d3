"""hexad.data's bundled sets (Planetoid graphs, PBMC 68k reduced) and their file checks."""

import numpy as np
import pytest

from hexad.data import load_pbmc68k, load_planetoid


def test_bundled_planetoid_and_pbmc_load():
    cora = load_planetoid("cora")
    assert cora.features.shape == (2708, 1433) and cora.num_classes == 7
    assert cora.edges.shape == (5278, 2) and np.all(cora.edges[:, 0] < cora.edges[:, 1])
    cite = load_planetoid("citeseer")
    assert cite.features.shape == (3327, 3703) and cite.num_classes == 6
    assert (cite.labels == -1).sum() == 15
    for g in (cora, cite):
        assert g.features.sum() == g.features.astype(bool).sum()  # binary bag of words
        for idx in (g.train_idx, g.val_idx, g.test_idx):
            assert idx.min() >= 0 and idx.max() < g.num_nodes
    d = load_pbmc68k()
    assert d.X_pca.shape == (700, 50) and d.X_umap.shape == (700, 2)
    assert d.cell_type.shape == d.louvain.shape == (700,)
    assert d.cell_type.max() < len(d.cell_type_names) == 10


def _graph():
    """A valid 4-node graph with 3 features: the CSR rows are [1, 0, 2], [], [0, 1], [2]."""
    return dict(
        features_data=np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32),
        features_indices=np.array([0, 2, 0, 1, 2], np.int32),
        features_indptr=np.array([0, 2, 2, 4, 5], np.int64),
        features_shape=np.array([4, 3], np.int64),
        edges=np.array([[0, 1], [1, 2], [0, 3]], np.int32),
        labels=np.array([0, 1, -1, 1], np.int32),
        train_idx=np.array([0, 1], np.int32),
        val_idx=np.array([3], np.int32),
        test_idx=np.array([2, 3], np.int32),
    )


def test_planetoid_tiny_file_loads(tmp_path):
    np.savez(tmp_path / "g.npz", **_graph())
    g = load_planetoid("cora", tmp_path / "g.npz")
    want = np.array([[1, 0, 2], [0, 0, 0], [3, 4, 0], [0, 0, 5]], np.float32)
    np.testing.assert_array_equal(g.features, want)
    assert g.num_nodes == 4 and g.num_classes == 2
    np.testing.assert_array_equal(g.test_idx, [2, 3])


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("labels", np.array([0, 1, 1], np.int32), "labels: expected shape"),
        ("labels", np.array([0, 1, -2, 1], np.int32), "labels: expected"),
        ("labels", np.array([0.0, 1, 1, 1]), "labels: expected"),
        ("train_idx", np.array([0, 4], np.int32), "train_idx: expected"),
        ("val_idx", np.array([-1], np.int32), "val_idx: expected"),
        ("test_idx", np.array([[2, 3]], np.int32), "test_idx: expected"),
        ("edges", np.array([[0, 1], [2, 2], [0, 3]], np.int32), "edges: expected"),
        ("edges", np.array([[0, 1], [2, 1], [0, 3]], np.int32), "edges: expected"),
        ("edges", np.array([[0, 1], [0, 1], [0, 3]], np.int32), "edges: expected"),
        ("edges", np.array([[0, 4]], np.int32), "edges: expected"),
        ("edges", np.array([[0, 1], [1, 2**32 + 2]], np.int64), "edges: expected"),  # not wrapped
        ("features_indices", np.array([0, -1, 0, 1, 2], np.int32), "features_indices: expected"),
        ("features_indices", np.array([0, 3, 0, 1, 2], np.int32), "features_indices: expected"),
        ("features_indices", np.array([0, 2, 0, 1], np.int32), r"features_data: .*\(4,\)"),
        ("features_data", np.ones(6, np.float32), "features_data: expected"),
        ("features_indptr", np.array([0, 2, 1, 4, 5], np.int64), "features_indptr: expected"),
        ("features_indptr", np.array([1, 2, 2, 4, 5], np.int64), "features_indptr: expected"),
        ("features_indptr", np.array([0, 2, 2, 4, 4], np.int64), "features_indptr: expected"),
        ("features_indptr", np.array([0, 2, 2, 5], np.int64), "features_indptr: expected"),
        ("features_shape", np.array([4, 3, 1], np.int64), "features_shape: expected"),
    ],
    ids=[
        "labels_short",
        "labels_below_minus_one",
        "labels_float",
        "train_idx_past_n",
        "val_idx_negative",
        "test_idx_2d",
        "edges_self_loop",
        "edges_i_gt_j",
        "edges_duplicate",
        "edges_past_n",
        "edges_past_int32",
        "indices_negative",
        "indices_past_f",
        "indices_short",
        "data_long",
        "indptr_decreasing",
        "indptr_not_from_zero",
        "indptr_short_of_nnz",
        "indptr_wrong_length",
        "shape_3d",
    ],
)
def test_planetoid_rejects_a_corrupt_file(tmp_path, key, value, match):
    _assert_rejected(tmp_path, _graph() | {key: value}, lambda p: load_planetoid("cora", p), match)


def _assert_rejected(tmp_path, arrays, load, match):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=match):
        load(tmp_path / "bad.npz")


def _cells(n=5):
    return dict(
        X_pca=np.zeros((n, 3), np.float32),
        X_umap=np.zeros((n, 2), np.float32),
        cell_type=np.arange(n, dtype=np.int32) % 3,
        cell_type_names=np.array(["a", "b", "c"]),
        louvain=np.zeros(n, np.int32),
    )


def test_pbmc_tiny_file_loads(tmp_path):
    np.savez(tmp_path / "c.npz", **_cells())
    d = load_pbmc68k(tmp_path / "c.npz")
    assert d.X_pca.shape == (5, 3) and d.cell_type_names == ("a", "b", "c")
    np.testing.assert_array_equal(d.cell_type, [0, 1, 2, 0, 1])


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("X_pca", np.zeros((4, 3), np.float32), r"X_umap: expected shape \[4, 2\]"),
        ("X_pca", np.zeros(5, np.float32), "X_pca: expected"),
        ("X_umap", np.zeros((6, 2), np.float32), "X_umap: expected"),
        ("cell_type", np.zeros(4, np.int32), "cell_type: expected"),
        ("louvain", np.zeros(6, np.int32), "louvain: expected"),
        ("cell_type", np.array([0, 1, 2, 3, 0], np.int32), "cell_type: expected"),
        ("cell_type", np.array([0, 1, -1, 0, 0], np.int32), "cell_type: expected"),
        ("cell_type", np.zeros(5), "cell_type: expected"),
        ("louvain", np.zeros(5), "louvain: expected"),
    ],
    ids=[
        "pca_rows",
        "pca_1d",
        "umap_rows",
        "cell_type_rows",
        "louvain_rows",
        "cell_type_past_names",
        "cell_type_negative",
        "cell_type_float",
        "louvain_float",
    ],
)
def test_pbmc_rejects_a_corrupt_file(tmp_path, key, value, match):
    _assert_rejected(tmp_path, _cells() | {key: value}, load_pbmc68k, match)
