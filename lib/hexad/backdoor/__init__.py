"""Defense-triggered backdoors (DTB) and the sanitisation defenses they target.

Security research: this package exists so that backdoor defenses can be tested against a
decoy-plus-hidden backdoor whose hidden half is activated by sanitisation itself.

- Triggers and poisoning: :func:`patch_trigger` (BadNets), :func:`blend_trigger`,
  :func:`warp_trigger` (WaNet), :func:`apply_trigger`, :func:`poison` (all-to-one).
- Models and training: :class:`SmallCNN`, :class:`PreActResNet`, :func:`fit`,
  :func:`make_trainer` (a :class:`hexad._base.Algorithm` with
  :class:`hexad._base.TrainState`), :func:`minimize`.
- Metrics: :func:`accuracy`, :func:`attack_success_rate`, :func:`robust_accuracy`,
  :func:`defense_effectiveness_rating`; :func:`evaluate` (a model's
  :class:`BackdoorMetrics`: clean accuracy, decoy and hidden ASR), :func:`defense_table`
  (before / after each defense / after a surrogate, with means, DER and the surrogate's gap)
  and :func:`detection_rates` (a detector's TPR and FPR); :func:`benchmark_defenses` runs
  them all on one model.
- DTB: :class:`DTBConfig`, :class:`DTBProblem`, :func:`dtb_objective` (first-order or unrolled
  hypergradient, gate, multi-round surrogate), :func:`make_dtb`, :func:`implant`,
  :func:`surrogate_defense` (the surrogate as a defense).
- Defenses (BackdoorBench protocol): :func:`finetune` (FT), :func:`fine_pruning` (FP),
  :func:`nad`, :func:`anp`, :func:`neural_cleanse` (NC), :func:`ibau`, :func:`clp`,
  :func:`ft_sam`, :func:`rnp`, :func:`mcr`, :func:`sau` (SAU), :func:`abl` (ABL, on the
  defender's training set); detectors :func:`activation_clustering` (AC) and
  :func:`spectral_signatures` (SS): 14 defenses; :func:`compose` for multi-round
  sanitisation; :data:`DEFENSES` maps short names to the model-repair ones, and
  :func:`make_defense` gives each of them one step budget (``"a+b"``: their composition).
"""

from hexad.backdoor._defenses import (
    DEFENSES,
    ABLOutput,
    NCOutput,
    abl,
    activation_clustering,
    anp,
    clp,
    compose,
    fine_pruning,
    finetune,
    ft_sam,
    ibau,
    make_defense,
    mcr,
    nad,
    neural_cleanse,
    rnp,
    sau,
    spectral_signatures,
)
from hexad.backdoor._dtb import (
    DTBBatch,
    DTBConfig,
    DTBInfo,
    DTBProblem,
    dtb_objective,
    implant,
    make_dtb,
    sanitise_surrogate,
    surrogate_defense,
)
from hexad.backdoor._eval import (
    BackdoorMetrics,
    benchmark_defenses,
    defense_table,
    detection_rates,
    evaluate,
)
from hexad.backdoor._models import PreActResNet, SmallCNN, apply_channel_mask, conv_layers
from hexad.backdoor._train import (
    TrainInfo,
    accuracy,
    attack_success_rate,
    cross_entropy,
    defense_effectiveness_rating,
    fit,
    make_trainer,
    minimize,
    robust_accuracy,
    sample_batch,
)
from hexad.backdoor._triggers import (
    BlendTrigger,
    PatchTrigger,
    Poisoned,
    WarpTrigger,
    apply_trigger,
    blend_trigger,
    check_images,
    patch_trigger,
    poison,
    warp_trigger,
)

__all__ = [
    "ABLOutput",
    "BackdoorMetrics",
    "benchmark_defenses",
    "DEFENSES",
    "NCOutput",
    "abl",
    "activation_clustering",
    "anp",
    "clp",
    "compose",
    "defense_table",
    "detection_rates",
    "evaluate",
    "fine_pruning",
    "finetune",
    "ft_sam",
    "ibau",
    "make_defense",
    "mcr",
    "nad",
    "neural_cleanse",
    "rnp",
    "sau",
    "spectral_signatures",
    "DTBBatch",
    "DTBConfig",
    "DTBInfo",
    "DTBProblem",
    "dtb_objective",
    "implant",
    "make_dtb",
    "sanitise_surrogate",
    "surrogate_defense",
    "BlendTrigger",
    "PatchTrigger",
    "Poisoned",
    "PreActResNet",
    "SmallCNN",
    "TrainInfo",
    "WarpTrigger",
    "accuracy",
    "apply_channel_mask",
    "apply_trigger",
    "attack_success_rate",
    "blend_trigger",
    "check_images",
    "conv_layers",
    "cross_entropy",
    "defense_effectiveness_rating",
    "fit",
    "make_trainer",
    "minimize",
    "patch_trigger",
    "poison",
    "robust_accuracy",
    "sample_batch",
    "warp_trigger",
]
