"""Small flax CNNs sized for CPU, with per-neuron (channel) scales for pruning defenses.

Pruning and neuron-perturbation defenses (FP, ANP, CLP, RNP) act on conv channels. The CNN
exposes them directly: each conv layer ``conv{i}`` computes ``scale * (W * h) + bias_scale *
b`` before its ReLU, where ``scale`` and ``bias_scale`` are per-channel vectors (ones by
default). A mask is baked into parameters by :func:`apply_channel_mask`. There is no batch
normalisation, so a zeroed channel is exactly zero after the ReLU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

__all__ = ["SmallCNN", "apply_channel_mask", "conv_layers"]


def _chan(v):
    """Reshapes a per-channel vector to ``[1, 1, 1, c]`` (no implicit rank promotion)."""
    return jnp.reshape(v, (1, 1, 1, -1)) if jnp.ndim(v) else v


class SmallCNN(nn.Module):
    """A small CNN: ``len(widths)`` 3x3 conv + ReLU layers (2x2 average pooling between them),
    flatten, a ReLU dense layer of ``hidden`` units and a linear head.

    Attributes:
      num_classes: number of classes (static).
      widths: channels of each conv layer (static).
      hidden: units of the dense layer (static).

    Call as ``model.apply(params, x, scales=None, bias_scales=None, features=False)`` with
    ``x`` of shape ``[n, H, W, C]``; returns logits ``[n, num_classes]``, or
    ``(logits, feats)`` when ``features`` where ``feats`` maps ``conv{i}`` to its post-ReLU
    activations ``[n, h, w, c]`` and ``"fc"`` to the penultimate ``[n, hidden]``.

    >>> m = SmallCNN(num_classes=10, widths=(4, 8), hidden=16)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> m.apply(p, jnp.zeros((2, 8, 8, 1))).shape
    (2, 10)
    """

    num_classes: int = 10
    widths: Sequence[int] = (16, 32, 32)
    hidden: int = 64

    @nn.compact
    def __call__(
        self,
        x,
        scales: Mapping[str, jax.Array] | None = None,
        bias_scales: Mapping[str, jax.Array] | None = None,
        features: bool = False,
    ):
        feats = {}
        h = x
        for i, w in enumerate(self.widths):
            name = f"conv{i}"
            z = nn.Conv(w, (3, 3), padding="SAME", use_bias=False, name=name)(h)
            b = self.param(f"{name}_bias", nn.initializers.zeros, (w,), z.dtype)
            s = scales[name] if scales is not None and name in scales else 1.0
            bs = bias_scales[name] if bias_scales is not None and name in bias_scales else 1.0
            h = nn.relu(z * _chan(s) + _chan(b * bs))
            feats[name] = h
            if i < len(self.widths) - 1:
                h = nn.avg_pool(h, (2, 2), (2, 2))
        h = h.reshape(h.shape[0], -1)
        h = nn.relu(nn.Dense(self.hidden, name="fc")(h))
        feats["fc"] = h
        logits = nn.Dense(self.num_classes, name="head")(h)
        return (logits, feats) if features else logits


def conv_layers(params) -> tuple[str, ...]:
    """Returns the names of the conv layers in ``params`` (``conv0``, ``conv1``, ...) in order.

    >>> conv_layers({"params": {"conv0": {}, "conv0_bias": 0, "fc": {}}})
    ('conv0',)
    """
    p = params["params"]
    names = [k for k in p if k.startswith("conv") and not k.endswith("_bias")]
    return tuple(sorted(names, key=lambda s: int(s[4:])))


def apply_channel_mask(params, masks: Mapping[str, jax.Array]):
    """Returns ``params`` with conv channel ``c`` of layer ``l`` scaled by ``masks[l][c]``.

    Scaling the kernel's output channel and the bias by the same factor equals scaling the
    pre-activation, so a 0/1 mask prunes channels exactly (no batch norm in :class:`SmallCNN`).

    Args:
      params: SmallCNN parameters.
      masks: layer name -> ``[c]`` per-channel factors.

    >>> p = {"params": {"conv0": {"kernel": jnp.ones((3, 3, 1, 2))}, "conv0_bias": jnp.ones(2)}}
    >>> apply_channel_mask(p, {"conv0": jnp.array([1.0, 0.0])})["params"]["conv0_bias"]
    Array([1., 0.], dtype=float32)
    """
    inner = dict(params["params"])
    for name, m in masks.items():
        if name not in inner:
            raise ValueError(f"masks: unknown layer {name!r}; layers: {conv_layers(params)}")
        k = inner[name]["kernel"]
        if m.shape != (k.shape[-1],):
            raise ValueError(f"masks[{name!r}]: expected shape [{k.shape[-1]}], got {m.shape}")
        inner[name] = {**inner[name], "kernel": k * _chan(m.astype(k.dtype))}
        inner[f"{name}_bias"] = inner[f"{name}_bias"] * m.astype(k.dtype)
    return {**params, "params": inner}
