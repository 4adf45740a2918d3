"""Setting up a composition study: likelihood spaces, deterministic actions, disjoint
selection/test splits, and the precision ratio of a prior to an actor. (Intervals and verdicts
are not the library's: the studies take them from one shared statistics module.)"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from hexad.policy._gaussian import DiagGaussian

__all__ = [
    "SPACES",
    "actor_for_space",
    "check_disjoint",
    "check_space",
    "deterministic_action",
    "precision_ratio",
]

SPACES = ("pretanh", "action")
"""The likelihood spaces a policy (and so its PoE) may live in (:func:`check_space`)."""


def check_space(space: str) -> str:
    """Returns ``space`` if it is one of :data:`SPACES`, else raises ``ValueError``.

    ``"pretanh"``: a tanh-squashed Gaussian, composed over pre-tanh variables, acting with
    ``tanh(mean)``; ``"action"``: a Gaussian over actions with a state-independent std (as
    the IQL reference), composed in action space, acting with ``clip(mean, -1, 1)``.

    >>> check_space("action")
    'action'
    """
    if space not in SPACES:
        raise ValueError(f"space: expected one of {SPACES}, got {space!r}")
    return space


def actor_for_space(space: str, action_dim: int, hidden: Sequence[int]):
    """Returns the ``GaussianActor`` of a likelihood space (see :func:`check_space`).

    >>> actor_for_space("action", 2, (8,)).squash
    False
    """
    from hexad.policy._networks import GaussianActor

    pre = check_space(space) == "pretanh"
    return GaussianActor(action_dim, tuple(hidden), state_dependent_std=pre, squash=pre)


def deterministic_action(mean, squashed):
    r"""Returns :math:`\tanh(\text{mean})` where ``squashed`` and ``clip(mean, -1, 1)`` elsewhere.

    Args:
      mean: ``[B, d]`` composed means.
      squashed: bool, scalar or ``[B]`` (one flag per row).

    >>> a = deterministic_action(jnp.array([[2.0], [2.0]]), jnp.array([True, False]))
    >>> [round(float(v), 3) for v in a[:, 0]]
    [0.964, 1.0]
    """
    flag = jnp.asarray(squashed)
    flag = flag[:, None] if flag.ndim == 1 else flag
    return jnp.where(flag, jnp.tanh(mean), jnp.clip(mean, -1.0, 1.0))


def check_disjoint(select, test, name: str = "select_seeds") -> None:
    """Raises ``ValueError`` naming ``name`` if the selection and test episodes share a seed.

    >>> check_disjoint([1, 2], [3, 4])
    """
    shared = set(np.asarray(select).ravel().tolist()) & set(np.asarray(test).ravel().tolist())
    if shared:
        raise ValueError(
            f"{name}: selection and test episodes must not overlap, got shared seeds "
            f"{sorted(shared)[:5]}"
        )


def precision_ratio(actor: DiagGaussian, prior: DiagGaussian) -> np.ndarray:
    r"""Returns :math:`\lambda_P / \lambda_A = (s_A / s_P)^2` elementwise: how much the prior's
    precision outweighs the actor's in a PoE (``> 1``: the prior dominates the composed mean).

    >>> a = DiagGaussian(jnp.zeros(1), jnp.full(1, 2.0))
    >>> precision_ratio(a, DiagGaussian(jnp.zeros(1), jnp.ones(1))).tolist()
    [4.0]
    """
    return np.square(np.asarray(actor.std) / np.asarray(prior.std))
