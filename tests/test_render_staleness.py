"""The report's staleness rule: a later commit makes a run stale only if it changes code, not
if it changes docstrings or comments alone (docs/render_results.py, ``_provenance``)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import render_results as render  # noqa: E402

SRC = '''"""A module."""

def f(x):
    """Doubles x."""
    return 2 * x  # twice
'''
DOC_ONLY = '''"""A module, documented better."""

def f(x):
    """Doubles ``x``.

    Args:
      x: a number.
    """
    # the same code
    return 2 * x
'''
CODE = SRC.replace("2 * x", "3 * x")
EMPTIED = '''def f(x):
    """Only a docstring."""
'''


def test_fingerprint_ignores_docstrings_and_comments_only():
    assert render.code_fingerprint(SRC) == render.code_fingerprint(DOC_ONLY)
    assert render.code_fingerprint(SRC) != render.code_fingerprint(CODE)
    # a body that was only a docstring still differs from one that does something
    assert render.code_fingerprint(EMPTIED) != render.code_fingerprint("def f(x):\n    return x\n")
    assert render.code_fingerprint("def (:") == "def (:"  # unparsable: compared as text


def test_fingerprint_a_stub_documented_instead_of_ellipsis_is_unchanged():
    # a Protocol member written ``...`` and the same member given a docstring run alike
    stub = "class P:\n    def exp(self, x, v): ...\n"
    documented = 'class P:\n    def exp(self, x, v):\n        """The exponential map."""\n'
    assert render.code_fingerprint(stub) == render.code_fingerprint(documented)
    assert render.code_fingerprint(stub) == render.code_fingerprint(stub.replace("...", "pass"))
    assert render.code_fingerprint(stub) != render.code_fingerprint(stub.replace("...", "x"))


RUN, LATER, HEAD = "a" * 40, "b" * 40, "c" * 40


def _fake_git(files):
    """A history RUN -> LATER -> HEAD where ``files[rev]`` is lib/hexad/m.py at each rev."""

    def git(*args):
        match args:
            case ("rev-parse", *_):
                return 0, RUN
            case ("merge-base", "--is-ancestor", _, "HEAD"):
                return 0, ""
            case ("merge-base", "--is-ancestor", *_):
                return 1, ""
            case ("log", *_):
                return 0, HEAD
            case ("rev-list", *_):
                return 0, f"{HEAD}\n{LATER}"
            case ("diff", "--name-only", a, b, "--", *_):
                parent = {f"{LATER}^": RUN, f"{HEAD}^": LATER}[a]
                return 0, "lib/hexad/m.py" if files[parent] != files[b] else ""
            case ("show", spec):
                rev, _, _ = spec.partition(":")
                rev = {f"{LATER}^": RUN, f"{HEAD}^": LATER}.get(rev, rev)
                return 0, files[rev]
        raise AssertionError(args)

    return git


def _prov(monkeypatch, files):
    monkeypatch.setattr(render, "_git", _fake_git(files))
    run = render.Run("s", "", {"provenance": {"commit": RUN, "date": "d"}}, {})
    return render._provenance(run, ("lib/hexad",))


def test_a_docstring_only_history_leaves_the_run_current(monkeypatch):
    prov = _prov(monkeypatch, {RUN: SRC, LATER: DOC_ONLY, HEAD: DOC_ONLY + "\n# more\n"})
    assert prov.state == "current" and "only docstrings or comments" in prov.text


def test_a_code_change_after_the_run_makes_it_stale_and_names_the_last_one(monkeypatch):
    prov = _prov(monkeypatch, {RUN: SRC, LATER: CODE, HEAD: CODE.replace('"""A', '"""The')})
    assert prov.state == "stale"
    assert prov.range == f"{RUN[:7]}..{LATER[:7]}" and "(1 of them change it)" in prov.text
    prov = _prov(monkeypatch, {RUN: SRC, LATER: DOC_ONLY, HEAD: CODE})
    assert prov.state == "stale" and prov.range == f"{RUN[:7]}..{HEAD[:7]}"
