"""The generators that Pref-MH tilts: probabilistic PCA and the token trigram model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import prefmh


def test_ppca_keeps_the_top_eigenpairs_and_averages_the_rest():
    # Tipping & Bishop's ML solution: W W^T + sigma^2 I has the d largest eigenpairs of the
    # sample covariance S, and sigma^2 (the mean of the others) in the remaining directions.
    rng = np.random.default_rng(0)
    w_true = rng.normal(size=(6, 2)) * np.array([3.0, 2.0])
    x = rng.normal(size=(4000, 2)) @ w_true.T + 0.3 * rng.normal(size=(4000, 6)) + 1.5
    model = prefmh.fit_ppca(x, 2)
    s = np.cov(x, rowvar=False)
    evals = np.sort(np.linalg.eigvalsh(s))[::-1]
    model_cov = model.weight @ model.weight.T + model.noise * np.eye(6)
    got = np.sort(np.linalg.eigvalsh(model_cov))[::-1]
    np.testing.assert_allclose(got[:2], evals[:2], rtol=1e-10)
    np.testing.assert_allclose(got[2:], evals[2:].mean(), rtol=1e-10)
    np.testing.assert_allclose(model.mean, x.mean(0))
    # The planted model is recovered up to sampling error (n = 4000; relative error ~ 0.05).
    np.testing.assert_allclose(model.noise, 0.09, rtol=0.15)
    np.testing.assert_allclose(model.weight @ model.weight.T, w_true @ w_true.T, atol=1.0)
    z = jnp.array([1.0, -2.0])
    np.testing.assert_allclose(
        model.decode(z), model.mean + model.weight @ np.asarray(z), rtol=1e-5
    )


def test_trigram_counts_are_exact():
    tokens = np.array([0, 1, 2, 0, 1, 2, 0, 1, 1])
    model = prefmh.fit_trigram(tokens, 3, 0.5)
    cond = np.exp(np.asarray(model.log_cond))
    np.testing.assert_allclose(cond.sum(-1), 1.0, rtol=1e-6)
    # After (0, 1): 2 at twice, 1 once -> (2.5, 1.5, 0.5) / 4.5 for c = (2, 1, 0).
    np.testing.assert_allclose(cond[0, 1], [0.5 / 4.5, 1.5 / 4.5, 2.5 / 4.5], rtol=1e-6)
    # Unseen context: uniform.
    np.testing.assert_allclose(cond[2, 2], [1 / 3] * 3, rtol=1e-6)
    start = np.exp(np.asarray(model.log_start))
    bigrams = np.zeros((3, 3))
    np.add.at(bigrams, (tokens[:-1], tokens[1:]), 1.0)
    np.testing.assert_allclose(start, (bigrams + 0.5) / (bigrams + 0.5).sum(), rtol=1e-6)


def test_trigram_sampler_follows_the_model():
    # A near-deterministic cycle 0 -> 1 -> 2 -> 0: every drawn sequence follows it, and the
    # first token is 0, 1 or 2 with the bigram start law.
    tokens = np.tile([0, 1, 2], 200)
    model = prefmh.fit_trigram(tokens, 3, 1e-6)
    sample = jax.jit(jax.vmap(prefmh.trigram_sampler(model, 12)))
    seqs = np.asarray(sample(jax.random.split(jax.random.key(0), 3000)))
    assert seqs.shape == (3000, 12) and seqs.dtype == np.int32
    assert ((seqs[:, 1:] - seqs[:, :-1]) % 3 == 1).all()
    # Start pairs (0,1), (1,2), (2,0) have counts 200, 200, 199: each ~1/3; 4 binomial SEs.
    freq = np.bincount(seqs[:, 0], minlength=3) / 3000
    assert np.abs(freq - 1 / 3).max() < 4 * np.sqrt(2 / 9 / 3000)


def test_bad_input_raises():
    with pytest.raises(ValueError, match=r"latent_dim: expected an int in \[1, 2\]"):
        prefmh.fit_ppca(np.zeros((10, 3)), 3)
    with pytest.raises(ValueError, match="x"):
        prefmh.fit_ppca(np.zeros(10), 1)
    with pytest.raises(ValueError, match="tokens"):
        prefmh.fit_trigram(np.array([0, 3, 1]), 3, 0.1)
    with pytest.raises(ValueError, match="smoothing"):
        prefmh.fit_trigram(np.array([0, 1, 1]), 3, 0.0)
    with pytest.raises(ValueError, match="length"):
        prefmh.trigram_sampler(prefmh.fit_trigram(np.array([0, 1, 1]), 2, 0.1), 1)
