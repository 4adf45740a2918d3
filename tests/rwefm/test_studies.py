"""Smoke tests of the RWEFM studies at tiny size: they run end to end and report every key;
an interrupted protein run resumed from its checkpoint reproduces the uninterrupted one."""

import json

import pytest

from experiments import _runner, rwefm_protein, rwefm_singlecell, rwefm_synthetic

TINY = {
    "n_train": 8,
    "n_test": 4,
    "n_points": 6,
    "steps": 2,
    "chunk": 2,
    "batch": 4,
    "width": 8,
    "depth": 1,
    "heads": 1,
    "sampler_steps": 2,
    "n_seeds": 2,
    "n_floor": 2,
    "map_max_iterations": 200,
    "n_generations": 2,
}
KEYS = (
    "noise",
    "map_converged_frac_rwefm",
    "map_converged_frac_euclid",
    "eval_converged_frac",
    "emd_1nna_diff_mean",
    "emd_1nna_diff_sd",
    "floor_chamfer_mm_mean",
    "rwefm_emd_kmmd_sd",
    "on_manifold_max_err",
    "emd_1nna_half_diff_mean",
)
# On a torus: the Euclidean flow fed the torus's (cos, sin) features, paired with RWEFM.
PERIODIC_KEYS = ("euclid_periodic_emd_1nna_half_seeds", "emd_1nna_diff_periodic_mean")
VERDICT_KEYS = ("verdict", "effect_mean", "effect_ci_low", "effect_ci_high", "seeds_needed",
                "equivalence_margin", "verdict_reference")  # fmt: skip


@pytest.mark.slow  # ~30 s of CPU: four trainer and sampler compilations
def test_synthetic_study_smoke(tmp_path):
    cfg = rwefm_synthetic.STUDY.make_config(True, {**TINY, "manifolds": ("t2",)})
    summary = rwefm_synthetic.STUDY.execute(
        cfg, out_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    for k in KEYS:
        assert f"t2_{k}" in summary
    for k in ("noise", "map_converged_frac_rwefm", "eval_converged_frac"):
        assert k in summary
    assert summary["t2_on_manifold_max_err"] == 0.0
    assert json.loads((tmp_path / "summary.json").read_text())["t2_rwefm_emd_mm_mean"] >= 0.0


@pytest.mark.slow  # ~15 s of CPU; the protein study covers the same shared routine by default
def test_singlecell_study_smoke(tmp_path):
    cfg = rwefm_singlecell.STUDY.make_config(True, {**TINY, "n_pcs": 3})
    summary = rwefm_singlecell.STUDY.execute(
        cfg, out_dir=tmp_path, checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    for k in KEYS:
        assert k in summary
    assert not any(k.startswith("euclid_periodic") for k in summary)  # S^n: features = coords
    for k in ("rwefm_composition_tv_seeds", "type_nn_dist_diff_mean", "floor_composition_tv_mean"):
        assert k in summary
    assert summary["on_manifold_max_err"] < 1e-5


class _Interrupted(Exception):
    pass


def _protein_cfg():
    # two chunks per model, a checkpoint after each; the bundled torsion sample
    return rwefm_protein.STUDY.make_config(True, {**TINY, "steps": 4, "ckpt_every": 1, "stride": 6})


def _figures_equal(a, b):
    for k in (*KEYS[1:], "rwefm_final_loss_mean", "euclid_final_loss_mean"):
        # same parameters, same keys, same compiled functions: CPU XLA is deterministic
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), k


def _trained_models(out_dir):
    path = out_dir / "metrics.jsonl"
    if not path.is_file():  # nothing logged
        return []
    rows = [json.loads(s) for s in path.read_text().splitlines()]
    # one line per training chunk (Context.train_chunks), named by its stage
    return [(r["stage"], r["step"]) for r in rows if "stage" in r]


@pytest.mark.slow  # ~48 s of CPU (one study run, compilation); the default budget is ~100 s
def test_protein_study_smoke_and_resume_of_a_finished_run(tmp_path):
    cfg = _protein_cfg()
    full = rwefm_protein.STUDY.execute(
        cfg, out_dir=tmp_path / "a", checkpoint_dir=tmp_path / "ckpt", show_progress=False
    )
    for k in (*KEYS, *PERIODIC_KEYS, *VERDICT_KEYS, "n_train_clouds", "n_test_clouds"):
        assert k in full
    assert full["arms"] == ["rwefm", "euclid", "euclid_periodic"]
    assert full["verdict_reference"] == "euclid_periodic" and full["n_seeds"] == 2
    assert 0.0 <= full["rwefm_basin_tv_mean"] <= 1.0 and full["floor_rama_js_mean"] >= 0.0
    assert full["on_manifold_max_err"] == 0.0  # the torus exp wraps exactly
    assert full["n_test_clouds"] == 4 and full["frame_ps"] == 0.5
    assert (tmp_path / "a" / "ramachandran.png").is_file()
    assert _trained_models(tmp_path / "a") == [
        ("rwefm", 2),
        ("rwefm", 4),
        ("euclid", 2),
        ("euclid", 4),
        ("euclid_periodic", 2),
        ("euclid_periodic", 4),
    ]
    # --resume of a finished run restores every model and trains nothing
    again = rwefm_protein.STUDY.execute(
        cfg,
        out_dir=tmp_path / "b",
        checkpoint_dir=tmp_path / "ckpt",
        resume=True,
        show_progress=False,
    )
    assert _trained_models(tmp_path / "b") == []
    _figures_equal(again, full)


@pytest.mark.slow  # ~70 s of CPU: three runs of the study
def test_protein_study_interrupted_and_resumed_equals_uninterrupted(tmp_path, monkeypatch):
    cfg = _protein_cfg()
    full = rwefm_protein.STUDY.execute(
        cfg, out_dir=tmp_path / "a", checkpoint_dir=tmp_path / "a_ckpt", show_progress=False
    )
    # interrupt RWEFM's training right after its first chunk was checkpointed ...
    log = _runner.Context.log

    def interrupt(self, **m):
        if m.get("stage") == "rwefm" and m.get("step") == 2:
            raise _Interrupted
        return log(self, **m)

    monkeypatch.setattr(_runner.Context, "log", interrupt)
    with pytest.raises(_Interrupted):
        rwefm_protein.STUDY.execute(
            cfg, out_dir=tmp_path / "b", checkpoint_dir=tmp_path / "b_ckpt", show_progress=False
        )
    monkeypatch.setattr(_runner.Context, "log", log)
    # ... and resume: RWEFM trains only its second chunk, the baseline from scratch
    resumed = rwefm_protein.STUDY.execute(
        cfg,
        out_dir=tmp_path / "b",
        checkpoint_dir=tmp_path / "b_ckpt",
        resume=True,
        show_progress=False,
    )
    assert _trained_models(tmp_path / "b") == [
        ("rwefm", 4),
        ("euclid", 2),
        ("euclid", 4),
        ("euclid_periodic", 2),
        ("euclid_periodic", 4),
    ]
    _figures_equal(resumed, full)


def test_map_converged_frac_is_the_same_after_resume(tmp_path, monkeypatch):
    # _rwefm._train's map_converged_frac is the mean over all training chunks: an interrupted
    # run resumed, and a finished run resumed, report the uninterrupted run's value, not the
    # mean over the chunks run after the restart.
    import jax
    import jax.numpy as jnp

    from experiments import _rwefm
    from hexad import rwefm
    from hexad.geometry import Torus

    # 3 chunks of 2 steps; 3 Sinkhorn iterations, so the fraction of converged maps varies
    cfg = _rwefm.TrainConfig(**{**_rwefm.QUICK, **TINY, "steps": 6, "ckpt_every": 1})
    torus = Torus(2)
    clouds = jax.random.uniform(jax.random.key(1), (8, 6, 2), minval=-3.0, maxval=3.0)
    ones = jnp.ones(clouds.shape[:2])
    noise = rwefm.fit_noise(torus, rwefm.CloudBatch(clouds, ones), cfg.noise)

    def train(name, ckpt, resume=False):
        out = tmp_path / name
        out.mkdir(exist_ok=True)
        ctx = _runner.Context(
            "t", out, checkpoint_dir=ckpt, resume=resume, show_progress=False, settings="s"
        )
        try:
            key = jax.random.key(0)
            return _rwefm._train(key, torus, None, noise, clouds, cfg, 3, ctx, "arm")[2]
        finally:
            ctx.close()

    full = train("full", None)
    per_chunk = [json.loads(s)["map_converged"] for s in (tmp_path / "full" / "metrics.jsonl")
                 .read_text().splitlines()]  # fmt: skip
    assert len(per_chunk) == 3 and len(set(per_chunk)) > 1, per_chunk  # the test can tell
    log = _runner.Context.log

    def interrupt(self, **m):
        if m.get("chunk") == 2:
            raise _Interrupted
        return log(self, **m)

    monkeypatch.setattr(_runner.Context, "log", interrupt)
    with pytest.raises(_Interrupted):
        train("cut", tmp_path / "ckpt")  # chunks 0 and 1 checkpointed, chunk 2 lost
    monkeypatch.setattr(_runner.Context, "log", log)
    assert train("resumed", tmp_path / "ckpt", resume=True) == full
    assert train("again", tmp_path / "ckpt", resume=True) == full  # a finished run
