"""Defense-triggered backdoors (DTB) and the sanitisation defenses they target.

Security research: this package exists so that backdoor defenses can be tested against a
decoy-plus-hidden backdoor whose hidden half is activated by sanitisation itself.

- Triggers and poisoning: :func:`patch_trigger` (BadNets), :func:`blend_trigger`,
  :func:`warp_trigger` (WaNet), :func:`apply_trigger`, :func:`poison` (all-to-one).
- Models and training: :class:`SmallCNN`, :class:`PreActResNet`, :func:`fit`,
  :func:`make_trainer` (a :class:`hexad._base.Algorithm` with
  :class:`hexad._base.TrainState`), :func:`minimize`.
- Metrics: :func:`accuracy`, :func:`attack_success_rate`, :func:`robust_accuracy`,
  :func:`target_rate`, :func:`defense_effectiveness_rating`; :func:`evaluate` (a model's
  :class:`BackdoorMetrics`: clean accuracy, decoy and hidden ASR), :func:`defense_table`
  (before / after each defense / after a surrogate, with means, DER and the surrogate's gap)
  and :func:`detection_rates` (a detector's TPR and FPR); :func:`benchmark_defenses` runs
  them all on one model.
- DTB: :class:`DTBConfig`, :class:`DTBProblem` (hidden and decoy targets differ),
  :func:`dtb_objective` (decoy at an ordinary poison rate, an inner surrogate drawn each
  outer step from :data:`FAMILY`, a never-zero weight in place of a gate; first-order or
  unrolled hypergradient), :func:`make_dtb`, :func:`implant` (keeps the checkpoint with the
  lowest objective on the attacker's held-out images; :class:`ImplantInfo`),
  :func:`surrogate_defense`, :func:`weight_displacement`.
- Defenses: :mod:`hexad.backdoor.defenses`, 14 model repairs with one signature
  ``(key, model, params, data, n_steps) -> DefenseOutput(params, info)``;
  :data:`DEFENSES`, :func:`make_defense`, :func:`compose`, :class:`DefenseData`.
- :func:`finetune_trajectory`: clean accuracy and both ASRs along one real fine-tuning run.
"""

from hexad.backdoor import defenses
from hexad.backdoor._dtb import (
    FAMILY,
    DTBBatch,
    DTBConfig,
    DTBInfo,
    DTBProblem,
    check_problem,
    dtb_objective,
    implant,
    make_dtb,
    sanitise_surrogate,
    surrogate_defense,
    surrogate_path,
    weight_displacement,
)
from hexad.backdoor._dtb import ImplantInfo as ImplantInfo  # noqa: F401 (re-export)
from hexad.backdoor._eval import (
    BackdoorMetrics,
    benchmark_defenses,
    defense_table,
    detection_rates,
    evaluate,
    finetune_trajectory,
)
from hexad.backdoor._models import (
    PreActResNet,
    SmallCNN,
    apply_channel_mask,
    channel_count,
    conv_layers,
    head_input_layer,
    mask_layers,
    norm_layers,
)
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
    target_rate,
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
from hexad.backdoor.defenses import (
    DEFENSES,
    NEEDS_TRAIN,
    DefenseData,
    DefenseOutput,
    compose,
    make_defense,
)

__all__ = [
    "DEFENSES",
    "FAMILY",
    "NEEDS_TRAIN",
    "BackdoorMetrics",
    "BlendTrigger",
    "DTBBatch",
    "DTBConfig",
    "DTBInfo",
    "DTBProblem",
    "DefenseData",
    "DefenseOutput",
    "PatchTrigger",
    "Poisoned",
    "PreActResNet",
    "SmallCNN",
    "TrainInfo",
    "WarpTrigger",
    "accuracy",
    "apply_channel_mask",
    "channel_count",
    "apply_trigger",
    "attack_success_rate",
    "benchmark_defenses",
    "blend_trigger",
    "check_images",
    "check_problem",
    "compose",
    "conv_layers",
    "head_input_layer",
    "mask_layers",
    "norm_layers",
    "cross_entropy",
    "defense_effectiveness_rating",
    "defense_table",
    "defenses",
    "detection_rates",
    "dtb_objective",
    "evaluate",
    "finetune_trajectory",
    "fit",
    "implant",
    "make_defense",
    "make_dtb",
    "make_trainer",
    "minimize",
    "patch_trigger",
    "poison",
    "robust_accuracy",
    "sample_batch",
    "target_rate",
    "sanitise_surrogate",
    "surrogate_defense",
    "surrogate_path",
    "warp_trigger",
    "weight_displacement",
]
