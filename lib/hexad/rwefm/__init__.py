"""RWEFM: Riemannian Wasserstein entropic flow matching, generating point clouds on a manifold.

Data are clouds (probability measures on M: the sphere, the flat torus, ...). A
permutation-equivariant transformer :class:`VectorField` is regressed onto the velocities of
McCann interpolations between noise clouds and data clouds, built from the Riemannian entropic
map (:mod:`hexad.ot`); :func:`make_sampler` integrates it with Riemannian Euler/midpoint steps.
Training: :func:`make_trainer` returns the :class:`hexad._base.Algorithm` ``(init, step)``,
:func:`make_train` scans its step over minibatches of a set of clouds, and :func:`make_loss`
is the step's objective alone (for evaluation).
Noise (:class:`NoiseModel`, :func:`fit_noise`): the reference's per-cloud-fitted ambient
Gaussian projected onto M, uniform, or a wrapped normal, shared by RWEFM and its baseline.
Metrics: Chamfer and entropic-EMD cloud distances; 1-NN accuracy, minimum-matching distance
and a fixed-bandwidth kernel MMD on them.
"""

from hexad.rwefm._data import vmf_mixture_clouds, wrapped_normal_mixture_clouds
from hexad.rwefm._metrics import (
    chamfer_distances,
    cloud_distances,
    emd_distances,
    median_bandwidth,
    min_matching_distance,
    mmd,
    one_nn_accuracies,
    one_nn_accuracy,
    set_w2,
)
from hexad.rwefm._model import VectorField, time_embedding
from hexad.rwefm._train import (
    NOISE_KINDS,
    PAIRINGS,
    CloudBatch,
    NoiseModel,
    Sampler,
    TrainInfo,
    TrainState,
    calibrate_map_iterations,
    check_noise_kind,
    euclidean_baseline,
    fit_noise,
    flow_matching_loss,
    make_loss,
    make_sampler,
    make_train,
    make_trainer,
    match_clouds,
    pair_clouds,
    shard_batch,
    validate_batch,
)

__all__ = [
    "NOISE_KINDS",
    "PAIRINGS",
    "CloudBatch",
    "NoiseModel",
    "Sampler",
    "TrainInfo",
    "TrainState",
    "VectorField",
    "calibrate_map_iterations",
    "chamfer_distances",
    "check_noise_kind",
    "cloud_distances",
    "emd_distances",
    "euclidean_baseline",
    "fit_noise",
    "flow_matching_loss",
    "make_loss",
    "make_sampler",
    "make_train",
    "make_trainer",
    "match_clouds",
    "median_bandwidth",
    "min_matching_distance",
    "mmd",
    "one_nn_accuracies",
    "one_nn_accuracy",
    "pair_clouds",
    "set_w2",
    "shard_batch",
    "time_embedding",
    "validate_batch",
    "vmf_mixture_clouds",
    "wrapped_normal_mixture_clouds",
]
