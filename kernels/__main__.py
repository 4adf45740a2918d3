"""``python -m kernels [name ...] [--quick] [--json FILE] [--list]``.

Runs the benchmark cases of every kernel module (or of the named ones: a name selects a module,
``rwefm``, or the cases whose name starts with it, ``rwefm/map s2``), after measuring this
machine's roofline. Prints one row per case: shapes and dtype, compile seconds, steady-state
median (>= 5 runs after warm-up), throughput, fraction of the roofline, the named peer's median
measured in the same run, and the ratio ours / peer (below 1 is faster). ``--json FILE`` appends
the rows as JSON lines. No row is a pass/fail test; the ``goal`` column states each kernel's target.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time
import traceback
from pathlib import Path

import kernels
from kernels import _harness


def kernel_modules() -> list[str]:
    """Names of the modules in ``kernels/`` that define ``cases``."""
    return sorted(
        info.name
        for info in pkgutil.iter_modules(kernels.__path__)
        if not info.name.startswith("_")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", help="modules or case-name prefixes (default: all)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--json", type=Path, default=None, help="append rows as JSON lines")
    parser.add_argument("--list", action="store_true", help="list the kernel modules and exit")
    args = parser.parse_args(argv)

    modules = kernel_modules()
    if args.list:
        print("\n".join(modules))
        return 0
    selected = []
    for name in args.names:
        module = name.split("/", 1)[0]
        if module not in modules:
            parser.error(f"unknown kernel {name!r}; known modules: {', '.join(modules)}")
        selected.append((module, name))
    wanted = {m for m, _ in selected} if selected else set(modules)

    t0 = time.perf_counter()
    roofline = _harness.measure_roofline(quick=args.quick)
    print(
        f"# roofline ({roofline.backend}): {roofline.peak_flops / 1e9:.1f} GFLOP/s float32 "
        f"matmul, {roofline.bandwidth / 1e9:.1f} GB/s stream  [{time.perf_counter() - t0:.1f}s]",
        flush=True,
    )
    rows: list[_harness.Row] = []
    failed = []
    for module in sorted(wanted):
        mod = importlib.import_module(f"kernels.{module}")
        prefixes = [n for m, n in selected if m == module and n != module]
        for case in mod.cases(args.quick):
            if prefixes and not any(case.name.startswith(p) for p in prefixes):
                continue
            try:
                row = _harness.time_case(case, roofline)
            except Exception:  # a broken case must not hide the others' rows
                failed.append(case.name)
                traceback.print_exc()
                continue
            rows.append(row)
            print(_harness.format_table([row]).splitlines()[-1], flush=True)
    print()
    print(_harness.format_table(rows))
    if args.json is not None:
        meta = _harness.run_meta()
        meta["roofline_gflops"] = roofline.peak_flops / 1e9
        meta["roofline_gbs"] = roofline.bandwidth / 1e9
        _harness.write_jsonl(rows, args.json, meta)
    unbounded = [r.name for r in rows if r.bound_s is None]
    if unbounded:
        print(f"# rows without a lower bound: {', '.join(unbounded)}", file=sys.stderr)
    if failed:
        print(f"# failed cases: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
