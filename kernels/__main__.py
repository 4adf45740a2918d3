"""``python -m kernels [name ...] [--quick] [--json FILE] [--list]``.

Runs the benchmark cases of every kernel module (or of the named ones: a name selects a module,
``rwefm``, or the cases whose name starts with it, ``rwefm/map s2``), after measuring this
machine's roofline. Prints one row per case: shapes and dtype, compile seconds, steady-state
median (>= 5 runs after warm-up), throughput, fraction of the roofline, the named peer's median
measured in the same run, and the ratio ours / peer (below 1 is faster). ``--json FILE`` appends
the rows as JSON lines. No row is a pass/fail test; the ``goal`` column states each kernel's target.
A name that is both a module and a prefix of its cases selects the whole module; a prefix
that matches no case is a usage error (exit 2). A module that cannot be imported or give its
cases, or a case that raises, is reported on stderr and the run goes on; the exit code is then 1.
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
    # module -> the case-name prefixes that select its cases; None selects the whole module
    selected: dict[str, list[str] | None] = {}
    for name in args.names:
        module = name.split("/", 1)[0]
        if module not in modules:
            parser.error(f"unknown kernel {name!r}; known modules: {', '.join(modules)}")
        if name == module or selected.get(module, []) is None:
            selected[module] = None
        else:
            selected.setdefault(module, []).append(name)
    wanted = sorted(selected) if selected else modules

    failed = []
    cases: dict[str, list[_harness.Case]] = {}

    def load(module: str) -> list[_harness.Case] | None:
        """The cases of ``kernels.<module>``; None, recorded as failed, if it cannot give them."""
        try:
            return importlib.import_module(f"kernels.{module}").cases(args.quick)
        except Exception:  # a broken module must not hide the other modules' rows either
            failed.append(f"{module} (module)")
            traceback.print_exc()
            return None

    # Check the case-name prefixes before anything is timed; only the modules named with a
    # prefix have their cases built here (the others are built one at a time, when timed).
    for module, prefixes in selected.items():
        if prefixes is None or (built := load(module)) is None:
            continue
        names = [case.name for case in built]
        for prefix in prefixes:
            if not any(n.startswith(prefix) for n in names):
                parser.error(
                    f"argument names: case prefix {prefix!r} matches no case of {module!r}; "
                    f"its cases: {', '.join(names) or '(none)'}"
                )
        cases[module] = [c for c in built if any(c.name.startswith(p) for p in prefixes)]

    t0 = time.perf_counter()
    roofline = _harness.measure_roofline(quick=args.quick)
    print(
        f"# roofline ({roofline.backend}): {roofline.peak_flops / 1e9:.1f} GFLOP/s float32 "
        f"matmul, {roofline.bandwidth / 1e9:.1f} GB/s stream  [{time.perf_counter() - t0:.1f}s]",
        flush=True,
    )
    rows: list[_harness.Row] = []
    for module in wanted:
        if selected.get(module) is not None:
            module_cases = cases.pop(module, None)  # None: it failed to load above
        else:
            module_cases = load(module)
        for case in module_cases or []:
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
        print(f"# failed cases or modules: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
