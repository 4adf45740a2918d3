"""Many chains at once: vmapped chains in a chunked ``lax.scan``, sharded over a mesh."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from hexad import sharding
from hexad._base import DATA_AXIS, check_int
from hexad.prefmh._diagnostics import effective_sample_size, potential_scale_reduction

__all__ = ["ChainResult", "run_chains"]


class ChainResult(NamedTuple):
    """Output of :func:`run_chains`.

    Attributes:
      state: final states, leaves ``[chains, ...]``.
      trace: ``[chains, num_kept, ...]`` positions after burn-in, every ``thin``-th step.
      acceptance: ``[chains]`` mean acceptance over all steps.
      judge_calls: ``[chains]`` int, total comparisons per chain.
      truncated: ``[chains]`` int, two-coin steps that hit ``max_rounds``.
      ess: ``[...]`` bulk effective sample size of ``trace`` per coordinate (BlackJAX's, on
        rank-normalised split chains; :func:`effective_sample_size`).
      rhat: ``[...]`` rank-normalised split R-hat of ``trace`` per coordinate (BlackJAX's;
        :func:`potential_scale_reduction`).
    """

    state: Any
    trace: jax.Array
    acceptance: jax.Array
    judge_calls: jax.Array
    truncated: jax.Array
    ess: jax.Array
    rhat: jax.Array


def _make_chunk(step: Callable, thin: int):
    def one_chain(keys, state):
        def body(carry, k):
            s, acc, calls, trunc, ok = carry
            s, info = step(k, s)
            # A plain BlackJAX info has no judge_calls / truncated / valid: 0, False, True.
            carry = (
                s,
                acc + info.is_accepted.astype(acc.dtype),
                calls + jnp.asarray(getattr(info, "judge_calls", 0)).astype(calls.dtype),
                trunc + jnp.asarray(getattr(info, "truncated", False)).astype(trunc.dtype),
                ok & getattr(info, "valid", True),
            )
            return carry, s.position

        zero_f = jnp.zeros((), jnp.result_type(float))
        zero_i = jnp.zeros((), jnp.int32)
        init = (state, zero_f, zero_i, zero_i, jnp.ones((), jnp.bool_))
        (state, acc, calls, trunc, ok), positions = jax.lax.scan(body, init, keys)
        return state, positions[thin - 1 :: thin], acc, calls, trunc, ok

    return jax.vmap(one_chain)


def run_chains(
    key: jax.Array,
    algorithm: Any,
    initial_positions: jax.Array,
    num_steps: int,
    *,
    burn_in: int = 0,
    thin: int = 1,
    chunk_size: int = 100,
    mesh: jax.sharding.Mesh | None = None,
    axis: str = DATA_AXIS,
    callback: Callable[[int, int], None] | None = None,
) -> ChainResult:
    """Runs many chains of ``algorithm`` and returns the trace and its diagnostics.

    The chains are vmapped; the steps run in jitted ``lax.scan`` chunks of ``chunk_size``
    steps (one compilation), and ``callback(steps_done, num_steps)`` is called from the host
    between chunks (progress bars). With ``mesh`` the chains are sharded along ``axis``.
    A step whose judge outcome or proposal ratio was invalid raises a ``ValueError`` after
    its chunk.

    Args:
      key: PRNG key, typed (``jax.random.key``) or raw (``jax.random.PRNGKey``).
      algorithm: ``(init, step)``, e.g. :func:`~hexad.prefmh.prefmh`, or any BlackJAX one
        whose state has a ``position`` and whose info has ``is_accepted`` (``blackjax.rmh``);
        an info without Pref-MH's ``judge_calls``, ``truncated`` or ``valid`` counts as 0
        comparisons, not truncated and valid.
      initial_positions: ``[chains, ...]``.
      num_steps: (static) total steps per chain, including burn-in.
      burn_in: (static) steps left out of the trace.
      thin: (static) keep every ``thin``-th step; must divide ``chunk_size``.
      chunk_size: (static) steps per jitted chunk.
      mesh: optional mesh; ``chains`` must be divisible by ``mesh.shape[axis]``.
      axis: (static) the mesh axis of the chains.
      callback: optional host function ``callback(steps_done, num_steps)``.

    >>> from hexad.prefmh import bradley_terry_judge, prefmh, random_walk
    >>> algo = prefmh(bradley_terry_judge(lambda x: -0.5 * jnp.sum(x**2)), random_walk(1.0))
    >>> out = run_chains(jax.random.key(0), algo, jnp.zeros((4, 2)), 200, burn_in=100)
    >>> out.trace.shape
    (4, 100, 2)
    """
    num_steps = check_int("num_steps", num_steps)
    burn_in = check_int("burn_in", burn_in, lo=0)
    thin = check_int("thin", thin)
    chunk_size = check_int("chunk_size", chunk_size)
    if burn_in >= num_steps:
        raise ValueError(f"burn_in: expected < num_steps = {num_steps}, got {burn_in}")
    chunk_size = min(chunk_size, num_steps)
    if num_steps % chunk_size:
        raise ValueError(
            f"num_steps: expected a multiple of chunk_size = {chunk_size}, got {num_steps}"
        )
    if chunk_size % thin:
        raise ValueError(f"thin: expected a divisor of chunk_size = {chunk_size}, got {thin}")
    if burn_in % chunk_size:
        raise ValueError(
            f"burn_in: expected a multiple of chunk_size = {chunk_size}, got {burn_in}"
        )
    positions = jnp.asarray(initial_positions)
    if positions.ndim < 1:
        raise ValueError(f"initial_positions: expected [chains, ...], got {positions.shape}")
    num_chains = positions.shape[0]
    spec = None
    if mesh is not None:
        # The chains are independent: shard them on an Auto mesh and let XLA propagate.
        sharding.check_divisible(mesh, axis, num_chains, "initial_positions")
        spec = sharding.batch_sharding(mesh, axis)
    states = jax.vmap(lambda p: algorithm.init(p))(positions)
    if spec is not None:
        states = sharding.put(states, spec)

    kwargs = {}
    if spec is not None:
        kwargs = dict(in_shardings=(spec, spec), out_shardings=spec)
    chunk_fn = jax.jit(_make_chunk(algorithm.step, thin), **kwargs)

    acc = jnp.zeros((num_chains,), jnp.result_type(float))
    calls = jnp.zeros((num_chains,), jnp.int32)
    trunc = jnp.zeros((num_chains,), jnp.int32)
    traces = []
    done = 0
    while done < num_steps:
        n = chunk_size
        key, sub = jax.random.split(key)
        # The same keys as split(sub, chains * n).reshape(chains, n) for a typed key; a raw
        # uint32 key (shape [2]) gives [chains, n, 2].
        keys = jax.random.split(sub, (num_chains, n))
        if spec is not None:
            keys = sharding.put(keys, spec)
        states, pos, a, c, t, ok = chunk_fn(keys, states)
        if not bool(jnp.all(ok)):
            bad = int(jnp.sum(~ok))
            raise ValueError(
                f"judge/proposal: {bad} chain(s) met a non-binary judge outcome or a non-finite "
                f"score / log_rho (NaN or +inf) between steps {done} and {done + n}"
            )
        acc, calls, trunc = acc + a, calls + c, trunc + t
        if done >= burn_in:
            traces.append(pos)
        done += n
        if callback is not None:
            callback(done, num_steps)
    trace = jnp.concatenate(traces, axis=1)
    ess = (
        effective_sample_size(trace) if trace.shape[1] >= 4 else jnp.full(trace.shape[2:], jnp.nan)
    )
    rhat = (
        potential_scale_reduction(trace)
        if trace.shape[1] >= 4 and num_chains >= 2
        else jnp.full(trace.shape[2:], jnp.nan)
    )
    return ChainResult(
        state=states,
        trace=trace,
        acceptance=acc / num_steps,
        judge_calls=calls,
        truncated=trunc,
        ess=ess,
        rhat=rhat,
    )
