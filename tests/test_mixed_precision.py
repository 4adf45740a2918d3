"""Mixed precision: the networks compute in bfloat16 with float32 parameters, heads and outputs.

For each network (RWEFM's transformer, the policy actor and critic, the backdoor CNN and
ResNet) the same float32 parameters are applied by the float32 model and by its
``dtype=jnp.bfloat16`` twin. Checked: the bfloat16 model really runs its matmuls or
convolutions in bfloat16 (so the agreement below cannot hold because the flag is ignored), its
parameters, outputs and gradients are float32, and it agrees with float32.

Tolerances, from 20 keys at these shapes (bfloat16's unit roundoff is 2^-9, about 0.002):
output relative error (L2) at most 0.013 (RWEFM), 0.007 (MLPs, CNN), 0.005 (ResNet); one
minus the cosine between the two models' parameter gradients at most 1e-3. The thresholds
are 3x and 10x those worst cases: a real precision bug (a float32 head in bfloat16, a
bfloat16 accumulation of a long sum, a dropped cast) exceeds them by far.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from hexad import backdoor as bd
from hexad import policy, rwefm
from hexad.geometry import Sphere

OUT_RTOL = 0.04
GRAD_COS_MIN = 0.99


def _vector_field(dtype):
    s2 = Sphere(3)
    k1, k2 = jax.random.split(jax.random.key(0))
    x = s2.random_uniform(k1, (4, 16))
    args = (x, jnp.ones((4, 16), bool), jax.random.uniform(k2, (4,)))
    return rwefm.VectorField(s2, width=32, depth=2, heads=4, dtype=dtype), args


def _actor(dtype):
    obs = jax.random.normal(jax.random.key(0), (32, 11))
    return policy.GaussianActor(3, (64, 64), dtype=dtype), (obs,)


def _critic(dtype):
    k1, k2 = jax.random.split(jax.random.key(0))
    obs = jax.random.normal(k1, (32, 11))
    act = jax.random.uniform(k2, (32, 3), minval=-1.0, maxval=1.0)
    return policy.TwinCritic((64, 64), dtype=dtype), (obs, act)


def _cnn(dtype):
    x = jax.random.uniform(jax.random.key(0), (8, 16, 16, 3))
    return bd.SmallCNN(10, (8, 16), 32, dtype=dtype), (x,)


def _resnet(dtype):
    x = jax.random.uniform(jax.random.key(0), (8, 16, 16, 3))
    return bd.PreActResNet(10, (8, 16), 4, dtype=dtype), (x,)


NETWORKS = {
    "rwefm.VectorField": _vector_field,
    "policy.GaussianActor": _actor,
    "policy.TwinCritic": _critic,
    "backdoor.SmallCNN": _cnn,
    "backdoor.PreActResNet": _resnet,
}


def _first_output(out):
    """The array a caller reads first: the Gaussian's mean, Q1, or the array itself."""
    if isinstance(out, policy.DiagGaussian):
        return out.mean
    if isinstance(out, tuple):
        return out[0]
    return out


def _params(model, args):
    params = model.init(jax.random.key(1), *args)
    # RWEFM's head starts at zero (the field is 0 at init): perturb every parameter so the
    # comparison is of a non-trivial function.
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(params))))
    return jax.tree.map(lambda v: v + 0.1 * jax.random.normal(next(keys), v.shape, v.dtype), params)


def _leaves_dtypes(tree):
    return {str(v.dtype) for v in jax.tree.leaves(tree)}


@pytest.mark.parametrize("name", list(NETWORKS))
def test_bfloat16_compute_agrees_with_float32(name):
    model32, args = NETWORKS[name](None)
    model16, _ = NETWORKS[name](jnp.bfloat16)
    params = _params(model32, args)
    # Same parameter tree and float32 parameters whichever compute dtype builds it.
    params16 = model16.init(jax.random.key(1), *args)
    assert jax.tree.structure(params16) == jax.tree.structure(params)
    assert _leaves_dtypes(params16) == {"float32"}

    def apply(model):
        return lambda p: _first_output(model.apply(p, *args))

    # The flag is honoured: bfloat16 operands appear only in the bfloat16 model.
    assert "bf16" in str(jax.make_jaxpr(apply(model16))(params))
    assert "bf16" not in str(jax.make_jaxpr(apply(model32))(params))

    def loss(model):
        def f(p):
            out = apply(model)(p)
            return jnp.sum(jnp.sin(out)), out

        return jax.jit(jax.grad(f, has_aux=True))

    g32, out32 = loss(model32)(params)
    g16, out16 = loss(model16)(params)
    assert out16.dtype == jnp.float32
    assert bool(jnp.all(jnp.isfinite(out16)))
    err = float(jnp.linalg.norm(out16 - out32) / jnp.linalg.norm(out32))
    assert err < OUT_RTOL, err
    assert _leaves_dtypes(g16) == {"float32"}
    a = jnp.concatenate([v.ravel() for v in jax.tree.leaves(g32)])
    b = jnp.concatenate([v.ravel() for v in jax.tree.leaves(g16)])
    cos = float(a @ b / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))
    assert cos > GRAD_COS_MIN, cos


def test_cnn_features_are_float32_under_bfloat16():
    model, (x,) = _cnn(jnp.bfloat16)
    params = model.init(jax.random.key(1), x)
    _, feats = model.apply(params, x, features=True)
    assert {k: str(v.dtype) for k, v in feats.items()} == dict.fromkeys(feats, "float32")
