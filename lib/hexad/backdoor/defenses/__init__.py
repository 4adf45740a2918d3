"""Backdoor defenses with one signature (BackdoorBench's protocol, arXiv 2206.12654).

Every defense is a model repair::

    defense(key, model, params, data, n_steps=100, **settings) -> DefenseOutput(params, info)

with ``data`` a :class:`DefenseData` (the defender's clean split; the training set it holds
for ABL, AC and SS; optional backdoor validation data for BackdoorBench's pruning-level rule)
and ``n_steps`` one step budget from which each defense derives its sub-budgets (its
docstring says how). :data:`DEFENSES` is the registry (14: FT, FP, NAD, ANP, NC, I-BAU,
CLP, FT-SAM, RNP, MCR, SAU, ABL, AC, SS), :func:`make_defense` fixes a budget and settings,
:func:`compose` chains any of them (multi-round sanitisation), and :func:`select_lr` lets a
fine-tuning defense choose its step size on held-out clean data. Modules by family:
:mod:`.finetuning` (FT, FT-SAM, NAD, MCR), :mod:`.pruning` (FP, ANP, CLP, RNP),
:mod:`.adversarial` (I-BAU, SAU), :mod:`.nc`, :mod:`.abl`, :mod:`.detectors` (AC, SS).

Loops run through :func:`hexad.backdoor.minimize`, whose chunk is a module-level jit; the
losses are value-hashable objects and the optimisers cached, so one compile per
architecture and shapes serves every model a study sanitises. Do not wrap a defense in
``jax.jit`` (pruning rules and detectors run on the host).

Calibration. An "epoch" of BackdoorBench is a
pass over its 2,500-image clean split at batch 256 (~10 steps); here the budget ``n`` is in
steps of batch 64 on a 500-image split (~8 steps an epoch), so BB's 100 epochs ~ n = 800.

Each entry: BackdoorBench default / value here / why.

- FT: 100 epochs of SGD 0.01, momentum 0.9, wd 5e-4, cosine, RandomCrop(4) + flip /
  ``n`` steps, same optimiser and schedule, random 2-pixel shift, no flip / flips would swap
  our diagonal and corner classes. With :func:`select_lr` (``make_defense(..., lrs=...)``)
  FT, FP, NAD, FT-SAM and MCR choose the step size on held-out clean data instead: at 0.01
  FT leaves a DTB implant at chance accuracy (0.10 after 200 steps; its clean-split gradient
  is 4.7x a BadNets model's at the same weight norm), and BadNets itself passes through 0.16
  at step 30 before recovering to 0.92. On a BadNets model trained with the 2-pixel shift
  (200 steps at 0.01) FT-SAM still ends at 0.10 and FP at 0.14 or 0.97 depending on the key;
  ``experiments.backdoor_dtb`` selects among 0.01, 0.003 and 0.001 by default.
- FP: prune the last layer's inputs by mean activation until a relative test-accuracy drop
  of 0.1, then FT / the last conv layer's channels (our dense part reads them), one at a
  time, until a relative clean-split drop of 0.1, then ``n`` FT steps / the defender holds no
  test set.
- NAD: teacher 10 epochs, student 100, betas 500 / 1000 / 1000 / teacher ``n/2``, student
  ``n``, betas 50 / 100 / 100 on the last three conv layers / a 10x shorter teacher barely
  moves from the backdoored model at our budgets; with FT's step size the attention term
  at BackdoorBench's betas takes the GroupNorm ResNet to accuracy 0.18 (0.29 at 125 / 250 /
  1000, 0.56 at 100 / 200 / 200, 0.93 at a tenth).
- ANP: masks on the batch norms' channels, 2000 iterations, eps 0.4, alpha 0.2, mask lr
  0.2, threshold sweep 0-0.9 keeping the lowest backdoor ASR / masks on the GroupNorms'
  channels (:func:`hexad.backdoor.mask_layers`; the conv channels of a model without
  norms), ``2n`` mask steps, eps 0.2, the same alpha, lr and sweep when ``data.x_bd`` is
  given (else threshold 0.2) / at eps 0.4 every threshold of the 16-32-channel ResNet
  loses more than the rule's 10% of accuracy, so the rule prunes nothing; the natural loss
  masks weights only, as the reference code.
- NC: 80 epochs of reversal with an adaptive cost from 1e-3, MAD 2, unlearning on 20%
  stamped for 100 epochs at 0.01 / ``n`` Adam steps at 0.1 with a fixed cost 1e-2, MAD 2,
  ``n`` unlearning steps on 20% stamped at a constant SGD 0.003 (batch 32) / a host-side
  cost schedule per class would recompile; unlearning at a constant 0.01 takes the
  GroupNorm ResNet to chance accuracy (0.10), at 0.003 it keeps 0.98.
- I-BAU: Adam 1e-4, 5 rounds, K 5, inner SGD lr 10, L2 regulariser 1e-3, implicit
  hypergradient, the perturbation on 1% of each outer batch / Adam 1e-3 for ``n`` steps, K
  5, inner lr 10, regulariser 1e-3, Danskin's gradient at the inner solution (unrolled on
  request), the perturbation on every image of the outer batch / 1e-4 over ``n`` <<
  BackdoorBench's steps barely moves the model; Danskin's gradient costs a third of the
  unrolled one, which at 1e-3 took the model to chance accuracy.
- CLP: u 3 on each conv channel's spectral norm with its following BN folded in / u 3 on
  the kernels' spectral norms / GroupNorm has no per-channel running scale to fold.
- FT-SAM: ASAM at rho 2.0, label smoothing 0.1, 100 epochs / plain SAM at rho 0.02, no
  smoothing, FT's optimiser, ``n`` steps / with FT's step size BackdoorBench's setting
  takes the GroupNorm ResNet to chance (0.10); so do smoothing 0.1 alone (0.69) and SAM at
  0.05 (0.10 with smoothing, 0.63 without); at half the step size SAM keeps accuracy but not
  the backdoor's removal (ASR 0.52-0.75 at rho 0.01-0.05).
- RNP: masks on the batch norms' channels; unlearn 20 epochs at lr 0.01 to accuracy 0.2,
  recover 20 epochs at 0.2, sweep by backdoor ASR / masks as ANP's; unlearn ``n/5`` steps
  (SGD, momentum 0.9) to 0.2, recover ``n`` at 0.2, the same sweep with ``data.x_bd`` / as
  BackdoorBench on our split.
- MCR: 3-bend Bezier, curve 100 epochs at 3e-5, ``test_t`` 0.1 / quadratic Bezier, ``n``
  steps at 0.01, t 0.4 / 3e-5 over our step counts leaves the curve at its start; t 0.4 is
  in the MCR paper's repairing range.
- SAU: Adam 1e-4 for 100 epochs, eps 0.2, 5 PGD steps of 0.2, beta 0.01 / 1, lambda 1 / 0 /
  1 / Adam 1e-3 for ``n`` steps, the rest the same / step-count scaling, as I-BAU.
- ABL: from scratch, LGA 20 epochs (gamma 0.5, SGD 0.1), isolate 1%, 60 epochs on the rest,
  unlearn 20 epochs at 5e-4 / from scratch, LGA ``5n/4`` and ``15n/4`` on the rest with
  Adam 1e-3, isolate 1%, unlearn ``n/5`` at 5e-4 / SGD 0.1 (set for BN ResNets) diverges on
  our norm-free CNN; the 20 : 60 ratio is kept.
- AC: PCA 10, 2-means, flag the smaller cluster, retrain from scratch / the same rule
  (``size_threshold=None``), retrain from scratch ``5n`` Adam steps / the paper's 0.35
  size rule never fires at 10% all-to-one poisoning.
- SS: flag the top 1.5 eps per class (eps the poison rate), retrain / the same, retrain as
  AC / as BackdoorBench.

The efficacy of each setting on a 10%-poison BadNets model is measured by
``experiments.backdoor_dtb`` (``efficacy_<d>``); figures live with its results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from hexad._base import check_int
from hexad.backdoor.defenses._common import DefenseData as DefenseData  # noqa: F401 (re-export)
from hexad.backdoor.defenses._common import DefenseOutput
from hexad.backdoor.defenses.abl import abl
from hexad.backdoor.defenses.adversarial import ibau, sau
from hexad.backdoor.defenses.detectors import (
    ac,
    activation_clustering,
    spectral_signatures,
    ss,
)
from hexad.backdoor.defenses.finetuning import finetune, ft_sam, mcr, nad
from hexad.backdoor.defenses.nc import neural_cleanse
from hexad.backdoor.defenses.pruning import anp, clp, fine_pruning, rnp
from hexad.backdoor.defenses.selection import paired_drop, select_lr

# DefenseData and DefenseOutput are importable here and documented once, in hexad.backdoor.
__all__ = [
    "DEFENSES",
    "Composition",
    "abl",
    "ac",
    "activation_clustering",
    "anp",
    "clp",
    "compose",
    "fine_pruning",
    "finetune",
    "ft_sam",
    "ibau",
    "make_defense",
    "mcr",
    "nad",
    "neural_cleanse",
    "paired_drop",
    "rnp",
    "sau",
    "select_lr",
    "spectral_signatures",
    "ss",
]

DEFENSES: Mapping[str, Callable] = {
    "ft": finetune,
    "fp": fine_pruning,
    "nad": nad,
    "anp": anp,
    "nc": neural_cleanse,
    "ibau": ibau,
    "clp": clp,
    "ftsam": ft_sam,
    "rnp": rnp,
    "mcr": mcr,
    "sau": sau,
    "abl": abl,
    "ac": ac,
    "ss": ss,
}
"""Every defense by short name, each ``(key, model, params, data, n_steps=100, **settings)
-> DefenseOutput``. ``"abl"``, ``"ac"`` and ``"ss"`` need ``data.x_train``."""

NEEDS_TRAIN = frozenset({"abl", "ac", "ss"})
"""The registry's names that read the training set the defender holds."""

LR_SELECTABLE = frozenset({"ft", "fp", "nad", "ftsam", "mcr"})
"""The registry's fine-tuning names whose ``lr`` :func:`select_lr` can choose."""


class Composition:
    """Multi-round sanitisation, as returned by :func:`compose`: a defense, ``(key, model,
    params, data) -> DefenseOutput``, whose ``rounds`` are applied in order.

    Round 0 gets ``key`` itself and round ``i >= 1`` gets ``fold_in(key, i)``, so the first
    round is the very run its defense makes alone with that key: a composition and its first
    defense are a paired comparison, and :meth:`from_first` continues from that run rather
    than repeat it (:func:`hexad.backdoor.benchmark_defenses` does so).
    """

    def __init__(self, rounds: tuple[Callable, ...]):
        if not rounds:
            raise ValueError("defenses: expected at least one defense, got none")
        for i, d in enumerate(rounds):
            if not callable(d):
                raise TypeError(f"defenses[{i}]: expected a callable defense, got {d!r}")
        self.rounds = tuple(rounds)

    def __call__(self, key, model, params, data) -> DefenseOutput:
        return self.from_first(key, model, self.rounds[0](key, model, params, data), data)

    def from_first(self, key, model, first: DefenseOutput, data) -> DefenseOutput:
        """The composition given round 0's output ``first`` (``rounds[0]`` run with ``key``)."""
        out, infos = _checked(0, first), [first.info]
        for i, d in enumerate(self.rounds[1:], 1):
            out = _checked(i, d(jax.random.fold_in(key, i), model, out.params, data))
            infos.append(out.info)
        return DefenseOutput(out.params, {"rounds": tuple(infos)})


def _checked(i: int, out) -> DefenseOutput:
    if not isinstance(out, DefenseOutput):
        raise TypeError(
            f"defenses[{i}]: expected it to return a DefenseOutput, got {type(out).__name__}"
        )
    return out


def compose(*defenses: Callable) -> Composition:
    """Returns the defense that applies ``defenses`` in order, each on the previous one's
    parameters, with the same data (multi-round sanitisation; a :class:`Composition`): round
    0 gets the key itself, round ``i >= 1`` gets ``fold_in(key, i)``.

    Each element is ``(key, model, params, data) -> DefenseOutput`` (a :data:`DEFENSES`
    member at its default budget, a :func:`make_defense` result, or another composition).
    The result returns ``DefenseOutput(params, {"rounds": (info_0, info_1, ...)})``.

    >>> both = compose(finetune, clp)
    """
    return Composition(defenses)


# make_defense's per-round callables, one object per (name, budget, step sizes, settings):
# equal requests give the same object, so a composition's first round is recognisably the
# standalone defense of the same name (see Composition.from_first).
_BUDGETED: dict = {}


def make_defense(
    name: str, n_steps: int = 100, lrs: tuple[float, ...] | None = None, **settings: Any
) -> Callable:
    """Returns ``defense(key, model, params, data) -> DefenseOutput`` for ``name`` at the
    step budget ``n_steps``; names joined by ``+`` (``"nc+ft"``) give their
    :func:`compose`, each round at the same budget and ``settings``.

    Args:
      name: a key of :data:`DEFENSES`, or keys joined by ``+``.
      n_steps: the step budget (an int >= 1).
      lrs: optional candidate step sizes: every round in :data:`LR_SELECTABLE` then chooses
        its ``lr`` among them on held-out clean data (:func:`select_lr`, default rule).
      **settings: keyword settings of the defense (of every round of a composition).

    >>> import jax.numpy as jnp
    >>> from hexad.backdoor import SmallCNN
    >>> m = SmallCNN(2, (2,), 4)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> d = DefenseData(jnp.zeros((4, 8, 8, 1)), jnp.zeros(4, int))
    >>> out = make_defense("ft+clp", 2)(jax.random.key(1), m, p, d)
    >>> len(out.info["rounds"])
    2
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a defense name (str), got {type(name).__name__}")
    rounds = name.split("+")
    bad = [r for r in rounds if r not in DEFENSES]
    if bad:
        raise ValueError(
            f"name: unknown defense {bad[0]!r} in {name!r}; expected one of {sorted(DEFENSES)} "
            "or '+'-joined ones"
        )
    n = check_int("n_steps", n_steps, lo=1)

    if lrs is not None:
        select_lr(finetune, lrs)  # validates lrs here, naming the argument

    def build(r: str) -> Callable:
        f = DEFENSES[r]
        if lrs is not None and r in LR_SELECTABLE:
            f = select_lr(f, lrs)
        return lambda k, m, p, data: f(k, m, p, data, n, **settings)

    grid = None if lrs is None else tuple(map(float, lrs))

    def budgeted(r: str) -> Callable:
        key = (r, n, grid, tuple(sorted(settings.items())))
        try:
            hash(key)
        except TypeError:  # unhashable settings (arrays): a fresh callable
            return build(r)
        if key not in _BUDGETED:
            _BUDGETED[key] = build(r)
        return _BUDGETED[key]

    fs = [budgeted(r) for r in rounds]
    return fs[0] if len(fs) == 1 else compose(*fs)
