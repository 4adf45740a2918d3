"""hexad.data.protein: alanine dipeptide torsions from OpenMM, the bundled sample, clouds."""

import math

import numpy as np
import pytest

from hexad.data import protein


def _atoms(text):
    rows = [line for line in text.splitlines() if line.startswith("ATOM")]
    return np.array([[float(r[30 + 8 * k : 38 + 8 * k]) for k in range(3)] for r in rows])


def test_wrap_angle_is_half_open():
    x = np.array([math.pi, -math.pi, 3 * math.pi, 1e-9 - math.pi, math.pi - 1e-9, 7.0, -7.0])
    y = protein.wrap_angle(x)
    assert y.dtype == np.float32
    assert np.all(y >= -math.pi) and np.all(y < math.pi)
    # the same angles modulo 2 pi, to float32 rounding
    np.testing.assert_allclose(np.cos(y), np.cos(x), atol=1e-6)
    np.testing.assert_allclose(np.sin(y), np.sin(x), atol=1e-6)


def test_built_structure_has_the_requested_dihedrals_by_mdtraj(tmp_path):
    import mdtraj

    for phi, psi in ((-80.0, 150.0), (-60.0, -45.0), (60.0, 30.0)):
        text = protein.alanine_dipeptide_pdb(phi, psi)
        x = _atoms(text)
        # rows: C(ACE)=1, N=3, CA=4, C=5, N(NME)=8
        ours = np.degrees([protein.dihedral(*x[[1, 3, 4, 5]]), protein.dihedral(*x[[3, 4, 5, 8]])])
        # the PDB keeps 1e-3 A, so up to ~0.1 deg of rounding on 1.5 A bonds
        np.testing.assert_allclose(ours, [phi, psi], atol=0.2)
        path = tmp_path / "ala2.pdb"
        path.write_text(text)
        t = mdtraj.load_pdb(str(path))
        ref = np.degrees([mdtraj.compute_phi(t)[1][0, 0], mdtraj.compute_psi(t)[1][0, 0]])
        np.testing.assert_allclose(ours, ref, atol=0.05)


def test_built_alanine_is_the_l_enantiomer():
    # the CA chiral volume (N-CA) . ((C-CA) x (CB-CA)) is about +2.5 A^3 for L amino acids
    # (Engh & Huber 1991 restraint targets); the D form has the opposite sign
    x = _atoms(protein.alanine_dipeptide_pdb())
    n, ca, c, cb = x[3], x[4], x[5], x[7]
    vol = np.dot(n - ca, np.cross(c - ca, cb - ca))
    assert 2.0 < vol < 3.0


def test_bundled_sample_loads_and_is_physical():
    d = protein.load_torsions()
    assert d.torsions.shape == (8, 320, 2) and d.torsions.dtype == np.float32
    assert np.all(d.torsions >= -math.pi) and np.all(d.torsions < math.pi)
    assert sorted(set(d.temperature.tolist())) == [300.0, 500.0]
    assert d.solvent == "obc" and d.frame_ps == pytest.approx(0.5)
    # L-alanine at 300 K in implicit water lives almost only at phi < 0 (beta, C7eq, alpha_R);
    # alpha_L (phi > 0) is rare: < 10% of frames is a loose bound for 160 ps per trajectory
    cold = d.torsions[d.temperature == 300.0]
    assert np.mean(cold[..., 0] > 0) < 0.1
    # both the extended (psi > 100 deg) and the helical (psi in [-90, 0] deg) basins are visited
    psi = np.degrees(cold[..., 1])
    assert np.mean(psi > 100) > 0.05 and np.mean((psi > -90) & (psi < 0)) > 0.05


def _write(path, **arrays):
    base = dict(
        torsions=np.zeros((1, 3, 2), np.float32),
        temperature=np.ones(1, np.float32),
        seed=np.ones(1, np.int64),
        frame_ps=np.float64(0.5),
        solvent=np.array("obc"),
    )
    base.update(arrays)
    base = {k: v for k, v in base.items() if v is not None}
    np.savez(path, **base)
    return path


@pytest.mark.parametrize(
    "arrays, match",
    [
        ({"torsions": np.full((1, 3, 2), 3.5, np.float32)}, r"\[-pi, pi\)"),
        ({"torsions": np.full((1, 3, 2), np.nan, np.float32)}, "finite"),
        ({"torsions": np.zeros((3, 2), np.float32)}, "n_traj, n_frames, 2"),
        ({"temperature": np.ones(2, np.float32)}, "temperature"),
        ({"seed": None}, "lacks"),
        ({"solvent": np.array("water")}, "solvent"),
    ],
)
def test_loader_rejects_bad_files(tmp_path, arrays, match):
    with pytest.raises(ValueError, match=match):
        protein.load_torsions(_write(tmp_path / "bad.npz", **arrays))


def test_loader_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="path"):
        protein.load_torsions(tmp_path / "nope.npz")


def test_torsion_clouds_windows():
    t = protein.Torsions(
        np.arange(2 * 10 * 2, dtype=np.float32).reshape(2, 10, 2) / 100,
        np.array([300.0, 500.0], np.float32),
        np.array([1, 2]),
        0.5,
        "obc",
    )
    c, j = protein.torsion_clouds(t, 4, 3, select=[1])
    assert c.shape == (3, 4, 2) and j.tolist() == [1, 1, 1]
    np.testing.assert_array_equal(c[1], t.torsions[1, 3:7])
    with pytest.raises(ValueError, match="window"):
        protein.torsion_clouds(t, 11)
    with pytest.raises(ValueError, match="select"):
        protein.torsion_clouds(t, 2, select=[2])


def test_simulate_validates_arguments():
    with pytest.raises(ValueError, match="temperature"):
        protein.simulate(-1.0, 1, 2)
    with pytest.raises(ValueError, match="n_frames"):
        protein.simulate(300.0, 1, 0)
    with pytest.raises(ValueError, match="solvent"):
        protein.simulate(300.0, 1, 2, solvent="tip3p")


def test_tiny_simulation_and_cache(tmp_path, monkeypatch):
    # a few hundred steps of a 22-atom system: about a second on one core
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path))
    d = protein.alanine_dipeptide([300.0], [7], n_frames=4, steps_per_frame=50, equil_steps=100)
    assert d.torsions.shape == (1, 4, 2)
    assert np.all(d.torsions >= -math.pi) and np.all(d.torsions < math.pi)
    # minimised from phi=-80, psi=150 and run 0.5 ps at 300 K: still in the beta/PII basin
    assert np.all(d.torsions[..., 0] < 0)
    files = list((tmp_path / "protein").glob("*.npz"))
    assert len(files) == 1 and "T300" in files[0].name
    # the second call reads the cache (no simulation)
    monkeypatch.setattr(protein, "simulate", lambda *a, **k: pytest.fail("re-simulated"))
    again = protein.alanine_dipeptide([300.0], [7], n_frames=4, steps_per_frame=50, equil_steps=100)
    np.testing.assert_array_equal(again.torsions, d.torsions)


def _saved(
    path, temperatures=(300.0, 500.0), seeds=(1, 2), n_frames=3, frame_ps=0.2, solvent="obc"
):
    """Writes a set as :func:`alanine_dipeptide` would for these settings (no simulation)."""
    pairs = [(t, s) for t in temperatures for s in seeds]
    data = protein.Torsions(
        np.zeros((len(pairs), n_frames, 2), np.float32),
        np.array([t for t, _ in pairs], np.float32),
        np.array([s for _, s in pairs], np.int64),
        frame_ps,
        solvent,
    )
    return protein.save_torsions(path, data)


# the request that matches _saved's defaults: 100 steps of 2 fs per frame is 0.2 ps
_REQUEST = dict(temperatures=[300.0, 500.0], seeds=[1, 2], n_frames=3, steps_per_frame=100)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"temperatures": [350.0, 500.0]}, "temperatures"),
        ({"temperatures": [500.0, 300.0]}, "temperatures"),  # another trajectory order
        ({"temperatures": [300.0]}, "temperatures|seeds"),
        ({"seeds": [1, 9]}, "seeds"),
        ({"seeds": [1]}, "temperatures|seeds"),
        ({"n_frames": 5}, "n_frames"),
        ({"steps_per_frame": 50}, "steps_per_frame"),
        ({"solvent": "vacuum"}, "solvent"),
    ],
    ids=[
        "temperature",
        "order",
        "fewer_temperatures",
        "seed",
        "fewer_seeds",
        "frames",
        "spf",
        "solvent",
    ],
)
def test_explicit_path_with_other_settings_is_rejected(tmp_path, monkeypatch, change, match):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(protein, "simulate", lambda *a, **k: pytest.fail("simulated"))
    path = _saved(tmp_path / "set.npz")
    d = protein.alanine_dipeptide(**_REQUEST, path=path)  # the matching request loads it
    assert d.torsions.shape == (4, 3, 2)
    with pytest.raises(ValueError, match=rf"path: .*set\.npz.*({match})"):
        protein.alanine_dipeptide(**{**_REQUEST, **change}, path=path)


def test_cache_hit_with_matching_settings_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("HEXAD_CACHE", str(tmp_path))
    monkeypatch.setattr(protein, "simulate", lambda *a, **k: pytest.fail("simulated"))
    name = protein._file_name([300.0, 500.0], [1, 2], 3, 100, 5000, "obc")
    _saved(tmp_path / "protein" / name)
    d = protein.alanine_dipeptide(**_REQUEST)
    assert d.torsions.shape == (4, 3, 2) and d.solvent == "obc"
    np.testing.assert_array_equal(d.seed, [1, 2, 1, 2])
    # a cache file whose contents disagree with its name is not trusted either
    _saved(tmp_path / "protein" / name, seeds=(1, 3))
    with pytest.raises(ValueError, match="seeds"):
        protein.alanine_dipeptide(**_REQUEST)
