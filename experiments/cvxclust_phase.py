"""Phase diagram of exact recovery: the graph alone, node information alone, and joint programs.

A contextual SBM with ``K`` balanced classes of ``n / K`` nodes (``cvxclust.contextual_sbm``):
the graph has ``p = (1 + dpq) / 2`` and ``q = (1 - dpq) / 2`` (so unit graph costs are
proportional to the log-likelihood ratio); features ``x_v = (sep / 2) m_{y_v} + N(0, I_d)``
with unit class means (simplex directions for ``K = 3``, ``d >= 2``); ``labels_per_class``
labelled nodes per class, each label flipped with probability ``label_noise``. Panels
``K in ks`` x ``d in dims``; in each, a ``dpq`` x ``sep`` grid. The five programs of
``hexad.cvxclust`` on every draw:

- ``graph``: the paper's graph program, PSD-hard (``graph_problem``; ``L in B``, ``L >= 0``);
- ``node``: node information alone as convex clustering: ``FusionProblem`` with the features,
  the partial labels under the softmax cross-entropy, Gaussian weights on the complete graph,
  and the partition read from the clusterpath at its first ``gamma`` with ``<= K`` clusters;
- ``joint``: the shared-model joint program (``shared_atom_problem``, our formulation of the
  paper's shared atomic representation) with weights set through ``eps = 2 mu0 / mu1``;
- ``joint_nograph``: the same program with the graph term's weight zero (no adjacency,
  ``C = 0``) at the same weights: the joint program's own node-only part;
- ``linear``: the linear-reward surrogate ``joint_problem`` (PSD-hard), ``alpha =
  feature_scale / std(K_x)``, ``beta`` (the ``eps -> infinity`` limit of the joint family).

**The joint program's weights.** Minimised over its models ``U``, the joint program's feature
part is ``mu0 tr(X^T (L + eps I)^-1 X)``: on cluster indicators a k-means shrunk by ``n_c / (n_c
+ eps)`` (``n_c = n / K``), for ``eps >> n_c`` the linear surrogate, and for ``eps << n_c`` a
reward for covering per-node noise, so features cannot help there (review cvxclust-2, 6.2).
The weights at ``eps`` are ``mu1 = f (n_c + eps) / n_c``, ``mu0 = eps mu1 / 2`` and the label
weight ``label_weight f / mu1`` (``_cvxclust.joint_weights``), with ``f = node_weight * n``:
the force on one node of an indicator ``L`` and the labels' weight stay those of ``mu1 = f``,
label weight ``label_weight``, at every ``eps``. Declared before any run: the **fixed** rule is
``eps = eps_fixed * n / K = 10 n / K`` for both joint arms, factor 1 for the others.

**Tuning.** Every arm has the same budget: ``len(grid)`` values (graph: the non-edge weight
times ``grid``; node: the Gaussian bandwidth times it; linear: ``alpha`` and ``beta`` times
it; the joint arms: ``eps`` in ``eps_grid * n / K`` = ``{1, 10, 100} n / K``) tried on the
same ``tune_trials`` tuning draws per cell. These come from their own generator stream
(``_cvxclust.draw_cell``), never scored. The **tuned** value of an arm is the one that recovers
most tuning draws (a tie keeps the fixed rule's value if it is among the best, else the
lowest); the arm is then scored on the cell's scored draws at its fixed and its tuned value.

**Draws.** ``trials_near`` scored draws in the cells whose ``dpq`` lies in ``[t - near_below,
t + near_above]`` around the dense graph threshold ``t`` of their ``K``
(``_cvxclust.graph_threshold``; 0.357 for ``K = 2`` and 0.430 for ``K = 3`` at ``n = 60``, so
rows 0.2-0.4 and 0.3-0.5), ``trials`` elsewhere. A scored draw's graph does not depend on
``sep`` or ``d`` (trial ``t`` of a row draws it first from the same generator), so ``graph``
is solved once per ``(K, dpq)`` and every program of a cell is scored on the same draws:
the comparisons are paired.

**Recovery.** A draw is recovered when the program's partition equals the truth (matrix
programs: the components of ``L > 1/2``; node: the fused clusters): the *rounding* criterion.
The *exact* criterion is ``max |L - 1[y_u = y_v]| <= recovery_tol`` (node: the same as
rounding). A solve is certified when it converged (residuals ``<= tol``) and (matrix
programs) its relative duality gap is ``<= cert_tol`` (node: every path solve converged); a
matrix solve whose gap is above ``cert_tol`` continues from its own iterate at ``tol / 10``,
then ``tol / 100`` (up to ``max_iters`` more each), until the gap certifies it.

**Synergy and the verdict (stated before any run).** Per regime (fixed, tuned), criterion
(rounding, exact) and cell, the joint is compared with each of its parts (``graph``,
``joint_nograph``) on the cell's scored draws by the exact McNemar test
(``_verdicts.mcnemar``, one-sided: the joint recovers more often). A **synergy cell**: the
joint rate ``>= 0.5``, both parts' rates ``<= 0.3``, the one-sided McNemar ``p < alpha =
0.05`` against each part (an intersection-union test: the cell's p is the larger of the two,
with no correction across the two parts), and every scored solve of the joint and its parts in
the cell certified. A *candidate* cell meets the two rate conditions only. The counts are
exploratory (about 100 cells per regime); the verdict also asks the cell's p to survive Holm's
correction over all cells of the regime at 0.05. ``verdict`` (fixed regime, rounding
criterion), in the vocabulary of ``_verdicts.OUTCOMES``:

1. "not tested": the positive control fails: in some panel the graph program's fixed rate at
   the largest ``dpq`` (above both thresholds in the full study, where the earlier run had
   0.90 for ``K = 2`` and 0.65 for ``K = 3``) is below ``CONTROL = 0.25``;
2. "reproduced": at least one synergy cell whose p survives Holm;
3. "undecided": no such cell, but at least one candidate cell (the rates point to synergy;
   the test, its certificates or the correction do not confirm it);
4. "not reproduced": no candidate cell: nowhere does the joint reach 0.5 with both of its
   parts at 0.3 or below.

``verdict_exact`` is the same rule under the exact criterion, ``verdict_tuned`` under the
rounding criterion in the tuned regime. ``node`` (convex clustering) is reported and tested
beside the parts (``synergy_p_*``) but does not enter the rule. The Holm family is the cells
of the run: the verdict is that of the assembled study (a single panel's part decides over its
own 25 cells only).

Every cell's solves are checkpointed (``checkpoints/<study>/<run>/settings-<hash>/cell-...``
or ``--ckpt DIR``) as soon as they finish, so a long run can be stopped and continued with
``--resume``: the cells already solved with the same seed and settings are restored, not
solved again. The settings hash leaves out the panel lists, so the panels can be run as separate
processes on one ``--ckpt`` folder (``--set ks=2``, ``--set ks=3``, or one ``dims`` each) and
the full study then assembled from their cells with ``--resume``.

Command:  python -m experiments.cvxclust_phase [--quick] [--out DIR] [--seed N] [--set k=v]
          [--resume] [--ckpt DIR]
Runtime:  --quick (n = 24, one panel, 2 x 2 grid, 4 / 3 scored and 2 tuning draws, 2 grid
          values) 76-117 s wall and 73 CPU-s, measured twice with ``nice`` on the 2 shared
          cores at load 2-6; so well under 2 min on 2 idle cores. The full study (n = 60, 4
          panels, 5 x 5 grids, 40 scored draws in 60 near cells and 15 in 40 others, 10
          tuning draws x 3 values per cell and arm) is estimated at about 3-4 CPU-hours,
          extrapolated from single cells run with ``nice`` on the shared 2-core machine at
          load 6-9 (compiles included): K2 d1 (0.3, 4), 40 draws, 345 s wall; K3 d5 (0.4,
          5), 40 draws, 156 CPU-s and 229 s wall; K2 d1 (0.1, 2), 15 draws, 200 s wall; i.e.
          about 120-170 CPU-s a near cell and 60-100 a far one, about 1 CPU-hour a panel.
          Run it in parts (``--set ks=2 --set dims=1 --out results/cvxclust_phase/K2_d1`` and
          so on, one process per panel, two at a time on 2 cores: about 2 h idle, 4-7 h on
          busy cores): the report joins the panel folders into the study
          (``experiments._cvxclust.join_panels``: Holm over the cells of every panel, the
          verdicts decided again) and reads "undecided" until all four are in; on one
          ``--ckpt`` folder, ``--resume`` also assembles them into one run.

summary.json keys: ``dpq_grid``, ``sep_grid``, ``panels`` (``"K{k}_d{d}"``), ``programs``;
for regime in ``fixed``, ``tuned`` and program in ``programs`` (``graph``, ``node``,
``joint``, ``joint_nograph``, ``linear``): ``{regime}_{program}_recovery``, ``..._lo``,
``..._hi`` ([panel][dpq][sep] rounding rates and Wilson 95% bounds) and
``{regime}_{program}_exact`` (exact rates); ``tuned_{program}_choice`` (the tuned value per
cell: a factor, or ``eps`` in units of ``n / K``); for criterion suffix ``""`` (rounding) and
``"_exact"``: ``synergy_cells_{regime}{sfx}`` (count), ``synergy_cell_list_{regime}{sfx}``
(``[panel, dpq, sep]``), ``synergy_cells_{regime}{sfx}_holm`` (those whose p survives Holm),
``candidate_cells_{regime}{sfx}`` (count) and ``synergy_p_{regime}{sfx}`` ([panel][dpq][sep]
of the one-sided McNemar p of the joint against ``mcnemar_arms`` = ``graph``,
``joint_nograph``, ``node``, in that order); ``verdict``, ``verdict_exact``,
``verdict_tuned``, ``verdict_reason``; ``positive_control`` (the graph's fixed rate at the
largest ``dpq``, per panel); ``max_min_eig_violation`` (most negative eigenvalue over all
PSD-hard solves); ``uncertified_solves`` (count of single solves, tuning ones included),
``uncertified_list`` (up to 20 ``[program, panel, dpq, sep, value, "scored" or "tuning",
count]``), ``uncertified_by_program``; ``n``, ``trials``, ``trials_near``, ``tune_trials``,
``trials_per_cell`` ([panel][dpq][sep]), ``near_band`` (``[near_below, near_above]``),
``grid``, ``eps_grid`` and ``eps_fixed`` (in units of ``n / K``), ``alpha``;
``graph_threshold`` (per panel, the dense threshold ``dpq``) and ``feature_threshold`` (``s``
with ``Phi(s/2)^n = 1/2``).
"""

from __future__ import annotations

import dataclasses

from threadpoolctl import threadpool_limits

from experiments import _cvxclust, _runner

P = _cvxclust.PHASE_PROGRAMS
#: The positive control: the graph program's least fixed rate at the largest ``dpq``.
CONTROL = 0.25
#: The verdicts and the (regime, criterion) each decides.
VERDICTS = {"fixed": "verdict", "fixed_exact": "verdict_exact", "tuned": "verdict_tuned"}


@dataclasses.dataclass(frozen=True)
class Config:
    n: int = 60
    ks: tuple[int, ...] = (2, 3)
    dims: tuple[int, ...] = (1, 5)
    dpq: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5)
    sep: tuple[float, ...] = (0.0, 2.0, 3.0, 4.0, 5.0)
    trials: int = 15
    trials_near: int = 40
    near_below: float = 0.2
    near_above: float = 0.1
    tune_trials: int = 10
    labels_per_class: int = 3
    label_noise: float = 0.1
    grid: tuple[float, ...] = (0.5, 1.0, 2.0)
    eps_grid: tuple[float, ...] = (1.0, 10.0, 100.0)
    eps_fixed: float = 10.0
    feature_scale: float = 0.5
    beta: float = 0.5
    node_weight: float = 0.1
    label_weight: float = 1.0
    alpha: float = 0.05
    gamma_range: tuple[float, ...] = (1e-3, 1.0)
    n_gammas: int = 12
    recovery_tol: float = 0.05
    tol: float = 1e-4
    cert_tol: float = 1e-3
    max_iters: int = 3000

    def __post_init__(self):
        _runner.at_least(self, 2, "ks", "labels_per_class")
        _runner.at_least(self, 1, "dims", "trials", "trials_near", "tune_trials", "max_iters")
        _runner.at_least(self, 1, "n_gammas")
        _runner.require(all(self.n % k == 0 for k in self.ks), "n", "n: a multiple of each K")
        _runner.require(1.0 in self.grid, "grid", "grid: must hold the fixed factor 1")
        _runner.require(
            self.eps_fixed in self.eps_grid, "eps_fixed", "eps_fixed: must be in eps_grid"
        )
        _runner.require(
            len(self.eps_grid) == len(self.grid),
            ("grid", "eps_grid"),
            "grid, eps_grid: the same number of values (every arm gets the same tuning budget)",
        )
        _runner.in_range(self, 0, 1, "dpq")
        _runner.at_least(self, 0, "sep", "near_below", "near_above")
        _runner.in_unit(self, "label_noise")
        _runner.in_range(self, 0, 0.5, "alpha", lo_open=True, hi_open=True)
        _runner.positive(self, "grid", "eps_grid", "feature_scale", "beta", "node_weight")
        _runner.positive(self, "label_weight", "gamma_range", "recovery_tol", "tol", "cert_tol")


def run(cfg: Config, ctx: _runner.Context) -> dict:
    panels = [(k, d) for k in cfg.ks for d in cfg.dims]
    tally, graph_cache = _cvxclust.PhaseTally(cfg, panels), {}
    with threadpool_limits(1):  # one BLAS thread: LAPACK's eigh thrashes on busy cores
        for a, (k, d) in enumerate(ctx.progress(panels, desc="panels")):
            for i, dpq in enumerate(cfg.dpq):
                for j, sep in enumerate(cfg.sep):
                    todo = P if (k, i) not in graph_cache else P[1:]
                    cell = (ctx.seed, k, d, i, j, dpq, sep)
                    start, res = _cvxclust.cell_checkpointed(ctx, cfg, cell, todo, graph_cache)
                    res["graph"] = graph_cache.setdefault((k, i), res["graph"])
                    tally.add((a, i, j), cell, res, todo)  # a cached graph record counted once
                    ctx.log(
                        K=k, d=d, dpq=dpq, sep=sep, restored=start > 0,
                        trials=int(tally.n_trials[a, i, j]),
                        **{p: res[p]["recovered"].mean(1).tolist() for p in P},
                    )  # fmt: skip
    out = {
        "dpq_grid": list(cfg.dpq),
        "sep_grid": list(cfg.sep),
        "panels": tally.names,
        "programs": P,
    }
    control = tally.positive_control()
    reasons = []
    for regime in _cvxclust.PHASE_REGIMES:
        out |= tally.recovery(regime)
        for sfx, flag in _cvxclust.PHASE_CRITERIA:
            keys, cells = tally.synergy(regime, sfx, flag)
            out |= keys
            if (name := VERDICTS.get(f"{regime}{sfx}")) is not None:
                out[name] = _cvxclust.phase_verdict(
                    min(control) >= CONTROL, cells.holm.any(), cells.candidate.any()
                )
                reasons.append(cells.reason(name, out[name]))
            if sfx == "":
                _cvxclust.plot_phase(ctx, cfg, panels, cells, regime)
        if regime == "tuned":
            out |= {f"tuned_{p}_choice": tally.choice[p].tolist() for p in P}
    ok = "passes" if min(control) >= CONTROL else "fails"
    out |= {
        "verdict_reason": "; ".join(reasons) + f"; positive control {ok}",
        "positive_control": control,
        "mcnemar_arms": list(_cvxclust.MCNEMAR_ARMS),
        **tally.solve_checks(),
        **tally.design(),
    }
    return out


STUDY = _runner.Study(
    "cvxclust_phase",
    Config,
    run,
    quick={
        "n": 24,
        "ks": (2,),
        "dims": (1,),
        "dpq": (0.3, 0.7),
        "sep": (0.0, 4.0),
        "trials": 3,
        "trials_near": 4,
        "tune_trials": 2,
        "grid": (1.0, 2.0),
        "eps_grid": (10.0, 100.0),
        "max_iters": 1500,
    },
    doc=__doc__,
    resume_shared=("ks", "dims"),
)

if __name__ == "__main__":
    STUDY.main()
