"""Bad inputs to the Pref-MH rules and diagnostics are named, not turned into numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad import prefmh


@pytest.mark.parametrize(
    "samples",
    [jnp.full((2, 8), jnp.nan), jnp.ones((2, 8)).at[1, 3].set(jnp.nan), jnp.full((2, 8), jnp.inf)],
)
def test_diagnostics_reject_non_finite_draws(samples):
    with pytest.raises(ValueError, match="samples: expected finite"):
        prefmh.effective_sample_size(samples)  # all-NaN was an ESS of 0
    with pytest.raises(ValueError, match="samples: expected finite"):
        prefmh.potential_scale_reduction(samples)


def test_a_traced_nan_chain_gives_a_nan_ess_not_zero():
    x = jax.random.normal(jax.random.key(0), (2, 8, 2)).at[:, :, 1].set(jnp.nan)
    ess = jax.jit(prefmh.effective_sample_size)(x)
    assert np.isfinite(ess[0]) and np.isnan(ess[1])


@pytest.mark.parametrize("bad", [jnp.nan, jnp.inf], ids=["nan", "inf"])
def test_a_traced_non_finite_draw_is_nan_even_where_the_split_drops_it(bad):
    # 9 draws: BlackJAX's split leaves draw 8 out, and its own NaN guard with it (alone it gives
    # a number here); an infinite draw it ranks like any other.
    x = jax.random.normal(jax.random.key(1), (2, 9, 2)).at[1, 8, 1].set(bad)
    for f in (prefmh.effective_sample_size, prefmh.potential_scale_reduction):
        got = jax.jit(f)(x)
        assert np.isfinite(got[0]) and np.isnan(got[1]), (f.__name__, got)


def test_missing_blackjax_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "blackjax.diagnostics", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"hexad\[prefmh\]"):
        prefmh.effective_sample_size(jnp.zeros((2, 7, 5)))  # a shape not traced before


def test_constant_chains_still_have_zero_ess():
    assert float(prefmh.effective_sample_size(jnp.zeros((2, 8)))[()]) == 0.0


@pytest.mark.parametrize("wins", [7, -1, jnp.array([0, 4]), np.array([1.0, np.nan])])
def test_kbudget_acceptance_rejects_wins_outside_the_budget(wins):
    with pytest.raises(ValueError, match="wins: expected values in \\[0, num_comparisons = 3\\]"):
        prefmh.kbudget_acceptance(wins, 3, jnp.array(0.0))  # 7 of 3 was -2.33


def test_kbudget_acceptance_traced_wins_outside_the_budget_are_nan():
    a = jax.jit(lambda w: prefmh.kbudget_acceptance(w, 3, jnp.zeros(4)))(jnp.array([-1, 0, 3, 7]))
    np.testing.assert_array_equal(np.isnan(a), [True, False, False, True])
    assert a[1] == 0.0 and a[2] == 1.0


def test_kbudget_acceptance_checks_its_budget():
    with pytest.raises(ValueError, match="num_comparisons"):
        prefmh.kbudget_acceptance(jnp.array(1), 0, jnp.array(0.0))


def test_distances_reject_nan_draws_and_bad_masses():
    a = jnp.zeros((4, 2))
    with pytest.raises(ValueError, match="a: expected finite"):
        prefmh.sliced_w1(a.at[0, 0].set(jnp.nan), a, jnp.eye(2))  # was NaN
    probs = jnp.full((2, 2), 0.25)
    with pytest.raises(ValueError, match="probs: expected finite"):
        prefmh.grid_tv(a, probs.at[0, 0].set(jnp.nan), 1.0)  # was NaN
    with pytest.raises(ValueError, match="probs: expected non-negative"):
        prefmh.grid_tv(a, probs.at[0, 0].set(-0.25), 1.0)
    with pytest.raises(ValueError, match="samples: expected finite"):
        prefmh.grid_tv(a.at[1, 1].set(jnp.inf), probs, 1.0)
