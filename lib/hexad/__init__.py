"""hexad: a JAX-native functional research codebase.

Subpackages (one per method; see docs/design.md): ``geometry`` and ``ot`` (shared foundations),
``rwefm``, ``prefmh``, ``cvxclust``, ``policy``, ``backdoor``, ``cachex`` and ``data``.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
