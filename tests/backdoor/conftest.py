"""Shared tiny models for the backdoor tests: a clean and a BadNets CNN on 8x8 digits.

Trained once per test process (module fixtures would retrain per file). Sizes are tiny so the
whole folder stays within its CPU budget; the figures they reach are asserted in the tests.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax
import pytest

from hexad import backdoor as bd
from hexad.data.images import load_digits, train_test_split

TARGET = 0


@dataclasses.dataclass(frozen=True)
class Trained:
    model: bd.SmallCNN
    trigger: bd.PatchTrigger
    clean: dict
    bad: dict
    poisoned: bd.Poisoned
    x: jax.Array
    y: jax.Array
    x_test: jax.Array
    y_test: jax.Array
    x_clean: jax.Array  # the defender's 5% clean split
    y_clean: jax.Array


@pytest.fixture(scope="session")
def trained():
    d = load_digits(8)
    tr, te = train_test_split(d, 0.2, seed=0)
    x, y = jnp.asarray(tr.x), jnp.asarray(tr.y)
    trig = bd.patch_trigger((8, 8, 1), size=2)
    pois = bd.poison(jax.random.key(1), x, y, trig, rate=0.1, target=TARGET, num_classes=10)
    model = bd.SmallCNN(num_classes=10, widths=(8, 16), hidden=32)
    p0 = jax.jit(model.init)(jax.random.key(0), x[:1])

    # Both models in one minimize run (one compile): the loss is a sum over independent
    # parameters and Adam is elementwise, so each trains exactly as bd.fit would alone (same
    # key, so the same minibatch rows). chunk=1: for 300 steps, compiling one step and
    # dispatching it 300 times costs less CPU than compiling a 10-step unrolled chunk.
    def loss(ps, k, batch):
        del k
        xb, yb, xp, yp = batch
        f = model.apply
        return bd.cross_entropy(f(ps[0], xb), yb) + bd.cross_entropy(f(ps[1], xp), yp)

    data = (x, y, pois.x, pois.y)
    (clean, bad), _ = bd.minimize(
        jax.random.key(2), (p0, p0), loss, data, optax.adam(3e-3), 300, 64
    )
    n_clean = int(0.05 * x.shape[0])
    return Trained(
        model,
        trig,
        clean,
        bad,
        pois,
        x,
        y,
        jnp.asarray(te.x),
        jnp.asarray(te.y),
        x[-n_clean:],
        y[-n_clean:],
    )
