"""The shared experiment runner: CLI, configs, result files, progress and plots.

Every study module looks like this (see docs/design.md, "Contracts / Experiments")::

    '''One paragraph on what the study measures.

    Command:  python -m experiments.my_study [--quick] [--out DIR] [--seed N] [--set k=v ...]
    Runtime:  --quick about 40 s on 2 CPU cores; full about 20 min.
    summary.json keys: ``acc`` (test accuracy), ...
    '''
    import dataclasses
    from experiments import _runner

    @dataclasses.dataclass(frozen=True)
    class Config:
        n_steps: int = 1000
        lr: float = 1e-3

    def run(cfg: Config, ctx: _runner.Context) -> dict:
        for chunk in ctx.progress(range(10), desc="train"):
            ...                                  # one jitted chunk of work
            ctx.log(step=chunk, loss=float(loss))  # -> metrics.jsonl
        ctx.save_plot(fig, "curve")               # -> curve.png
        return {"acc": 0.9}                        # -> summary.json

    STUDY = _runner.Study("my_study", Config, run, quick={"n_steps": 50})

    if __name__ == "__main__":
        STUDY.main()

``python -m experiments.demo`` finds every module of this package that defines ``STUDY`` and
runs it with ``--quick``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import numbers
import os
import platform
import secrets
import subprocess
import sys
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
    "Context",
    "Study",
    "apply_overrides",
    "at_least",
    "check_chains",
    "in_range",
    "in_unit",
    "mean_se",
    "one_of",
    "parse_set",
    "positive",
    "provenance",
    "require",
    "to_jsonable",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
#: ``--seed`` must be below this: a JAX key holds 32 bits of it (larger seeds would wrap).
_SEED_LIMIT = 2**32


def checkpoint_root() -> Path:
    """The folder under which studies checkpoint by default: ``$HEXAD_CHECKPOINTS`` if set,
    else the repository's ``checkpoints/``."""
    env = os.environ.get("HEXAD_CHECKPOINTS")
    return Path(env) if env else REPO_ROOT / "checkpoints"


# --------------------------------------------------------------------------------------------
# Config ranges: each study's Config checks its fields in ``__post_init__`` with these helpers
# --------------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """A config field outside its range. ``keys`` names the field(s) the message is about."""

    def __init__(self, keys: str | tuple[str, ...], message: str):
        super().__init__(message)
        self.keys = (keys,) if isinstance(keys, str) else tuple(keys)


def _each(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _check(cfg: Any, names: tuple[str, ...], ok: Callable[[Any], bool], expected: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None:  # an optional field left unset
            continue
        if not all(ok(v) for v in _each(value)):
            each = "each entry of " if isinstance(value, (tuple, list)) else ""
            raise ConfigError(name, f"{each}{name} must be {expected}, got {value!r}")


def at_least(cfg: Any, lo: float, *names: str) -> None:
    """Checks ``getattr(cfg, name) >= lo`` for each name (each entry of a tuple field).

    Use ``lo=1`` for counts and sizes, ``lo=0`` for non-negative amounts.

    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class C:
    ...     n: int = 0
    >>> at_least(C(), 1, "n")
    Traceback (most recent call last):
    ...
    experiments._runner.ConfigError: n must be >= 1, got 0
    """
    _check(cfg, names, lambda v: v >= lo, f">= {lo}")


def positive(cfg: Any, *names: str) -> None:
    """Checks ``getattr(cfg, name) > 0`` for each name (learning rates, scales, temperatures)."""
    _check(cfg, names, lambda v: v > 0, "> 0")


def in_range(
    cfg: Any, lo: float, hi: float, *names: str, lo_open: bool = False, hi_open: bool = False
) -> None:
    """Checks that each named field lies in the interval from ``lo`` to ``hi`` (closed unless
    ``lo_open``/``hi_open``)."""
    text = f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    _check(
        cfg,
        names,
        lambda v: (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi),
        text,
    )


def in_unit(cfg: Any, *names: str, lo_open: bool = False, hi_open: bool = False) -> None:
    """Checks that each named field is a probability or fraction in ``[0, 1]``."""
    in_range(cfg, 0, 1, *names, lo_open=lo_open, hi_open=hi_open)


def one_of(cfg: Any, choices: Iterable[Any], *names: str) -> None:
    """Checks that each named field (each entry of a tuple field) is one of ``choices``."""
    choices = tuple(choices)
    _check(cfg, names, lambda v: v in choices, f"one of {list(choices)}")


def check_chains(cfg: Any) -> None:
    """The ranges of the Pref-MH studies' chain settings (``num_chains``, ``num_steps``,
    ``burn_in``, ``chunk_size``), as :func:`hexad.prefmh.run_chains` needs them."""
    at_least(cfg, 1, "num_chains", "num_steps", "chunk_size")
    at_least(cfg, 0, "burn_in")
    n, b, c = cfg.num_steps, cfg.burn_in, min(cfg.chunk_size, cfg.num_steps)
    require(b < n, ("burn_in", "num_steps"), f"burn_in must be < num_steps, got {b} >= {n}")
    require(
        n % c == 0 and b % c == 0,
        ("num_steps", "burn_in", "chunk_size"),
        f"num_steps and burn_in must be multiples of chunk_size, got {n}, {b} and {c}",
    )


def require(ok: bool, keys: str | tuple[str, ...], message: str) -> None:
    """Raises :class:`ConfigError` about ``keys`` with ``message`` unless ``ok`` (for checks
    that tie fields together, such as ``burn_in < num_steps``)."""
    if not ok:
        raise ConfigError(keys, message)


# --------------------------------------------------------------------------------------------
# Configs and --set overrides
# --------------------------------------------------------------------------------------------


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


def _convert(name: str, text: str, typ: Any) -> Any:
    """Converts the string ``text`` to ``typ`` or raises a ValueError naming ``name``."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(name, text, a)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(f"--set {name}={text!r}: expected one of {typ}; " + "; ".join(errors))
    if typ is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"--set {name}={text!r}: expected a bool (true/false), got {text!r}")
    if typ is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"--set {name}={text!r}: expected an int, got {text!r}") from None
    if typ is float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"--set {name}={text!r}: expected a float, got {text!r}") from None
        return value
    if typ is str:
        return text
    if origin in (tuple, list):
        inner = text.strip().strip("()[]").strip()
        if not inner:
            raise ValueError(
                f"--set {name}={text!r}: expected at least one comma-separated value, got none"
            )
        items = inner.split(",")
        if len(items) > 1 and not items[-1].strip():  # one trailing comma, as in Python's (3,)
            items.pop()
        if not all(t.strip() for t in items):
            raise ValueError(
                f"--set {name}={text!r}: expected comma-separated values, got an empty item"
            )
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            elem = [args[0]] * len(items)
        elif origin is tuple and args:
            if len(args) != len(items):
                raise ValueError(
                    f"--set {name}={text!r}: expected {len(args)} comma-separated values, "
                    f"got {len(items)}"
                )
            elem = list(args)
        else:
            elem = [args[0] if args else str] * len(items)
        # a JSON or Python list of strings ("[\"a\", 'b']") gives the strings unquoted
        values = [
            _convert(name, t.strip().strip("'\"") if e is str else t.strip(), e)
            for t, e in zip(items, elem, strict=True)
        ]
        return tuple(values) if origin is tuple else values
    if typing.get_origin(typ) is typing.Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ValueError(f"--set {name}={text!r}: expected one of {list(args)}, got {text!r}")
    if typ is Any:
        return text
    raise ValueError(f"--set {name}: fields of type {typ} cannot be set from the command line")


def parse_set(items: Iterable[str]) -> dict[str, str]:
    """Parses ``["a=1", "b=x"]`` into ``{"a": "1", "b": "x"}`` with a clear error on bad items."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip()
        if not k:
            raise ValueError(f"--set expects key=value with a non-empty key, got {item!r}")
        out[k] = v.strip()
    return out


def apply_overrides(config: Any, overrides: Mapping[str, Any]) -> Any:
    """Returns a copy of the frozen dataclass ``config`` with ``overrides`` applied.

    String values are converted to each field's annotated type; other values are checked
    against it. Unknown keys and values of the wrong type raise ``ValueError`` naming the key.
    """
    if not dataclasses.is_dataclass(config):
        raise TypeError(f"config: expected a dataclass instance, got {type(config).__name__}")
    types_ = _field_types(type(config))
    changes = {}
    for k, v in overrides.items():
        if k not in types_:
            known = ", ".join(sorted(types_))
            raise ValueError(
                f"unknown config key {k!r} for {type(config).__name__}; known: {known}"
            )
        typ = types_[k]
        if isinstance(v, str) and typ is not str:
            v = _convert(k, v, typ)
        elif typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        elif typ in (int, float, bool, str) and not isinstance(v, typ):
            raise ValueError(f"config key {k!r}: expected {typ.__name__}, got {v!r}")
        if any(isinstance(x, float) and not math.isfinite(x) for x in _each(v)):
            if isinstance(v, (tuple, list)):
                raise ValueError(f"config key {k!r}: expected finite numbers, got {v!r}")
            raise ValueError(f"config key {k!r}: expected a finite number, got {v!r}")
        changes[k] = v
    # The config's __post_init__ checks the ranges (ConfigError naming the field).
    return dataclasses.replace(config, **changes)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _portable(arg: str) -> str:
    """An argument as another machine would write it: an absolute path becomes relative to the
    repository (or the working folder), or its last two parts; no machine's folders are kept."""
    prefix, sep, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not value.startswith("/"):
        return arg
    p = Path(value)
    for base in (REPO_ROOT, Path.cwd()):
        with contextlib.suppress(ValueError):
            return prefix + sep + str(p.resolve().relative_to(base.resolve()))
    return prefix + sep + str(Path("...", *p.parts[-2:]))


def provenance(study: str, *, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Where a run's figures came from: the commit (and whether the tree had local changes),
    the date, the command, and the machine (CPU model and cores, jax's backend and devices).
    No host names or paths."""
    import jax

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    if sys.argv and Path(sys.argv[0]).stem == study:
        command = " ".join([f"python -m experiments.{study}", *map(_portable, sys.argv[1:])])
    else:  # called from Python (the demo, a test, a notebook): the equivalent command
        command = f"python -m experiments.{study}{' --quick' if quick else ''} --seed {seed}"
    return {
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "backend": jax.default_backend(),
            "devices": [d.device_kind for d in jax.devices()],
            "python": platform.python_version(),
            "jax": jax.__version__,
        },
    }


def to_jsonable(obj: Any) -> Any:
    """Converts numpy/jax scalars and arrays, dataclasses and tuples into plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy / jax arrays and scalars
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


# --------------------------------------------------------------------------------------------
# Context: what a study's run() gets
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    """Where a study writes, with what seed, and the helpers that write for it.

    Attributes:
      name: the study's name.
      out_dir: the run's output folder (``runs/<study>/<timestamp>/`` unless ``--out``).
      seed: the ``--seed`` value; ``ctx.key()`` turns it into a JAX key.
      quick: whether ``--quick`` was given.
      checkpoint_dir: ``checkpoints/<study>/<run>/`` unless ``--ckpt`` (the root is
        ``$HEXAD_CHECKPOINTS`` when set; the test suite points it at a temporary folder).
      resume: whether ``--resume`` was given (restore the newest durable step).
      show_progress: whether to draw tqdm bars.
      settings: the :func:`settings_stamp` of the run's config and seed; checkpoints go to
        ``checkpoint_dir / settings / tag``, so ``--resume`` never restores a checkpoint
        written under other settings ("": straight into ``checkpoint_dir / tag``).
      writer: whether this process writes ``out_dir`` (metrics, plots, JSON) and draws
        progress bars: in a ``jax.distributed`` job process 0 alone does (the others run the
        same study and write nothing there); checkpoints are every process's own.
    """

    name: str
    out_dir: Path
    seed: int = 0
    quick: bool = False
    checkpoint_dir: Path | None = None
    resume: bool = False
    show_progress: bool = True
    settings: str = ""
    writer: bool = True
    _metrics_file: Any = dataclasses.field(default=None, repr=False)

    def key(self):
        """Returns ``jax.random.key(seed)``."""
        import jax

        return jax.random.key(self.seed)

    def log(self, **metrics: Any) -> None:
        """Appends one JSON line of ``metrics`` to ``metrics.jsonl`` (host values only)."""
        if not self.writer:
            return
        if self._metrics_file is None:
            self._metrics_file = open(self.out_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._metrics_file.write(json.dumps(to_jsonable(metrics)) + "\n")
        self._metrics_file.flush()

    def progress(self, iterable: Iterable, desc: str | None = None, total: int | None = None):
        """Wraps ``iterable`` in a tqdm bar (host side: put one jitted chunk per item)."""
        if not self.show_progress or not self.writer:
            return iterable
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)

    def save_plot(self, fig: Any, name: str) -> Path:
        """Saves a matplotlib figure as ``out_dir/<name>.png`` and closes it."""
        import matplotlib.pyplot as plt

        stem = name[:-4] if name.endswith(".png") else name
        if not stem or "/" in stem or "\\" in stem or stem.startswith("."):
            raise ValueError(f"name: expected a plain file name, got {name!r}")
        path = self.out_dir / f"{stem}.png"
        if self.writer:
            fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return path

    def write_json(self, name: str, obj: Any) -> Path:
        """Writes ``obj`` as pretty JSON to ``out_dir/<name>`` (process 0 of a job only)."""
        path = self.out_dir / name
        if not self.writer:
            return path
        path.write_text(json.dumps(to_jsonable(obj), indent=2, sort_keys=True) + "\n")
        return path

    @contextlib.contextmanager
    def checkpointed(self, tag: str, init_state: Any) -> Iterator[tuple[int, Any, Callable]]:
        """Checkpoints one training run through :class:`hexad.cachex.CacheXManager`.

        Yields ``(start, state, save)``: ``start`` is 0 and ``state`` is ``init_state``, or,
        with ``--resume`` and a durable step ``s`` in ``checkpoint_dir / settings / tag``,
        ``s + 1`` and the restored state; ``save(step, state)`` stages a checkpoint. Leaving
        the block waits for the last save and closes the manager (also on an error). Without
        a checkpoint folder ``save`` does nothing.

        >>> import tempfile, numpy as np
        >>> ctx = Context("doc", Path(tempfile.mkdtemp()), checkpoint_dir=Path(tempfile.mkdtemp()))
        >>> with ctx.checkpointed("run", {"w": np.zeros(2)}) as (start, state, save):
        ...     saved = save(0, {"w": np.ones(2)})
        >>> ctx.resume = True
        >>> with ctx.checkpointed("run", {"w": np.zeros(2)}) as (start, state, save):
        ...     print(start, state["w"].tolist())
        1 [1.0, 1.0]
        """
        with _checkpoints(self.checkpoint_folder(tag), init_state, self.resume) as out:
            yield out

    def checkpoint_folder(self, tag: str) -> Path | None:
        """The folder of checkpoint ``tag``: ``settings_dir / tag``, and in a
        ``jax.distributed`` job this process's own ``process<k>`` under it (each process its
        own local tier; processes never write each other's steps). None without a checkpoint
        folder.

        >>> ctx = Context("doc", Path("out"), checkpoint_dir=Path("ck"), settings="settings-x")
        >>> ctx.checkpoint_folder("rules").as_posix()
        'ck/settings-x/rules'
        """
        root = self.settings_dir
        if root is None:
            return None
        if _process_count() > 1:
            return root / tag / f"process{_process_index()}"
        return root / tag

    def memo(self, tag: str, fn: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
        """``fn()``, a flat ``{name: number or bool}`` that is slow to compute (one defense's
        figures, say), kept in ``checkpoint_dir / settings / <tag>.json``: with ``--resume``
        and that file, it is read back instead of calling ``fn``. Values come back as Python
        ``bool``, ``int`` or ``float``, computed or restored alike. The file is written to a
        temporary name and renamed, so a stopped run never leaves a partial one, and it is read
        as JSON numbers and booleans only; anything else in it is an error naming the file.
        Without a checkpoint folder ``fn`` is just called.

        >>> import tempfile
        >>> ctx = Context("doc", Path(tempfile.mkdtemp()), checkpoint_dir=Path(tempfile.mkdtemp()))
        >>> ctx.memo("a", lambda: {"x": 1.5})
        {'x': 1.5}
        >>> ctx.resume = True
        >>> ctx.memo("a", lambda: {"x": 2.0})  # restored, not recomputed
        {'x': 1.5}
        """
        root = self.settings_dir
        path = None if root is None else root / f"{tag}.json"
        if path is not None and self.resume and path.is_file():
            try:
                kept = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:  # not JSON (nor UTF-8) at all
                kept = None
            ok = isinstance(kept, dict) and all(isinstance(v, int | float) for v in kept.values())
            if not ok:
                raise ValueError(f"{path}: expected a JSON object of numbers and booleans")
            return kept
        out = {k: _plain_scalar(v) for k, v in fn().items()}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            # this call's own temporary name: processes computing the same tag beside each
            # other (one --ckpt) must not rename or overwrite each other's file
            tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}")
            tmp.write_text(json.dumps(out), encoding="utf-8")
            os.replace(tmp, path)
        return out

    @property
    def settings_dir(self) -> Path | None:
        """``checkpoint_dir / settings``: the folder of this run's checkpoints (each ``tag``
        in its own subfolder), so a run under other settings or another seed never restores
        them. ``checkpoint_dir`` itself when ``settings`` is empty; None without one.

        >>> ctx = Context("doc", Path("out"), checkpoint_dir=Path("ck"), settings="settings-x")
        >>> ctx.settings_dir.as_posix()
        'ck/settings-x'
        """
        if self.checkpoint_dir is None or not self.settings:
            return self.checkpoint_dir
        return self.checkpoint_dir / self.settings

    def train_chunks(
        self,
        chunk_fn: Callable[[Any, Any], tuple[Any, Any]],
        state: Any,
        n_chunks: int,
        key: Any,
        *,
        tag: str,
        ckpt_every: int | None = None,
        log: Callable[[int, Any], Mapping[str, Any]] | None = None,
        on_chunk: Callable[[int, Any], None] | None = None,
    ) -> tuple[Any, Any]:
        """Runs ``n_chunks`` jitted chunks ``state, info = chunk_fn(state, fold_in(key, c))``.

        The loop every training study shares: a progress bar named ``tag``, one key per chunk
        (so a resumed run takes exactly the steps of an uninterrupted one), a ``metrics.jsonl``
        line per chunk, and, with ``ckpt_every``, a checkpoint of ``(state, info)`` every
        ``ckpt_every`` chunks and after the last one, in ``checkpoint_dir / settings / tag``,
        which ``--resume`` continues from.

        Args:
          chunk_fn: ``(state, key) -> (state, info)``, typically a jitted scan of steps.
          state: the initial state.
          n_chunks: the number of chunks (>= 1).
          key: the run's key.
          tag: names the progress bar, the checkpoint folder and the ``stage`` of each log line.
          ckpt_every: checkpoint every this many chunks; ``None``: never.
          log: ``(c, info) -> dict`` of the figures logged after chunk ``c``; by default the
            last entry of each field of a NamedTuple ``info``.
          on_chunk: called as ``on_chunk(c, state)`` after each chunk (e.g. to keep a snapshot).

        Returns:
          ``(state, info)`` after the last chunk.

        >>> import tempfile, jax, jax.numpy as jnp
        >>> ctx = Context("doc", Path(tempfile.mkdtemp()), show_progress=False)
        >>> step = jax.jit(lambda s, k: (s + 1, {"s": s + 1}))
        >>> ctx.train_chunks(step, jnp.zeros(()), 3, jax.random.key(0), tag="count")[0].item()
        3.0
        """
        import jax

        if not isinstance(n_chunks, int) or isinstance(n_chunks, bool) or n_chunks < 1:
            raise ValueError(f"n_chunks: expected an int >= 1, got {n_chunks!r}")
        if ckpt_every is not None and (not isinstance(ckpt_every, int) or ckpt_every < 1):
            raise ValueError(f"ckpt_every: expected None or an int >= 1, got {ckpt_every!r}")
        log = _last_of_each if log is None else log
        info_shape = jax.eval_shape(chunk_fn, state, jax.random.fold_in(key, 0))[1]
        info = jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), info_shape)
        folder = self.checkpoint_folder(tag) if ckpt_every is not None else None
        saved = {"state": state, "info": info}
        with _checkpoints(folder, saved, self.resume) as (start, saved, save):
            state, info = saved["state"], saved["info"]
            for c in self.progress(range(start, n_chunks), desc=tag, total=n_chunks - start):
                state, info = chunk_fn(state, jax.random.fold_in(key, c))
                if ckpt_every is not None and ((c + 1) % ckpt_every == 0 or c + 1 == n_chunks):
                    save(c, {"state": state, "info": info})
                self.log(stage=tag, chunk=c, **log(c, info))
                if on_chunk is not None:
                    on_chunk(c, state)
        return state, info

    def close(self) -> None:
        if self._metrics_file is not None:
            self._metrics_file.close()
            self._metrics_file = None


def settings_stamp(cfg: Any, seed: int, shared: Iterable[str] = ()) -> str:
    """A short hash of ``seed`` and the dataclass ``cfg``'s fields other than ``shared``: what
    a study's checkpoints depend on (see :attr:`Study.resume_shared`).

    >>> @dataclasses.dataclass(frozen=True)
    ... class Cfg:
    ...     parts: tuple = ("a", "b")
    ...     steps: int = 10
    >>> settings_stamp(Cfg(parts=("a",)), 0, ["parts"]) == settings_stamp(Cfg(), 0, ["parts"])
    True
    >>> settings_stamp(Cfg(steps=11), 0) == settings_stamp(Cfg(), 0)
    False
    """
    rest = [(f.name, getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name not in shared]
    text = repr((seed, type(cfg).__name__, rest))
    return "settings-" + hashlib.sha256(text.encode()).hexdigest()[:10]


@contextlib.contextmanager
def _checkpoints(folder: Path | None, init_state: Any, resume: bool):
    """:meth:`Context.checkpointed` in ``folder`` (:meth:`Context.checkpoint_folder`); without
    one nothing is saved."""
    if folder is None:
        yield 0, init_state, lambda step, state: None
        return
    import shutil

    from hexad import cachex

    if not resume and folder.exists():
        # A fresh run replaces an earlier run's checkpoints in the same folder, as it replaces
        # its summary: CacheX refuses to save a step at or below one already there.
        shutil.rmtree(folder)
    with cachex.CacheXManager(folder) as mngr:
        start, state = cachex.resume(mngr, init_state, resume)
        yield start, state, lambda step, st: mngr.save(step, st)
        mngr.wait_until_finished()


def _process_index() -> int:
    import jax

    return jax.process_index()


def _process_count() -> int:
    import jax

    return jax.process_count()


#: Seconds a process waits for the job's coordinator (and its peers) before giving up.
DISTRIBUTED_TIMEOUT_S = int(os.environ.get("HEXAD_DISTRIBUTED_TIMEOUT_S", "120"))


def initialize_distributed(timeout_s: int | None = None) -> None:
    """Joins this process to its ``jax.distributed`` job (``--distributed``).

    The job comes from the launcher's environment, as ``jax.distributed.initialize()`` reads
    it: Slurm's ``SLURM_*`` (``srun``), Open MPI's, a TPU pod's metadata, or
    ``JAX_COORDINATOR_ADDRESS`` with ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` (see
    BUILD.md). Host-CPU collectives use gloo. A coordinator that does not answer within
    ``timeout_s`` (default :data:`DISTRIBUTED_TIMEOUT_S`, ``$HEXAD_DISTRIBUTED_TIMEOUT_S``)
    is a ``RuntimeError`` naming it, not a hang.
    """
    import jax

    timeout_s = DISTRIBUTED_TIMEOUT_S if timeout_s is None else int(timeout_s)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw: dict[str, Any] = {"initialization_timeout": timeout_s}
    if "JAX_NUM_PROCESSES" in os.environ:  # a plain launcher: address, count and id
        kw.update(
            coordinator_address=os.environ.get("JAX_COORDINATOR_ADDRESS"),
            num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
            process_id=int(os.environ["JAX_PROCESS_ID"]),
        )
    where = kw.get("coordinator_address") or os.environ.get("JAX_COORDINATOR_ADDRESS")
    # jax's client aborts the process (no Python exception) when its coordinator never
    # answers: a process other than the coordinator's checks that it listens first.
    if where and kw.get("process_id", 0) != 0:
        _wait_for_coordinator(where, timeout_s)
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # jax raises its runtime's own error types
        raise RuntimeError(
            f"--distributed: could not join the job's coordinator {where or '(from the launcher)'}"
            f" within {timeout_s} s: {type(e).__name__}: {e}"
        ) from None


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Waits until ``host:port`` accepts a TCP connection; ``RuntimeError`` after
    ``timeout_s``."""
    import socket

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"--distributed: could not join the job's coordinator {address} within "
                    f"{timeout_s:g} s ({e}); is process 0 running, and is the address its?"
                ) from None
            time.sleep(0.2)


def agree_across_processes(cfg: Any, seed: int, quick: bool) -> None:
    """Raises ``ValueError`` naming the config fields (or ``seed``, ``quick``) on which the
    processes of the job differ: every process must run the same study."""
    import hashlib

    import numpy as np
    from jax.experimental import multihost_utils

    items = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    items |= {"seed": seed, "quick": quick}
    digest = [
        int.from_bytes(hashlib.sha256(repr(to_jsonable(v)).encode()).digest()[:4], "little")
        for v in items.values()
    ]
    local = np.asarray(digest, np.uint32).view(np.int32)
    every = np.asarray(multihost_utils.process_allgather(local))  # [process, item]
    differ = [k for k, col in zip(items, every.T, strict=True) if len(set(col.tolist())) > 1]
    if differ:
        raise ValueError(
            f"processes of the job run different studies: they differ in {', '.join(differ)} "
            f"(this is process {_process_index()} of {_process_count()})"
        )


def _plain_scalar(v: Any) -> bool | int | float:
    """A host scalar (numpy's too) as Python ``bool``, ``int`` or ``float``."""
    import numpy as np

    if isinstance(v, bool | np.bool_):
        return bool(v)
    if isinstance(v, int | np.integer):
        return int(v)
    return float(v)


def _last_of_each(c: int, info: Any) -> dict[str, float]:
    fields = info._asdict() if hasattr(info, "_asdict") else dict(info)
    return {k: float(v.reshape(-1)[-1]) for k, v in fields.items()}


def mean_se(values: Any, n_groups: int = 1) -> float | None:
    """The standard error of a mean, averaged over ``n_groups`` equal groups of ``values``.

    ``values`` is group-major (``n_groups`` runs of equal length, e.g. one method's episodes
    after another's); None when a group has fewer than two values.

    >>> mean_se([1.0, 3.0, 2.0, 2.0], 2)
    0.5
    """
    import numpy as np

    per = np.asarray(values, np.float64).reshape(n_groups, -1)
    if per.shape[1] < 2:
        return None
    return float(np.mean(per.std(axis=1, ddof=1) / np.sqrt(per.shape[1])))


def _check_run(name: str, seed: Any, resume: bool, located: bool, cli: bool = False) -> None:
    """Raises a ValueError (naming the flags when ``cli``) for a seed outside
    ``[0, 2**32)`` or a resume with no folder to resume from (``located``: an out or
    checkpoint folder was given)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        seed_ok = False
    else:
        seed_ok = 0 <= seed < _SEED_LIMIT
    if not seed_ok:
        raise ValueError(
            f"{'--seed' if cli else 'seed'}: expected an int in [0, 2**32), got {seed!r}"
        )
    if resume and not located:
        if cli:
            raise ValueError(
                "--resume needs --out DIR (the run to continue: its checkpoints are in "
                f"checkpoints/{name}/<DIR's name>/ by default) or --ckpt DIR; without "
                "either the run gets a new timestamped folder, with nothing to restore"
            )
        raise ValueError(
            "resume: needs out_dir or checkpoint_dir (the run to continue); without "
            "either the checkpoints go to a new timestamped folder, with nothing to restore"
        )


def _configure_matplotlib() -> None:
    # Checked before the run rather than at its first plot, hours in: every study plots, and
    # a missing package names the extra that installs it.
    from hexad.data import require

    os.environ.setdefault("MPLBACKEND", "Agg")
    require("matplotlib", "studies").use("Agg", force=True)
    require("tqdm", "studies")


# --------------------------------------------------------------------------------------------
# Study: config class + run function + CLI
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Study:
    """A registered study: ``run(config, ctx) -> summary`` with a frozen-dataclass config.

    Args:
      name: the study's name (the module name, e.g. ``"prefmh_mixture"``).
      config_cls: a frozen dataclass whose defaults are the full study.
      run: ``run(cfg, ctx) -> dict`` returning the flat summary.
      quick: field overrides that ``--quick`` applies (before any ``--set``).
      doc: the module docstring, shown by ``--help``.
      resume_shared: config fields that only choose which parts of the study run (its panels,
        its manifolds) or what is asked of a checkpointed model (an evaluation task): left
        out of the checkpoints' :func:`settings_stamp`, so a run of some parts and a later
        full run with ``--resume`` share those parts' checkpoints.
    """

    name: str
    config_cls: type
    run: Callable[[Any, Context], Mapping[str, Any]]
    quick: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    doc: str | None = None
    resume_shared: tuple[str, ...] = ()

    def __post_init__(self):
        if not dataclasses.is_dataclass(self.config_cls):
            raise TypeError(f"config_cls: expected a dataclass type, got {self.config_cls!r}")
        if not self.config_cls.__dataclass_params__.frozen:
            raise TypeError(f"config_cls: {self.config_cls.__name__} must be frozen")
        names = {f.name for f in dataclasses.fields(self.config_cls)}
        for arg in ("quick", "resume_shared"):
            unknown = set(getattr(self, arg)) - names
            if unknown:
                raise ValueError(f"{arg}: unknown config keys {sorted(unknown)}")

    def parser(self) -> argparse.ArgumentParser:
        fields = "\n".join(
            f"  {f.name} = {f.default!r}"
            for f in dataclasses.fields(self.config_cls)
            if f.default is not dataclasses.MISSING
        )
        p = argparse.ArgumentParser(
            prog=f"python -m experiments.{self.name}",
            description=self.doc,
            epilog=f"config fields (defaults = full study):\n{fields}\n--quick sets: "
            f"{dict(self.quick)}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("--quick", action="store_true", help="small, fast version (<~2 min)")
        p.add_argument("--out", type=Path, default=None, help="output folder")
        p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config field (repeatable)",
        )
        p.add_argument(
            "--resume",
            action="store_true",
            help="resume from the newest checkpoint (needs --out or --ckpt; appends to the "
            "run's metrics.jsonl)",
        )
        p.add_argument("--ckpt", type=Path, default=None, help="checkpoint folder")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        p.add_argument(
            "--distributed",
            action="store_true",
            help="join a jax.distributed job (the launcher's environment, see BUILD.md); "
            "process 0 alone writes --out",
        )
        return p

    def make_config(self, quick: bool = False, overrides: Mapping[str, Any] | None = None):
        """Returns the default config with the ``--quick`` overrides and then ``overrides``.

        Each step builds the config anew, so its ``__post_init__`` checks the ranges; a value
        out of range raises :class:`ConfigError` naming the ``--set`` item that caused it,
        e.g. ``--set num_chains=-4: num_chains must be >= 1, got -4``.
        """
        cfg = self.config_cls()
        if quick:
            cfg = apply_overrides(cfg, self.quick)
        if overrides:
            try:
                cfg = apply_overrides(cfg, overrides)
            except ConfigError as e:
                named = [k for k in e.keys if k in overrides] or list(overrides)
                shown = {k: v if isinstance(v, str) else repr(v) for k, v in overrides.items()}
                items = " ".join(f"--set {k}={shown[k]}" for k in named)
                raise ConfigError(e.keys, f"{items}: {e}") from None
        return cfg

    def execute(
        self,
        cfg: Any,
        out_dir: Path | None = None,
        seed: int = 0,
        quick: bool = False,
        resume: bool = False,
        checkpoint_dir: Path | None = None,
        show_progress: bool = True,
    ) -> dict[str, Any]:
        """Runs the study with ``cfg`` and writes config.json, summary.json (and metrics).

        An earlier run's ``summary.json`` in ``out_dir`` is removed before the run starts, so
        it never stays beside this run's ``config.json`` (a crashed run leaves none), and so is
        its ``metrics.jsonl``, except with ``resume``: a resumed run appends to the lines of
        the run it continues (chunks redone after the last durable checkpoint appear twice).

        Raises:
          ValueError: ``seed`` outside ``0 <= seed < 2**32``, or ``resume`` without
            ``out_dir`` or ``checkpoint_dir`` (the default folders are named by a new
            timestamp, so there would be nothing to resume from); nothing is written then.
        """
        _check_run(self.name, seed, resume, out_dir is not None or checkpoint_dir is not None)
        seed = int(seed)
        _configure_matplotlib()
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        # Absolute paths: orbax (checkpoints, the CacheX studies' storage) refuses relative
        # ones, and a study may change directory.
        out_dir = Path(out_dir) if out_dir is not None else REPO_ROOT / "runs" / self.name / stamp
        out_dir = out_dir.resolve()
        writer = _process_index() == 0
        if _process_count() > 1:
            agree_across_processes(cfg, seed, quick)
        if writer:
            out_dir.mkdir(parents=True, exist_ok=True)
            for stale in ("summary.json",) if resume else ("summary.json", "metrics.jsonl"):
                (out_dir / stale).unlink(missing_ok=True)
        if checkpoint_dir is None:
            checkpoint_dir = checkpoint_root() / self.name / out_dir.name
        ctx = Context(
            name=self.name,
            out_dir=out_dir,
            seed=seed,
            quick=quick,
            checkpoint_dir=Path(checkpoint_dir).resolve(),
            resume=resume,
            show_progress=show_progress,
            settings=settings_stamp(cfg, seed, self.resume_shared),
            writer=writer,
        )
        ctx.write_json(
            "config.json",
            {
                "study": self.name,
                "seed": seed,
                "quick": quick,
                "config": cfg,
                "provenance": provenance(self.name, quick=quick, seed=seed),
            },
        )
        t0 = time.perf_counter()
        try:
            summary = self.run(cfg, ctx)
        finally:
            ctx.close()
        if not isinstance(summary, Mapping):
            raise TypeError(f"{self.name}.run must return a dict summary, got {type(summary)}")
        summary = dict(to_jsonable(summary))
        summary.setdefault("runtime_s", round(time.perf_counter() - t0, 2))
        ctx.write_json("summary.json", summary)
        return summary

    def main(self, argv: list[str] | None = None) -> dict[str, Any]:
        """The CLI: parses ``argv``, runs, prints the summary. Exit code 2 on a bad config, a
        ``--seed`` outside ``0 <= N < 2**32``, ``--resume`` without ``--out`` or ``--ckpt``, or
        ``--distributed`` without a coordinator that answers."""
        args = self.parser().parse_args(argv)
        try:
            if args.distributed:
                initialize_distributed()
            located = args.out is not None or args.ckpt is not None
            _check_run(self.name, args.seed, args.resume, located, cli=True)
            cfg = self.make_config(args.quick, parse_set(args.overrides))
        except (ValueError, TypeError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        summary = self.execute(
            cfg,
            out_dir=args.out,
            seed=args.seed,
            quick=args.quick,
            resume=args.resume,
            checkpoint_dir=args.ckpt,
            show_progress=not args.no_progress,
        )
        print(json.dumps(summary, indent=2, sort_keys=True))
        return summary
