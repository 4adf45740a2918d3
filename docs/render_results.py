"""Renders the reproduction report, one page per paper, from the committed full runs.

Reads ``results/<study>/config.json`` (the config and its provenance: commit, date, command,
machine) and ``results/<study>/summary.json`` for every study of a paper, copies the study's
PNG plots next to the page, and writes ``docs/reproduction/papers/<paper>.md``: the paper's
claims, each study's figures and provenance, and a verdict per claim decided by a rule stated on
the page. A claim whose figures are not in ``results/`` yet is reported as not measured, with the
command that measures it. Nothing on the pages is typed by hand.

Run: ``python docs/render_results.py`` (``make docs`` runs it first).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
OUT = Path(__file__).resolve().parent / "reproduction" / "papers"

Summaries = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Claim:
    """One claim of a paper and the rule that decides it from the studies' summaries.

    ``rule(summaries) -> (verdict, reason)`` with verdict one of "reproduced", "partly",
    "not reproduced", "undecided" (measured, but the measured difference is within its
    spread) or "not measured"; it may raise ``KeyError`` for a missing figure.
    """

    text: str
    rule_text: str
    rule: Callable[[Summaries], tuple[str, str]]


@dataclass(frozen=True)
class Paper:
    slug: str
    title: str
    source: str
    studies: tuple[str, ...]
    claims: tuple[Claim, ...] = field(default=())
    # a study's own tables (markdown lines), placed after its key/value table
    tables: Mapping[str, Callable[[Mapping[str, Any]], list[str]]] = field(default_factory=dict)


#: The RWEFM settings: (study, key prefix of that setting in its summary, label).
RWEFM_SETTINGS = (
    ("rwefm_synthetic", "s2_", "S^2 (vMF mixtures)"),
    ("rwefm_synthetic", "t2_", "T^2 (mixtures straddling the seam)"),
    ("rwefm_protein", "", "T^2 (alanine dipeptide torsions)"),
    ("rwefm_singlecell", "", "S^7 (PBMC cells)"),
)


def _rwefm_setting(summaries: Summaries, study: str, prefix: str) -> tuple[str, str]:
    # The headline metric is the EMD 1-NN two-sample accuracy (0.5 ideal); each seed scores
    # the distance of its 1-NNA from 0.5, paired over seeds, so that a model which memorises
    # (below 0.5) is not rewarded.
    s = summaries[study]
    conv = float(s[f"{prefix}eval_converged_frac"])
    r = [abs(float(v) - 0.5) for v in s[f"{prefix}rwefm_emd_1nna_seeds"]]
    e = [abs(float(v) - 0.5) for v in s[f"{prefix}euclid_emd_1nna_seeds"]]
    d = [a - b for a, b in zip(r, e, strict=True)]
    mean, sd = statistics.mean(d), statistics.stdev(d) if len(d) > 1 else 0.0
    where = f"{study} {prefix.rstrip('_')}".strip()
    floor = float(s[f"{prefix}floor_emd_1nna_mean"])
    reason = (
        f"{where}: distance of the EMD 1-NNA from 0.5, RWEFM - baseline = {mean:+.4f} "
        f"(sd {sd:.4f}, {len(d)} seeds; data floor 1-NNA {floor:.3f})"
    )
    if conv < 0.99:
        return "not measured", reason + f"; evaluation Sinkhorn converged in {conv:.3f} < 0.99"
    if len(d) < 2:
        return "not measured", reason + ": fewer than two seeds"
    if mean + 2 * sd < 0:
        return "reproduced", reason
    if mean - 2 * sd > 0:
        return "not reproduced", reason
    return "undecided", reason + ": within two sd of zero"


def _rwefm_claim(study: str, prefix: str) -> Callable[[Summaries], tuple[str, str]]:
    return lambda summaries: _rwefm_setting(summaries, study, prefix)


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
    per = s.get("uncertified_by_program")  # absent: only the first 20 are listed
    listed = {p for p, c in per.items() if c} if per else {str(e[0]) for e in s["uncertified_list"]}
    which = f" ({', '.join(sorted(listed))})" if listed else ""
    reason = (
        f"cvxclust_phase: {tuned} synergy cell(s) with every program tuned on the same grid, "
        f"{fixed} with the weights fixed in advance ({int(s['trials'])} trials per cell; "
        f"{bad} uncertified solve(s){which}, most negative eigenvalue of a PSD-hard solve "
        f"{eig:.2g}); by the same rule the linear-reward surrogate in place of the joint "
        f"program has {surrogate['tuned']} tuned and {surrogate['fixed']} fixed"
    )
    if (not per and bad > len(s["uncertified_list"])) or listed & set(CVXCLUST_COMPARED):
        return "not measured", reason + ": a solve of a compared program is not certified"
    return ("reproduced" if tuned > 0 else "not reproduced"), reason


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
        return "not measured", reason
    if len(held) == len(tested):
        return "reproduced", reason
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
        return "not measured", reason + " (excluded: the actor does not beat the zero action)"
    capped = "help" not in tested["medium_expert_"]
    responsive = "help" in tested["medium_replay_"]
    if capped and responsive:
        return "reproduced", reason
    return ("partly" if capped or responsive else "not reproduced"), reason


def _dtb(summaries: Summaries) -> tuple[str, str]:
    s = summaries["backdoor_dtb"]
    ours = float(s["hidden_asr_after_suppressed_mean"])
    naive = float(s["naive_hidden_asr_after_suppressed_mean"])
    sd = float(s.get("hidden_asr_after_suppressed_mean_sd", 0.0))
    n = float(s["n_defenses_suppressed"])  # a mean over seeds
    ok = float(s.get("implant_ok", 1.0))  # the fraction of seeds whose DTB implant held
    reason = (
        f"backdoor_dtb: hidden ASR after the defenses that suppressed the decoy and kept the "
        f"clean accuracy ({n:.2g} a seed on average) {ours:.3f} (sd {sd:.3f}) vs the naive "
        f"model's {naive:.3f}; DTB implant usable in {ok:.0%} of seeds"
    )
    if n == 0:
        return "not measured", reason + ": no defense suppressed the decoy"
    above = ours - 2 * sd > naive
    if ours >= 0.5 and above:
        return "reproduced", reason
    return ("partly" if ours >= 0.1 and above else "not reproduced"), reason


def _cachex(summaries: Summaries) -> tuple[str, str]:
    s = summaries["cachex_bench"]
    ratio = float(s["stall_ratio_vs_orbax"])
    reason = f"cachex_bench: training stall {ratio:.3f}x orbax's async save (blocked time)"
    if ratio <= 0.2:
        return "reproduced", reason
    return ("partly" if ratio < 1.0 else "not reproduced"), reason


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
                "the EMD 1-NNA's distance from 0.5, RWEFM - baseline paired over seeds: "
                "reproduced if below 0 by more than 2 sd, not reproduced if above by more, else "
                "undecided; not measured below 99% converged evaluation solves",
                _rwefm_claim(study, prefix),
            )
            for study, prefix, label in RWEFM_SETTINGS
        ),
        {st: _rwefm_tables(st) for st in ("rwefm_synthetic", "rwefm_protein", "rwefm_singlecell")},
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
                "reproduced if every K-budget chain's grid TV is within 1.5x the exact MH "
                "chain's (same chains and steps) and majority vote's is above 3x it",
                _prefmh,
            ),
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
                "reproduced if the phase study finds at least one synergy cell with every "
                "program tuned on the same grid (joint rate >= 0.5, both single sources <= 0.3, "
                "Wilson intervals apart); not measured unless every solve of those three "
                "programs is certified",
                _cvxclust,
            ),
        ),
        {"cvxclust_phase": _cvxclust_table, "cvxclust_planetoid": _planetoid_table},
    ),
    Paper(
        "policy",
        "When policies cannot be retrained: PoE / KL post-training steering",
        "arXiv 2604.22873 (abstract)",
        ("policy_pointmaze", "policy_antmaze", "policy_locomotion"),
        (
            Claim(
                "Composition degrades gracefully under a bad prior.",
                "reproduced if the pre-stated graceful-degradation rule holds for every prior "
                "that is decidedly worse than the actor alone (the others are not tested)",
                lambda s: _verdict_keys(s, "policy_pointmaze", "verdict_graceful_"),
            ),
            Claim(
                "Under a bad prior, precision-blind additive blending does worse than PoE at "
                "the same weight.",
                "reproduced if the pre-stated contrast holds for every prior that is decidedly "
                "worse than the actor alone",
                lambda s: _verdict_keys(s, "policy_pointmaze", "verdict_additive_below_poe_"),
            ),
            Claim(
                "The KL-budget selector picks a near-oracle weight without test-time search.",
                "reproduced if every prior's pre-stated selector rule holds",
                lambda s: _verdict_keys(s, "policy_pointmaze", "verdict_selector_"),
            ),
            Claim(
                "A competent (medium-expert) actor can only be hurt by composition; a weaker "
                "(medium-replay) one responds to it.",
                "reproduced if on HalfCheetah no medium-expert cell is Help with PoE at the "
                "selection-chosen alpha and some medium-replay cell is; partly if one of the two",
                _ceiling,
            ),
        ),
    ),
    Paper(
        "dtb",
        "DTB: defense-triggered backdoors by bi-level optimisation",
        "the paper's abstract",
        ("backdoor_dtb",),
        (
            Claim(
                "A hidden backdoor stays dormant until a defense removes the decoy, then wakes.",
                "reproduced if the hidden ASR after the defenses that suppressed the decoy "
                "(keeping the clean accuracy) is >= 0.5 and above the naive two-backdoor "
                "model's by more than two sd; partly if >= 0.1 and above it by two sd",
                _dtb,
            ),
        ),
        {"backdoor_dtb": _dtb_table},
    ),
    Paper(
        "cachex",
        "CacheX: checkpoint staging through host memory, a neighbour and a PFS drain",
        "the paper's abstract",
        ("cachex_durability", "cachex_bench"),
        (
            Claim(
                "Training stalls only for the copy into host memory.",
                "reproduced if the measured blocked time is at most 0.2x orbax's own async "
                "save; partly if below 1x",
                _cachex,
            ),
            Claim(
                "After a crash, a lost node, a dead neighbour, a full disk, a corrupt file or "
                "a PFS outage, a restore returns the newest complete step, never corrupt bytes.",
                "reproduced if every fault run restores the newest complete step bit-exact and "
                "none returns corrupt bytes; partly if none is corrupt",
                _cachex_faults,
            ),
        ),
    ),
)
PAPERS_BY_SLUG = {p.slug: p for p in PAPERS}


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4g}"
    if isinstance(v, list):
        s = json.dumps(v)
        return s if len(s) <= 80 else s[:77] + "..."
    return str(v).replace("|", "\\|")


def _runs(study: str) -> list[tuple[str, dict, dict]]:
    """The committed runs of ``study``: ``[("", config, summary)]`` for a whole-study folder, or
    one ``(part, config, summary)`` per subfolder when the study was run in parts (e.g.
    ``rwefm_synthetic``, one ``--set manifolds=...`` run per manifold in ``s2/`` and ``t2/``;
    their summary keys carry the part's prefix, so the claims read them merged)."""
    root = RESULTS / study
    whole = (root / "summary.json").is_file()
    dirs = [("", root)] if whole else [(d.name, d) for d in sorted(root.glob("*/"))]
    files = ("config.json", "summary.json")
    return [
        (part, *(json.loads((d / f).read_text(encoding="utf-8")) for f in files))
        for part, d in dirs
        if all((d / f).is_file() for f in files)
    ]


def _run_lines(paper: Paper, study: str, part: str, config: dict, summary: dict) -> list[str]:
    prov = config.get("provenance", {})
    machine = prov.get("machine", {})
    lines = [f"### run `{part}`", ""] if part else []
    if config.get("quick"):
        lines += ["**A `--quick` run, not the full study.**", ""]
    lines += [
        f"- command: `{prov.get('command', '?')}`",
        f"- commit: `{prov.get('commit', '?')}`"
        + (" (with local changes)" if prov.get("dirty") else ""),
        f"- date: {prov.get('date', '?')}; seed {config.get('seed')}; "
        f"runtime {_fmt(summary.get('runtime_s'))} s",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
        f"{machine.get('backend', '?')}, jax {machine.get('jax', '?')}",
        "",
        "| key | value |",
        "| --- | --- |",
    ]
    lines += [f"| `{k}` | {_fmt(v)} |" for k, v in sorted(summary.items())]
    lines.append("")
    if study in paper.tables:
        lines += paper.tables[study](summary)
    src = RESULTS / study / part
    name = f"{study}/{part}".rstrip("/")
    img_dir = OUT / "_img" / name
    for png in sorted(src.glob("*.png")):
        img_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(png, img_dir / png.name)
        lines += [f"![{png.stem}](_img/{name}/{png.name})", ""]
    return lines


def render(paper: Paper) -> str:
    lines = [f"# {paper.title}", "", f"Source of the claims: {paper.source}.", ""]
    summaries: dict[str, dict] = {}
    study_lines: list[str] = []
    for study in paper.studies:
        study_lines += [f"## `{study}`", ""]
        runs = _runs(study)
        if not runs:
            study_lines += [
                f"No full run of this study is committed under `results/{study}/` yet. "
                f"It is measured by `python -m experiments.{study} --out results/{study}`.",
                "",
            ]
            continue
        if len(runs) > 1 or runs[0][0]:
            study_lines += [
                f"Run in parts, one folder each under `results/{study}/`: "
                + ", ".join(f"`{part}`" for part, _, _ in runs)
                + ".",
                "",
            ]
        summaries[study] = {}
        for part, config, summary in runs:
            summaries[study] |= summary
            study_lines += _run_lines(paper, study, part, config, summary)
    lines += [
        "## Verdicts",
        "",
        "| claim | verdict | rule | measured |",
        "| --- | --- | --- | --- |",
    ]
    for claim in paper.claims:
        try:
            verdict, reason = claim.rule(summaries)
        except KeyError as e:
            verdict, reason = "not measured", f"no committed figure `{e.args[0]}` yet"
        lines.append(f"| {claim.text} | **{verdict}** | {claim.rule_text} | {reason} |")
    lines.append("")
    return "\n".join(lines + study_lines)


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for paper in PAPERS:
        (OUT / f"{paper.slug}.md").write_text(render(paper), encoding="utf-8")
    print(f"rendered {len(PAPERS)} reproduction pages into {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
