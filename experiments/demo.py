"""Runs every registered study's ``--quick`` mode and collects a report.

Command:  python -m experiments.demo [--out DIR] [--only NAME ...] [--timeout S]

A study is registered by defining ``STUDY = _runner.Study(...)`` at the top level of a module
in ``experiments/``. Each study runs in its own process (so one failure does not stop the rest)
with ``--quick --out DIR/<study>``; the demo then writes ``DIR/report.md`` with one table of
every summary, links to each study's plots, and prints the table. Default ``DIR``:
``runs/demo``. Exit status 1 if any study failed, 0 otherwise (also when none is registered).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import time
from pathlib import Path

from experiments._runner import REPO_ROOT

EXPERIMENTS_DIR = Path(__file__).resolve().parent


def registered_studies(directory: Path = EXPERIMENTS_DIR) -> list[str]:
    """Returns the module names in ``directory`` that assign ``STUDY`` at top level.

    Found by parsing, not importing, so the demo stays cheap and a broken study cannot break
    the discovery of the others.
    """
    names = []
    for path in sorted(directory.glob("*.py")):
        if path.stem.startswith("_") or path.stem == "demo":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            if any(isinstance(t, ast.Name) and t.id == "STUDY" for t in targets):
                names.append(path.stem)
                break
    return names


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        text = "[" + ", ".join(_fmt(v) for v in value[:8]) + (", ..." if len(value) > 8 else "]")
        return text if len(value) <= 8 else text + "]"
    return str(value)


def render_report(results: dict[str, dict], out_dir: Path) -> str:
    """Returns the Markdown report for ``{study: {"status", "seconds", "summary", "plots"}}``."""
    lines = ["# hexad demo: every study's --quick mode", ""]
    if not results:
        lines.append("No study is registered yet (no module in experiments/ defines STUDY).")
        return "\n".join(lines) + "\n"
    lines += ["| study | status | seconds |", "| --- | --- | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['status']} | {r['seconds']:.1f} |")
    for name, r in results.items():
        lines += ["", f"## {name}", ""]
        summary = r.get("summary") or {}
        if summary:
            lines += ["| key | value |", "| --- | --- |"]
            lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items()]
        else:
            lines.append(f"No summary ({r['status']}).")
        for plot in r.get("plots", []):
            rel = Path(plot).relative_to(out_dir)
            lines += ["", f"![{rel.stem}]({rel.as_posix()})"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "runs" / "demo")
    parser.add_argument("--only", nargs="*", default=None, help="run only these studies")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per study")
    args = parser.parse_args(argv)

    studies = registered_studies()
    if args.only:
        unknown = sorted(set(args.only) - set(studies))
        if unknown:
            parser.error(f"--only: unknown studies {unknown}; registered: {studies}")
        studies = [s for s in studies if s in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    if not studies:
        print("No study is registered yet (no module in experiments/ defines STUDY).")
    for name in studies:
        study_out = args.out / name
        cmd = [sys.executable, "-m", f"experiments.{name}", "--quick", "--no-progress"]
        cmd += ["--out", str(study_out)]
        print(f"[demo] {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, timeout=args.timeout, check=False)
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {args.timeout:.0f} s"
        seconds = time.perf_counter() - t0
        summary_path = study_out / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        plots = sorted(str(p) for p in study_out.glob("*.png"))
        results[name] = {"status": status, "seconds": seconds, "summary": summary, "plots": plots}

    report = render_report(results, args.out)
    (args.out / "report.md").write_text(report)
    print(report)
    print(f"[demo] report: {args.out / 'report.md'}")
    return 0 if all(r["status"] == "ok" for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
