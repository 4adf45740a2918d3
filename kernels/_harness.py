"""The kernel bench harness: compile time, steady-state medians, peer ratios, roofline.

A kernel module ``kernels/<name>.py`` defines ``cases(quick: bool) -> list[Case]``. Each
``Case`` names a function and its example arguments, and optionally a *peer*: the named
baseline (an ott-jax call, a BlackJAX kernel, a CVXPY solve, ...), timed in the same run on
the same problem. ``python -m kernels [name ...]`` discovers the modules, times every case and
prints one row per case; ``--json FILE`` appends the rows as JSON lines.

Timing protocol (docs/design.md): for a jitted case, compile seconds come from
``jax.jit(f).lower(*args).compile()``; then ``warmup`` calls, then at least ``repeats`` timed
calls, each ended with ``jax.block_until_ready``; the row reports the median. The peer gets the
same protocol, interleaved with ours: both are compiled and warmed up, then each timed call of
ours is followed by one of the peer's, so that a drift of the host (clock boost, another
process, the caches) falls on both sides alike rather than on whichever ran second (a case
whose two sides share state that a call leaves busy, e.g. a disk still committing, sets
``interleave=False`` and is timed one side after the other). ``ratio = median(ours) /
median(peer)``: below 1 means faster than the peer.

Lower bounds: every row states the kernel's own limit and the fraction of it reached
(``bound_s / median``, 1.0 = at the limit), beside the peer ratio; a peer can be slow too. A
case gives its bound in one of three ways, and ``bound_note`` says how it was computed:

- the roofline, from ``flops`` and ``bytes``: at start-up the harness measures this machine's
  peak float32 matmul FLOP/s and memory bandwidth with jnp kernels (:func:`measure_roofline`),
  and the bound is ``max(flops / peak, bytes / bandwidth)``;
- an *equivalent-work* bound: ``bound_work`` times the median of ``bound_fn(*bound_args)``,
  timed in the same run by the same protocol (e.g. DTB's outer step against its pass count in plain
  training steps of the same model, or Pref-MH against one random-walk MH step);
- a fixed ``bound_s`` in seconds, measured by the case module itself (e.g. fsync'd bytes over
  this disk's measured fsync'd bandwidth, a host copy over the measured copy bandwidth).

The ratio to the peer and the fraction of the bound are the two numbers to quote.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Case", "Roofline", "Row", "measure_roofline", "time_call", "time_case", "time_pair"]


@dataclasses.dataclass
class Case:
    """One benchmark row.

    Attributes:
      name: row name, ``"<module>/<what>"``, e.g. ``"cvxclust/ama n=1000"``.
      fn: the function under test, called as ``fn(*args)``.
      args: example arguments (already on device).
      shapes: a short description of the shapes, e.g. ``"x[1024,3] y[1024,3]"``.
      dtype: the dtype of the main arrays.
      jit: whether the harness wraps ``fn`` in ``jax.jit`` (and reports compile seconds). Set
        False for functions that are already compiled, or are not JAX (file I/O, CVXPY).
      flops: floating-point operations of one call (0 if not meaningful).
      bytes: bytes moved to/from memory by one call, at least (0 if not meaningful).
      items: work items per call for the throughput column (points, chain steps, updates).
      unit: the name of one item (``"steps"``, ``"points"``, ``"B"``).
      peer: the named baseline, called as ``peer(*peer_args)``; ``None`` for no peer.
      peer_args: arguments of ``peer`` (default: ``args``).
      peer_name: what the peer is, e.g. ``"ott-jax sinkhorn"``.
      peer_jit: whether to wrap ``peer`` in ``jax.jit``.
      goal: the kernel's target, stated as text, e.g. ``"ratio <= 1.2"``.
      repeats: at least this many timed calls (raised to 5 if lower).
      warmup: untimed calls before timing (after compilation).
      bound_s: the kernel's lower bound in seconds, measured by the case module (see the
        module docstring); ``None`` to use ``bound_fn`` or the roofline.
      bound_fn: a reference computation whose median, times ``bound_work``, is the bound.
      bound_args: arguments of ``bound_fn`` (default: ``args``; when ``bound_fn`` is the peer,
        the peer's own median is reused).
      bound_work: how many ``bound_fn`` calls one call of ``fn`` must do at least.
      bound_jit: whether to wrap ``bound_fn`` in ``jax.jit``.
      bound_note: how the bound is computed, in words (printed with the row).
      setup: optional ``setup()`` run before every call of ``fn`` (warm-up and timed), outside
        the timer: e.g. letting the background work of earlier calls finish, so that each
        timed call starts on a quiet host.
      peer_setup: the same for ``peer``.
      interleave: alternate the timed calls of ``fn`` and ``peer`` (the default); False times
        all of ``fn``'s, then all of the peer's.
    """

    name: str
    fn: Callable
    args: tuple = ()
    shapes: str = ""
    dtype: str = "float32"
    jit: bool = True
    flops: float = 0.0
    bytes: float = 0.0
    items: float = 1.0
    unit: str = "calls"
    peer: Callable | None = None
    peer_args: tuple | None = None
    peer_name: str = ""
    peer_jit: bool = True
    goal: str = ""
    repeats: int = 7
    warmup: int = 2
    bound_s: float | None = None
    bound_fn: Callable | None = None
    bound_args: tuple | None = None
    bound_work: float = 1.0
    bound_jit: bool = True
    bound_note: str = ""
    setup: Callable[[], Any] | None = None
    peer_setup: Callable[[], Any] | None = None
    interleave: bool = True


@dataclasses.dataclass
class Roofline:
    """Peak float32 matmul FLOP/s and memory bandwidth (bytes/s) measured on this machine."""

    peak_flops: float
    bandwidth: float
    backend: str

    def bound(self, flops: float, nbytes: float) -> float:
        """Returns the roofline's lower bound on seconds for ``flops`` and ``nbytes``."""
        return max(flops / self.peak_flops, nbytes / self.bandwidth)


@dataclasses.dataclass
class Row:
    """One measured row, as printed and as written to the JSON lines file."""

    name: str
    shapes: str
    dtype: str
    backend: str
    compile_s: float | None
    median_s: float
    min_s: float
    runs: int
    throughput: float
    unit: str
    roofline_frac: float | None
    peer_name: str = ""
    peer_compile_s: float | None = None
    peer_median_s: float | None = None
    ratio: float | None = None
    goal: str = ""
    bound_s: float | None = None
    bound_frac: float | None = None
    bound_note: str = ""
    extra: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _block(out: Any) -> Any:
    return jax.block_until_ready(out)


def time_call(
    fn: Callable,
    args: Sequence,
    *,
    jit: bool,
    repeats: int,
    warmup: int,
    setup: Callable[[], Any] | None = None,
) -> tuple[float | None, list[float]]:
    """Returns ``(compile_seconds or None, [seconds of each timed call])``.

    With ``jit``, ``fn`` is lowered and compiled ahead of time and the compiled executable is
    what gets timed, so the timed calls can never include a retrace. ``setup()``, if given,
    runs before every call, untimed.
    """
    compile_s, call = _compiled(fn, args, jit)
    for _ in range(max(warmup, 1)):
        _timed(call, args, setup)
    return compile_s, [_timed(call, args, setup) for _ in range(max(repeats, 5))]


def _compiled(fn: Callable, args: Sequence, jit: bool) -> tuple[float | None, Callable]:
    """``(compile seconds or None, the callable to time)``: with ``jit`` the AOT-compiled
    executable, so a timed call can never include a retrace."""
    if not jit:
        return None, fn
    # Without this, a function object compiled earlier in the process (by the roofline
    # calibration, or by another case) reuses its executable and reports ~0 s compile.
    jax.clear_caches()
    t0 = time.perf_counter()
    call = jax.jit(fn).lower(*args).compile()
    return time.perf_counter() - t0, call


def _timed(call: Callable, args: Sequence, setup: Callable[[], Any] | None) -> float:
    """Seconds of one call (ended with ``block_until_ready``), ``setup()`` run before, untimed."""
    if setup is not None:
        setup()
    t0 = time.perf_counter()
    _block(call(*args))
    return time.perf_counter() - t0


def time_pair(
    fn: Callable,
    args: Sequence,
    peer: Callable,
    peer_args: Sequence,
    *,
    jit: bool,
    peer_jit: bool,
    repeats: int,
    warmup: int,
    setup: Callable[[], Any] | None = None,
    peer_setup: Callable[[], Any] | None = None,
) -> tuple[float | None, list[float], float | None, list[float]]:
    """:func:`time_call` for ``fn`` and ``peer`` with their calls interleaved: both compiled,
    both warmed up, then ``fn``, ``peer``, ``fn``, ... Returns ``(compile_s, times,
    peer_compile_s, peer_times)``."""
    compile_s, call = _compiled(fn, args, jit)
    p_compile_s, p_call = _compiled(peer, peer_args, peer_jit)
    for _ in range(max(warmup, 1)):
        _timed(call, args, setup)
        _timed(p_call, peer_args, peer_setup)
    times, p_times = [], []
    for _ in range(max(repeats, 5)):
        times.append(_timed(call, args, setup))
        p_times.append(_timed(p_call, peer_args, peer_setup))
    return compile_s, times, p_compile_s, p_times


def measure_roofline(quick: bool = False) -> Roofline:
    """Measures peak float32 matmul FLOP/s and memory bandwidth with jnp kernels.

    Matmul: the best of several square float32 ``jnp.dot`` sizes (n = 1024/2048, or 512/1024
    with ``quick``). Bandwidth: ``y = x * a + b`` on a float32 array much larger than the
    caches (reads 4 B and writes 4 B per element). A peak is what the machine can reach, so
    each figure takes the fastest of 7 runs, not the median: on a shared machine the median
    understates the peak and would put ordinary kernels above 100% of the roofline.
    """
    sizes = (512, 1024) if quick else (1024, 2048)
    best_flops = 0.0
    for n in sizes:
        ka, kb = jax.random.split(jax.random.key(n))
        a = jax.random.normal(ka, (n, n), jnp.float32)
        b = jax.random.normal(kb, (n, n), jnp.float32)
        _, times = time_call(jnp.dot, (a, b), jit=True, repeats=7, warmup=1)
        best_flops = max(best_flops, 2.0 * n**3 / min(times))
    m = (16 if quick else 64) * 2**20 // 4  # 16 or 64 MiB of float32
    x = jnp.arange(m, dtype=jnp.float32)
    _, times = time_call(lambda v: v * 1.5 + 0.25, (x,), jit=True, repeats=7, warmup=1)
    bandwidth = 8.0 * m / min(times)
    return Roofline(best_flops, bandwidth, jax.default_backend())


def time_case(case: Case, roofline: Roofline) -> Row:
    """Times ``case`` (and its peer, in the same run, interleaved unless the case says not)
    and returns its row."""
    peer_args = case.args if case.peer_args is None else case.peer_args
    timing = dict(repeats=case.repeats, warmup=case.warmup)
    paired = case.peer is not None and case.interleave
    if paired:
        compile_s, times, p_compile, p_times = time_pair(
            case.fn,
            case.args,
            case.peer,
            peer_args,
            jit=case.jit,
            peer_jit=case.peer_jit,
            setup=case.setup,
            peer_setup=case.peer_setup,
            **timing,
        )
    else:
        compile_s, times = time_call(case.fn, case.args, jit=case.jit, setup=case.setup, **timing)
    median = statistics.median(times)
    frac = None
    if case.flops or case.bytes:
        frac = roofline.bound(case.flops, case.bytes) / median
    row = Row(
        name=case.name,
        shapes=case.shapes,
        dtype=case.dtype,
        backend=roofline.backend,
        compile_s=compile_s,
        median_s=median,
        min_s=min(times),
        runs=len(times),
        throughput=case.items / median,
        unit=case.unit,
        roofline_frac=frac,
        goal=case.goal,
    )
    if case.peer is not None:
        if not paired:
            p_compile, p_times = time_call(
                case.peer, peer_args, jit=case.peer_jit, setup=case.peer_setup, **timing
            )
        row.peer_name = case.peer_name or getattr(case.peer, "__name__", "peer")
        row.peer_compile_s = p_compile
        row.peer_median_s = statistics.median(p_times)
        row.ratio = median / row.peer_median_s
    row.bound_s, row.bound_note = _bound(case, roofline, row.peer_median_s)
    if row.bound_s is not None:
        row.bound_frac = row.bound_s / median
    return row


def _bound(case: Case, roofline: Roofline, peer_median: float | None) -> tuple[float | None, str]:
    """Returns ``(bound seconds or None, how it was computed)`` for ``case``.

    A ``bound_fn`` that is the case's own peer (with no ``bound_args`` of its own) reuses the
    peer's median instead of timing it again.
    """
    if case.bound_s is not None:
        return float(case.bound_s), case.bound_note or "measured by the case"
    if case.bound_fn is not None and case.bound_fn is case.peer and case.bound_args is None:
        note = case.bound_note or f"{case.bound_work:g} x the peer"
        return case.bound_work * peer_median, note
    if case.bound_fn is not None:
        args = case.args if case.bound_args is None else case.bound_args
        # The bound is a steady-state reference: at least one untimed call, so that a case
        # timed with its compilation (warmup 0) is not held against a compiled bound.
        _, times = time_call(
            case.bound_fn,
            args,
            jit=case.bound_jit,
            repeats=case.repeats,
            warmup=max(case.warmup, 1),
        )
        note = case.bound_note or f"{case.bound_work:g} x {case.bound_fn.__name__}"
        return case.bound_work * statistics.median(times), note
    if case.flops or case.bytes:
        return roofline.bound(case.flops, case.bytes), case.bound_note or "roofline"
    return None, ""


def _si(x: float | None, unit: str = "") -> str:
    if x is None or not np.isfinite(x):
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def _secs(x: float | None) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.1f}us"
    if x < 1:
        return f"{x * 1e3:.2f}ms"
    return f"{x:.2f}s"


def format_table(rows: Sequence[Row]) -> str:
    """Returns the rows as a fixed-width text table."""
    header = (
        "name",
        "shapes",
        "compile",
        "median",
        "throughput",
        "roofline",
        "bound",
        "of bound",
        "peer",
        "peer median",
        "ratio",
        "goal",
    )
    body = []
    for r in rows:
        body.append(
            (
                r.name,
                f"{r.shapes} {r.dtype}".strip(),
                _secs(r.compile_s),
                _secs(r.median_s),
                _si(r.throughput, r.unit + "/s"),
                "-" if r.roofline_frac is None else f"{100 * r.roofline_frac:.1f}%",
                f"{_secs(r.bound_s)} ({r.bound_note})" if r.bound_s is not None else "-",
                "-" if r.bound_frac is None else f"{100 * r.bound_frac:.1f}%",
                r.peer_name or "-",
                _secs(r.peer_median_s),
                "-" if r.ratio is None else f"{r.ratio:.3f}",
                r.goal or "-",
            )
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)) for row in body]
    return "\n".join(lines)


def write_jsonl(rows: Sequence[Row], path: Path, meta: dict[str, Any]) -> None:
    """Appends one JSON line per row (with ``meta``: time, host, versions) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            d = r.as_dict()
            d = {
                k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                for k, v in d.items()
            }
            f.write(json.dumps({**meta, **d}) + "\n")


def run_meta() -> dict[str, Any]:
    """Host and version facts stored with every JSON row."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "devices": [str(d) for d in jax.devices()],
    }
