"""Runs every registered study's ``--quick`` mode and collects a report.

Command:  python -m experiments.demo [--out DIR] [--only NAME ...] [--timeout S]

A study is registered by defining ``STUDY = _runner.Study(...)`` at the top level of a module
in ``experiments/``. Each study runs in its own process (so one failure does not stop the rest)
with ``--quick --out DIR/<study>``; the demo then writes ``DIR/report.md`` with one table of
every summary, links to each study's plots, and prints the table. Default ``DIR``:
``runs/demo``. Exit status 1 if any study failed, 0 otherwise (also when none is registered).

After each study the demo prints its wall time and what it added to the data cache
(``$HEXAD_CACHE``, default ``~/.cache/hexad``; :func:`hexad.data.cache_dir`): the files under
the cache are listed before and after the study, so "generated N files" means the study made
its data (a first run), and "nothing generated" that it found its data cached or needs none.
A study that fails or times out has the last lines of its stderr printed, and the exact command
that reruns it alone. At the end the demo prints every study's wall time and the total.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from experiments._runner import REPO_ROOT

STDERR_TAIL_LINES = 25

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


def cache_root() -> Path:
    """The data cache the studies use: ``$HEXAD_CACHE``, default ``~/.cache/hexad``."""
    from hexad.data import cache_dir

    return cache_dir()


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """``{path relative to root: (size, mtime_ns)}`` of every file under ``root`` ({} if none)."""
    out: dict[str, tuple[int, int]] = {}
    if not root.is_dir():
        return out
    for dirpath, _, files in os.walk(root):
        for f in files:
            path = Path(dirpath) / f
            try:
                st = path.stat()
            except OSError:  # removed while we looked
                continue
            out[path.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def describe_cache(before: dict, after: dict) -> str:
    """One line on what a study added to the cache, from :func:`snapshot` before and after."""
    new = sorted(set(after) - set(before))
    rewritten = sum(1 for k in set(before) & set(after) if before[k] != after[k])
    if not new:
        text = "nothing generated (used cached data or needs none)"
        return text + (f"; rewrote {_files(rewritten)} already there" if rewritten else "")
    groups = collections.Counter("/".join(k.split("/")[:2]) for k in new)
    mib = sum(after[k][0] for k in new) / 2**20
    listed = ", ".join(f"{g} ({c} files)" if c > 1 else g for g, c in sorted(groups.items()))
    return f"generated {_files(len(new))}, {mib:.1f} MiB: {listed}"


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def render_report(results: dict[str, dict], out_dir: Path) -> str:
    """Returns the Markdown report for ``{study: {"status", "seconds", "summary", "plots"}}``
    (optional per study: ``"cache"``, a :func:`describe_cache` line; ``"stderr_tail"`` and
    ``"command"`` for a study that failed)."""
    lines = ["# hexad demo: every study's --quick mode", ""]
    if not results:
        lines.append("No study is registered yet (no module in experiments/ defines STUDY).")
        return "\n".join(lines) + "\n"
    lines += ["| study | status | seconds | data cache |", "| --- | --- | --- | --- |"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['status']} | {r['seconds']:.1f} | {r.get('cache', '')} |")
    total = sum(r["seconds"] for r in results.values())
    lines.append(f"| total | {sum(r['status'] == 'ok' for r in results.values())}/"
                 f"{len(results)} ok | {total:.1f} | |")  # fmt: skip
    for name, r in results.items():
        lines += ["", f"## {name}", ""]
        if r["status"] != "ok" and r.get("command"):
            lines += [f"Failed: {r['status']}. Rerun it alone with", "", "```",
                      r["command"], "```", ""]  # fmt: skip
            if r.get("stderr_tail"):
                lines += ["Last lines of its stderr:", "", "```", *r["stderr_tail"], "```", ""]
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


def run_study(cmd: list[str], timeout: float) -> tuple[str, list[str]]:
    """Runs ``cmd`` in its own process group, echoing its stderr; returns ``(status, the last
    lines of its stderr)``. On timeout the whole group (the study's helper processes too) is
    killed."""
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True, errors="replace",
        start_new_session=True,
    )  # fmt: skip

    def pump():
        for line in proc.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
        status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        status = f"timed out after {timeout:.0f} s"
    reader.join(timeout=5)
    return status, list(tail)


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
    cache = cache_root()
    print(f"[demo] data cache: {cache} (set HEXAD_CACHE to move it)", flush=True)
    t_all = time.perf_counter()
    for name in studies:
        study_out = args.out / name
        cmd = [sys.executable, "-m", f"experiments.{name}", "--quick", "--no-progress"]
        cmd += ["--out", str(study_out)]
        print(f"[demo] {name}: {' '.join(cmd[1:])}", flush=True)
        before = snapshot(cache)
        t0 = time.perf_counter()
        status, tail = run_study(cmd, args.timeout)
        seconds = time.perf_counter() - t0
        cache_line = describe_cache(before, snapshot(cache))
        summary_path = study_out / "summary.json"
        summary = {}
        if status == "ok" and summary_path.exists():
            summary = json.loads(summary_path.read_text())
        plots = sorted(str(p) for p in study_out.glob("*.png"))
        command = f"cd {shlex.quote(str(REPO_ROOT))} && {shlex.join(cmd)}"
        results[name] = {"status": status, "seconds": seconds, "summary": summary,
                         "plots": plots, "cache": cache_line}  # fmt: skip
        print(f"[demo] {name}: {status} in {seconds:.1f} s; cache: {cache_line}", flush=True)
        if status != "ok":
            results[name] |= {"stderr_tail": tail, "command": command}
            print(f"[demo] {name} {status}. The last lines of its stderr:", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)
            print(f"[demo] rerun it alone: {command}", file=sys.stderr, flush=True)

    report = render_report(results, args.out)
    (args.out / "report.md").write_text(report)
    print(report)
    print("[demo] wall time per study:")
    for name, r in results.items():
        print(f"[demo]   {name:<24} {r['seconds']:8.1f} s  {r['status']}")
    total = time.perf_counter() - t_all
    print(f"[demo]   {'total':<24} {total:8.1f} s  ({total / 60:.1f} min)")
    failed = [n for n, r in results.items() if r["status"] != "ok"]
    if failed:
        print(f"[demo] failed: {', '.join(failed)} (each one's rerun command is in the report)")
    print(f"[demo] report: {args.out / 'report.md'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
