"""``--resume`` for a study that loops over independent items (rules, methods, seeds).

:class:`ItemCheckpoint` checkpoints, through a :class:`~hexad.cachex.CacheXManager`, after
each completed item: the JSON record of every completed item (the item's summary values) and a
fixed set of study-owned arrays (e.g. one histogram row per item). A resumed run restores the
newest durable step with :func:`~hexad.cachex.resume`, skips the completed items and reuses
their records and arrays, so its summary equals an uninterrupted run's (JSON round-trips
Python floats exactly). The state has a fixed structure (a JSON buffer of ``capacity`` bytes
plus the arrays), as the CacheX restore needs a target of the saved structure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hexad.cachex import _manager

__all__ = ["ItemCheckpoint"]


class ItemCheckpoint:
    """Records of completed items, checkpointed after each one; restored on ``--resume``.

    Args:
      manager: the study's :class:`~hexad.cachex.CacheXManager`.
      items: the item names in run order (unique).
      arrays: name -> ``(shape, dtype)`` of the study's arrays carried between runs; they
        start as zeros and are available (and writable) as ``self.arrays[name]``.
      config: a JSON-serialisable description of the run (e.g. the study config); a resume
        against a checkpoint written with a different one raises ``ValueError``.
      enabled: the study's ``ctx.resume``: restore the newest durable step (else start over).
      capacity: bytes of the JSON buffer (static).

    Raises:
      UnreadableCheckpointError: ``enabled`` and the directory holds steps that no tier could
        read (see :func:`~hexad.cachex.resume`): the completed items are not redone silently.

    >>> import tempfile
    >>> from hexad import cachex
    >>> m = cachex.CacheXManager(tempfile.mkdtemp())
    >>> log = ItemCheckpoint(m, ["a", "b"], {"h": ((2, 3), "float64")}, config={"n": 1})
    >>> log.arrays["h"][0] = 1.0
    >>> log.complete("a", {"score": 0.5})
    >>> again = ItemCheckpoint(m, ["a", "b"], {"h": ((2, 3), "float64")}, config={"n": 1})
    >>> again.done("a"), again.record("a"), again.arrays["h"][0].tolist()
    (True, {'score': 0.5}, [1.0, 1.0, 1.0])
    >>> m.close()
    """

    def __init__(
        self,
        manager: _manager.CacheXManager,
        items: Sequence[str],
        arrays: Mapping[str, tuple[Sequence[int], Any]] | None = None,
        *,
        config: Any = None,
        enabled: bool = True,
        capacity: int = 1 << 16,
    ):
        if not isinstance(manager, _manager.CacheXManager):
            raise TypeError(f"manager: expected a CacheXManager, got {type(manager).__name__}")
        items = [str(i) for i in items]
        if len(set(items)) != len(items):
            raise ValueError(f"items: expected unique names, got {items}")
        if not isinstance(capacity, int) or capacity < 64:
            raise ValueError(f"capacity: expected an int >= 64, got {capacity!r}")
        self.manager, self.items, self.capacity = manager, items, capacity
        self._config = json.loads(json.dumps(config, sort_keys=True, default=_jsonable))
        self.arrays = {k: np.zeros(tuple(s), np.dtype(d)) for k, (s, d) in (arrays or {}).items()}
        self._records: dict[str, Any] = {}
        init = {"json": np.zeros(capacity, np.uint8), "arrays": dict(self.arrays)}
        step, state = _manager.resume(manager, init, enabled)
        # A run that starts over in a used directory saves after the steps already there.
        self._step = step if step > 0 else max(manager.all_steps(), default=-1) + 1
        if step > 0:
            raw = np.asarray(state["json"]).tobytes().rstrip(b"\0")
            saved = json.loads(raw)
            if saved["config"] != self._config or saved["items"] != self.items:
                raise ValueError(
                    f"resume: the checkpoint under {manager.directory} was written by a different "
                    f"run: expected config {self._config} and items {self.items}, got config "
                    f"{saved['config']} and items {saved['items']}; use a new --ckpt or drop "
                    "--resume"
                )
            self._records = saved["records"]
            self.arrays = {k: np.array(v) for k, v in state["arrays"].items()}

    def done(self, item: str) -> bool:
        """Whether ``item`` was completed (in this run or a resumed one)."""
        return item in self._records

    def record(self, item: str) -> Any:
        """The JSON record :meth:`complete` stored for ``item``."""
        return self._records[item]

    def complete(self, item: str, record: Any) -> None:
        """Stores ``item``'s JSON record with the current arrays and checkpoints them (blocks
        until the step is durable, so a later crash cannot lose it)."""
        if item not in self.items:
            raise ValueError(f"item: expected one of {self.items}, got {item!r}")
        records = dict(self._records)
        records[item] = json.loads(json.dumps(record, default=_jsonable))
        body = json.dumps(
            {"config": self._config, "items": self.items, "records": records},
            sort_keys=True,
        ).encode()
        if len(body) > self.capacity:  # checked before storing: a refused item is not done
            raise ValueError(
                f"capacity: the records need {len(body)} bytes of JSON, more than the "
                f"capacity {self.capacity}; pass a larger capacity"
            )
        self._records = records
        buf = np.zeros(self.capacity, np.uint8)
        buf[: len(body)] = np.frombuffer(body, np.uint8)
        self.manager.save(self._step, {"json": buf, "arrays": dict(self.arrays)})
        self.manager.wait_until_finished()
        self._step += 1


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    raise TypeError(f"record: {type(x).__name__} is not JSON-serialisable")
