"""The extras in pyproject.toml: each method's installs no other method's heavy dependencies,
and `exp` (what the README's `make` installs) covers every extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
METHOD_EXTRAS = ("rwefm", "prefmh", "cvxclust", "policy", "backdoor", "cachex")
HEAVY = {"openmm", "mujoco", "gymnasium", "gymnasium-robotics"}


def _closure(extra: str) -> set[str]:
    """The distribution names ``hexad[extra]`` installs, self-references followed."""
    out: set[str] = set()
    for req in EXTRAS[extra]:
        m = re.match(r"hexad\[([^\]]+)\]", req)
        if m:
            for sub in m.group(1).split(","):
                out |= _closure(sub.strip())
        else:
            out.add(re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower())
    return out


@pytest.mark.parametrize(
    "extra,allowed",
    [("rwefm", set()), ("prefmh", set()), ("cvxclust", set()), ("backdoor", set()),
     ("cachex", set()), ("policy", {"mujoco", "gymnasium", "gymnasium-robotics"})],
)  # fmt: skip
def test_method_extra_installs_only_its_own_heavy_packages(extra, allowed):
    assert _closure(extra) & HEAVY == allowed


def test_exp_and_all_cover_every_method_extra():
    every = set().union(*(_closure(e) for e in (*METHOD_EXTRAS, "protein", "images", "studies")))
    assert every <= _closure("exp") and _closure("exp") <= _closure("all")
    assert "openmm" in _closure("protein") and "chex" in _closure("test")
    # The core install has no simulator, MD engine or test-only package.
    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in core}
    assert not names & (HEAVY | {"chex", "scikit-learn"})
