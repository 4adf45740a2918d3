"""Bad inputs to the manifolds get a clear error naming the argument, at construction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hexad.geometry import Euclidean, Product, Sphere, Torus, check_points


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: Sphere(-1), "dim"),
        (lambda: Sphere(2.5), "dim"),
        (lambda: Sphere(1), "dim"),  # S^0: two points, no tangent space
        (lambda: Torus(0), "dim"),
        (lambda: Euclidean("3"), "dim"),
        (lambda: Euclidean(0), "dim"),
        (lambda: Sphere(True), "dim"),
        (lambda: Product(()), "factors"),
    ],
)
def test_bad_static_fields_are_rejected_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_product_factors_must_be_manifolds():
    with pytest.raises(TypeError, match=r"factors\[1\]"):
        Product((Sphere(3), 2))


def test_numpy_ints_and_lists_are_stored_as_hashable_python_values():
    s = Sphere(np.int64(3))
    assert type(s.dim) is int and s == Sphere(3) and hash(s) == hash(Sphere(3))
    p = Product([Sphere(3), Torus(1)])
    assert p.factors == (Sphere(3), Torus(1)) and hash(p) == hash(Product((Sphere(3), Torus(1))))


def test_validated_manifolds_still_pass_through_jit_vmap_and_tree_maps():
    # jax rebuilds a manifold from its static fields (tree_unflatten runs __post_init__).
    p = Product((Sphere(3), Torus(1)))
    assert jax.tree.map(lambda a: a, p) == p
    x = jnp.array([[1.0, 0.0, 0.0, 0.5], [0.0, 1.0, 0.0, -0.5]])
    d = jax.jit(lambda m, a, b: m.dist(a, b))(p, x, x[::-1])
    dv = jax.vmap(lambda m, a: m.proj(a), in_axes=(None, 0))(p, x)
    assert d.shape == (2,) and dv.shape == (2, 4)
    assert jax.jit(lambda m: m.dim)(Sphere(5)) == 5


def test_check_points_on_a_closed_over_cloud_checks_its_values_under_jit():
    # Before: TracerArrayConversionError (the manifold error was computed by jnp inside the
    # outer trace, then read by NumPy). Now a valid closed-over cloud passes and an invalid
    # one is named, inside jit, grad and vmap.
    for m in (Sphere(3), Torus(2), Euclidean(2)):
        y = m.proj(jnp.ones((3, m.dim)))

        def f(p, y=y, m=m):
            check_points(m, y, "y")
            return jnp.sum(m.sqdist(p, y))

        assert np.isfinite(jax.jit(f)(y))
        assert np.all(np.isfinite(jax.jit(jax.grad(f))(y + 0.01)))
        assert jax.vmap(f)(jnp.stack([y, y])).shape == (2,)
    off = 2.0 * jnp.ones((3, 3))
    with pytest.raises(ValueError, match="y: expected points on Sphere"):
        jax.jit(lambda p: (check_points(Sphere(3), off, "y"), p)[1])(off)
