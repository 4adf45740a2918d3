"""A tiny study for tests/test_distributed_runner.py: run as one process, or as each process of
a 2-process ``jax.distributed`` job (``--distributed``, launcher environment set by the test)."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from experiments import _runner


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 3
    lr: float = 0.1
    crash_at: int = -1  # process 1 exits right after starting this step's save (a lost node)


def run(cfg: Config, ctx: _runner.Context) -> dict:
    w = jnp.zeros(4)
    target = jax.random.normal(ctx.key(), (4,))
    step = jax.jit(lambda w: w - cfg.lr * 2.0 * (w - target))

    def lockstep(w):  # every process's w, averaged: a collective, as a sharded step has
        return jnp.asarray(np.mean(multihost_utils.process_allgather(np.asarray(w)), 0))

    with ctx.checkpointed("train", {"w": np.zeros(4, np.float32)}) as (start, state, save):
        w = jnp.asarray(state["w"])
        for i in ctx.progress(range(start, cfg.steps), desc="train"):
            w = step(lockstep(w))
            save(i, {"w": np.asarray(w)})
            if i == cfg.crash_at and jax.process_index() == 1 and not ctx.resume:
                os._exit(3)  # its step i commit dies with it; process 0's goes through
            ctx.log(step=i, loss=float(jnp.sum((w - target) ** 2)))
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot(np.asarray(w))
    ctx.save_plot(fig, "w")
    return {
        "loss": float(jnp.sum((w - target) ** 2)),
        "process_count": jax.process_count(),
        "start": start,
    }


STUDY = _runner.Study("dist_study", Config, run)

if __name__ == "__main__":
    STUDY.main()
