"""What a defense takes and returns: the defender's data and a defense's output.

They sit below both the defenses (:mod:`hexad.backdoor.defenses`) and the DTB attack, whose
surrogate members are defenses too, so that neither imports the other.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax


class DefenseData(NamedTuple):
    """What the defender holds.

    Attributes:
      x_clean: ``[m, H, W, C]`` the defender's small clean split (BackdoorBench: 5% of the
        training set); y_clean: ``[m]`` its labels.
      x_train: optional ``[n, H, W, C]`` the (possibly poisoned) training set, needed by the
        training-time defense ABL and the detectors AC and SS; y_train: ``[n]``.
      x_bd: optional ``[k, H, W, C]`` backdoor-triggered validation images and y_bd ``[k]``
        their attack targets: BackdoorBench's pruning-level selection for ANP and RNP
        (lowest ASR on them) reads these; without them a fixed threshold is used.
    """

    x_clean: jax.Array
    y_clean: jax.Array
    x_train: jax.Array | None = None
    y_train: jax.Array | None = None
    x_bd: jax.Array | None = None
    y_bd: jax.Array | None = None


class DefenseOutput(NamedTuple):
    """A defense's result: ``params``, the sanitised parameters, and ``info``, a dict of its
    diagnostics (host or device arrays: masks, flags, the pruning level chosen, ...)."""

    params: Any
    info: dict
