"""Jit benchmarks of hexad's hot kernels: ``python -m kernels [name ...] [--quick] [--json F]``.

Each module ``kernels/<name>.py`` defines ``cases(quick: bool) -> list[kernels._harness.Case]``.
See :mod:`kernels._harness` for the timing protocol.
"""
