"""DTB kernels: outer bi-level steps per second, and the whole defense evaluation.

Rows:

- ``backdoor/dtb first-order K=5``: one outer DTB step (first-order hypergradient, 5 inner
  steps of clean fine-tuning + log1m decoy unlearning, SGD with momentum 0.9, the member
  drawn from ``DTBConfig``'s default family) on the digits CNN (16x16x1 inputs, widths
  8-16-16, hidden 32) at batch 64 (inner batch 32). Peer: one plain clean training step of the
  same model and optimiser (optax adam) on the same batch, timed in the same run; the ratio
  says how many clean steps one bi-level step costs (K = 5 forces at least ~6x).
- ``backdoor/dtb unrolled K=5``: the same with the exact unrolled (second-order) hypergradient.
- ``backdoor/defense eval``: (full mode only) the 14 defenses of ``hexad.backdoor.DEFENSES``
  at budget 100 on the quick model (8x8 digits, widths 8-16), with a 70-image clean split and
  the 1400-image training set (ABL, AC, SS); goal: under 10 minutes on CPU. Not jitted as a
  whole (each defense compiles its own steps), so this row includes compile time and runs 6 times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from hexad import backdoor as bd
from hexad.data.images import load_digits
from kernels._harness import Case


def _step_cases(hypergrad: str, size: int, batch: int):
    x = jnp.asarray(load_digits(size).x[: 4 * batch])
    y = jnp.asarray(load_digits(size).y[: 4 * batch])
    shape = (size, size, 1)
    model = bd.SmallCNN(10, (8, 16, 16), 32)
    p0 = model.init(jax.random.key(0), x[:1])
    problem = bd.DTBProblem(
        bd.patch_trigger(shape, 3), bd.blend_trigger(jax.random.key(1), shape, 0.15), 0, 1
    )
    opt = optax.adam(1e-3)
    cfg = bd.DTBConfig(inner_steps=5, inner_batch=32, hypergrad=hypergrad)
    dtb = bd.make_dtb(model, opt, cfg, problem, params=p0)
    batch_ = bd.DTBBatch(x[:batch], y[:batch], x[batch : 2 * batch], y[batch : 2 * batch])
    trainer = bd.make_trainer(model, opt, params=p0)
    clean = (x[:batch], y[:batch])
    return Case(
        name=f"backdoor/dtb {hypergrad.replace('_', '-')} K=5",
        fn=dtb.step,
        args=(jax.random.key(2), dtb.init(None, batch_), batch_),
        shapes=f"x[{batch},{size},{size},1] inner[{batch}]",
        items=1.0,
        unit="steps",
        peer=trainer.step,
        peer_args=(jax.random.key(2), trainer.init(None, clean), clean),
        peer_name="plain clean train step (adam)",
        goal="report steps/s; ratio = clean steps per bi-level step",
    )


def _defense_eval():
    d = load_digits(8)
    x, y = jnp.asarray(d.x[:1400]), jnp.asarray(d.y[:1400])
    xc, yc = x[-70:], y[-70:]
    model = bd.SmallCNN(10, (8, 16), 32)
    params = model.init(jax.random.key(0), x[:1])

    data = bd.DefenseData(xc, yc, x, y)

    def run():
        return [
            f(jax.random.key(i), model, params, data) for i, f in enumerate(bd.DEFENSES.values())
        ]

    n = len(bd.DEFENSES)
    return Case(
        name=f"backdoor/defense eval ({n} defenses)",
        fn=run,
        shapes="x_clean[70,8,8,1] x_train[1400,8,8,1]",
        jit=False,
        items=n,
        unit="defenses",
        goal="< 600 s per evaluation on CPU",
        repeats=5,
        warmup=0,
    )


def cases(quick: bool) -> list[Case]:
    out = [_step_cases("first_order", 16, 64), _step_cases("unrolled", 16, 64)]
    if not quick:
        out.append(_defense_eval())
    return out
