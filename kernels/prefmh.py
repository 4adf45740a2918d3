"""Pref-MH chain throughput against BlackJAX, and the cost of the external-judge path.

Rows:

- ``prefmh/kbudget K=1``: chain steps per second of Pref-MH (K = 1, a Bradley-Terry judge of a
  2-D four-component Gaussian mixture, Gaussian random walk), 4096 vmapped chains, 50 steps in
  one ``lax.scan``. Peer: ``blackjax.normal_random_walk`` with the exact log-density of the
  same target and the same step size, same chains and steps (goal: ratio ours/peer <= 1.05).
- ``prefmh/kbudget K=3``: the same with three comparisons per step (same peer).
- ``prefmh/external judge``: the same K = 1 chain whose judge is a numpy Bradley-Terry
  simulator reached through ``jax.pure_callback`` (one batched host call per step for all
  chains); throughput is in comparisons/s. Peer: the in-graph Bradley-Terry judge. The
  overhead per comparison is ``(median - peer median) / comparisons``.

Bounds: a K-budget step does at least the work of one random-walk MH step (one score of the
proposal, one uniform), so each K-budget row's bound is the BlackJAX step timed in the same run
(a fraction of 1.0 is RWMH's cost); the external-judge row's bound is the same chain with the
in-graph judge (what remains is the host round trip). On this small target the random bits and
the transcendentals dominate a step. RWMH draws 7 32-bit words per chain step in three draws (a
two-way key split, two normals, one uniform) and takes one log. A K-budget step with the
in-graph Bradley-Terry judge draws 5 + K in two (its proposal key, its acceptance uniform and
its K comparison uniforms in one draw, two normals) and takes one exp (the judge's sigmoid; the
rule ``min(1, rho k / (K + 1 - k))`` needs none for a symmetric proposal), so K = 1 can match it.

Run: ``python -m kernels prefmh [--quick]`` (``--quick``: 1024 chains, 20 steps).
"""

from __future__ import annotations

import blackjax
import jax
import jax.numpy as jnp
import numpy as np

from hexad import prefmh
from kernels._harness import Case

_MEANS = np.array([[-2.0, -2.0], [2.0, -2.0], [-2.0, 2.0], [2.0, 2.0]], np.float32)
_SIGMA = 0.6
_STEP = 1.0


def _logdensity(x):
    d2 = jnp.sum((x[None, :] - _MEANS) ** 2, axis=-1)
    return jax.scipy.special.logsumexp(-0.5 * d2 / _SIGMA**2) - np.log(4.0)


def _np_judge(first, second, rng):
    def logd(x):
        d2 = np.sum((x[:, None, :] - _MEANS[None]) ** 2, axis=-1)
        m = -0.5 * d2 / _SIGMA**2
        top = m.max(axis=1)
        return top + np.log(np.exp(m - top[:, None]).sum(axis=1))

    logit = logd(second) - logd(first)
    return (rng.random(first.shape[0]) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int32)


def _scan_ours(algo, num_steps):
    step = jax.vmap(algo.step)

    def run(key, state):
        def body(s, k):
            s, _ = step(jax.random.split(k, state.position.shape[0]), s)
            return s, None

        state, _ = jax.lax.scan(body, state, jax.random.split(key, num_steps))
        return state.position

    return run, jax.jit(jax.vmap(algo.init))


def _scan_blackjax(num_steps):
    algo = blackjax.normal_random_walk(_logdensity, _STEP * jnp.ones(2))
    step = jax.vmap(algo.step)

    def run(key, state):
        def body(s, k):
            s, _ = step(jax.random.split(k, state.position.shape[0]), s)
            return s, None

        state, _ = jax.lax.scan(body, state, jax.random.split(key, num_steps))
        return state.position

    return run, algo


def cases(quick: bool) -> list[Case]:
    chains, steps = (1024, 20) if quick else (4096, 50)
    key = jax.random.key(0)
    x0 = jax.random.normal(key, (chains, 2)) * 2.0
    peer_run, bj = _scan_blackjax(steps)
    bj_state = jax.jit(jax.vmap(bj.init))(x0)
    bt = prefmh.bradley_terry_judge(_logdensity)
    rw = prefmh.random_walk(_STEP)
    shapes = f"chains={chains} steps={steps} d=2"
    out = []
    for k in (1, 3):
        run, init = _scan_ours(prefmh.prefmh(bt, rw, "kbudget", k), steps)
        out.append(
            Case(
                name=f"prefmh/kbudget K={k}",
                fn=run,
                args=(key, init(x0)),
                shapes=shapes,
                items=chains * steps,
                unit="steps",
                peer=peer_run,
                peer_args=(key, bj_state),
                peer_name="blackjax.normal_random_walk",
                goal="ratio <= 1.05 vs the peer" if k == 1 else "",
                bound_fn=peer_run,
                bound_note="1 RWMH step per step",
            )
        )
    ext_steps = 5 if quick else 10
    ext = prefmh.external_judge(_np_judge)
    ext_run, ext_init = _scan_ours(prefmh.prefmh(ext, rw, "kbudget", 1), ext_steps)
    bt_run, bt_init = _scan_ours(prefmh.prefmh(bt, rw, "kbudget", 1), ext_steps)
    out.append(
        Case(
            name="prefmh/external judge K=1",
            fn=ext_run,
            args=(key, ext_init(x0)),
            shapes=f"chains={chains} steps={ext_steps} d=2",
            items=chains * ext_steps,
            unit="comparisons",
            peer=bt_run,
            peer_args=(key, bt_init(x0)),
            peer_name="in-graph BT judge",
            goal="report overhead per comparison",
            repeats=5,
            bound_fn=bt_run,
            bound_note="the in-graph judge's chain",
        )
    )
    return out
