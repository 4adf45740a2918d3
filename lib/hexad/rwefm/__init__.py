"""RWEFM: Riemannian Wasserstein entropic flow matching, generating point clouds on a manifold.

Data are clouds (probability measures on M: the sphere, the flat torus, ...). A
permutation-equivariant transformer :class:`VectorField` is regressed onto the velocities of
McCann interpolations between noise clouds and data clouds, built from the Riemannian entropic
map (:mod:`hexad.ot`); :func:`make_sampler` integrates it with Riemannian Euler/midpoint steps.
Training: :func:`make_trainer` returns the :class:`hexad._base.Algorithm` ``(init, step)``,
:func:`make_train` scans its step over minibatches of a set of clouds, and :func:`make_loss`
is the step's objective alone (for evaluation).
Metrics: Sinkhorn W2 on M between clouds, 1-NN two-sample accuracy, MMD.
"""

from hexad.rwefm._data import vmf_mixture_clouds, wrapped_normal_mixture_clouds
from hexad.rwefm._metrics import cloud_distances, mmd, one_nn_accuracy, set_w2
from hexad.rwefm._model import VectorField, time_embedding
from hexad.rwefm._train import (
    CloudBatch,
    NoiseModel,
    Sampler,
    TrainInfo,
    TrainState,
    euclidean_baseline,
    fit_noise,
    flow_matching_loss,
    make_loss,
    make_sampler,
    make_train,
    make_trainer,
    pair_clouds,
    shard_batch,
    validate_batch,
)

__all__ = [
    "CloudBatch",
    "NoiseModel",
    "Sampler",
    "TrainInfo",
    "TrainState",
    "VectorField",
    "cloud_distances",
    "euclidean_baseline",
    "fit_noise",
    "flow_matching_loss",
    "make_loss",
    "make_sampler",
    "make_train",
    "make_trainer",
    "mmd",
    "one_nn_accuracy",
    "pair_clouds",
    "set_w2",
    "shard_batch",
    "time_embedding",
    "validate_batch",
    "vmf_mixture_clouds",
    "wrapped_normal_mixture_clouds",
]
