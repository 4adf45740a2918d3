"""Optional dependencies: an import that names the extra to install when it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """Returns the imported ``module``, or raises a ModuleNotFoundError naming ``extra``.

    hexad's core install (jax, flax, optax, orbax, ott-jax, numpy) has no simulator, image or
    molecular-dynamics package; each comes with an extra (``pip install 'hexad[policy]'``), and
    the code that needs one imports it through this function, when it is first needed.

    Args:
      module: the dotted module name, e.g. ``"openmm"``.
      extra: the hexad extra that installs it, e.g. ``"protein"``.

    >>> require("json", "core").__name__
    'json'
    >>> require("not_a_module_hexad_knows", "policy")
    Traceback (most recent call last):
    ...
    ModuleNotFoundError: not_a_module_hexad_knows is needed here ...: pip install 'hexad[policy]'
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        # Only the module itself (or its top package) being absent means "install the extra";
        # a broken dependency inside an installed package is re-raised as it is.
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise
        raise ModuleNotFoundError(
            f"{module} is needed here and is not installed: pip install 'hexad[{extra}]'",
            name=module,
        ) from e
