"""Sphinx glue for hexad's API reference: each object documented once, under its public name.

- A NamedTuple's fields are documented by its docstring's ``Attributes`` section (one entry per
  field, typed from the annotation); the generated ``Alias for field number N`` properties and
  the methods flax adds to its dataclasses are skipped.
- A manifold of :mod:`hexad.geometry` shows every member of the :class:`hexad.base.Manifold`
  contract; a member without a docstring of its own takes the contract's.
- A constant re-exported from a private module takes the doc comment it has there.
- Objects live in private modules (``hexad.ot._entropic.EntropicMap``) and are documented under
  the public name (``hexad.ot.EntropicMap``). A reference that does not resolve as written (an
  annotation's private path, another public path of the same object, a bare name in a
  docstring) resolves to the page of the same object when exactly one documented object
  matches; otherwise it stays unresolved and ``nitpicky`` reports it.
- Coverage: every public module of hexad has a page, and every name in its ``__all__`` is
  documented somewhere; a missing one is a warning (an error under ``-W``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import sys
import typing
from typing import Any

from sphinx.pycode import ModuleAnalyzer
from sphinx.util import logging
from sphinx.util.nodes import make_refnode
from sphinx.util.typing import stringify_annotation

logger = logging.getLogger(__name__)

# Values equal to a constant of another module by identity (interned strings, small ints) must
# not make a reference to one resolve to the other: only these kinds are matched by identity.
_PRIMITIVES = (bool, int, float, complex, str, bytes, type(None))
_MISSING = object()


@functools.cache
def _import(path: str) -> Any:
    """The object at the dotted ``path`` (a module, then attributes), or ``None``."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:  # noqa: BLE001 (any import failure means: not this split)
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


# --- what autodoc shows ------------------------------------------------------------------------


def _manifold_members() -> set[str]:
    from hexad.base import Manifold

    return {n for n in vars(Manifold) if not n.startswith("_")}


def _is_manifold_member(obj: Any, name: str) -> bool:
    # A method or property of a class in hexad.geometry that the contract names.
    func = obj.fget if isinstance(obj, property) else obj
    module = getattr(func, "__module__", "") or ""
    return module.startswith("hexad.geometry.") and name in _manifold_members()


def skip_member(app, what, name, obj, skip, options):
    if what != "class":
        return None
    doc = getattr(obj, "__doc__", None) or ""
    if doc.startswith("Alias for field number"):
        return True  # a NamedTuple field: its class docstring's Attributes section has it
    if (getattr(obj, "__module__", None) or "").startswith("flax."):
        return True  # flax.struct's ``replace`` and friends, the same on every dataclass
    if skip and _is_manifold_member(obj, name):
        return False  # shown with the contract's docstring (process_docstring)
    if not (callable(obj) or isinstance(obj, (property, classmethod, staticmethod))):
        # A field (with its default as value), an enum member or a class constant: the class
        # docstring's Attributes section documents it, with its type.
        return True
    return None


def process_docstring(app, what, name, obj, options, lines):
    if what in ("class", "exception"):
        _type_attributes(app, obj, lines)
    if what in ("data", "attribute") and name.startswith("hexad."):
        # A constant documents itself with a doc comment where it is defined; autodoc finds
        # only those of the module it documents, and otherwise shows the value's type's
        # docstring (``dict``'s, ``tuple``'s), which says nothing about the constant.
        doc = _private_attr_doc(name)
        if doc is not None:
            lines[:] = doc
        elif lines and "\n".join(lines).strip() == (inspect.getdoc(type(obj)) or "").strip():
            lines[:] = []
        return
    if lines and any(line.strip() for line in lines):
        return
    if what in ("method", "property") and _is_manifold_member(obj, name.rsplit(".", 1)[-1]):
        from hexad.base import Manifold

        doc = inspect.getdoc(getattr(Manifold, name.rsplit(".", 1)[-1]))
        if doc:
            lines[:] = [*doc.splitlines(), "", "(From the :class:`hexad.base.Manifold` contract.)"]


_ENTRY = re.compile(r"^(\s+)(\w+)\s*:(\s|$)")


def _type_attributes(app, cls, lines: list[str]) -> None:
    """Writes each untyped entry of the Attributes section as ``name (type): ...``.

    napoleon would look the annotation up itself, but writes it fully qualified
    (``jax.jaxlib._jax.Array``, ``hexad._base.Manifold``); this writes it as the signatures
    are written (``autodoc_typehints_format = "short"``).
    """
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 (an annotation that does not evaluate: leave it out)
        hints = {}
    if not hints:
        return
    mode = "smart" if app.config.autodoc_typehints_format == "short" else "fully-qualified"
    inside, indent = False, None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if not line[0].isspace():
            inside, indent = line.rstrip() in ("Attributes:", "Attributes"), None
            continue
        if not inside:
            continue
        match = _ENTRY.match(line)
        this = len(line) - len(line.lstrip())
        if indent is None:
            indent = this
        if match is None or this != indent or match.group(2) not in hints:
            continue
        kind = stringify_annotation(hints[match.group(2)], mode)
        head = f"{match.group(1)}{match.group(2)} ({kind}):"
        lines[i] = head + line[match.end(0) - len(match.group(3)) :]


def _private_attr_doc(fullname: str) -> list[str] | None:
    """The doc comment of a constant, from the hexad module that defines it.

    Modules holding the same object are tried nearest first (the package's private modules,
    then the rest of hexad: ``hexad.base.DATA_AXIS`` is defined in ``hexad._base``).
    """
    module_name, attr = fullname.rsplit(".", 1)
    value = _import(fullname)
    candidates = sorted(
        (not m.startswith(module_name + "."), m)
        for m in list(sys.modules)
        if m.startswith("hexad.") and m != module_name
    )
    for _, candidate in [(False, module_name), *candidates]:
        module = sys.modules.get(candidate)
        if module is None or getattr(module, attr, _MISSING) is not value:
            continue
        try:
            docs = ModuleAnalyzer.for_module(candidate).find_attr_docs()
        except Exception:  # noqa: BLE001 (no source: try the next module)
            continue
        if ("", attr) in docs:
            return list(docs["", attr])
    return None


# --- references to the public name ----------------------------------------------------------


def _documented(env) -> dict[str, Any]:
    """Fully qualified name -> object, for every documented hexad object (cached per build)."""
    cache = getattr(env, "_hexad_documented", None)
    py = env.get_domain("py")
    if cache is None or cache[0] != len(py.objects):
        table = {}
        for fullname, entry in py.objects.items():
            # ``aliased`` entries are the canonical (private) names autodoc adds for classes.
            if fullname.startswith("hexad.") and not entry.aliased:
                obj = _import(fullname)
                if obj is not None:
                    table[fullname] = obj
        cache = (len(py.objects), table)
        env._hexad_documented = cache
    return cache[1]


def _by_identity(env, obj: Any) -> list[str]:
    if isinstance(obj, _PRIMITIVES):
        return []
    return [name for name, value in _documented(env).items() if value is obj]


def _candidates(env, node) -> list[str]:
    target = node.get("reftarget", "")
    if not target:
        return []
    context = node.get("py:module") or ""
    klass = node.get("py:class") or ""
    # 1. The target names an object (by a private path, or another public path).
    paths = [target]
    if context:
        if klass:
            paths.append(f"{context}.{klass}.{target}")
        paths.append(f"{context}.{target}")
    for path in paths:
        obj = _import(path)
        if obj is not None:
            found = _by_identity(env, obj)
            if found:
                return found
    # 2. A bare or partial name: the documented objects whose name ends with it, the ones
    # nearest the referring module first.
    suffix = "." + target.lstrip(".~")
    matches = [name for name in _documented(env) if name.endswith(suffix)]
    if len(matches) > 1 and context:
        package = ".".join(context.split(".")[:2]) + "."
        near = [m for m in matches if m.startswith(package)]
        matches = near or matches
    return matches


def _external_in_context(app, node) -> bool:
    """Whether a bare name (an annotation autodoc could not evaluate) names, in the module that
    defines the documented class, an object of a library in ``nitpick_ignore_regex``."""
    target = node.get("reftarget", "")
    klass = node.get("py:class")
    if "." in target or not klass or not node.get("py:module"):
        return False
    cls = _import(f"{node['py:module']}.{klass.split('.')[0]}")
    home = sys.modules.get(getattr(cls, "__module__", "") or "")
    obj = getattr(home, target, None)
    if obj is None or (getattr(obj, "__module__", "") or "").startswith("hexad"):
        return False
    qualified = f"{obj.__module__}.{getattr(obj, '__qualname__', target)}"
    return any(
        re.fullmatch(kind, f"py:{node.get('reftype')}") and re.fullmatch(pattern, qualified)
        for kind, pattern in app.config.nitpick_ignore_regex
    )


def missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    if any(re.fullmatch(p, node.get("reftarget", "")) for _, p in app.config.nitpick_ignore_regex):
        return None  # an external name, left unlinked
    if _external_in_context(app, node):
        return contnode  # left unlinked, as nitpick_ignore_regex leaves the qualified name
    matches = sorted(set(_candidates(env, node)))
    if len(matches) != 1:
        return None
    py = env.get_domain("py")
    entry = py.objects[matches[0]]
    return make_refnode(
        app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, matches[0]
    )


# --- coverage --------------------------------------------------------------------------------


def _public_modules() -> list[str]:
    import hexad

    out = []
    for info in pkgutil.walk_packages(hexad.__path__, prefix="hexad."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        out.append(info.name)
    return sorted(out)


def check_coverage(app, env):
    py = env.get_domain("py")
    documented = _documented(env)
    for module_name in _public_modules():
        if module_name not in py.modules and module_name not in py.objects:
            # (A module whose name a function of its package shadows, such as
            # ``hexad.backdoor.defenses.abl``, is documented without an index entry.)
            logger.warning(
                "API reference: the public module %s has no page in docs/api",
                module_name,
                type="hexad",
                subtype="api",
            )
            continue
        module = importlib.import_module(module_name)
        for attr in getattr(module, "__all__", ()):
            fullname = f"{module_name}.{attr}"
            value = getattr(module, attr)
            if fullname in documented or fullname in py.modules:
                continue
            if inspect.ismodule(value) and value.__name__ in py.modules:
                continue
            if _by_identity(env, value):
                continue
            logger.warning(
                "API reference: %s is public (in %s.__all__) but documented nowhere; add it "
                "to a table in docs/api",
                fullname,
                module_name,
                type="hexad",
                subtype="api",
            )


def setup(app):
    app.connect("autodoc-skip-member", skip_member)
    # Before napoleon (priority 500), so a borrowed docstring is converted like any other.
    app.connect("autodoc-process-docstring", process_docstring, priority=400)
    app.connect("missing-reference", missing_reference)
    app.connect("env-check-consistency", check_coverage)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
