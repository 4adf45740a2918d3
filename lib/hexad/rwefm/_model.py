"""The RWEFM vector field: a permutation-equivariant transformer on point clouds."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hexad._base import head_dtype
from hexad.geometry import Manifold

__all__ = ["VectorField", "time_embedding"]


def time_embedding(t: jax.Array, width: int) -> jax.Array:
    """Returns sinusoidal features ``[B, width]`` of times ``t [B]`` in ``[0, 1]``.

    >>> time_embedding(jnp.zeros(2), 8).shape
    (2, 8)
    """
    half = width // 2
    freqs = jnp.exp(-math.log(1000.0) * jnp.arange(half, dtype=jnp.float32) / max(half - 1, 1))
    ang = 1000.0 * t[:, None] * freqs[None, :]
    emb = jnp.concatenate([jnp.sin(ang), jnp.cos(ang)], axis=-1)
    if width % 2:
        emb = jnp.concatenate([emb, jnp.zeros((t.shape[0], 1), emb.dtype)], axis=-1)
    return emb


class VectorField(nn.Module):
    """A vector field on clouds: ``(x [B, n, d], mask [B, n], t [B], labels [B]) -> [B, n, d]``.

    Points are embedded through ``manifold.features`` (ambient coordinates; ``(cos, sin)``
    of angles on a torus; the coordinates themselves for a manifold without it), or through
    ``features_of.features`` when it is given (a flow in one geometry with another's input
    features: the Euclidean flow on angles with the torus's periodic features separates what
    the features do from what the transport does), the time
    embedding (and an optional label embedding) is added to every point, ``depth`` pre-norm
    transformer blocks with masked self-attention mix the points (no positional encoding, so
    the field is permutation-equivariant), and the output is projected onto ``T_x M`` and
    zeroed at padded points. Labels: ``num_classes > 0`` enables conditioning; the label
    ``num_classes`` is the null label used for classifier-free guidance.

    Attributes:
      manifold: the manifold (static).
      width: token width (static).
      depth: number of transformer blocks (static).
      heads: attention heads (static).
      num_classes: number of labels, 0 for an unconditional field (static).
      features_of: the manifold whose ``features`` embed the points (static); ``None``: the
        field's own ``manifold``. Its ``dim`` must equal ``manifold.dim``.
      dtype: compute dtype of the embeddings and transformer blocks (static). ``None``
        computes in the parameters' float32; ``jnp.bfloat16`` is mixed precision for
        accelerators: parameters stay float32, layer norms take their statistics in float32,
        and the head and the returned field are float32.

    >>> from hexad.geometry import Sphere
    >>> f = VectorField(Sphere(3), width=16, depth=1, heads=2)
    >>> x = Sphere(3).random_uniform(jax.random.key(0), (2, 5))
    >>> m, t = jnp.ones((2, 5), bool), jnp.zeros(2)
    >>> params = f.init(jax.random.key(1), x, m, t)
    >>> f.apply(params, x, m, t).shape
    (2, 5, 3)
    >>> from hexad.geometry import Euclidean, Torus
    >>> g = VectorField(Euclidean(2), width=16, depth=1, heads=2, features_of=Torus(2))
    >>> a = Torus(2).random_uniform(jax.random.key(0), (2, 5))
    >>> g.init(jax.random.key(1), a, m, t)["params"]["embed"]["kernel"].shape  # (cos, sin)
    (4, 16)
    """

    manifold: Manifold
    width: int = 64
    depth: int = 2
    heads: int = 4
    num_classes: int = 0
    dtype: Any = None
    features_of: Manifold | None = None

    def __post_init__(self):
        if self.features_of is not None and self.features_of.dim != self.manifold.dim:
            raise ValueError(
                f"features_of: expected a manifold of dim {self.manifold.dim} (the field's "
                f"manifold's), got {self.features_of} of dim {self.features_of.dim}"
            )
        super().__post_init__()

    @nn.compact
    def __call__(
        self, x: jax.Array, mask: jax.Array, t: jax.Array, labels: jax.Array | None = None
    ) -> jax.Array:
        dt = self.dtype
        embed_by = self.manifold if self.features_of is None else self.features_of
        feats = embed_by.features(x)
        h = nn.Dense(self.width, dtype=dt, name="embed")(feats)
        temb = time_embedding(t, self.width)
        temb = nn.Dense(self.width, dtype=dt)(nn.gelu(nn.Dense(self.width, dtype=dt)(temb)))
        h = h + temb[:, None, :]
        if self.num_classes > 0:
            if labels is None:
                labels = jnp.full(x.shape[:1], self.num_classes, jnp.int32)
            h = h + nn.Embed(self.num_classes + 1, self.width, dtype=dt)(labels)[:, None, :]
        attn_mask = mask[:, None, None, :]  # keys only: padded queries stay finite
        for _ in range(self.depth):
            y = nn.LayerNorm(dtype=dt)(h)
            y = nn.MultiHeadDotProductAttention(
                num_heads=self.heads, qkv_features=self.width, dtype=dt
            )(y, y, mask=attn_mask)
            h = h + y
            y = nn.LayerNorm(dtype=dt)(h)
            y = nn.Dense(self.width, dtype=dt)(nn.gelu(nn.Dense(2 * self.width, dtype=dt)(y)))
            h = h + y
        hd = head_dtype(dt)
        out = nn.Dense(x.shape[-1], kernel_init=nn.initializers.zeros, dtype=hd, name="head")(
            nn.LayerNorm(dtype=hd)(h)
        )
        return self.manifold.proj_tangent(x, out) * mask[..., None].astype(out.dtype)
