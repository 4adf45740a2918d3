"""A tiny study for tests/test_distributed_runner.py: run as one process, or as each process of
a 2-process ``jax.distributed`` job (``--distributed``, launcher environment set by the test)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from experiments import _runner


@dataclasses.dataclass(frozen=True)
class Config:
    steps: int = 3
    lr: float = 0.1


def run(cfg: Config, ctx: _runner.Context) -> dict:
    w = jnp.zeros(4)
    target = jax.random.normal(ctx.key(), (4,))
    step = jax.jit(lambda w: w - cfg.lr * 2.0 * (w - target))
    with ctx.checkpointed("train", {"w": np.zeros(4, np.float32)}) as (start, state, save):
        w = jnp.asarray(state["w"])
        for i in ctx.progress(range(start, cfg.steps), desc="train"):
            w = step(w)
            save(i, {"w": np.asarray(w)})
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
