"""Every leaf orbax saves, CacheX saves too: typed PRNG keys, bfloat16, int4/uint4, 0-d and
empty arrays, nested NamedTuples and dataclasses; a property test over random small pytrees
checks CacheX's round trip bit-exact and against orbax's own; CacheX uses public orbax only."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from hexad import cachex
from hexad.cachex import _format


class Pair(NamedTuple):
    a: Any
    b: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    x: Any
    y: Any


def _same(a: Any, b: Any) -> bool:
    """Bit-exact equality of two pytrees: structure, leaf kind, dtype, shape and bytes."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    for x, y in zip(la, lb, strict=True):
        if _format._is_key(x) or _format._is_key(y):
            if not (_format._is_key(x) and _format._is_key(y)):
                return False
            if str(jax.random.key_impl(x)) != str(jax.random.key_impl(y)):
                return False
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        if isinstance(x, jax.Array) != isinstance(y, jax.Array):
            return False
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    m = cachex.CacheXManager(tmp_path_factory.mktemp("leaves"), max_to_keep=1)
    m.steps = itertools.count()
    yield m
    m.close()


def _round_trip(m, tree, target=None):
    step = next(m.steps)
    assert m.save(step, tree)
    m.wait_until_finished()
    r = m.restore(tree if target is None else target)
    assert r.step == step
    return r.state


# -- typed PRNG keys ---------------------------------------------------------------------------


def test_typed_prng_keys_round_trip_with_their_impl(manager):
    tree = {
        "key": jax.random.key(0),
        "keys": jax.random.split(jax.random.key(1), 3),
        "rbg": jax.random.key(2, impl="rbg"),
        "w": jnp.arange(3.0),
    }
    got = _round_trip(manager, tree)
    assert _same(got, tree)
    # a restored key draws the same numbers as the saved one
    assert np.array_equal(jax.random.normal(got["key"], (4,)), jax.random.normal(tree["key"], (4,)))
    assert str(jax.random.key_impl(got["rbg"])) == "rbg"
    # abstract targets work too
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    assert _same(manager.restore(abstract).state, got)


def test_sharded_key_array_restores_with_its_sharding(manager):
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, P("data"))
    keys = jax.device_put(jax.random.split(jax.random.key(7), 8), sharding)
    got = _round_trip(manager, {"k": keys})
    assert _same(got, {"k": keys}) and got["k"].sharding == sharding
    sds = {"k": jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=sharding)}
    again = manager.restore(sds).state
    assert _same(again, {"k": keys}) and again["k"].sharding == sharding


@pytest.mark.parametrize(
    "saved, target, match",
    [
        (jax.random.key(0), jnp.zeros(2, jnp.uint32), "expected typed PRNG keys"),
        (jnp.zeros(2, jnp.uint32), jax.random.key(0), "expected a plain array"),
        (jax.random.key(0), jax.random.key(0, impl="rbg"), "expected typed PRNG keys"),
        (jax.random.split(jax.random.key(0), 2), jax.random.key(0), "expected typed PRNG keys"),
    ],
    ids=["key_into_plain", "plain_into_key", "other_impl", "other_shape"],
)
def test_key_target_mismatch_is_a_clear_error(manager, saved, target, match):
    step = next(manager.steps)
    manager.save(step, {"k": saved})
    manager.wait_until_finished()
    with pytest.raises(ValueError, match=r"target\['k'\]: " + match):
        manager.restore({"k": target})


# -- other leaves --------------------------------------------------------------------------------


def test_low_precision_zero_d_empty_and_nested_leaves(manager):
    tree = {
        "bf16": jnp.linspace(-1, 1, 5, dtype=jnp.bfloat16),
        "np_bf16": np.arange(3).astype(ml_dtypes.bfloat16),
        "int4": jnp.arange(-8, 8, dtype=jnp.int4),
        "uint4": jnp.arange(16, dtype=jnp.uint4),
        "np_int4": np.arange(-3, 3).astype(ml_dtypes.int4),
        "fp8": jnp.arange(4, dtype=jnp.float8_e4m3fn),
        "scalar": jnp.float32(2.5),
        "np_scalar": np.int8(-3),
        "zero_d": np.array(7, np.uint16),
        "empty": jnp.zeros((0, 3), jnp.float32),
        "np_empty": np.zeros((2, 0), np.int16),
        "nested": Pair(Box(jnp.ones(2), [np.zeros(1), 3]), Pair(None, {"z": 1.5})),
    }
    assert _same(_round_trip(manager, tree), tree)


# -- property test against orbax's own round trip ------------------------------------------------

_DTYPES = ["float32", "bfloat16", "float16", "int8", "uint8", "int32", "bool", "int4", "uint4"]
_SHAPES = [(), (0,), (3,), (2, 0), (2, 3)]


@st.composite
def _leaves(draw):
    kind = draw(st.sampled_from(["jax", "numpy", "key", "python"]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if kind == "key":
        impl = draw(st.sampled_from(["threefry2x32", "rbg"]))
        key = jax.random.key(seed, impl=impl)
        return draw(st.sampled_from([key, jax.random.split(key, 2)]))
    if kind == "python":
        return draw(st.sampled_from([seed, seed / 7.0, bool(seed % 2)]))
    name = draw(st.sampled_from(_DTYPES + (["float64", "complex64"] if kind == "numpy" else [])))
    dtype = _dtype(name)
    shape = draw(st.sampled_from(_SHAPES))
    if np.issubdtype(dtype, np.integer) or name in ("int4", "uint4"):
        lo, hi = (-8, 8) if name == "int4" else (0, 16) if name == "uint4" else (0, 100)
        x = rng.integers(lo, hi, size=shape).astype(dtype)
    elif dtype == np.bool_:
        x = rng.integers(0, 2, size=shape).astype(bool)
    else:
        x = rng.standard_normal(shape).astype(dtype)
    return jnp.asarray(x) if kind == "jax" else x


def _dtype(name: str) -> np.dtype:
    return (
        np.dtype(getattr(ml_dtypes, name))
        if name in ("bfloat16", "int4", "uint4")
        else np.dtype(name)
    )


def _trees():
    names = st.sampled_from(["a", "b", "c"])
    return st.recursive(
        _leaves(),
        lambda kids: st.one_of(
            st.dictionaries(names, kids, min_size=1, max_size=3),
            st.lists(kids, min_size=1, max_size=3),
            st.builds(Pair, kids, kids),
            st.builds(Box, kids, kids),
        ),
        max_leaves=6,
    )


def _orbax_saves(x: Any) -> bool:
    """What orbax 0.12's StandardCheckpointer refuses: empty arrays, uint4, numpy scalars."""
    if isinstance(x, np.generic):
        return False
    dtype = getattr(x, "dtype", None)
    if dtype is None or _format._is_key(x):
        return True
    return np.size(x) > 0 and dtype != _dtype("uint4")


@pytest.fixture(scope="module")
def orbax_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("orbax")


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure reproduces
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(tree=_trees())
def test_random_pytrees_round_trip_bit_exact_like_orbax(manager, orbax_dir, tree):
    tree = {"t": tree}
    got = _round_trip(manager, tree)
    assert _same(got, tree)
    # the peer: orbax saves the same tree (its leaves it supports) and restores the same bits
    peer = jax.tree.map(lambda x: x if _orbax_saves(x) else None, tree)
    path = orbax_dir / str(next(manager.steps))
    with ocp.StandardCheckpointer() as ck:
        ck.save(path, peer)
        ck.wait_until_finished()
        back = ck.restore(path, peer)
    mine = jax.tree.map(lambda x, y: x if y is not None else None, got, peer)
    assert _same(back, peer) and _same(mine, back)


# -- public orbax only ---------------------------------------------------------------------------


def test_cachex_uses_public_orbax_only():
    lib = Path(cachex.__file__).parents[1]
    private = [
        f"{p.relative_to(lib)}:{n}"
        for p in sorted(lib.rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"orbax\.checkpoint\._src|orbax\.checkpoint import _src", line)
    ]
    assert private == []


def test_step_metadata_reads_back_through_public_orbax(tmp_path):
    with cachex.CacheXManager(tmp_path) as m:
        m.save(0, {"w": np.ones(2, np.float32)})
    meta = ocp.metadata.get_step_metadata(m.steps_dir / "0")
    assert meta.init_timestamp_nsecs and meta.commit_timestamp_nsecs
    assert meta.init_timestamp_nsecs <= meta.commit_timestamp_nsecs
