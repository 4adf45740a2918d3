"""Glue the Pref-MH studies share: chains with a progress bar, rules checkpointed one by one,
and the efficiency figures every rule reports."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments import _runner
from hexad import cachex, prefmh


def run_chains(ctx: _runner.Context, cfg: Any, key, algo, x0, desc: str) -> prefmh.ChainResult:
    """``prefmh.run_chains`` with the study's ``num_steps``, ``burn_in`` and ``chunk_size``,
    drawing a progress bar named ``desc`` unless ``--no-progress``."""
    bar = None
    if ctx.show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.num_steps, desc=desc, leave=False)
    out = prefmh.run_chains(
        key,
        algo,
        x0,
        cfg.num_steps,
        burn_in=cfg.burn_in,
        chunk_size=cfg.chunk_size,
        callback=None if bar is None else lambda done, total: bar.update(done - bar.n),
    )
    if bar is not None:
        bar.close()
    return out


def run_rules(
    ctx: _runner.Context,
    cfg: Any,
    names: Sequence[str],
    key,
    run_rule: Callable[[int, str, Any, dict[str, np.ndarray]], dict[str, Any]],
    arrays: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Runs ``run_rule(i, name, key, arrays) -> record`` for each rule, checkpointing each.

    Rule ``i`` gets the ``i``-th split of ``key`` whether it runs or is restored, so a run
    resumed with ``--resume`` takes exactly the keys of an uninterrupted one. ``arrays`` (name
    -> ``(shape, dtype)``) are checkpointed with the records (:class:`hexad.cachex.
    ItemCheckpoint`); ``run_rule`` fills its part of them. Each rule's scalar figures go to
    ``metrics.jsonl``. The checkpoint is kept in ``ctx.checkpoint_folder("rules")`` (each
    process of a job its own), so runs with another seed or other settings into the same
    ``--ckpt`` keep theirs apart.

    Returns:
      ``(summary, arrays)``: the records merged, and the arrays after the last rule.
    """
    summary: dict[str, Any] = {}
    with cachex.CacheXManager(ctx.checkpoint_folder("rules")) as mngr:
        done = cachex.ItemCheckpoint(
            mngr,
            names,
            arrays,
            config={"seed": ctx.seed, **dataclasses.asdict(cfg)},
            enabled=ctx.resume,
        )
        for i, name in enumerate(ctx.progress(names, desc="rules")):
            key, sub = jax.random.split(key)
            resumed = done.done(name)
            if resumed:
                record = done.record(name)
            else:
                record = run_rule(i, name, sub, done.arrays)
                done.complete(name, record)
            summary.update(record)
            scalars = {k: v for k, v in record.items() if not isinstance(v, list | tuple)}
            ctx.log(method=name, **({"resumed": True} if resumed else {}), **scalars)
    return summary, done.arrays


def figures(out: prefmh.ChainResult, cfg: Any, ess: float | None = None) -> dict[str, float]:
    """A rule's acceptance and efficiency: ``acc`` (mean acceptance), ``calls_per_step``
    (judge comparisons per chain-step), ``ess_per_step`` (``ess`` per kept chain-step; by
    default the smallest ESS over coordinates) and, for a rule that compares,
    ``ess_per_kcall`` (ESS per 1000 comparisons)."""
    kept = cfg.num_chains * (cfg.num_steps - cfg.burn_in)
    ess = float(jnp.min(out.ess)) if ess is None else ess
    calls = float(jnp.mean(out.judge_calls)) / cfg.num_steps
    f = {
        "acc": float(jnp.mean(out.acceptance)),
        "calls_per_step": calls,
        "ess_per_step": ess / kept,
    }
    if calls > 0:
        f["ess_per_kcall"] = 1000.0 * ess / (calls * kept)
    return f


def directions(rng: np.random.Generator, num: int, dim: int) -> np.ndarray:
    """``[num, dim]`` random unit vectors (the sliced-W1 projections)."""
    dirs = rng.standard_normal((num, dim))
    return dirs / np.linalg.norm(dirs, axis=1, keepdims=True)


def random_pairs(rng: np.random.Generator, n: int, num: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``(a, b)`` of up to ``num`` random pairs of distinct items among ``n``."""
    a, b = rng.integers(0, n, (2, num))
    return a[a != b], b[a != b]
