"""Results glue of the backdoor study (``backdoor_dtb``); not a study.

- :data:`SUMMARY` and :func:`summary_entries`: which figures of each model's
  :func:`hexad.backdoor.benchmark_defenses` table the study's ``summary.json`` reports, and
  under which names (the study docstring lists them).
- :func:`plot_asr`: hidden vs decoy ASR before and after each defense (``asr.png``).
"""

from __future__ import annotations

from typing import Any

# Per model: the summary's figures from its table, each ``key`` or ``key=table key``;
# ``{d}`` stands for each defense. Keys get the prefix ``<model>_``, except DTB's.
SUMMARY = {
    "dtb": (
        "clean_acc=clean_acc_before decoy_asr_before hidden_asr_before clean_acc_after_{d} "
        "decoy_asr_after_{d} hidden_asr_after_{d} decoy_asr_after_mean hidden_asr_after_mean "
        "dtb_der_decoy_mean=der_decoy_mean surrogate_clean_acc surrogate_decoy_asr "
        "surrogate_hidden_asr surrogate_clean_acc_mae surrogate_decoy_asr_mae "
        "surrogate_hidden_asr_mae"
    ),
    "naive": (
        "clean_acc=clean_acc_before decoy_asr_before hidden_asr_before decoy_asr_after_{d} "
        "hidden_asr_after_{d} hidden_asr_after_mean surrogate_hidden_asr"
    ),
    "badnets": (
        "clean_acc=clean_acc_before asr_before=decoy_asr_before asr_after_{d}=decoy_asr_after_{d} "
        "asr_after_mean=decoy_asr_after_mean der_mean=der_decoy_mean surrogate_clean_acc "
        "surrogate_asr=surrogate_decoy_asr surrogate_clean_acc_mae "
        "surrogate_asr_mae=surrogate_decoy_asr_mae"
    ),
}


def summary_entries(tag: str, table: dict[str, float], names: list[str]) -> dict[str, float]:
    """Returns the summary entries of model ``tag`` (:data:`SUMMARY`), with its detectors'
    ``<det>_tpr`` / ``<det>_fpr``, from its defense ``table``; ``names``: the defenses.

    >>> t = {"clean_acc_before": 0.9, "decoy_asr_before": 1.0, "hidden_asr_before": 0.0,
    ...      "decoy_asr_after_ft": 0.5, "hidden_asr_after_ft": 0.1, "hidden_asr_after_mean": 0.1,
    ...      "surrogate_hidden_asr": 0.2, "ss_tpr": 0.25}
    >>> sorted(summary_entries("naive", t, ["ft"]))[:3]
    ['naive_clean_acc', 'naive_decoy_asr_after_ft', 'naive_decoy_asr_before']
    """
    if tag not in SUMMARY:
        raise ValueError(f"tag: expected one of {sorted(SUMMARY)}, got {tag!r}")
    pre = "" if tag == "dtb" else f"{tag}_"
    out = {pre + k: v for k, v in table.items() if k.endswith(("_tpr", "_fpr"))}
    for item in SUMMARY[tag].split():
        key, _, src = item.partition("=")
        for d in names if "{d}" in key else [""]:
            out[pre + key.format(d=d)] = table[(src or key).format(d=d)]
    return out


def plot_asr(ctx: Any, tables: dict[str, dict[str, float]], names: list[str]) -> None:
    """Saves ``asr.png``: DTB's and the naive model's hidden vs decoy ASR before (star) and
    after each defense in ``names``, from their defense tables."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for tag, color in (("dtb", "C3"), ("naive", "C0")):
        t = tables[tag]
        xs = [t[f"decoy_asr_after_{n}"] for n in names]
        ys = [t[f"hidden_asr_after_{n}"] for n in names]
        ax.scatter(xs, ys, color=color, alpha=0.7, label=f"{tag} after")
        before = ([t["decoy_asr_before"]], [t["hidden_asr_before"]])
        ax.scatter(*before, marker="*", s=200, color=color, label=f"{tag} before")
        for n, u, v in zip(names, xs, ys, strict=True):
            ax.annotate(n, (u, v), fontsize=7, color=color)
    ax.set(xlabel="decoy ASR", ylabel="hidden ASR", xlim=(-0.05, 1.05), ylim=(-0.05, 1.05))
    ax.set_title("Hidden vs decoy ASR before and after each defense")
    ax.legend(fontsize=8)
    ctx.save_plot(fig, "asr")
