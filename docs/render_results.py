"""Renders the reproduction report, one page per paper, from the committed full runs.

Reads ``results/<study>/config.json`` (the config and its provenance: commit, date, command,
machine) and ``results/<study>/summary.json`` for every study of a paper (or of each part, one
subfolder per part, when a study was run in parts), copies the study's PNG plots next to the
page, and writes ``docs/reproduction/papers/<paper>.md``: the verdict per claim first, then each
rule once with its pre-stated margin, the runs with their commits, and each study's figures.
Nothing on the pages is typed by hand.

- Every interval and test comes from ``experiments/_verdicts.py`` (paired t intervals, TOST
  against a margin stated in advance, the seeds an undecided claim would need); no rule here
  computes a spread of its own.
- A claim reads its runs' own validity checks (``CHECKS``: converged solves, exactness
  counters, positive controls): a failed one makes it "not tested", with the reason.
- A run is "stale" when a commit after the run's provenance commit touched its method's code
  (``Paper.code``) or its study module (``experiments/<study>.py``); "provenance unknown" when
  the commit is missing, unknown to git, or git is unavailable.

Run: ``python docs/render_results.py`` (``make docs`` runs it first).
"""

from __future__ import annotations

import functools
import json
import math
import re
import shutil
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
    ``reads`` names the runs (``"study"`` or ``"study/part"``) whose validity checks and
    provenance the verdict carries.
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
    # a study's own tables (markdown lines), placed after its key/value table
    tables: Mapping[str, Callable[[Mapping[str, Any]], list[str]]] = field(default_factory=dict)
    # the method's code (library and shared study helpers); with experiments/<study>.py it is
    # what a run is stale against
    code: tuple[str, ...] = ()


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
    ("rwefm_singlecell", "", "S^7 (PBMC cells)"),
)

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
    "the features'; the raw-angle baseline is reported beside",
    f"±{RWEFM_MARGIN} in 1-NNA distance",
)


def _rwefm_setting(summaries: Summaries, study: str, prefix: str) -> tuple[str, str]:
    s = summaries[study]

    def dist(arm):
        return [abs(float(v) - 0.5) for v in s[f"{prefix}{arm}_emd_1nna_seeds"]]

    where = f"{study} {prefix.rstrip('_')}".strip()
    floor = float(s[f"{prefix}floor_emd_1nna_mean"])
    v = _verdicts.paired(dist("rwefm"), dist("euclid"), margin=RWEFM_MARGIN, direction="less",
                         alpha=ALPHA)  # fmt: skip
    if f"{prefix}euclid_periodic_emd_1nna_seeds" not in s:
        return v.outcome, f"{where}: {v.figures()}; data floor 1-NNA {floor:.3f}"
    # On a torus the run also has the chart flow fed the torus's (cos, sin) features: the
    # claim (transport on M) is decided against it; the raw-angle baseline is reported beside.
    vp = _verdicts.paired(dist("rwefm"), dist("euclid_periodic"), margin=RWEFM_MARGIN,
                          direction="less", alpha=ALPHA)  # fmt: skip
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
    tuned, fixed = int(s["synergy_cells_tuned"]), int(s["synergy_cells_fixed"])
    bad, eig = int(s["uncertified_solves"]), float(s["max_min_eig_violation"])
    surrogate = {r: _cvxclust_synergy(s, r, "linear") for r in ("fixed", "tuned")}
    listed = _cvxclust_uncertified(s)
    which = f" ({', '.join(sorted(listed))})" if listed else ""
    reason = (
        f"cvxclust_phase: {tuned} synergy cell(s) with every program tuned on the same grid, "
        f"{fixed} with the weights fixed in advance ({int(s['trials'])} trials per cell; "
        f"{bad} uncertified solve(s){which}, most negative eigenvalue of a PSD-hard solve "
        f"{eig:.2g}); by the same rule the linear-reward surrogate in place of the joint "
        f"program has {surrogate['tuned']} tuned and {surrogate['fixed']} fixed"
    )
    return ("reproduced" if tuned > 0 else "not reproduced"), reason


def _cvxclust_uncertified(s: Mapping[str, Any]) -> set[str]:
    """The programs with an uncertified solve (from the first 20 listed when the study did not
    count them per program)."""
    per = s.get("uncertified_by_program")
    return {p for p, c in per.items() if c} if per else {str(e[0]) for e in s["uncertified_list"]}


def _cvxclust_certified(s: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    if "uncertified_solves" not in s:
        return []
    listed = _cvxclust_uncertified(s)
    if not s.get("uncertified_by_program") and int(s["uncertified_solves"]) > len(
        s["uncertified_list"]
    ):
        return [
            "`uncertified_solves` counts more solves than it lists: which programs they "
            "belong to is unknown"
        ]
    if bad := sorted(listed & set(CVXCLUST_COMPARED)):
        return [f"a solve of a compared program ({', '.join(bad)}) is not certified"]
    return []


def _cvxclust_synergy(s: Mapping[str, Any], regime: str, joint: str) -> int:
    """The phase study's synergy cells with program ``joint`` as the joint one: its rate
    >= 0.5, graph and node <= 0.3, its Wilson lower bound above both of their upper bounds."""
    g = {p: s[f"{regime}_{p}_recovery"] for p in ("graph", "node", joint)}
    lo, hi = s[f"{regime}_{joint}_lo"], {p: s[f"{regime}_{p}_hi"] for p in ("graph", "node")}
    return sum(
        g[joint][a][i][j] >= 0.5
        and max(g["graph"][a][i][j], g["node"][a][i][j]) <= 0.3
        and lo[a][i][j] > max(hi["graph"][a][i][j], hi["node"][a][i][j])
        for a in range(len(g[joint]))
        for i in range(len(g[joint][a]))
        for j in range(len(g[joint][a][i]))
    )


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


#: The phase study's programs, in the order of its tables, and those its synergy rule compares.
CVXCLUST_PROGRAMS = ("joint", "graph", "node", "linear")
CVXCLUST_COMPARED = ("joint", "graph", "node")


def _cvxclust_table(s: Mapping[str, Any]) -> list[str]:
    """Per regime and panel, the recovery rates on the ``dpq`` x ``sep`` grid."""
    dpq, sep = s["dpq_grid"], s["sep_grid"]
    names = " / ".join(CVXCLUST_PROGRAMS)
    lines = []
    for regime in ("fixed", "tuned"):
        syn = {tuple(c) for c in s[f"synergy_cell_list_{regime}"]}
        rates = [s[f"{regime}_{p}_recovery"] for p in CVXCLUST_PROGRAMS]
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


def _verdict_keys(summaries: Summaries, study: str, prefix: str) -> tuple[str, str]:
    s = summaries[study]
    keys = sorted(k for k in s if k.startswith(prefix))
    if not keys:
        raise KeyError(prefix)
    vals = {k[len(prefix) :]: str(s[k]) for k in keys}
    # "not tested: ..." / "excluded: ...": the rule's precondition did not hold for that row.
    reason = f"{study}: " + ", ".join(f"{k} {v.split(':')[0]}" for k, v in vals.items())
    tested = [v for v in vals.values() if v.split(":")[0] in ("holds", "fails", "undecided")]
    held = [v for v in tested if v == "holds"]
    if not tested:
        return "not tested", reason + " (no row met the rule's precondition)"
    if len(held) == len(tested):
        return "reproduced", reason
    if not held and "fails" not in tested:
        return "undecided", reason
    return ("partly" if held else "not reproduced"), reason


def _ceiling(summaries: Summaries) -> tuple[str, str]:
    s = summaries["policy_locomotion"]
    oracle = {  # level -> {prior: its oracle-alpha cell}
        lv: {q: str(s[f"{lv}cell_oracle_{q}"]) for q in s.get(f"{lv}cells", {})}
        for lv in ("medium_expert_", "medium_replay_")
    }
    reason = "policy_locomotion (oracle-alpha cells): " + "; ".join(
        f"{lv.rstrip('_')} " + ", ".join(f"{q} {c.split(':')[0]}" for q, c in cs.items())
        for lv, cs in oracle.items()
    )
    tested = {
        lv: [c for c in cs.values() if not c.startswith("excluded")] for lv, cs in oracle.items()
    }
    if not tested["medium_expert_"] or not tested["medium_replay_"]:
        return "not tested", reason + " (excluded: the actor does not beat the zero action)"
    capped = "help" not in tested["medium_expert_"]
    responsive = "help" in tested["medium_replay_"]
    if capped and responsive:
        return "reproduced", reason
    return ("partly" if capped or responsive else "not reproduced"), reason


DTB_MARGIN = _verdicts.MARGINS["dtb"]

DTB_RULE = Rule(
    "the hidden ASR after the defenses that suppressed the decoy (keeping the clean accuracy), "
    "DTB - the naive two-backdoor model, over seeds; the summary keeps each arm's mean and sd, "
    "not per-seed pairs, so the spread of the difference is bounded by the sum of the two sds "
    "(true for any correlation). Not reproduced if DTB's hidden ASR is < 0.1 (it does not "
    "wake); else no advantage if TOST puts the difference within the margin, reproduced if the "
    f"{1 - ALPHA:.0%} t interval lies above 0 and the ASR is >= 0.5 (partly if < 0.5), not "
    "reproduced if it lies below 0, undecided otherwise; not measured when no defense "
    "suppressed the decoy",
    f"±{DTB_MARGIN} in attack success rate",
)


def _dtb(summaries: Summaries) -> tuple[str, str]:
    s = summaries["backdoor_dtb"]
    key = "hidden_asr_after_suppressed_mean"
    ours, naive = float(s[key]), float(s[f"naive_{key}"])
    sd = float(s[f"{key}_sd"]) + float(s[f"naive_{key}_sd"])
    n_sup = float(s["n_defenses_suppressed"])  # a mean over seeds
    reason = (
        f"backdoor_dtb: hidden ASR after the defenses that suppressed the decoy and kept the "
        f"clean accuracy ({n_sup:.2g} a seed on average) {ours:.3f} vs the naive model's "
        f"{naive:.3f}"
    )
    if n_sup == 0 or math.isnan(ours):
        return "not measured", reason + ": no defense suppressed the decoy"
    n = int(s["n_seeds_run"])
    v = _verdicts.decide_stats(
        ours - naive, sd, n, margin=DTB_MARGIN, direction="greater", alpha=ALPHA
    )
    reason += f"; DTB - naive: {v.figures('ASR')}"
    if ours < 0.1:  # it does not wake, whatever the comparison says
        return "not reproduced", reason
    if v.outcome == "reproduced":
        return ("reproduced" if ours >= 0.5 else "partly"), reason
    return v.outcome, reason


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


def _rwefm_table(s: Mapping[str, Any], prefix: str, label: str) -> list[str]:
    """One RWEFM setting: each metric for both arms, their paired difference and the data
    floor (mean ± sd over seeds or floor draws), then the maps' convergence."""
    if f"{prefix}emd_1nna_diff_mean" not in s:
        return []

    def msd(key: str) -> str:
        return f"{float(s[f'{prefix}{key}_mean']):.4f} ± {float(s[f'{prefix}{key}_sd']):.4f}"

    lines = [f"{label}, mean ± sd over {s.get('n_seeds', '?')} seeds (lower is better; "
             "1-NNA: 0.5 is ideal):", "",
             "| metric | RWEFM | baseline | RWEFM - baseline (paired) | data floor |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for g in ("emd", "chamfer"):
        for m in ("1nna", "mm", "kmmd"):
            k = f"{prefix}{g}_{m}"
            diff = f"{float(s[f'{k}_diff_mean']):+.4f} ± {float(s[f'{k}_diff_sd']):.4f}"
            cells = [msd(f"rwefm_{g}_{m}"), msd(f"euclid_{g}_{m}"), diff, msd(f"floor_{g}_{m}")]
            lines.append(f"| {g} {m} | " + " | ".join(cells) + " |")
    conv = [f"{a}: {float(s[f'{prefix}map_converged_frac_{a}']):.3f} of the training maps "
            f"converged within {s[f'{prefix}map_iterations_{a}']} iterations"
            for a in ("rwefm", "euclid")]  # fmt: skip
    conv.append(f"evaluation solves converged: {float(s[f'{prefix}eval_converged_frac']):.3f}")
    head = f"Noise `{s[f'{prefix}noise']}`, pairing `{s[f'{prefix}pairing']}`; "
    return [*lines, "", head + "; ".join(conv) + ".", ""]


def _rwefm_tables(study: str) -> Callable[[Mapping[str, Any]], list[str]]:
    settings = [(p, lb) for st, p, lb in RWEFM_SETTINGS if st == study]
    return lambda s: [line for p, lb in settings for line in _rwefm_table(s, p, lb)]


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


def _rwefm_claim(study: str, prefix: str) -> Callable[[Summaries], tuple[str, str]]:
    return lambda summaries: _rwefm_setting(summaries, study, prefix)


def _rwefm_reads(study: str, prefix: str) -> tuple[str, ...]:
    # rwefm_synthetic runs one part per manifold, named by the setting's key prefix
    return (f"{study}/{prefix.rstrip('_')}",) if prefix else (study,)


_POLICY_RULE = (
    "reproduced if the study's pre-stated {what} holds for every prior that is decidedly worse "
    "than the actor alone (the others are not tested); undecided if none holds and none fails; "
    "partly if some hold. {cells}"
)
# the policy studies decide each cell themselves, with their own intervals and margins
_POLICY_CELLS = "Each cell's verdict, interval and margin are the study's (experiments/_policy.py)"

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
                    "reproduced if the phase study finds at least one synergy cell with every "
                    "program tuned on the same grid (joint rate >= 0.5, both single sources "
                    "<= 0.3, their Wilson intervals, computed by the study, apart)"
                ),
                _cvxclust,
                ("cvxclust_phase",),
            ),
        ),
        {"cvxclust_phase": _cvxclust_table, "cvxclust_planetoid": _planetoid_table},
        ("lib/hexad/cvxclust", "experiments/_cvxclust.py"),
    ),
    Paper(
        "policy",
        "When policies cannot be retrained: PoE / KL post-training steering",
        "arXiv 2604.22873 (abstract)",
        ("policy_pointmaze", "policy_antmaze", "policy_locomotion"),
        (
            Claim(
                "Composition degrades gracefully under a bad prior.",
                Rule(_POLICY_RULE.format(what="graceful-degradation rule", cells=_POLICY_CELLS)),
                lambda s: _verdict_keys(s, "policy_pointmaze", "verdict_graceful_"),
                ("policy_pointmaze",),
            ),
            Claim(
                "Under a bad prior, precision-blind additive blending does worse than PoE at "
                "the same weight.",
                Rule(_POLICY_RULE.format(what="additive-below-PoE contrast", cells=_POLICY_CELLS)),
                lambda s: _verdict_keys(s, "policy_pointmaze", "verdict_additive_below_poe_"),
                ("policy_pointmaze",),
            ),
            Claim(
                "The KL-budget selector picks a near-oracle weight without test-time search.",
                Rule(
                    "reproduced if every prior's pre-stated selector rule holds; undecided if "
                    f"none holds and none fails; partly if some hold. {_POLICY_CELLS}"
                ),
                lambda s: _verdict_keys(s, "policy_pointmaze", "verdict_selector_"),
                ("policy_pointmaze",),
            ),
            Claim(
                "A competent (medium-expert) actor can only be hurt by composition; a weaker "
                "(medium-replay) one responds to it.",
                Rule(
                    "reproduced if on HalfCheetah no medium-expert cell is Help with PoE at the "
                    "selection-chosen alpha and some medium-replay cell is; partly if one of "
                    "the two; not tested where the actor does not beat the zero action"
                ),
                _ceiling,
                ("policy_locomotion",),
            ),
        ),
        code=("lib/hexad/policy", "experiments/_policy.py"),
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
    "cvxclust_phase": (
        Gate("every solve of the compared programs (joint, graph, node) certified",
             _cvxclust_certified),
    ),
    "backdoor_dtb": (
        _key_gate(
            "implant_ok", lambda v: v == 1, "= 1",
            "every seed's implant kept its clean accuracy >= 0.5",
        ),
        _key_gate(
            "n_defenses_effective", lambda v: v > 0, "> 0",
            "the positive control: some defense removes BadNets",
        ),
        # experiments/backdoor_dtb.py names the oracle (DTB trained against fine-pruning's own
        # operator) "the control for whether this model can carry the effect at all": if even
        # it does not wake under fine-pruning (the rule's waking level, hidden ASR 0.1), the
        # study cannot show the claim either way.
        _key_gate(
            "oracle_hidden_asr_after_fp", lambda v: v >= 0.1, ">= 0.1",
            "the positive control: the oracle DTB's hidden backdoor wakes under fine-pruning",
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


def _provenance(run: Run, code: Sequence[str]) -> Provenance:
    prov = run.config.get("provenance", {})
    commit, date = str(prov.get("commit") or ""), str(prov.get("date", "?"))
    dirty = "; run with local changes" if prov.get("dirty") else ""
    paths = (*code, f"experiments/{run.study}.py")

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
    count = _git("rev-list", "--count", f"{full[1]}..{last[1]}", "--", *paths)
    n = f" ({count[1]} of them touch it)" if count and count[0] == 0 else ""
    span = f"{commit[:7]}..{last[1][:7]}"
    text = f"stale: code changed after the run, commits {span}{n}{dirty}"
    return Provenance(commit, date, "stale", text, span)


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


def _run_lines(paper: Paper, run: Run, prov: Provenance) -> list[str]:
    config, summary = run.config, run.summary
    meta = config.get("provenance", {})
    machine = meta.get("machine", {})
    lines = [f"### run `{run.part}`", ""] if run.part else []
    if config.get("quick"):
        lines += ["**A `--quick` run, not the full study.**", ""]
    failed = _failed_checks(run)
    lines += [
        f"- command: `{meta.get('command', '?')}`",
        f"- commit: `{meta.get('commit', '?')}`"
        + (" (with local changes)" if meta.get("dirty") else ""),
        f"- code since the run: {prov.text}",
        "- validity checks: " + ("; ".join(failed) if failed else "passed"),
        f"- date: {meta.get('date', '?')}; seed {config.get('seed')}; "
        f"runtime {_fmt(summary.get('runtime_s'))} s",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('backend', '?')}, jax {machine.get('jax', '?')}",
        "",
        "| key | value |",
        "| --- | --- |",
    ]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in sorted(summary.items())]
    lines.append("")
    if run.study in paper.tables:
        lines += paper.tables[run.study](summary)
    src = RESULTS / run.study / run.part
    img_dir = OUT / "_img" / run.name
    for png in sorted(src.glob("*.png")):
        img_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, img_dir / png.name)
        lines += [f"![{png.stem}](_img/{run.name}/{png.name})", ""]
    return lines


def _claim_runs(claim: Claim, runs: Mapping[str, list[Run]]) -> list[Run]:
    """The runs a claim reads: ``study/part`` picks that part and its seed groups
    (``part-seed<k>``), and a study run whole (no such part) or named without a part gives all
    of its runs."""
    out: list[Run] = []
    for name in claim.reads:
        study, _, part = name.partition("/")
        have = runs.get(study, [])
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


def _stale_note(provs: Sequence[tuple[Run, Provenance]]) -> str:
    notes = []
    for r, p in provs:
        where = f" (`{r.name}`)" if r.part else ""
        if p.state == "stale":
            notes.append(f"stale: code changed after the run, commits {p.range}{where}")
        elif p.state == "unknown":
            notes.append(f"provenance unknown{where}")
    if len({p.commit for _, p in provs}) > 1:
        notes.append(
            "parts from different commits: "
            + ", ".join(f"`{r.name}` `{p.commit[:7]}`" for r, p in provs)
        )
    return f" ({'; '.join(notes)})" if notes else ""


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


def render(paper: Paper) -> str:
    lines = [f"# {paper.title}", "", f"Source of the claims: {paper.source}.", ""]
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
            summaries[study] = merge_parts(summaries[study], run.summary)
            provs[run.name] = _provenance(run, paper.code)
        if len(runs[study]) > 1 or runs[study][0].part:
            commits = {provs[r.name].commit for r in runs[study]}
            study_lines += [
                f"Run in parts, one folder each under `results/{study}/`: "
                + ", ".join(
                    f"`{r.part}` (commit `{provs[r.name].commit[:7]}`)" for r in runs[study]
                )
                + (": parts from different commits." if len(commits) > 1 else "."),
                "",
            ]
        for run in runs[study]:
            study_lines += _run_lines(paper, run, provs[run.name])
    rules = list(dict.fromkeys(c.rule for c in paper.claims))
    lines += [
        "## Verdicts",
        "",
        "| claim | verdict | rule | measured |",
        "| --- | --- | --- | --- |",
    ]
    for claim in paper.claims:
        read = _claim_runs(claim, runs)
        verdict, reason = decide(claim, summaries, read)
        note = _stale_note([(r, provs[r.name]) for r in read])
        rule = f"R{rules.index(claim.rule) + 1}"
        cells = [claim.text, f"**{verdict}**{note}", rule, reason]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
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
        f"{span}. A run is stale when a later commit touched its method's code ({code}) or its "
        "study module (`experiments/<study>.py`).",
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
