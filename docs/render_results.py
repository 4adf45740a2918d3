"""Renders the reproduction report, one page per paper, from the committed full runs.

Reads ``results/<study>/config.json`` (the config and its provenance: commit, date, command,
machine) and ``results/<study>/summary.json`` for every study of a paper (or of each part, one
subfolder per part, when a study was run in parts), copies the study's PNG plots next to the
page, and writes ``docs/reproduction/papers/<paper>.md``: the verdict per claim first, then each
rule once with its pre-stated margin, the runs with their commits, and per study its method x
metric tables (``METRIC_TABLES``, read by the summary's key names), its own tables, its figures
at full width and the keys no table showed, folded. Nothing on the pages is typed by hand.

- Every interval and test comes from ``experiments/_verdicts.py`` (paired t intervals, TOST
  against a margin stated in advance, the seeds an undecided claim would need); no rule here
  computes a spread of its own.
- A claim reads its runs' own validity checks (``CHECKS``: converged solves, exactness
  counters, positive controls): a failed one makes it "not tested", with the reason.
- A run is "stale" when a commit after the run's provenance commit changed its method's code
  (``Paper.code``) or its study module (``experiments/<study>.py``): docstrings and comments
  do not count, so a documentation edit leaves a run current; "provenance unknown" when
  the commit is missing, unknown to git, or git is unavailable.

Run: ``python docs/render_results.py`` (``make docs`` runs it first).
"""

from __future__ import annotations

import ast
import functools
import json
import math
import re
import shlex
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
OUT = Path(__file__).resolve().parent / "reproduction" / "papers"

# the statistics module lives with the studies; the renderer runs as a script, not a package
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from experiments import _verdicts  # noqa: E402

Summaries = Mapping[str, Mapping[str, Any]]

#: The level of every interval and test on the pages: 95% intervals decide the sign, TOST's
#: 90% interval the equivalence.
ALPHA = 0.05


@dataclass(frozen=True)
class Rule:
    """How a claim is decided, in words, with its equivalence margin (pre-stated) if any."""

    text: str
    margin: str = ""


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, the rule that decides it, and the runs it reads.

    ``decide(summaries) -> (verdict, reason)`` with verdict one of the outcomes of
    ``experiments/_verdicts.py`` ("reproduced", "not reproduced", "no advantage",
    "undecided"), "partly" for a rule with two sub-claims, or "not measured"; it may raise
    ``KeyError`` for a missing figure and ``ValueError`` for figures no verdict can use.
    A study run in parts is in ``summaries`` merged (:func:`merge_parts`) and each part as
    ``"study/part"``. ``reads`` names the runs (``"study"`` or ``"study/part"``) whose
    validity checks and provenance the verdict carries.
    """

    text: str
    rule: Rule
    decide: Callable[[Summaries], tuple[str, str]]
    reads: tuple[str, ...]


@dataclass(frozen=True)
class Paper:
    slug: str
    title: str
    source: str
    studies: tuple[str, ...]
    claims: tuple[Claim, ...] = field(default=())
    # a study's own tables (markdown lines), placed after its method x metric tables
    tables: Mapping[str, Callable[[Mapping[str, Any]], list[str]]] = field(default_factory=dict)
    # the method's code (library and shared study helpers); with experiments/<study>.py it is
    # what a run is stale against
    code: tuple[str, ...] = ()
    # keys of docs/references.bib: the paper itself ("" while it is not public) and the prior
    # work its claims rest on, cited under the page's title
    cite: str = ""
    prior: tuple[str, ...] = ()


@dataclass(frozen=True)
class Run:
    study: str
    part: str
    config: Mapping[str, Any]
    summary: Mapping[str, Any]

    @property
    def name(self) -> str:
        return f"{self.study}/{self.part}" if self.part else self.study


#: The RWEFM settings: (study, key prefix of that setting in its summary, label).
RWEFM_SETTINGS = (
    ("rwefm_synthetic", "s2_", "S^2 (vMF mixtures)"),
    ("rwefm_synthetic", "t2_", "T^2 (mixtures straddling the seam)"),
    ("rwefm_protein", "", "T^2 (alanine dipeptide torsions)"),
    (
        "rwefm_protein/chart",
        "",
        "T^2 (alanine dipeptide torsions, the chart rotated by (-60, 30) degrees so that the "
        "Euclidean arms' seam runs through the beta basin)",
    ),
    ("rwefm_singlecell", "", "S^7 (PBMC cells)"),
)

#: Config fields (with their default) that make a part a control of its study, not more seeds
#: of its claim: such parts are kept out of the study's merged summary and merged apart, as
#: ``"study/<group>"`` (the part's name without ``-seed<k>``), which a claim of their own reads.
#: The protein study's chart rotation is an isometry of the torus: RWEFM's problem is the same,
#: the chart flows' seam moves (issue 49's chart-rotation control).
CONTROL_FIELDS = {"rwefm_protein": ("chart_shift_deg", (0.0, 0.0))}

#: The paired seeds a setting run in seed parts is decided at, stated before its parts ran
#: (issue 49: T^2 mixtures at >= 10); until then it reads undecided with interim figures, so
#: the verdict is not taken at whichever look first crosses a threshold.
RWEFM_PLANNED_SEEDS = {
    ("rwefm_synthetic", "t2_"): 10,
    ("rwefm_synthetic", "s2_"): 3,  # its Config's n_seeds
    ("rwefm_protein", ""): 3,  # its Config's n_seeds
    ("rwefm_protein/chart", ""): 3,  # the same study, chart rotated
    ("rwefm_singlecell", ""): 3,  # its Config's n_seeds
}

#: The seeds each PoE/KL study is decided at (its Config's ``n_seeds``, stated before its
#: runs): run in seed parts, a setting reads undecided until that many are in.
POLICY_PLANNED_SEEDS = {"policy_pointmaze": 5, "policy_locomotion": 3}

#: Stated in the statistics module, where the studies read it too.
RWEFM_MARGIN = _verdicts.MARGINS["rwefm"]

RWEFM_RULE = Rule(
    "per seed, the EMD 1-NNA's distance from 0.5 (|1-NNA - 0.5|, so that memorising below 0.5 "
    "is not rewarded), RWEFM - baseline, paired over seeds: no advantage if TOST puts the "
    f"difference within the margin (its {1 - 2 * ALPHA:.0%} t interval inside it); else "
    f"reproduced if the {1 - ALPHA:.0%} t interval lies below 0, not reproduced if above, "
    "undecided otherwise (with the seeds 80% power would need at the observed effect). On a "
    "torus, a run that has the third arm (the Euclidean flow on angles fed the same (cos, sin) "
    "features as RWEFM) is decided against it, so that the verdict is the transport's, not "
    "the features'; the raw-angle baseline is reported beside. A setting run in seed parts "
    "is decided once its pre-stated number of seeds is in (T^2 mixtures: 10; S^2, protein "
    "(in either chart) and PBMC: 3, their studies' n_seeds); before that it "
    "reads undecided, with the interim figures",
    f"±{RWEFM_MARGIN} in 1-NNA distance",
)


def _rwefm_setting(summaries: Summaries, study: str, prefix: str) -> tuple[str, str]:
    s = summaries[study]

    def dist(arm):
        return [abs(float(v) - 0.5) for v in s[f"{prefix}{arm}_emd_1nna_seeds"]]

    where = f"{study} {prefix.rstrip('_')}".strip()
    floor = float(s[f"{prefix}floor_emd_1nna_mean"])
    n, planned = len(dist("rwefm")), RWEFM_PLANNED_SEEDS.get((study, prefix), 0)
    if n < min(2, planned):  # one seed part in: no interval yet, the seed's figures
        arms = [a for a in ("rwefm", "euclid_periodic", "euclid")
                if f"{prefix}{a}_emd_1nna_seeds" in s]  # fmt: skip
        figs = ", ".join(f"{a} {float(s[f'{prefix}{a}_emd_1nna_seeds'][0]):.3f}" for a in arms)
        return "undecided", (
            f"{where}: interim, {n} of the {planned} pre-stated seeds (EMD 1-NNA {figs}); "
            f"data floor 1-NNA {floor:.3f}"
        )
    v = _verdicts.paired(dist("rwefm"), dist("euclid"), margin=RWEFM_MARGIN, direction="less",
                         alpha=ALPHA)  # fmt: skip
    interim = f"interim, {n} of the {planned} pre-stated seeds: " if n < planned else ""
    if f"{prefix}euclid_periodic_emd_1nna_seeds" not in s:
        line = v.line() if interim else v.figures()
        reason = f"{where}: {interim}{line}; data floor 1-NNA {floor:.3f}"
        return ("undecided" if interim else v.outcome), reason
    # On a torus the run also has the chart flow fed the torus's (cos, sin) features: the
    # claim (transport on M) is decided against it; the raw-angle baseline is reported beside.
    vp = _verdicts.paired(dist("rwefm"), dist("euclid_periodic"), margin=RWEFM_MARGIN,
                          direction="less", alpha=ALPHA)  # fmt: skip
    if interim:
        return "undecided", (
            f"{where}: {interim}against the chart flow with (cos, sin) features {vp.line()}; "
            f"against the raw-angle baseline {v.line()}; data floor 1-NNA {floor:.3f}"
        )
    return vp.outcome, (
        f"{where}: against the chart flow with (cos, sin) features {vp.figures()}; against "
        f"the raw-angle baseline {v.line()}; data floor 1-NNA {floor:.3f}"
    )


def _prefmh(summaries: Summaries) -> tuple[str, str]:
    # The reference for "exact" is the exact MH chain with the same chains and steps: chain
    # draws are correlated, so every chain (exact ones too) sits above the i.i.d. floor.
    s = summaries["prefmh_mixture"]
    ref, floor = float(s["tv_mh"]), float(s["tv_iid"])
    ks = sorted(k for k in s if k.startswith("tv_prefmh_k"))
    worst = max(float(s[k]) for k in ks)
    majority = float(s["tv_majority_k3"])
    reason = (
        f"prefmh_mixture: grid TV of the worst K-budget chain {worst:.4f}, exact MH {ref:.4f}, "
        f"majority vote {majority:.4f} (i.i.d. floor {floor:.4f})"
    )
    if worst <= 1.5 * ref and majority > 3 * ref:
        return "reproduced", reason
    return ("partly" if worst <= 1.5 * ref else "not reproduced"), reason


def _cvxclust(summaries: Summaries) -> tuple[str, str]:
    s = summaries["cvxclust_phase"]
    if "synergy_cells_fixed_holm" not in s:  # a run of the protocol before issue 51
        return "not tested", (
            "cvxclust_phase: the committed run predates the pre-stated rule (issue 51): its "
            "joint program ran at eps far below n/K, where the features cannot act, and its "
            "synergy had no paired test; rerun it"
        )
    from experiments import _cvxclust, cvxclust_phase

    parts = [v for k, v in summaries.items() if k.startswith("cvxclust_phase/")]
    if parts:  # panel parts: Holm over the cells of all of them, the verdicts decided again
        s = _cvxclust.join_panels(parts, cvxclust_phase.CONTROL, cvxclust_phase.VERDICTS)
    full = cvxclust_phase.Config()
    planned = [f"K{k}_d{d}" for k in full.ks for d in full.dims]
    missing = [p for p in planned if p not in s["panels"]]
    # the study decides with the shared module (experiments._verdicts.mcnemar, Holm over the
    # run's cells); the report states its figures and keeps its outcome
    reason = (
        f"cvxclust_phase (eps fixed at {_fmt(s['eps_fixed'])} n/K; {int(s['trials_near'])} "
        f"draws per cell near the graph threshold, {int(s['trials'])} elsewhere): "
        f"{int(s['synergy_cells_fixed'])} synergy cell(s) by the one-sided McNemar test "
        f"against both parts, {int(s['synergy_cells_fixed_holm'])} surviving Holm, "
        f"{int(s['candidate_cells_fixed'])} candidate(s) by the rates; under exact recovery: "
        f"{s['verdict_exact']}; with every arm tuned on separate draws: {s['verdict_tuned']}"
    )
    if missing:  # Holm's family is the whole study's cells: no verdict before every panel
        return "undecided", (
            f"interim, panels {', '.join(s['panels'])} of the {len(planned)} pre-stated "
            f"(missing {', '.join(missing)}): " + reason
        )
    return str(s["verdict"]), reason


def _planetoid_table(s: Mapping[str, Any]) -> list[str]:
    """Per data set and program: test accuracy (no label counts as wrong), coverage, accuracy
    on the covered nodes, the grid value chosen on validation and whether that solve is
    certified; the two baselines' accuracies below."""
    lines = []
    for d in ("karate", "cora", "citeseer"):
        if f"{d}_graph_acc" not in s:
            continue
        lines += [
            f"`{d}` (test nodes):",
            "",
            "| program | acc | coverage | covered acc | chosen | certified | rel. gap |",
            "| --- " * 7 + "|",
        ]
        for p in CVXCLUST_PROGRAMS:
            keys = ("acc", "coverage", "covered_acc", "choice", "certified", "rel_gap")
            cells = [_fmt(s.get(f"{d}_{p}_{k}", "-")) for k in keys]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lr, lp = _fmt(s[f"{d}_linear_lr_acc"]), _fmt(s[f"{d}_lp_acc"])
        lines += ["", f"Baselines: logistic regression {lr}, label propagation {lp}.", ""]
    return lines


#: The programs, in the order of the tables (the phase study's joint without its graph, from
#: issue 51 on). The phase study certifies its compared solves itself: a cell with an
#: uncertified one does not count towards synergy.
CVXCLUST_PROGRAMS = ("joint", "graph", "node", "linear")
CVXCLUST_PHASE_PROGRAMS = ("joint", "graph", "joint_nograph", "node", "linear")


def _cvxclust_table(s: Mapping[str, Any]) -> list[str]:
    """Per regime and panel, the recovery rates on the ``dpq`` x ``sep`` grid."""
    dpq, sep = s["dpq_grid"], s["sep_grid"]
    programs = [p for p in CVXCLUST_PHASE_PROGRAMS if f"fixed_{p}_recovery" in s]
    names = " / ".join(programs)
    lines = []
    for regime in ("fixed", "tuned"):
        syn = {tuple(c) for c in s[f"synergy_cell_list_{regime}"]}
        rates = [s[f"{regime}_{p}_recovery"] for p in programs]
        for a, panel in enumerate(s["panels"]):
            lines += [
                f"Recovery rate, {regime} weights, panel `{panel}`: {names} (rows `dpq`, "
                "columns `sep`; a synergy cell in bold):",
                "",
                "| dpq \\ sep | " + " | ".join(f"{v:g}" for v in sep) + " |",
                "| --- " * (len(sep) + 1) + "|",
            ]
            for i, d in enumerate(dpq):
                cells = []
                for j, v in enumerate(sep):
                    text = " / ".join(f"{r[a][i][j]:.2f}" for r in rates)
                    cells.append(f"**{text}**" if (panel, d, v) in syn else text)
                lines.append(f"| {d:g} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


#: The PoE / KL studies' pre-stated practical margins, in return units: ``margin_per_step`` x
#: ``episode_steps`` of the full study (each run's own ``margin`` is shown beside its figures).
POLICY_MARGINS = {
    "policy_pointmaze": "3 return points (PointMaze: 0.01 per step x 300 steps, 1% of the return "
    "of staying at the goal all episode)",
    "policy_locomotion": "50 return points (locomotion: 0.05 per step x 1000 steps)",
}

#: How the policy studies read the shared module's outcomes (experiments/_policy.py): a bound
#: holds when shown; a difference holds when shown beyond 0, and "no advantage" refutes it.
_POLICY_AS_CLAIM = {
    "reproduced": "holds",
    "not reproduced": "fails",
    "no advantage": "fails",
    "undecided": "undecided",
}
_POLICY_TOO_FEW = "fewer than two paired units"  # experiments._policy.TOO_FEW


@dataclass(frozen=True)
class _Decided:
    """A policy claim or figure: ``verdict`` ("holds" / "fails" / "undecided" / "not tested:
    <why>"; "" for a figure), the mean, the interval at ``level`` and the shared module's word."""

    verdict: str
    mean: float
    low: float
    high: float
    level: float
    outcome: str

    def ci(self) -> str:
        return f"{self.mean:+.3g} [{self.low:+.3g}, {self.high:+.3g}]"


def _policy_word(verdict: str) -> str:
    """A cell's verdict for the page, a failed gate's reason in parentheses."""
    head, _, why = verdict.partition(": ")
    return f"{head} ({why})" if why else head


def _policy_settings(summaries: Summaries, study: str) -> dict[str, list[Mapping[str, Any]]]:
    """A policy study's settings, each with its parts' summaries: the part folders (``render``
    keeps each as ``study/part``; ``<setting>-seed<k>`` and ``seed<k>`` are seed groups of one
    setting), or the whole run. Parts of different settings (locomotion's envs) share their
    key names, so their merged summary cannot be read."""
    parts = {k.partition("/")[2]: s for k, s in summaries.items() if k.startswith(f"{study}/")}
    if not parts:
        return {"": [summaries[study]]}
    out: dict[str, list[Mapping[str, Any]]] = {}
    for part, s in sorted(parts.items()):
        out.setdefault(re.sub(r"(^|-)seed\d+$", "", part), []).append(s)
    return out


def _policy_old(where: str, parts: Sequence[Mapping[str, Any]]) -> str:
    """Why a run of the protocol before issue 52 (no ``stat_unit``) is not tested; "" if none."""
    if all("stat_unit" in s for s in parts):
        return ""
    return (
        f"{where}: the committed run predates the rebuilt rules (issue 52: margins in return "
        "units, bounds and paired intervals from experiments/_verdicts.py, priors of known "
        "precision), so it carries none of their verdicts; rerun it"
    )


def _policy_runs(
    summaries: Summaries,
    study: str,
    verdicts: list[str],
    texts: list[str],
    label: Callable[[str, Sequence[Mapping[str, Any]]], str] = lambda setting, parts: setting,
):
    """Yields ``(where, parts)`` for each setting of ``study`` run under the rebuilt rules; a
    setting of the earlier protocol adds "not tested" and its reason to ``verdicts`` and
    ``texts`` instead."""
    for setting, parts in _policy_settings(summaries, study).items():
        where = f"{study} {label(setting, parts)}".strip()
        if old := _policy_old(where, parts):
            verdicts.append("not tested")
            texts.append(old)
            continue
        seeds, planned = _policy_seeds(parts), POLICY_PLANNED_SEEDS.get(study, 0)
        if seeds < planned:
            verdicts.append("undecided")
            texts.append(
                f"{where}: interim, {seeds} of the {planned} pre-stated seeds in (each part's "
                "figures are in its run below); decided when all are in"
            )
            continue
        yield where, parts


def _policy_seeds(parts: Sequence[Mapping[str, Any]]) -> int:
    """The seeds that seed-group parts hold together."""
    return sum(int(p["n_seeds"]) for p in parts)


def _policy_units(parts: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    """``name``'s paired units over seed-group parts: a part's per-seed means (``stat_unit``
    "seed"), or a one-seed part's test episodes reduced to their mean, its seed's unit."""
    out: list[float] = []
    for s in parts:
        d = [float(x) for x in s[f"{name}_diffs"]]
        out += d if s["stat_unit"] == "seed" else [statistics.fmean(d)]
    return out


def _policy_why(parts: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    """The gates that failed in any part: a cell not tested in one part is not tested joined."""
    why = [
        w.strip()
        for s in parts
        if str(s[key]).startswith("not tested")
        for w in str(s[key]).partition(":")[2].split("; ")
    ]
    return [w for w in dict.fromkeys(why) if w and w != _POLICY_TOO_FEW]


def _policy_claim(parts: Sequence[Mapping[str, Any]], name: str) -> _Decided:
    """Claim ``name``: the study's own verdict for one part; for seed-group parts, their units
    joined and decided again by the claim's rule (``<name>_rule``) at its margin."""
    s, alpha = parts[0], float(parts[0]["stat_alpha"])
    if len(parts) == 1:
        keys = ("mean", "ci_low", "ci_high", "ci_level")
        return _Decided(str(s[f"verdict_{name}"]), *(float(s[f"{name}_{k}"]) for k in keys),
                        str(s[f"{name}_outcome"]))  # fmt: skip
    rule, direction = str(s[f"{name}_rule"]).split()
    bound = rule.startswith("bound")
    why = _policy_why(parts, f"verdict_{name}")
    v = (_verdicts.noninferior if bound else _verdicts.decide)(
        _policy_units(parts, name),
        margin=float(s[f"{name}_margin"]),
        direction=direction,  # type: ignore[arg-type]
        alpha=alpha,
        failed=why,
    )
    lo, hi = (v.eq_low, v.eq_high) if bound else (v.ci_low, v.ci_high)
    verdict = _POLICY_AS_CLAIM.get(v.outcome) or "not tested: " + "; ".join(why)
    return _Decided(verdict, v.effect_mean, lo, hi, 1 - (2 if bound else 1) * alpha, v.outcome)


def _policy_figure(
    parts: Sequence[Mapping[str, Any]], name: str, direction: str = "greater"
) -> _Decided:
    """Figure ``name`` (a mean paired difference, its (1 - alpha) t interval and outcome at
    the margin): the study's for one part, decided again on the joined units otherwise."""
    s, alpha = parts[0], float(parts[0]["stat_alpha"])
    if len(parts) == 1:
        low, high = float(s[f"{name}_ci_low"]), float(s[f"{name}_ci_high"])
        return _Decided("", float(s[name]), low, high, 1 - alpha, str(s[f"{name}_outcome"]))
    v = _verdicts.decide(
        _policy_units(parts, name),
        margin=float(s["margin"]),
        direction=direction,  # type: ignore[arg-type]
        alpha=alpha,
    )
    return _Decided("", v.effect_mean, v.ci_low, v.ci_high, 1 - alpha, v.outcome)


def _policy_combine(verdicts: Sequence[str]) -> str:
    """One report verdict from cells ("holds" / "fails" / "undecided" / "not tested: ..." or
    the report's own words): not tested if none was tested; reproduced if every tested one
    holds; partly if some hold (or are partly); not reproduced if none holds and some fail;
    undecided if none holds and none fails."""
    tested = [v for v in verdicts if not v.startswith("not tested")]
    if not tested:
        return "not tested"
    held = [v for v in tested if v in ("holds", "reproduced")]
    if len(held) == len(tested):
        return "reproduced"
    if held or "partly" in tested:
        return "partly"
    return "not reproduced" if {"fails", "not reproduced"} & set(tested) else "undecided"


def _policy_head(where: str, parts: Sequence[Mapping[str, Any]], what: str) -> str:
    s = parts[0]
    if len(parts) > 1:
        units = f"per-seed means of {_policy_seeds(parts)} seeds"
        units += f" joined from {len(parts)} parts"
    elif s["stat_unit"] == "seed":
        units = f"per-seed means of {s['n_seeds']} seeds"
    else:
        units = f"the {s['n_test']} test episodes of one seed"
    return f"{where} ({what}; margin {_fmt(float(s['margin']))} in return; units: {units})"


def _policy_list(cells: Sequence[tuple[str, _Decided]], outcome: bool = False) -> str:
    """The tested cells with their intervals, then the untested ones grouped by reason."""
    shown, skipped = [], {}
    for label, c in cells:
        if c.verdict.startswith("not tested"):
            skipped.setdefault(c.verdict.partition(":")[2].strip(), []).append(label)
        else:
            word = f"{c.verdict} ({c.outcome})" if outcome else c.verdict
            shown.append(f"{label} {word} {c.ci()}")
    text = ", ".join(shown) or "no cell tested"
    return text + "".join(f"; not tested ({w}): {', '.join(ls)}" for w, ls in skipped.items())


def _policy_prior_claim(kind: str, what: str, outcome: bool = False) -> Callable:
    """Graceful degradation / additive below PoE: per prior of ``priors`` and space."""

    def decide(summaries: Summaries) -> tuple[str, str]:
        verdicts, texts = [], []
        for where, parts in _policy_runs(summaries, "policy_pointmaze", verdicts, texts):
            s = parts[0]
            cells = [(f"{q} {sp}", _policy_claim(parts, f"{kind}_{q}_{sp}"))
                     for sp in s["spaces"] for q in s["priors"]]  # fmt: skip
            verdicts += [c.verdict for _, c in cells]
            level = f"{cells[0][1].level:.0%}" if cells else "?"
            head = _policy_head(where, parts, f"{what}, mean [{level} interval]")
            texts.append(f"{head}: {_policy_list(cells, outcome)}")
        return _policy_combine(verdicts), "; ".join(texts)

    return decide


def _policy_prediction(parts: Sequence[Mapping[str, Any]], sp: str, figs: dict) -> str:
    """The precision-ratio prediction of one space on joined parts (the study's rule)."""
    why = _policy_why(parts, f"precision_ratio_prediction_{sp}")
    if 1.0 in figs and figs[1.0].outcome in ("reproduced", "not reproduced"):
        why.append("the r = 1 control (PoE and additive coincide) differs")
    if why:
        return "not tested: " + "; ".join(dict.fromkeys(why))
    rest = [f.outcome for r, f in figs.items() if r != 1.0]
    if rest and all(o == "reproduced" for o in rest):
        return "holds"
    return "fails" if "not reproduced" in rest else "undecided"


def _policy_precision(summaries: Summaries) -> tuple[str, str]:
    verdicts, texts = [], []
    for where, parts in _policy_runs(summaries, "policy_pointmaze", verdicts, texts):
        s, per, items = parts[0], [], []
        for sp in s["spaces"]:
            figs = {
                float(r): _policy_figure(
                    parts, f"precision_contrast_r{float(r):g}_{sp}", "less" if r < 1 else "greater"
                )
                for r in s["precision_ratios"]
            }
            pred = (
                str(s[f"precision_ratio_prediction_{sp}"])
                if len(parts) == 1
                else _policy_prediction(parts, sp, figs)
            )
            per.append(pred)
            items.append(
                f"{sp} {_policy_word(pred)}: "
                + ", ".join(f"r = {r:g} {f.ci()} {f.outcome}" for r, f in figs.items())
            )
        if len(parts) == 1:
            overall = str(s["precision_ratio_prediction"])
        else:  # the study's combination over spaces: a failed space fails it
            tested = [v for v in per if not v.startswith("not tested")]
            overall = (
                "not tested: no space passed its gates" if not tested
                else "fails" if "fails" in tested
                else "holds" if all(v == "holds" for v in tested)
                else "undecided"
            )  # fmt: skip
        verdicts.append(overall)
        level = f"{1 - float(s['stat_alpha']):.0%}"
        head = _policy_head(where, parts, f"additive - PoE at weight 0.5, mean [{level} interval]")
        texts.append(f"{head}: prediction {_policy_word(overall)}; " + "; ".join(items))
    return _policy_combine(verdicts), "; ".join(texts)


def _policy_selector(summaries: Summaries) -> tuple[str, str]:
    verdicts, texts = [], []
    for where, parts in _policy_runs(summaries, "policy_pointmaze", verdicts, texts):
        items = []
        for sp in parts[0]["spaces"]:
            c = _policy_claim(parts, f"selector_{sp}")
            reg = {
                k: _policy_figure(parts, f"{k}_regret_{sp}") for k in ("selector", "fixed", "actor")
            }
            d = _policy_figure(parts, f"selector_minus_fixed_{sp}")
            verdicts.append(c.verdict)
            items.append(
                f"{sp} {_policy_word(c.verdict)}: PoE-KL - oracle {c.ci()} ({c.level:.0%}), "
                f"regret ({d.level:.0%}) of the KL selector {reg['selector'].ci()}, of fixed "
                f"alpha {reg['fixed'].ci()}, of the actor alone {reg['actor'].ci()}, selector - "
                f"fixed {d.ci()} {d.outcome}"
            )
        head = _policy_head(where, parts, "regret against the oracle alpha in [0.1, 0.9]")
        texts.append(f"{head}: " + "; ".join(items))
    return _policy_combine(verdicts), "; ".join(texts)


def _policy_ceiling_cell(capped: str, responsive: str) -> str:
    """One (env, space): both hold, exactly one, both fail, neither tested, else undecided."""
    held = [capped, responsive].count("holds")
    if held:
        return "reproduced" if held == 2 else "partly"
    if capped == responsive == "fails":
        return "not reproduced"
    if capped.startswith("not tested") and responsive.startswith("not tested"):
        return "not tested"
    return "undecided"


def _policy_ceiling(summaries: Summaries) -> tuple[str, str]:
    verdicts, texts = [], []
    env = lambda setting, parts: str(parts[0].get("env") or setting or "?")
    for where, parts in _policy_runs(summaries, "policy_locomotion", verdicts, texts, env):
        if not all(s["data_admissible"] is True for s in parts):
            verdicts.append("not tested")
            steps = ", ".join(dict.fromkeys(_fmt(s["data_steps"]) for s in parts))
            texts.append(f"{where}: not tested (its data has {steps} SAC steps, below 100k)")
            continue
        items = []
        for sp in parts[0]["spaces"]:
            cap = _policy_claim(parts, f"capped_medium_expert_{sp}")
            resp = _policy_claim(parts, f"responsive_medium_replay_{sp}")
            cell = _policy_ceiling_cell(cap.verdict, resp.verdict)
            verdicts.append(cell)
            pre = ", ".join(
                f"{lv} {_policy_figure(parts, f'good_prior_minus_actor_{lv}_{sp}').outcome} / "
                f"{_policy_figure(parts, f'control_minus_actor_{lv}_{sp}').outcome}"
                for lv in ("medium_expert", "medium_replay")
            )
            items.append(
                f"{sp} {cell}: capped (medium-expert) {cap.ci()} ({cap.level:.0%}) "
                f"{_policy_word(cap.verdict)}, responsive (medium-replay) {resp.ci()} "
                f"({resp.level:.0%}) {_policy_word(resp.verdict)}, preconditions (good prior "
                f"alone - actor / control - actor): {pre}"
            )
        what = "PoE at the good prior's oracle alpha - actor, mean [interval]"
        texts.append(f"{_policy_head(where, parts, what)}: " + "; ".join(items))
    return _policy_combine(verdicts), "; ".join(texts)


_POLICY_PAIRED = (
    "paired per test episode (the same seed, start and goal under both arms), the units the "
    "per-seed means with two or more seeds"
)
_POLICY_COMBINE = (
    "reproduced if every tested cell holds, partly if some hold, not reproduced if none holds "
    "and some fail, undecided if none holds and none fails, not tested if none was tested"
)
_POLICY_JOIN = (
    "a study run in seed-group parts is decided on their units joined (a one-seed part's "
    "episodes as their mean) by the same rule, margin and level, once its pre-stated seeds "
    "are in (pointmaze 5, locomotion 3 per env; undecided before), and a cell not tested in "
    "any part is not tested; a run from before the rebuilt rules (issue 52) is not tested"
)
_POLICY_GATES = (
    "tested only where the actor beats the zero action on the selection episodes and the prior "
    "alone is decidedly worse than the actor (its own bound at -margin shown not to hold)"
)

POLICY_RULES = {
    "graceful": Rule(
        "experiments/policy_pointmaze.py's pre-stated rule, per prior Q of the run's `priors` "
        "and likelihood space (pretanh, action): graceful_Q_space holds if PoE at the KL-budget "
        "weight loses less than the margin against the actor alone, (PoE-KL - actor) > -margin "
        "by experiments._verdicts.noninferior (the 90% t interval's lower end above -margin), "
        f"fails if that interval lies below -margin, {_POLICY_PAIRED}; {_POLICY_GATES}. Over "
        f"the cells: {_POLICY_COMBINE}; {_POLICY_JOIN}",
        POLICY_MARGINS["policy_pointmaze"],
    ),
    "additive": Rule(
        "experiments/policy_pointmaze.py's pre-stated rule, per prior Q and likelihood space: "
        "additive_below_poe_Q_space holds if (additive - PoE) at the common weight 0.5 is below "
        "0 by experiments._verdicts.decide (the 95% t interval below 0, after TOST at the "
        'margin: a difference shown within the margin is "no advantage" and fails, as does '
        f"one shown above 0), {_POLICY_PAIRED}; {_POLICY_GATES}. Over the cells: "
        f"{_POLICY_COMBINE}; {_POLICY_JOIN}",
        POLICY_MARGINS["policy_pointmaze"],
    ),
    "precision": Rule(
        "experiments/policy_pointmaze.py's pre-stated prediction on the precision-ratio prior "
        "family (the actor's mean moved by 2 actor stds along one fixed random direction, with "
        "precision exactly r times the actor's at every state, r in the run's "
        "`precision_ratios`): (additive - PoE) at the common weight 0.5 is claimed below 0 for "
        "every r < 1 and above 0 for every r > 1, each by experiments._verdicts.decide (95% t "
        f"interval, TOST at the margin first), {_POLICY_PAIRED}. Per space it holds if every "
        "r != 1 is shown on its predicted side, fails if any is shown on the other side, and is "
        "undecided otherwise; not tested unless the actor beats the zero action, the family's "
        "mean alone is decidedly worse than the actor and the r = 1 control (where PoE and "
        "additive coincide) is not decidedly non-zero. Over both spaces (the study's "
        "`precision_ratio_prediction`): fails if one fails, holds if every tested one holds, "
        "undecided otherwise, read as reproduced / not reproduced / undecided / not tested; "
        f"{_POLICY_JOIN}",
        POLICY_MARGINS["policy_pointmaze"],
    ),
    "selector": Rule(
        "experiments/policy_pointmaze.py's pre-stated rule: a rule's regret is (the return of "
        "PoE at the oracle alpha among the alphas in [0.1, 0.9], chosen on selection episodes) "
        "- (the rule's return), averaged over the run's priors; per likelihood space, "
        "selector_space holds if the KL selector's regret is below the margin, (PoE-KL - "
        "oracle) > -margin by experiments._verdicts.noninferior (90% t interval), "
        f"{_POLICY_PAIRED}; tested where the actor beats the zero action. The KL budget is "
        "calibrated per space without reward (half the actor's own median KL between two data "
        "states). Shown beside it with 95% t intervals: the regrets of the rules without "
        "search (PoE at fixed alpha 0.5, the actor alone) and selector - fixed (the fixed "
        "rule's regret minus the selector's: positive when the selector's return is higher), "
        f"with its outcome by decide at the margin. Over both spaces: {_POLICY_COMBINE}; "
        f"{_POLICY_JOIN}",
        POLICY_MARGINS["policy_pointmaze"],
    ),
    "ceiling": Rule(
        "experiments/policy_locomotion.py's pre-stated rule, per env (one part each: "
        "HalfCheetah, Hopper, Walker2d) and likelihood space: capped, the good prior at its "
        "oracle alpha helps the medium-expert actor by less than the margin, (PoE - actor) < "
        "+margin by experiments._verdicts.noninferior (the 90% t interval's upper end: "
        "non-superiority), tested only if the good prior alone does not decidedly beat that "
        "actor (a competent actor); responsive, it helps the medium-replay actor, the 95% t "
        "interval of the same difference above 0 by decide (after TOST at the margin), tested "
        "only if the good prior alone decidedly beats that actor (the prior knows better); both "
        "only where the actor beats the zero action and the random-perturbation control (the "
        "good prior's precision and step in a random direction, at the same alpha) does not "
        f"help; the differences are {_POLICY_PAIRED}. Per (env, space): reproduced if both "
        "hold, partly if exactly one holds, not reproduced if both fail, not tested if neither "
        "was tested, undecided "
        "otherwise; every cell of an env whose data is below 100k SAC steps (`data_admissible` "
        "false) is not tested. Over (env, space): reproduced if every tested cell is, partly "
        "if some are reproduced or partly, not reproduced if none is and some are not "
        f"reproduced, undecided otherwise; {_POLICY_JOIN}",
        POLICY_MARGINS["policy_locomotion"],
    ),
}


DTB_MARGIN = _verdicts.MARGINS["dtb"]

DTB_RULE = Rule(
    "the study's pre-stated rule (experiments/backdoor_dtb.py, experiments._backdoor.verdict): "
    "not tested unless calibration admits >= 6 model-repair defenses (each removes BadNets on "
    ">= 2 of 3 seeds), the mask, FP-oracle and surrogate controls pass on >= 2 of 3 seeds, "
    "the implant is usable (decoy ASR >= 0.9, hidden ASR <= 0.05 before any defense) and "
    ">= 10 informative events (an admitted defense acted, suppressed the decoy keeping the "
    "clean accuracy, and sent <= 5% of clean images to the hidden target); then reproduced if "
    "the median hidden ASR over the events is >= 0.5 and beats the naive model's after the "
    "same events (paired over events, BCa interval from 10 pairs), partly if >= 0.2, not "
    "reproduced below",
    f"±{DTB_MARGIN} in attack success rate (DTB vs naive, paired over events)",
)


def _dtb(summaries: Summaries) -> tuple[str, str]:
    s = summaries["backdoor_dtb"]
    if "verdict_failed" not in s:  # a run of the protocol before issue 50
        return "not tested", (
            "backdoor_dtb: the committed run predates the study's positive controls and "
            "calibration gate (issue 50); rerun it"
        )
    from experiments import _backdoor  # the study's own rule, on the shared statistics module

    parts = [v for k, v in summaries.items() if k.startswith("backdoor_dtb/")]
    if len(parts) > 1:  # seed parts: the gates, events and verdict over all of their seeds
        s = _backdoor.join_parts(parts)
    verdict, failed, cmp = _backdoor.verdict(s)
    h = s["events_hidden_asr"]
    reason = (
        f"backdoor_dtb: {s['calibration_admitted']} defenses admitted, controls mask "
        f"{_pass(s['control_mask_pass'])}, FP oracle {_pass(s['control_oracle_fp_pass'])}, "
        f"surrogate {_pass(s['control_surrogate_pass'])}; {len(h)} informative events"
    )
    if h:
        reason += f", median hidden ASR {statistics.median(h):.3f}"
    if cmp is not None:
        reason += f"; DTB - naive over the events: {cmp.figures('ASR')}"
    if failed:
        reason += "; failed: " + "; ".join(failed)
    return verdict, reason


def _pass(ok: Any) -> str:
    return "passed" if ok is True else "failed"


#: The stall goal (issue 47): the blocked time's overhead over the host copy of the state, in ms.
#: orbax's own blocking bookkeeping was measured at about 2 ms; on CPU orbax's async save does
#: not copy the arrays in its blocking part, so a ratio to it (the old 0.2x bar) cannot be met
#: by any save that copies.
CACHEX_STALL_OVERHEAD_MS = 2.5


def _cachex(summaries: Summaries) -> tuple[str, str]:
    s = summaries["cachex_bench"]
    stall, copy = float(s["stall_ms_cachex"]), float(s["stage_ms_cachex"])
    over = stall - copy
    reason = (
        f"cachex_bench: mean blocked time {stall:.2f} ms, of which the copy into host memory "
        f"{copy:.2f} ms: overhead {over:.2f} ms (goal <= {CACHEX_STALL_OVERHEAD_MS:g} ms); "
        f"{float(s['stall_ratio_vs_orbax']):.3f}x orbax's async save"
    )
    return ("reproduced" if over <= CACHEX_STALL_OVERHEAD_MS else "not reproduced"), reason


def _cachex_faults(summaries: Summaries) -> tuple[str, str]:
    s = summaries["cachex_durability"]
    runs, exact = int(s["fault_runs"]), int(s["fault_exact_restores"])
    corrupt = int(s["fault_corrupt_restores"])
    reason = (
        f"cachex_durability: {exact} of {runs} fault runs restored the newest complete step "
        f"bit-exact, {corrupt} returned corrupt bytes"
    )
    if "steps_lost" in s:
        reason += (
            f"; {int(s['steps_lost'])} steps lost, {int(s['false_durable_claims'])} false "
            f"durability claims over {int(s['faults_tried'])} fault kinds"
        )
    if "orbax_emergency_fault_runs" in s:  # the peer under the faults its API allows
        em = {k: int(s[f"orbax_emergency_{k}"]) for k in (
            "faults_tried", "fault_runs", "exact_restores", "corrupt_restores",
            "failed_restores", "steps_lost", "false_durable_claims")}  # fmt: skip
        reason += (
            f"; orbax's emergency manager under {em['faults_tried']} of them "
            f"({em['fault_runs']} runs): {em['exact_restores']} exact, "
            f"{em['corrupt_restores']} corrupt and {em['failed_restores']} failed restores, "
            f"{em['steps_lost']} steps lost, {em['false_durable_claims']} false claims"
        )
    if corrupt == 0 and exact == runs:
        return "reproduced", reason
    return ("partly" if corrupt == 0 else "not reproduced"), reason


def _pm(s: Mapping[str, Any], key: str) -> str:
    if key not in s:
        return ""
    v, sd = float(s[key]), s.get(f"{key}_sd")
    if math.isnan(v):
        return "nan"
    return f"{v:.3f}" if sd is None or float(sd) == 0.0 else f"{v:.3f} ± {float(sd):.3f}"


def _rwefm_maps(s: Mapping[str, Any], prefix: str, label: str) -> list[str]:
    """One RWEFM setting's noise, pairing and solves, below its method x metric table: the
    share of each arm's training maps that converged and their iterations, and the share of
    evaluation solves that converged."""
    if f"{prefix}emd_1nna_diff_mean" not in s:
        return []
    conv = [f"{a}: {float(s[f'{prefix}map_converged_frac_{a}']):.3f} of the training maps "
            f"converged within {s[f'{prefix}map_iterations_{a}']} iterations"
            for a in ("rwefm", "euclid")]  # fmt: skip
    conv.append(f"evaluation solves converged: {float(s[f'{prefix}eval_converged_frac']):.3f}")
    head = f"{label}: noise `{s[f'{prefix}noise']}`, pairing `{s[f'{prefix}pairing']}`; "
    return [head + "; ".join(conv) + ".", ""]


def _rwefm_tables(study: str) -> Callable[[Mapping[str, Any]], list[str]]:
    settings = [(p, lb) for st, p, lb in RWEFM_SETTINGS if st == study]
    return lambda s: [line for p, lb in settings for line in _rwefm_maps(s, p, lb)]


def _dtb_table(s: Mapping[str, Any]) -> list[str]:
    """Per defense: its calibration on BadNets, then the DTB and naive models after it."""
    arms = ("DTB", "naive")
    head = "| defense | BadNets ASR after | BadNets acc after | effective | " + " | ".join(
        f"{a} {m} after" for a in arms for m in ("acc", "decoy ASR", "hidden ASR")
    )
    lines = ["Per defense (mean ± sd over the seeds that ran each figure):", "",
             head + " |", "| --- " * 10 + "|"]  # fmt: skip
    for d in s.get("defenses", []):
        cells = [f"`{d}`", _pm(s, f"calib_asr_{d}"), _pm(s, f"calib_acc_{d}"),
                 _pm(s, f"efficacy_{d}")]  # fmt: skip
        cells += [
            _pm(s, f"{p}{m}_after_{d}")
            for p in ("", "naive_")
            for m in ("clean_acc", "decoy_asr", "hidden_asr")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


#: An arm's or a metric's name in the summary's keys, or several (the first present wins).
Names = str | tuple[str, ...]
#: Arms, metrics or settings: ``(names, label)`` pairs, or a function of the summary giving them
#: (for those a study lists in its summary, such as its priors or its fault kinds).
Axis = Sequence[tuple[Names, str]] | Callable[[Mapping[str, Any]], Sequence[tuple[Names, str]]]


@dataclass(frozen=True)
class MetricTable:
    """A study's method x metric table, read from its summary by the keys' naming convention.

    The cell of arm ``a`` and metric ``m`` in setting ``p`` (a manifold's part, a likelihood
    space) reads the key that ``key`` names once its ``{arm}``, ``{metric}`` and ``{setting}``
    are filled in, ``_``-separated, an empty part dropping out with its ``_`` (so an arm named
    ``""`` is the study's unprefixed one): the cell shows ``<key>_mean`` or else ``<key>``,
    with ``± <key>_sd`` where the summary has it (the sd over seeds). An arm or metric name
    holding a ``{`` is a key template of its own, for a figure the study names otherwise
    (``"{setting}_{metric}_diff"``). Arms, metrics and settings with no key in a summary are
    left out, and so is a table with none.
    """

    arms: Axis
    metrics: Axis
    key: str = "{setting}_{arm}_{metric}"
    settings: Axis = (("", ""),)
    title: str = ""  # the caption, before a setting's label
    note: str = ""  # how to read the figures, in parentheses after the caption
    arm_header: str = "method"
    seeds: str = "n_seeds"  # the key counting the seeds an sd is over


def _axis(axis: Axis, s: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    pairs = axis(s) if callable(axis) else axis
    return [((n,) if isinstance(n, str) else tuple(n), label) for n, label in pairs]


def _fill(template: str, **parts: str) -> str:
    """``template`` with its parts filled in, ``_``-joined, empty parts left out."""
    return "_".join(t for t in (tok.format(**parts) for tok in template.split("_")) if t)


def _cell(s: Mapping[str, Any], table: MetricTable, setting: str, arm: tuple[str, ...],
          metric: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:  # fmt: skip
    """The cell's text and the keys it shows; ``None`` when the summary has no such key."""
    for a in arm:
        for m in metric:
            template = a if "{" in a else m if "{" in m else table.key
            k = _fill(template, setting=setting, arm=a, metric=m)
            for mean in (f"{k}_mean", k):
                if mean in s:
                    if f"{k}_sd" not in s:
                        return _fmt(s[mean]), (mean,)
                    return f"{_fmt(s[mean])} ± {_fmt(s[f'{k}_sd'])}", (mean, f"{k}_sd")
    return None


def metric_tables(
    tables: Sequence[MetricTable], s: Mapping[str, Any], shown: set[str] | None = None
) -> list[str]:
    """The markdown of ``tables`` on summary ``s``: per setting, a row per arm and a column per
    metric that the summary has. The keys the cells show are added to ``shown``."""
    lines: list[str] = []
    for table in tables:
        arms, metrics = _axis(table.arms, s), _axis(table.metrics, s)
        for (setting, *_), label in _axis(table.settings, s):
            cells = {(i, j): c for i, (a, _) in enumerate(arms) for j, (m, _) in enumerate(metrics)
                     if (c := _cell(s, table, setting, a, m)) is not None}  # fmt: skip
            if not cells:
                continue
            rows, cols = sorted({i for i, _ in cells}), sorted({j for _, j in cells})
            caption = ", ".join(x for x in (table.title, label) if x)
            if shown is not None:
                shown.update(k for _, keys in cells.values() for k in keys)
            if any(len(keys) > 1 for _, keys in cells.values()):
                n = s.get(_fill("{setting}_" + table.seeds, setting=setting), s.get(table.seeds))
                caption += f"{', ' if caption else ''}mean ± sd" + (
                    f" over {_fmt(n)} seeds" if n is not None else ""
                )
            if table.note:
                caption += f" ({table.note})"
            lines += [f"{caption[:1].upper()}{caption[1:]}:", ""] if caption else []
            lines += [
                f"| {table.arm_header} | " + " | ".join(metrics[j][1] for j in cols) + " |",
                "| --- " * (len(cols) + 1) + "|",
            ]
            lines += [
                f"| {arms[i][1]} | " + " | ".join(cells.get((i, j), ("-",))[0] for j in cols) + " |"
                for i in rows
            ]
            lines.append("")
    return lines


def _names_before(suffix: str, skip: tuple[str, ...] = ()) -> Callable[[Mapping[str, Any]], list]:
    """The arms a summary names by the keys ``<arm>_<suffix>``, in the summary's order."""
    tail = f"_{suffix}"
    return lambda s: [(k[: -len(tail)], k[: -len(tail)]) for k in s
                      if k.endswith(tail) and k[: -len(tail)] not in skip]  # fmt: skip


def _listed(key: str) -> Callable[[Mapping[str, Any]], list]:
    """The arms, metrics or settings a summary lists under ``key``."""
    return lambda s: [(str(v), str(v)) for v in s.get(key, ())]


_RWEFM_ARMS = (
    ("rwefm", "RWEFM"),
    ("euclid", "Euclidean baseline"),
    ("euclid_periodic", "Euclidean on (cos, sin) features"),
    ("{setting}_{metric}_diff", "RWEFM - baseline (paired)"),
    ("floor", "data floor"),
)
_RWEFM_METRICS = (
    *((f"{g}_{m}", f"{g} {m}") for g in ("emd", "chamfer") for m in ("1nna", "mm", "kmmd")),
    ("final_loss", "final loss"),
)


def _rwefm_metric_table(study: str) -> MetricTable:
    settings = tuple((p.rstrip("_"), lb) for st, p, lb in RWEFM_SETTINGS if st == study)
    return MetricTable(_RWEFM_ARMS, _RWEFM_METRICS, settings=settings,
                       note="lower is better; 1-NNA: 0.5 is ideal")  # fmt: skip


def _prefmh_arms(ks: Sequence[int], *rest: tuple[Names, str]) -> tuple[tuple[Names, str], ...]:
    # ESS per 1000 comparisons names a K-budget chain k<K>, its other figures prefmh_k<K>
    chains = tuple(((f"prefmh_k{k}", f"k{k}"), f"Pref-MH, K = {k}") for k in ks)
    return (("mh", "exact MH"), *chains, *rest)


_POLICY_METHODS = (
    ("actor_return_{setting}", "actor alone"),
    ("poe_kl", "PoE at the KL-budget alpha"),
    ("oracle", "PoE at the oracle alpha"),
    ("oracle_mid", "PoE at the oracle alpha in [0.1, 0.9]"),
    ("fixed", "PoE at alpha 0.5"),
    ("poe_contrast", "PoE at the contrast alpha"),
    ("additive_contrast", "additive at the contrast alpha"),
    ("prior_only", "prior alone"),
)


def _policy_metric_table(settings: Axis) -> MetricTable:
    # the priors are the columns: each method's test return under each prior
    return MetricTable(_POLICY_METHODS, _listed("priors"), key="{arm}_return_{metric}_{setting}",
                       settings=settings, title="test return per prior")  # fmt: skip


#: Each study's method x metric tables: arms (rows) and metrics (columns) named as its summary
#: names them (its docstring lists the keys). The keys no table shows are listed, folded, below.
METRIC_TABLES: Mapping[str, tuple[MetricTable, ...]] = {
    **{
        st: (_rwefm_metric_table(st),)
        for st in ("rwefm_synthetic", "rwefm_protein", "rwefm_singlecell")
    },
    "prefmh_mixture": (
        MetricTable(
            _prefmh_arms(
                (1, 3, 5, 9),
                ("majority_k3", "majority vote, K = 3"),
                ("two_coin", "two-coin"),
                ("iid", "i.i.d. draws"),
            ),
            (
                ("tv", "grid TV"),
                ("sw1", "sliced W1"),
                ("acc", "acceptance"),
                ("rhat", "R-hat"),
                ("ess_per_step", "ESS / step"),
                ("ess_per_kcall", "ESS / 1000 calls"),
                ("calls_per_step", "calls / step"),
                ("truncated", "steps cut at max_rounds"),
            ),
            key="{metric}_{arm}",
        ),
    ),
    "prefmh_digits": (
        MetricTable(
            (
                ("mh_latent", "exact MH (latent)"),
                ("prefmh_k1_latent", "Pref-MH, K = 1 (latent)"),
                ("prefmh_k3_latent", "Pref-MH, K = 3 (latent)"),
                ("prefmh_k1_indep", "Pref-MH, K = 1 (independent)"),
                ("base_{metric}", "generator draws"),
            ),
            (
                ("rate", "target rate"),
                ("judge_rate", "judge's rate"),
                ("diversity", "diversity"),
                ("sw1_to_mh", "sliced W1 to MH"),
                ("acc", "acceptance"),
                ("ess_per_step", "ESS / step"),
                ("ess_per_kcall", "ESS / 1000 calls"),
            ),
            key="{metric}_{arm}",
        ),
    ),
    "prefmh_text": (
        MetricTable(
            _prefmh_arms(
                (1, 3),
                ("majority_k3", "majority vote, K = 3"),
                ("exact_{metric}", "tilted reference"),
                ("base_{metric}", "p0"),
            ),
            (
                ("rate", "property rate"),
                ("tv_count", "count TV"),
                ("mean_count", "mean count"),
                ("hamming", "Hamming"),
                ("unique_frac", "unique"),
                ("acc", "acceptance"),
                ("ess_per_step", "ESS / step"),
                ("ess_per_kcall", "ESS / 1000 calls"),
            ),
            key="{metric}_{arm}",
        ),
    ),
    "backdoor_dtb": (
        MetricTable(
            # DTB's keys have no prefix, but its implant's training figures are dtb_<figure>
            ((("", "dtb"), "DTB"), ("naive", "naive"), ("oracle", "oracle (trained against FP)")),
            (
                ("clean_acc_before", "clean acc before"),
                ("decoy_asr_before", "decoy ASR before"),
                ("hidden_asr_before", "hidden ASR before"),
                ("decoy_asr_after_mean", "decoy ASR after (mean)"),
                ("hidden_asr_after_mean", "hidden ASR after (mean)"),
                ("hidden_asr_after_suppressed_mean", "hidden ASR after suppressing defenses"),
                ("n_defenses_suppressed", "defenses suppressing the decoy"),
                ("implant_ok", "implant ok"),
                ("implant_best_step", "implant's best step"),
            ),
            seeds="n_seeds_run",
        ),
    ),
    "cachex_bench": (
        MetricTable(
            (
                ("cachex", "CacheX"),
                ("orbax", "orbax async"),
                ("orbax_emergency_{metric}", "orbax emergency (multi-tier)"),
            ),
            (
                ("stall_ms", "mean stall (ms)"),
                ("stall_ms_median", "median stall (ms)"),
                ("stall_ms_p99", "p99 stall (ms)"),
                ("stage_ms", "host copy (ms)"),
                ("pfs_durable_s", "PFS-durable (s)"),
                ("variability", "p99/p50"),
                ("variability_save", "p99/p50 per save"),
                ("spread_iqr_s", "IQR (s)"),
            ),
            key="{metric}_{arm}",
        ),
    ),
    "cachex_durability": (
        MetricTable(
            # the totals over every fault are fault_<figure>, or unprefixed
            lambda s: [*_names_before("runs", ("fault",))(s), (("fault", ""), "all faults")],
            (
                ("runs", "runs"),
                (("exact", "exact_restores"), "exact restores"),
                (("corrupt", "corrupt_restores"), "corrupt restores"),
                ("steps_lost", "steps lost"),
                # per fault, not the total's fault_steps_lost_vs_orbax (floored at 0 per run)
                ("lost_vs_orbax", "lost vs orbax"),
                (("false_claims", "false_durable_claims"), "false durable claims"),
                ("max_lag_steps", "max lag (steps)"),
            ),
            arm_header="fault",
        ),
    ),
    "policy_pointmaze": (_policy_metric_table(_listed("spaces")),),
    "policy_antmaze": (_policy_metric_table(_listed("spaces")),),
    "policy_locomotion": (
        _policy_metric_table(
            lambda s: [
                (f"{lv}_{sp}", f"{lv}, {sp}")
                for lv in s.get("levels", ())
                for sp in s.get("spaces", ())
            ]
        ),
    ),
}


def _rwefm_claim(study: str, prefix: str) -> Callable[[Summaries], tuple[str, str]]:
    return lambda summaries: _rwefm_setting(summaries, study, prefix)


def _rwefm_reads(study: str, prefix: str) -> tuple[str, ...]:
    # rwefm_synthetic runs one part per manifold, named by the setting's key prefix
    return (f"{study}/{prefix.rstrip('_')}",) if prefix else (study,)


PAPERS = (
    Paper(
        "rwefm",
        "RWEFM: Riemannian Wasserstein entropic flow matching over point clouds",
        "the reference implementation DoronHav/WassersteinFlowMatching",
        ("rwefm_synthetic", "rwefm_protein", "rwefm_singlecell"),
        tuple(
            Claim(
                f"{label}: flow matching with Riemannian entropic maps generates clouds "
                "closer to held-out data than the Euclidean baseline from the same noise.",
                RWEFM_RULE,
                _rwefm_claim(study, prefix),
                _rwefm_reads(study, prefix),
            )
            for study, prefix, label in RWEFM_SETTINGS
        ),
        {st: _rwefm_tables(st) for st in ("rwefm_synthetic", "rwefm_protein", "rwefm_singlecell")},
        # the method calls the geometry and OT code for its maps, noise and scores
        ("lib/hexad/rwefm", "lib/hexad/geometry", "lib/hexad/ot", "experiments/_rwefm.py"),
        cite="haviv2025wfm",
        prior=("pooladian2021entropic", "lipman2023flow", "chen2024flow"),
    ),
    Paper(
        "prefmh",
        "Pref-MH: exact Metropolis-Hastings driven only by pairwise comparisons",
        "the paper's abstract",
        ("prefmh_mixture", "prefmh_digits", "prefmh_text"),
        (
            Claim(
                "The K-budget rule gives an exact chain from binary comparisons alone; majority "
                "vote does not.",
                Rule(
                    "reproduced if every K-budget chain's grid TV is within 1.5x the exact MH "
                    "chain's (same chains and steps) and majority vote's is above 3x it; partly "
                    "if only the first holds (one run, so no interval)"
                ),
                _prefmh,
                ("prefmh_mixture",),
            ),
        ),
        code=("lib/hexad/prefmh", "experiments/_prefmh.py"),
        prior=(
            "metropolis1953equation",
            "hastings1970monte",
            "bradley1952rank",
            "vats2020bernoulli",
        ),
    ),
    Paper(
        "cvxclust",
        "Bounds on perfect node classification: a convex graph clustering perspective",
        "arXiv 2508.20231 (abstract)",
        ("cvxclust_phase", "cvxclust_planetoid"),
        (
            Claim(
                "Graph and node information jointly recover communities where neither alone does.",
                Rule(
                    "the phase study's pre-stated rule (experiments/cvxclust_phase.py): with "
                    "the joint program's weights fixed in advance (eps = 10 n/K), reproduced if "
                    "at least one synergy cell survives Holm over the run's cells (joint "
                    "recovery rate >= 0.5, the graph program and the joint program without its "
                    "graph each <= 0.3, one-sided exact McNemar p < 0.05 against each on the "
                    "same draws, every compared solve certified); undecided if the rates point "
                    "to synergy somewhere without that test; not tested if the graph program "
                    "fails its own positive control (recovery < 0.25 at the largest dpq)"
                ),
                _cvxclust,
                ("cvxclust_phase",),
            ),
        ),
        {"cvxclust_phase": _cvxclust_table, "cvxclust_planetoid": _planetoid_table},
        ("lib/hexad/cvxclust", "experiments/_cvxclust.py"),
        cite="shahriarimehr2025bounds",
        prior=("chen2014improved", "chi2015splitting"),
    ),
    Paper(
        "policy",
        "When policies cannot be retrained: PoE / KL post-training steering",
        "arXiv 2604.22873 (abstract)",
        ("policy_pointmaze", "policy_antmaze", "policy_locomotion"),
        (
            Claim(
                "Composition degrades gracefully under a bad prior.",
                POLICY_RULES["graceful"],
                _policy_prior_claim("graceful", "PoE-KL - actor"),
                ("policy_pointmaze",),
            ),
            Claim(
                "Under a bad prior, precision-blind additive blending does worse than PoE at "
                "the same weight.",
                POLICY_RULES["additive"],
                _policy_prior_claim("additive_below_poe", "additive - PoE at weight 0.5", True),
                ("policy_pointmaze",),
            ),
            Claim(
                "PoE beats additive blending exactly when the prior is less precise than the "
                "actor (r < 1).",
                POLICY_RULES["precision"],
                _policy_precision,
                ("policy_pointmaze",),
            ),
            Claim(
                "The KL-budget selector picks a near-oracle weight without test-time search.",
                POLICY_RULES["selector"],
                _policy_selector,
                ("policy_pointmaze",),
            ),
            Claim(
                "A competent (medium-expert) actor cannot be helped by composition beyond the "
                "margin; a weaker (medium-replay) one is helped.",
                POLICY_RULES["ceiling"],
                _policy_ceiling,
                ("policy_locomotion",),
            ),
        ),
        code=("lib/hexad/policy", "experiments/_policy.py"),
        cite="hossain2026steering",
        prior=("hinton2002training", "kostrikov2022offline", "kumar2020conservative", "fu2020d4rl"),
    ),
    Paper(
        "dtb",
        "DTB: defense-triggered backdoors by bi-level optimisation",
        "the paper's abstract",
        ("backdoor_dtb",),
        (
            Claim(
                "A hidden backdoor stays dormant until a defense removes the decoy, then wakes.",
                DTB_RULE,
                _dtb,
                ("backdoor_dtb",),
            ),
        ),
        {"backdoor_dtb": _dtb_table},
        ("lib/hexad/backdoor", "experiments/_backdoor.py"),
        prior=(
            "gu2017badnets",
            "liu2018fine",
            "wang2019neural",
            "li2021anti",
            "wu2022backdoorbench",
        ),
    ),
    Paper(
        "cachex",
        "CacheX: checkpoint staging through host memory, a neighbour and a PFS drain",
        "the paper's abstract",
        ("cachex_durability", "cachex_bench"),
        (
            Claim(
                "Training stalls only for the copy into host memory.",
                Rule(
                    "reproduced if the mean blocked time of a save exceeds the copy of the "
                    "state into host memory by at most the margin, else not reproduced (one "
                    "benchmark run, so no interval; the blocked time is also reported as a "
                    "ratio to orbax's async save, which on CPU copies nothing while it blocks)",
                    f"{CACHEX_STALL_OVERHEAD_MS:g} ms over the copy",
                ),
                _cachex,
                ("cachex_bench",),
            ),
            Claim(
                "After a crash, a lost node, a dead neighbour, a full disk, a corrupt file or "
                "a PFS outage, a restore returns the newest complete step, never corrupt bytes.",
                Rule(
                    "reproduced if every fault run restores the newest complete step bit-exact "
                    "and none returns corrupt bytes; partly if none is corrupt"
                ),
                _cachex_faults,
                ("cachex_durability",),
            ),
        ),
        code=(
            "lib/hexad/cachex",
            "experiments/_cachex.py",
            "experiments/_cachex_faultworker.py",
        ),
        prior=("orbaxcheckpoint",),
    ),
)
PAPERS_BY_SLUG = {p.slug: p for p in PAPERS}


@dataclass(frozen=True)
class Gate:
    """One validity check of a study's runs: what must hold, in words, and ``failures(summary,
    config)``, the failures in words (empty when it holds)."""

    text: str
    failures: Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]


def _number(v: Any) -> float:
    # a check fails on a value that is not a number (NaN compares false with everything)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _key_gate(key: str, ok: Callable[[float], bool], need: str, why: str) -> Gate:
    """``key`` and every ``<prefix>_<key>`` (a study run in parts, or with a second arm,
    prefixes its keys) must satisfy ``ok``; a run without the key is not checked."""

    def failures(s: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
        keys = sorted(k for k in s if k == key or k.endswith(f"_{key}"))
        return [f"`{k}` = {_fmt(s[k])}, not {need} ({why})" for k in keys if not ok(_number(s[k]))]

    return Gate(f"`{key}` {need} ({why})", failures)


def _rwefm_calibrated(s: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    target = float(config.get("config", {}).get("map_target", 0.95))
    keys = sorted(k for k in s if re.search(r"(^|_)map_calibration_frac_(rwefm|euclid)$", k))
    return [
        f"`{k}` = {_fmt(s[k])}, below `map_target` {target:g} (the training maps' Sinkhorn "
        "bound was not calibrated)"
        for k in keys
        if not _number(s[k]) >= target
    ]


_RWEFM_GATES = (
    _key_gate(
        "eval_converged_frac", lambda v: v >= 0.99, ">= 0.99",
        "the scores need converged evaluation solves",
    ),
    Gate(
        "`map_calibration_frac_<arm>` >= the config's `map_target` (the training maps' "
        "Sinkhorn bound was calibrated)",
        _rwefm_calibrated,
    ),
)  # fmt: skip

#: Each study's own validity checks, on keys its summary already has (its docstring states
#: them). A failed one makes every claim that reads the run "not tested".
CHECKS: Mapping[str, tuple[Gate, ...]] = {
    "rwefm_synthetic": _RWEFM_GATES,
    "rwefm_protein": _RWEFM_GATES,
    "rwefm_singlecell": _RWEFM_GATES,
    "prefmh_mixture": (
        # Not truncated_two_coin: a two-coin step cut at max_rounds rejects, which keeps
        # detailed balance (hexad.prefmh.two_coin_acceptance), so the count is a cost only.
        _key_gate(
            "rhat_mh", lambda v: v <= 1.05, "<= 1.05",
            "the exact MH reference mixed (experiments/prefmh_mixture.py): a chain compared "
            "with an unmixed reference says nothing about exactness",
        ),
    ),
    "backdoor_dtb": (
        # the study's own gates (calibration, the three positive controls, a usable implant,
        # enough informative events) are part of its rule (_dtb); a collapsed implant is
        # checked here as well, for runs of either protocol
        _key_gate(
            "implant_ok", lambda v: v == 1, "= 1",
            "every seed's implant kept its clean accuracy >= 0.5",
        ),
    ),
    "cachex_bench": (
        _key_gate(
            "pfs_drained_fraction", lambda v: v == 1, "= 1",
            "every saved step reached the PFS, as orbax's did, so the stalls compare like "
            "with like",
        ),
    ),
    "cachex_durability": (
        _key_gate("fault_runs", lambda v: v > 0, "> 0", "faults were injected"),
    ),
}  # fmt: skip


def _failed_checks(run: Run) -> list[str]:
    return [f for g in CHECKS.get(run.study, ()) for f in g.failures(run.summary, run.config)]


@dataclass(frozen=True)
class Provenance:
    """A run's commit against its code: ``state`` is "current", "stale" or "unknown"."""

    commit: str
    date: str
    state: str
    text: str
    range: str = ""  # "<run>..<last change>" when stale


@functools.cache
def _git(*args: str) -> tuple[int, str] | None:
    try:
        r = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.returncode, r.stdout.strip()


def _code_paths(code: Sequence[str], *studies: str) -> tuple[str, ...]:
    """What a run is stale against: its method's code and its study's module."""
    return (*code, *(f"experiments/{study}.py" for study in studies))


def _provenance(run: Run, code: Sequence[str]) -> Provenance:
    prov = run.config.get("provenance", {})
    commit, date = str(prov.get("commit") or ""), str(prov.get("date", "?"))
    dirty = "; run with local changes" if prov.get("dirty") else ""
    paths = _code_paths(code, run.study)

    def unknown(why: str) -> Provenance:
        return Provenance(commit, date, "unknown", f"provenance unknown: {why}")

    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        return unknown("the run records no commit")
    full = _git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    if full is None:
        return unknown("git is unavailable")
    if full[0] != 0:
        return unknown(f"commit `{commit[:7]}` is not in this repository")
    in_history = _git("merge-base", "--is-ancestor", full[1], "HEAD")
    if in_history is None or in_history[0] != 0:
        return unknown(f"commit `{commit[:7]}` is not in this branch's history")
    last = _git("log", "-1", "--format=%H", "HEAD", "--", *paths)
    if last is None or last[0] != 0:
        return unknown("git log failed")
    if not last[1]:
        return Provenance(commit, date, "current", "current (no commit touched its code)" + dirty)
    after = _git("merge-base", "--is-ancestor", last[1], full[1])
    if after is not None and after[0] == 0:
        return Provenance(commit, date, "current", "current: no code change since the run" + dirty)
    since = _git("rev-list", f"{full[1]}..HEAD", "--", *paths)
    if since is None or since[0] != 0:
        return unknown("git rev-list failed")
    code = [c for c in since[1].split() if _code_changed(f"{c}^", c, paths)]
    if not code:
        text = "current: only docstrings or comments changed since the run"
        return Provenance(commit, date, "current", text + dirty)
    span = f"{commit[:7]}..{code[0][:7]}"
    text = f"stale: code changed after the run, commits {span} ({len(code)} of them change it)"
    return Provenance(commit, date, "stale", text + dirty, span)


def _code_of(rev: str, path: str) -> str | None:
    """``path`` at ``rev`` as far as running it goes: for Python, the syntax tree without its
    docstrings and bare string statements (comments never reach it); other files verbatim;
    None where the file does not exist there."""
    shown = _git("show", f"{rev}:{path}")
    if shown is None or shown[0] != 0:
        return None
    return code_fingerprint(shown[1]) if path.endswith(".py") else shown[1]


def code_fingerprint(source: str) -> str:
    """What of a Python source can change behaviour: its syntax tree without the statements
    that do nothing (a docstring or other bare constant such as ``...``, and ``pass``), so
    that a stub written ``...`` and one given a docstring instead compare equal; the source
    itself if it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            kept = [s for s in body if not _does_nothing(s)]
            node.body = kept or [ast.Pass()]
    return ast.dump(tree)


def _does_nothing(stmt: ast.stmt) -> bool:
    bare = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    return bare or isinstance(stmt, ast.Pass)


def _code_changed(a: str, b: str, paths: Sequence[str]) -> bool:
    """Whether a file under ``paths`` runs differently at ``b`` than at ``a`` (a change to
    docstrings or comments alone does not count)."""
    names = _git("diff", "--name-only", a, b, "--", *paths)
    if names is None or names[0] != 0:
        return True  # cannot tell: say changed, never claim a run current
    return any(_code_of(a, p) != _code_of(b, p) for p in names[1].split("\n") if p)


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, list):
        s = json.dumps(v)
        return s if len(s) <= 80 else s[:77] + "..."
    return str(v).replace("|", "\\|")


def _runs(study: str) -> list[Run]:
    """The committed runs of ``study``: one ``Run`` with part ``""`` for a whole-study folder,
    or one per subfolder when the study was run in parts (e.g. ``rwefm_synthetic``, one
    ``--set manifolds=...`` run per manifold in ``s2/`` and ``t2/``; their summary keys carry
    the part's prefix, so the claims read them merged)."""
    root = RESULTS / study
    whole = (root / "summary.json").is_file()
    dirs = [("", root)] if whole else [(d.name, d) for d in sorted(root.glob("*/"))]
    files = ("config.json", "summary.json")
    return [
        Run(study, part, *(json.loads((d / f).read_text(encoding="utf-8")) for f in files))
        for part, d in dirs
        if all((d / f).is_file() for f in files)
    ]


def _command(run: Run) -> str:
    """The run's recorded command as a reader would type it here: ``--out`` is the folder the
    run is committed in, and the scratch ``--ckpt`` folder (where it resumed from) is left out,
    so no page shows the folders of the machine that ran it."""
    cmd = run.config.get("provenance", {}).get("command")
    if not isinstance(cmd, str):
        return "?"
    try:
        words = shlex.split(cmd)
    except ValueError:
        return cmd
    out, i = [], 0
    while i < len(words):
        flag, _, value = words[i].partition("=")
        if flag in ("--out", "--ckpt"):
            i += 1 if value else 2
            if flag == "--out":
                out += ["--out", "/".join(("results", run.study, run.part)).rstrip("/")]
            continue
        out.append(words[i])
        i += 1
    return shlex.join(out)


def _run_lines(paper: Paper, run: Run, prov: Provenance) -> list[str]:
    config, summary = run.config, run.summary
    meta = config.get("provenance", {})
    machine = meta.get("machine", {})
    lines = [f"### run `{run.part}`", ""] if run.part else []
    if config.get("quick"):
        lines += ["**A `--quick` run, not the full study.**", ""]
    failed = _failed_checks(run)
    lines += [
        f"- command: `{_command(run)}`",
        f"- commit: `{meta.get('commit', '?')}`"
        + (" (with local changes)" if meta.get("dirty") else ""),
        f"- code since the run: {prov.text}",
        "- validity checks: " + ("; ".join(failed) if failed else "passed"),
        f"- date: {meta.get('date', '?')}; seed {config.get('seed')}; "
        f"runtime {_fmt(summary.get('runtime_s'))} s",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('backend', '?')}, jax {machine.get('jax', '?')}",
        "",
    ]
    shown: set[str] = set()
    lines += metric_tables(METRIC_TABLES.get(run.study, ()), summary, shown)
    if run.study in paper.tables:
        lines += paper.tables[run.study](summary)
    return lines + _figures(run) + _folded(summary, shown)


def _figures(run: Run) -> list[str]:
    """The run's plots, copied next to the page, each a figure of the column's full width (a
    click opens the full-size image)."""
    src = RESULTS / run.study / run.part
    img_dir = OUT / "_img" / run.name
    lines = []
    for png in sorted(src.glob("*.png")):
        img_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, img_dir / png.name)
        path = f"{run.name}/{png.name}"
        lines += [f":::{{figure}} _img/{path}", ":width: 100%", f":alt: {png.stem}", "",
                  f"`results/{path}`", ":::", ""]  # fmt: skip
    return lines


def _folded(summary: Mapping[str, Any], shown: set[str]) -> list[str]:
    """The summary's keys that no method x metric table showed (a study's own tables round
    their figures, so theirs stay), in a block folded until opened (raw HTML, which the HTML
    build keeps and other builders drop)."""
    rest = sorted(k for k in summary if k not in shown)
    if not rest:
        return []
    n = f"{len(rest)} key{'s' if len(rest) > 1 else ''}"
    what = f"The other {n}" if shown else f"All {n}"
    return [
        "<details>",
        f"<summary>{what} of <code>summary.json</code></summary>",
        "",
        "| key | value |",
        "| --- | --- |",
        *(f"| `{k}` | {_fmt(summary[k])} |" for k in rest),
        "",
        "</details>",
        "",
    ]


def _claim_runs(claim: Claim, runs: Mapping[str, list[Run]]) -> list[Run]:
    """The runs a claim reads: ``study/part`` picks that part and its seed groups
    (``part-seed<k>``), and a study run whole (no such part) or named without a part gives all
    of its runs."""
    out: list[Run] = []
    for name in claim.reads:
        study, _, part = name.partition("/")
        # a claim on the study as a whole does not read its control parts
        have = [r for r in runs.get(study, []) if part or not _control(r)]
        out += [r for r in have if r.part == part or r.part.startswith(f"{part}-")] or have
    return out


def decide(claim: Claim, summaries: Summaries, runs: Sequence[Run] = ()) -> tuple[str, str]:
    """The claim's verdict and reason: its rule on the merged summaries, "not measured" for a
    missing figure or figures no verdict can use, "not tested" when a run it reads fails one
    of its study's validity checks."""
    try:
        verdict, reason = claim.decide(summaries)
    except KeyError as e:
        return "not measured", f"no committed figure `{e.args[0]}` yet"
    except ValueError as e:
        return "not measured", f"no verdict from these figures: {e}"
    failed = [f"`{r.name}`: {f}" for r in runs for f in _failed_checks(r)]
    if failed:
        return "not tested", f"a validity check failed: {'; '.join(failed)}. Measured: {reason}"
    return verdict, reason


def _same_code(provs: Sequence[tuple[Run, Provenance]], code: Sequence[str]) -> bool:
    """Whether every part ran the same code: their commits differ at most in docstrings,
    comments and files outside the method's code and the study's module (any commit git does
    not know counts as different)."""
    commits = list(dict.fromkeys(p.commit for _, p in provs))
    if len(commits) < 2:
        return True
    if any(p.state == "unknown" for _, p in provs):
        return False
    paths = _code_paths(code, *dict.fromkeys(r.study for r, _ in provs))
    return not any(_code_changed(commits[0], c, paths) for c in commits[1:])


def _stale_note(provs: Sequence[tuple[Run, Provenance]], code: Sequence[str]) -> str:
    notes = []
    for r, p in provs:
        where = f" (`{r.name}`)" if r.part else ""
        if p.state == "stale":
            notes.append(f"stale: code changed after the run, commits {p.range}{where}")
        elif p.state == "unknown":
            notes.append(f"provenance unknown{where}")
    if not _same_code(provs, code):
        notes.append(
            "parts from commits whose code differs: "
            + ", ".join(f"`{r.name}` `{p.commit[:7]}`" for r, p in provs)
        )
    return f" ({'; '.join(notes)})" if notes else ""


def _control(run: Run) -> str:
    """The control group a part belongs to (:data:`CONTROL_FIELDS`), "" when it is seeds of its
    study's claim."""
    name, default = CONTROL_FIELDS.get(run.study, ("", ()))
    value = run.config.get("config", {}).get(name, default) if name and run.part else default
    if [float(v) for v in value] == [float(v) for v in default]:
        return ""
    return re.sub(r"-seed\d+$", "", run.part) or "control"


def merge_parts(merged: Mapping[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    """Adds one part's summary to the parts merged so far. Parts of different settings carry
    different key prefixes (``s2_``, ``t2_``) and merge side by side; parts of one setting are
    groups of seeds (``--seed`` 0, 1, ...: independent draws of data, noise and init, each
    paired within itself), whose per-seed lists (``*_seeds``) are joined, so a rule reads every
    seed of every part. Other keys of such parts are the last part's."""
    out = dict(merged)
    for k, v in part.items():
        if k.endswith("_seeds") and isinstance(v, list) and isinstance(out.get(k), list):
            out[k] = [*out[k], *v]
        else:
            out[k] = v
    return out


def _citations(paper: Paper) -> str:
    """The line citing the paper and its prior work (sphinxcontrib-bibtex roles)."""
    parts = [f"Paper: {{cite:t}}`{paper.cite}`." if paper.cite else ""]
    parts.append(f"Prior work: {{cite:t}}`{','.join(paper.prior)}`." if paper.prior else "")
    return " ".join(p for p in parts if p)


def render(paper: Paper) -> str:
    lines = [f"# {paper.title}", "", f"Source of the claims: {paper.source}."]
    lines += ["", cited, ""] if (cited := _citations(paper)) else [""]
    summaries: dict[str, dict] = {}
    runs: dict[str, list[Run]] = {}
    provs: dict[str, Provenance] = {}
    study_lines: list[str] = []
    for study in paper.studies:
        study_lines += [f"## `{study}`", ""]
        runs[study] = _runs(study)
        if not runs[study]:
            study_lines += [
                f"No full run of this study is committed under `results/{study}/` yet. "
                f"It is measured by `python -m experiments.{study} --out results/{study}`.",
                "",
            ]
            continue
        summaries[study] = {}
        for run in runs[study]:
            if group := _control(run):  # a control's parts merge apart (CONTROL_FIELDS)
                key = f"{study}/{group}"
                summaries[key] = merge_parts(summaries.get(key, {}), run.summary)
            else:
                summaries[study] = merge_parts(summaries[study], run.summary)
            if run.part:  # each part's own summary too, for rules that join parts themselves
                summaries[run.name] = dict(run.summary)
            provs[run.name] = _provenance(run, paper.code)
        if len(runs[study]) > 1 or runs[study][0].part:
            pairs = [(r, provs[r.name]) for r in runs[study]]
            if len({p.commit for _, p in pairs}) < 2:
                same = "."
            elif _same_code(pairs, paper.code):
                same = ": different commits, the same code (no code change between them)."
            else:
                same = ": parts from commits whose code differs."
            study_lines += [
                f"Run in parts, one folder each under `results/{study}/`: "
                + ", ".join(f"`{r.part}` (commit `{p.commit[:7]}`)" for r, p in pairs)
                + same,
                "",
            ]
        for run in runs[study]:
            study_lines += _run_lines(paper, run, provs[run.name])
    rules = list(dict.fromkeys(c.rule for c in paper.claims))
    # one rule for every claim is named once under the table, not in a column of its own
    head = ["claim", "verdict", *(["rule"] if len(rules) > 1 else []), "measured"]
    lines += ["## Verdicts", "", "| " + " | ".join(head) + " |", "| --- " * len(head) + "|"]
    for claim in paper.claims:
        read = _claim_runs(claim, runs)
        verdict, reason = decide(claim, summaries, read)
        note = _stale_note([(r, provs[r.name]) for r in read], paper.code)
        rule = [f"R{rules.index(claim.rule) + 1}"] if len(rules) > 1 else []
        cells = [claim.text, f"**{verdict}**{note}", *rule, reason]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if len(rules) == 1:
        lines += ["", f"{'Each claim is' if len(paper.claims) > 1 else 'The claim is'} decided "
                  "by rule **R1** below."]  # fmt: skip
    lines += ["", "## Rules", ""]
    for i, rule in enumerate(rules, 1):
        margin = f" Equivalence margin, stated in advance: {rule.margin}." if rule.margin else ""
        lines.append(f"- **R{i}**: {rule.text}.{margin}")
    groups: dict[str, list[str]] = {}
    for study in paper.studies:
        if study in CHECKS:
            text = "; ".join(g.text for g in CHECKS[study])
            groups.setdefault(text, []).append(f"`{study}`")
    lines += [
        "",
        "Intervals and tests: `experiments/_verdicts.py` (paired t intervals on the standard "
        f"error at {1 - ALPHA:.0%}, TOST at {1 - 2 * ALPHA:.0%}, noncentral-t power for the "
        "seeds an undecided claim needs). "
        + (
            'A claim is "not tested" when a run it reads fails one of its study\'s validity checks:'
            if groups
            else "These studies' summaries carry no validity check of their own."
        ),
        "",
    ]
    lines += [f"- {', '.join(studies)}: {text}" for text, studies in groups.items()]
    if groups:
        lines.append("")
    lines += ["## Runs", ""]
    lines += _runs_table(paper, runs, provs)
    return "\n".join(lines + [""] + study_lines)


def _runs_table(
    paper: Paper, runs: Mapping[str, list[Run]], provs: Mapping[str, Provenance]
) -> list[str]:
    listed = [r for study in paper.studies for r in runs.get(study, [])]
    if not listed:
        return ["No run is committed yet.", ""]
    dated = sorted(listed, key=lambda r: provs[r.name].date)
    first, last = provs[dated[0].name], provs[dated[-1].name]
    code = ", ".join(f"`{c}`" for c in paper.code)
    dates = first.date if first.date == last.date else f"{first.date} to {last.date}"
    span = (
        f"All runs are from commit `{first.commit[:7]}` ({dates})"
        if len({provs[r.name].commit for r in listed}) == 1
        else f"The runs span commits `{first.commit[:7]}` ({first.date}) to "
        f"`{last.commit[:7]}` ({last.date})"
    )
    lines = [
        f"{span}. A run is stale when a later commit changed its method's code ({code}) or its "
        "study module (`experiments/<study>.py`); docstrings and comments do not count.",
        "",
        "| run | commit | date | code since the run |",
        "| --- | --- | --- | --- |",
    ]
    for r in listed:
        p = provs[r.name]
        lines.append(f"| `{r.name}` | `{p.commit[:7]}` | {p.date} | {p.text} |")
    return lines + [""]


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for paper in PAPERS:
        (OUT / f"{paper.slug}.md").write_text(render(paper), encoding="utf-8")
    print(f"rendered {len(PAPERS)} reproduction pages into {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
