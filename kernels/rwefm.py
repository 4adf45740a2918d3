"""RWEFM kernels: the Riemannian entropic map, batched maps, and one training step.

Rows:

- ``rwefm/map s2 n=N`` and ``rwefm/map t2 n=N``: :class:`hexad.ot.EntropicMap` on ``S^2`` /
  ``T^2`` (Sinkhorn for ``d^2`` + the map of every source point) against ott-jax's Euclidean
  entropic map (``linear.solve`` on a ``PointCloud`` + ``DualPotentials.transport``) on the
  same points, the same epsilon and the same number of Sinkhorn iterations (the threshold is
  set unreachably low so both run exactly ``ITERS`` iterations). N = 1024 (``--quick``) or
  1024 and 4096. Goal: ratio <= 1.2. Bound (equivalent work): the peer itself, ``ITERS``
  Sinkhorn iterations on an ``n x n`` cost; the geodesic cost and the log/exp of the map come
  on top of them.
- ``rwefm/batched maps s2 64x256``: ``jax.vmap`` of the map over 64 cloud pairs of 256 points,
  against ``jax.vmap`` of ott-jax's Euclidean map; bound as above.
- ``rwefm/train step s2``: one jitted RWEFM training step (noise, cloud pairing, maps, loss,
  Adam) against the Euclidean flow-matching step (same network, same batch, ambient ``R^3``).
  Both arms draw from the same noise model (the studies' default, ``fit_noise`` on ``S^2``,
  as the studies give both arms) and run exactly ``STEP_ITERS`` Sinkhorn iterations per map
  (an unreachable ``sinkhorn_threshold``): at a reachable tolerance the iteration count
  depends on the cost (the geodesic and the Euclidean one converge at different rates), and
  the row would time the data, not the step. Goal: ratio <= 1.1. Bound (equivalent work):
  the Euclidean step (the peer), which does the same pairing, Sinkhorn iterations, network
  passes and Adam update; only the geodesic cost and the exp/log of each point are extra.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from ott.geometry import pointcloud
from ott.solvers import linear

from hexad.geometry import Euclidean, Sphere, Torus
from hexad.ot import EntropicMap
from hexad.rwefm import (
    CloudBatch,
    VectorField,
    fit_noise,
    make_trainer,
    vmf_mixture_clouds,
)
from kernels._harness import Case

EPS = 0.05
ITERS = 100
THRESH = 1e-12  # unreachable: both sides run exactly ITERS iterations
STEP_ITERS = 300  # Sinkhorn iterations per map in the train-step row (both arms)


def _ott_euclid_map(x, y):
    out = linear.solve(
        pointcloud.PointCloud(x, y, epsilon=EPS),
        threshold=THRESH,
        max_iterations=ITERS,
        inner_iterations=10,
    )
    return out.to_dual_potentials().transport(x)


def _ours(manifold):
    solver = EntropicMap(manifold, epsilon=EPS, threshold=THRESH, max_iterations=ITERS)

    def fn(x, y):
        return solver(x, y).mapped

    return fn


def cases(quick: bool) -> list[Case]:
    out = []
    sizes = (1024,) if quick else (1024, 4096)
    s2, t2 = Sphere(3), Torus(2)
    for n in sizes:
        kx, ky = jax.random.split(jax.random.key(n))
        for name, m in (("s2", s2), ("t2", t2)):
            x = m.random_uniform(kx, (n,))
            y = m.random_normal(ky, m.proj(jnp.ones(m.dim)), 0.5, (n,))
            out.append(
                Case(
                    name=f"rwefm/map {name} n={n}",
                    fn=_ours(m),
                    args=(x, y),
                    shapes=f"x[{n},{m.dim}] y[{n},{m.dim}] eps={EPS} iters={ITERS}",
                    items=float(n),
                    unit="points",
                    peer=_ott_euclid_map,
                    peer_name="ott-jax Euclidean entropic map",
                    goal="ratio <= 1.2",
                    bound_fn=_ott_euclid_map,
                    bound_note=f"{ITERS} Euclidean Sinkhorn iterations (the peer)",
                    repeats=5,
                    warmup=1,
                )
            )
    nb, npts = (16, 256) if quick else (64, 256)
    kx, ky = jax.random.split(jax.random.key(1))
    xs = s2.random_uniform(kx, (nb, npts))
    ys = vmf_mixture_clouds(ky, nb, npts)
    peer = jax.vmap(_ott_euclid_map)
    out.append(
        Case(
            name=f"rwefm/batched maps s2 {nb}x{npts}",
            fn=jax.vmap(_ours(s2)),
            args=(xs, ys),
            shapes=f"x[{nb},{npts},3] y[{nb},{npts},3]",
            items=float(nb * npts),
            unit="points",
            peer=peer,
            peer_name="vmap of ott-jax Euclidean entropic map",
            goal="ratio <= 1.2",
            bound_fn=peer,
            bound_note=f"{ITERS} Euclidean Sinkhorn iterations per pair (the peer)",
            repeats=5,
            warmup=1,
        )
    )
    bsz, npts = (8, 64) if quick else (32, 128)
    clouds = vmf_mixture_clouds(jax.random.key(2), bsz, npts)
    batch = CloudBatch(clouds, jnp.ones((bsz, npts)))
    opt = optax.adam(1e-3)
    e3 = Euclidean(3)
    noise = fit_noise(s2, batch)  # one noise model for both arms, as in the studies
    sink = dict(sinkhorn_iterations=STEP_ITERS, sinkhorn_threshold=THRESH)
    tr = make_trainer(s2, VectorField(s2, width=64, depth=2, heads=4), opt, noise, **sink)
    tr_e = make_trainer(e3, VectorField(e3, width=64, depth=2, heads=4), opt, noise, **sink)
    state = tr.init(jax.random.key(3), batch)
    state_e = tr_e.init(jax.random.key(3), batch)
    key = jax.random.key(4)
    out.append(
        Case(
            name=f"rwefm/train step s2 B={bsz} n={npts}",
            fn=tr.step,
            args=(key, state, batch),
            shapes=f"clouds[{bsz},{npts},3] width=64 depth=2 iters={STEP_ITERS}",
            items=float(bsz),
            unit="clouds",
            peer=tr_e.step,
            peer_args=(key, state_e, batch),
            peer_name="Euclidean flow-matching step (same net, R^3)",
            goal="ratio <= 1.1",
            bound_fn=tr_e.step,
            bound_note="the Euclidean step (the peer): the same work but the geodesic cost "
            "and the exp/log per point",
            repeats=5,
            warmup=1,
        )
    )
    return out
