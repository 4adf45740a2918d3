"""DTB kernels: outer bi-level steps per second, and the whole defense evaluation.

Rows:

- ``backdoor/dtb first-order K=5``: one outer DTB step (first-order hypergradient, 5 inner
  steps of clean fine-tuning without unlearning, ``DTBConfig``'s default, SGD with momentum
  0.9, the ``"ft"`` member of the surrogate family, so that every step does the same work;
  the post-sanitisation terms at ``P = 2`` path points) on the model and
  data the DTB study's defaults use: 16x16 RGB shapes (``load_shapes_rgb``), the GroupNorm
  ``PreActResNet`` of widths 16-32-32 (4 groups), outer batch 64, inner batch 32. Peer: one
  plain clean training step of the same model and optimiser (optax adam) on the same batch,
  timed in the same run; the ratio says how many clean steps one bi-level step costs.
  Bound (equivalent work), in clean steps of the outer batch (a forward pass counted 1/3 of
  a step, its backward 2/3): ``K r + 7/3 + 3 P``, ``r`` = the inner step's rows over the
  outer batch's (its 32 clean rows, doubled with decoy unlearning: 1/2 here). The K inner
  steps each run forward and backward on their rows (``r``); the outer objective takes three
  forward passes at the original parameters (the decoy-mixed, hidden-triggered and
  decoy-triggered batches) and backward through two of them (7/3), and at each path point
  one forward and one backward pass over the clean, decoy- and hidden-triggered rows (3).
  It is a serial count: XLA:CPU runs the independent passes of one outer step concurrently
  on the cores, which one plain step cannot, so a fraction above 1 is possible and means
  the step is at its pass count.
- ``backdoor/dtb unrolled K=5``: the same with the exact unrolled (second-order) hypergradient.
  Bound: ``3 K r + 7/3 + 3 P`` clean steps: each inner step's forward and backward (``r``)
  and, in the reverse sweep (one for all path points), its vjp, a Hessian-vector product at
  twice a gradient's cost (``2 r``), plus the outer passes as above.
- ``backdoor/defense eval``: (full mode only) the 14 defenses of ``hexad.backdoor.DEFENSES``
  at budget 100 on the quick model (8x8 digits, widths 8-16), with a 70-image clean split and
  the 1400-image training set (ABL, AC, SS); goal: under 10 minutes on CPU. Not jitted as a
  whole (each defense compiles its own steps), so this row includes compile time and runs 6 times.
  Bound (equivalent work): ``100 x 14`` plain training steps of the same model at batch 64 on
  the clean split, one budget per defense; most defenses spend several times their budget
  (teacher and student, reversal and unlearning, retraining from scratch), so a fraction well
  below 1 is expected.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from hexad import backdoor as bd
from hexad.data.images import load_digits, load_shapes_rgb
from kernels._harness import Case

K = 5


def pass_bound(cfg: bd.DTBConfig, batch: int) -> float:
    """The bound's pass count of one outer step of ``cfg`` at outer batch ``batch``, in clean
    steps (module docstring)."""
    r = (2 if cfg.unlearn_weight else 1) * (cfg.inner_batch or batch) / batch
    inner = (1 if cfg.hypergrad == "first_order" else 3) * cfg.inner_steps * r
    return inner + 7 / 3 + 3 * cfg.path_points


def _step_cases(hypergrad: str, size: int = 16, batch: int = 64):
    data = load_shapes_rgb(0, n_per_class=2 * batch // 10 + 1, size=size)
    x, y = jnp.asarray(data.x[: 2 * batch]), jnp.asarray(data.y[: 2 * batch])
    shape = (size, size, 3)
    model = bd.PreActResNet(10, (16, 32, 32), 4)  # experiments.backdoor_dtb's defaults
    p0 = model.init(jax.random.key(0), x[:1])
    problem = bd.DTBProblem(
        bd.patch_trigger(shape, 3), bd.blend_trigger(jax.random.key(1), shape, 0.15), 0, 1
    )
    opt = optax.adam(1e-3)
    cfg = bd.DTBConfig(inner_steps=K, inner_batch=batch // 2, hypergrad=hypergrad, family=("ft",))
    dtb = bd.make_dtb(model, opt, cfg, problem, params=p0)
    batch_ = bd.DTBBatch(x[:batch], y[:batch], x[batch : 2 * batch], y[batch : 2 * batch])
    trainer = bd.make_trainer(model, opt, params=p0)
    clean = (x[:batch], y[:batch])
    work = pass_bound(cfg, batch)
    return Case(
        name=f"backdoor/dtb {hypergrad.replace('_', '-')} K={K}",
        fn=dtb.step,
        args=(jax.random.key(2), dtb.init(None, batch_), batch_),
        shapes=f"x[{batch},{size},{size},3] inner[{batch // 2}] preact 16-32-32",
        items=1.0,
        unit="steps",
        peer=trainer.step,
        peer_args=(jax.random.key(2), trainer.init(None, clean), clean),
        peer_name="plain clean train step (adam)",
        goal=f"ratio = clean steps per bi-level step <= 1.3 x {work:.2f}",
        bound_fn=trainer.step,
        bound_work=work,
        bound_note=f"{work:.2f} clean steps: the pass count of one {hypergrad} outer step",
        # The clean step is the work unit, so it is timed back to back as training runs it:
        # right after an outer step it would pay for the caches that step evicted.
        interleave=False,
    )


def _defense_eval():
    d = load_digits(8)
    x, y = jnp.asarray(d.x[:1400]), jnp.asarray(d.y[:1400])
    xc, yc = x[-70:], y[-70:]
    model = bd.SmallCNN(10, (8, 16), 32)
    params = model.init(jax.random.key(0), x[:1])

    data = bd.DefenseData(xc, yc, x, y)
    opt = optax.sgd(0.01, momentum=0.9)
    trainer = bd.make_trainer(model, opt, params=params)
    clean = (jnp.concatenate([xc] * 2)[:64], jnp.concatenate([yc] * 2)[:64])

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
        bound_fn=trainer.step,
        bound_args=(jax.random.key(0), trainer.init(None, clean), clean),
        bound_work=100 * n,
        bound_note=f"100 x {n} plain training steps at batch 64: one budget per defense",
    )


def cases(quick: bool) -> list[Case]:
    out = [_step_cases("first_order"), _step_cases("unrolled")]
    if not quick:
        out.append(_defense_eval())
    return out
