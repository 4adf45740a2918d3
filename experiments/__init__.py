"""Studies: ``python -m experiments.<study> [--quick] [--out DIR] [--seed N] [--set k=v]``.

One module per study, each thin over ``hexad`` and built on :mod:`experiments._runner`.
``python -m experiments.demo`` runs every study's ``--quick`` mode and writes a report.
"""
