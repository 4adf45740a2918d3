"""The contract a method package implements: one trainer shape, one state, one manifold protocol.

hexad's packages share a few shapes, much as BlackJAX's ``SamplingAlgorithm`` and optax's
``GradientTransformation`` give those libraries one shape each. A contributor who adds a method
builds on these names instead of defining new ones, and a user who knows one package's trainer
knows them all:

- :class:`Algorithm` ``(init, step)``: what a trainer factory returns. The factory closes over
  every static setting (sizes, flags, networks, optimisers, numbers of steps);
  ``init(key, example_batch) -> State`` and ``step(key, state, batch) -> (State, Info)`` are
  pure, so the user may ``jax.jit`` the step, ``jax.vmap`` it over seeds and ``jax.lax.scan`` it
  over minibatches. States and infos are ``typing.NamedTuple`` pytrees. (Pref-MH's sampler,
  :func:`hexad.prefmh.prefmh`, returns the same pair as BlackJAX's field names,
  :class:`hexad.prefmh.SamplingAlgorithm`.)
- :class:`TrainState` ``(params, opt_state, step)``: the state of a gradient trainer.
- :class:`Manifold`: what the geometry, OT and flow-matching code asks of a manifold. The
  manifolds of :mod:`hexad.geometry` satisfy it structurally, and so can a user's own class.
- :data:`DATA_AXIS`, the mesh convention: a function that can shard takes ``mesh=None`` and
  ``axis=DATA_AXIS``, splits the leading axis of its batch (or of its chains) along ``axis`` and
  lets XLA propagate the rest (:mod:`hexad.sharding` builds such meshes).

The trainers of the method packages have this shape: :func:`hexad.rwefm.make_trainer`,
:func:`hexad.backdoor.make_trainer`, :func:`hexad.backdoor.make_dtb` and :func:`hexad.policy.bc`
return an :class:`Algorithm` whose state is a :class:`TrainState`; :func:`hexad.policy.iql`,
:func:`hexad.policy.cql`, :func:`hexad.policy.sac` and :func:`hexad.policy.sf_td` return one
whose state holds several networks and their targets.

Inside the library these names are imported from the private ``hexad._base``, which imports no
other hexad module; this module re-exports them for users, studies and the reference.

>>> from hexad import base, geometry
>>> isinstance(geometry.Sphere(3), base.Manifold)
True
"""

from hexad._base import DATA_AXIS, Algorithm, Manifold, TrainState

__all__ = ["DATA_AXIS", "Algorithm", "Manifold", "TrainState"]
