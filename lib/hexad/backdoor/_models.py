"""Small flax CNNs sized for CPU, with per-neuron (channel) scales for pruning defenses.

Pruning and neuron-perturbation defenses (FP, ANP, CLP, RNP) act on channels. Both models
expose them directly: each conv layer ``conv{i}`` computes ``scale * (W * h) + bias_scale *
b``, where ``scale`` and ``bias_scale`` are per-channel vectors (ones by default), and in
:class:`PreActResNet` each GroupNorm ``norm{i}`` computes ``scale * gamma * xhat +
bias_scale * beta`` from the same arguments keyed by its name. A mask is baked into
parameters by :func:`apply_channel_mask`. Neither model keeps batch statistics (no batch
normalisation), so parameters are one plain pytree that every defense, optimiser and
checkpoint handles alike. A zeroed conv channel of :class:`SmallCNN` or a zeroed GroupNorm
channel is exactly zero after its ReLU; a zeroed conv channel of :class:`PreActResNet`
zeroes that channel of the residual branch before the next GroupNorm (which then outputs
its bias there, and its group's statistics change). ANP and RNP therefore mask the
GroupNorms where a model has them (:func:`mask_layers`), as BackdoorBench masks its
ResNets' batch norms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hexad._base import head_dtype

__all__ = [
    "PreActResNet",
    "SmallCNN",
    "apply_channel_mask",
    "channel_count",
    "conv_layers",
    "head_input_layer",
    "mask_layers",
    "norm_layers",
]


def _conv_kernel_init(key, shape, dtype=jnp.float32):
    """Returns flax's default conv kernel init (LeCun normal: truncated normal of variance
    ``1 / fan_in``, ``fan_in = kh * kw * c_in``) for a ``[kh, kw, c_in, c_out]`` kernel,
    drawn as a ``[kh * kw * c_in, c_out]`` matrix and reshaped.

    Same distribution as ``nn.initializers.lecun_normal()`` on the 4-D shape, but XLA:CPU
    compiles the partitionable threefry sampler on 4-D shapes about ten times more slowly
    than on the 2-D one, and that compile dominates a model's ``init``.
    """
    flat = (math.prod(shape[:-1]), shape[-1])
    return nn.initializers.lecun_normal()(key, flat, dtype).reshape(shape)


def _chan(v):
    """Reshapes a per-channel vector to ``[1, 1, 1, c]`` (no implicit rank promotion)."""
    return jnp.reshape(v, (1, 1, 1, -1)) if jnp.ndim(v) else v


def _scaled(z, scale, bias):
    """``z * scale + bias`` per channel, in ``z``'s dtype (a bfloat16 layer stays bfloat16)."""
    return z * _chan(jnp.asarray(scale, z.dtype)) + _chan(jnp.asarray(bias, z.dtype))


def _widen(feats, dtype):
    """The features a caller reads, in ``head_dtype(dtype)`` (float32 under bfloat16)."""
    hd = head_dtype(dtype)
    return feats if hd is None else {k: v.astype(hd) for k, v in feats.items()}


class SmallCNN(nn.Module):
    """A small CNN: ``len(widths)`` 3x3 conv + ReLU layers (2x2 average pooling between them),
    flatten, a ReLU dense layer of ``hidden`` units and a linear head.

    Attributes:
      num_classes: number of classes (static).
      widths: channels of each conv layer (static).
      hidden: units of the dense layer (static).
      dtype: compute dtype of the conv and dense layers (static; ``None``: the parameters'
        float32, ``jnp.bfloat16``: mixed precision). Parameters stay float32; the head, the
        logits and the returned features are float32 under bfloat16.

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
    dtype: Any = None

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
            z = nn.Conv(
                w,
                (3, 3),
                padding="SAME",
                use_bias=False,
                kernel_init=_conv_kernel_init,
                dtype=self.dtype,
                name=name,
            )(h)
            b = self.param(f"{name}_bias", nn.initializers.zeros, (w,), jnp.float32)
            s = scales[name] if scales is not None and name in scales else 1.0
            bs = bias_scales[name] if bias_scales is not None and name in bias_scales else 1.0
            h = nn.relu(_scaled(z, s, b * bs))
            feats[name] = h
            if i < len(self.widths) - 1:
                h = nn.avg_pool(h, (2, 2), (2, 2))
        h = h.reshape(h.shape[0], -1)
        h = nn.relu(nn.Dense(self.hidden, dtype=self.dtype, name="fc")(h))
        feats["fc"] = h
        logits = nn.Dense(self.num_classes, dtype=head_dtype(self.dtype), name="head")(h)
        return (logits, _widen(feats, self.dtype)) if features else logits


class PreActResNet(nn.Module):
    """A small pre-activation ResNet (He et al., arXiv 1603.05027, fig. 4e), sized for CPU.

    A 3x3 stem conv ``conv0`` of ``widths[0]`` channels, then one pre-activation basic block
    per entry of ``widths`` (stage ``s``: ``norm -> ReLU -> conv{2s+1}`` (stride 2 from the
    second stage on) ``-> norm -> ReLU -> conv{2s+2}``, plus the skip path: identity, or a
    1x1 conv ``short{s}`` of the pre-activated input where the shape changes, as in
    PreAct-ResNet18 that BackdoorBench uses), then ``norm -> ReLU``, global average pooling
    and a linear head. Normalisation is GroupNorm (Wu & He, arXiv 1803.08494) in place of
    batch norm: it keeps no running statistics, so the model stays a pure ``apply`` of one
    parameter pytree (masks, fine-tuning and the DTB unrolled inner loop need no mutable
    state), and behaves the same on a batch of one.

    Attributes:
      num_classes: number of classes (static).
      widths: channels of each stage (static); each a multiple of ``groups``.
      groups: GroupNorm groups per layer (static).
      dtype: compute dtype, as in :class:`SmallCNN` (GroupNorm takes its statistics in
        float32).

    Call as :class:`SmallCNN`: ``model.apply(params, x, scales=None, bias_scales=None,
    features=False)``, ``x`` ``[n, H, W, C]`` -> logits ``[n, num_classes]``; with
    ``features``, ``feats`` maps ``conv{i}`` to ``relu`` of its (scaled) output
    ``[n, h, w, c]`` and ``"fc"`` to the pooled penultimate features ``[n, widths[-1]]``.

    >>> m = PreActResNet(num_classes=10, widths=(4, 8), groups=2)
    >>> p = m.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
    >>> m.apply(p, jnp.zeros((2, 8, 8, 1))).shape
    (2, 10)
    """

    num_classes: int = 10
    widths: Sequence[int] = (8, 16, 32)
    groups: int = 4
    dtype: Any = None

    @nn.compact
    def __call__(
        self,
        x,
        scales: Mapping[str, jax.Array] | None = None,
        bias_scales: Mapping[str, jax.Array] | None = None,
        features: bool = False,
    ):
        for w in self.widths:
            if w % self.groups:
                raise ValueError(f"widths: expected multiples of groups={self.groups}, got {w}")
        feats = {}

        def conv(h, i, width, stride):
            name = f"conv{i}"
            z = nn.Conv(
                width,
                (3, 3),
                (stride, stride),
                padding="SAME",
                use_bias=False,
                kernel_init=_conv_kernel_init,
                dtype=self.dtype,
                name=name,
            )(h)
            b = self.param(f"{name}_bias", nn.initializers.zeros, (width,), jnp.float32)
            s = scales[name] if scales is not None and name in scales else 1.0
            bs = bias_scales[name] if bias_scales is not None and name in bias_scales else 1.0
            z = _scaled(z, s, b * bs)
            feats[name] = nn.relu(z)
            return z

        def pre(h, name):
            gn = nn.GroupNorm(num_groups=self.groups, dtype=self.dtype, name=name)
            y = gn(h)
            s = scales.get(name) if scales is not None else None
            bs = bias_scales.get(name) if bias_scales is not None else None
            if s is not None or bs is not None:  # y = s gamma xhat + bs beta, per channel
                beta = jnp.asarray(gn.variables["params"]["bias"], y.dtype)
                s = 1.0 if s is None else _chan(jnp.asarray(s, y.dtype))
                bs = 1.0 if bs is None else _chan(jnp.asarray(bs, y.dtype))
                y = (y - _chan(beta)) * s + _chan(beta) * bs
            return nn.relu(y)

        h = conv(x, 0, self.widths[0], 1)
        for s_, w in enumerate(self.widths):
            stride = 1 if s_ == 0 else 2
            a = pre(h, f"norm{2 * s_}")
            if stride != 1 or h.shape[-1] != w:
                skip = nn.Conv(
                    w,
                    (1, 1),
                    (stride, stride),
                    use_bias=False,
                    kernel_init=_conv_kernel_init,
                    dtype=self.dtype,
                    name=f"short{s_}",
                )(a)
            else:
                skip = h
            z = conv(a, 2 * s_ + 1, w, stride)
            z = conv(pre(z, f"norm{2 * s_ + 1}"), 2 * s_ + 2, w, 1)
            h = z + skip
        h = pre(h, "norm_out")
        h = jnp.mean(h, axis=(1, 2))
        feats["fc"] = h
        logits = nn.Dense(self.num_classes, dtype=head_dtype(self.dtype), name="head")(h)
        return (logits, _widen(feats, self.dtype)) if features else logits


def conv_layers(params) -> tuple[str, ...]:
    """Returns the names of the conv layers in ``params`` (``conv0``, ``conv1``, ...) in order.

    >>> conv_layers({"params": {"conv0": {}, "conv0_bias": 0, "fc": {}}})
    ('conv0',)
    """
    p = params["params"]
    names = [k for k in p if k.startswith("conv") and not k.endswith("_bias")]
    return tuple(sorted(names, key=lambda s: int(s[4:])))


def norm_layers(params) -> tuple[str, ...]:
    """Returns the names of the normalisation layers in ``params`` (``norm0``, ...,
    ``norm_out``; none in :class:`SmallCNN`) in order.

    >>> norm_layers({"params": {"conv0": {}, "norm1": {}, "norm0": {}, "norm_out": {}}})
    ('norm0', 'norm1', 'norm_out')
    """
    names = [k for k in params["params"] if k.startswith("norm")]
    return tuple(sorted(names, key=lambda s: (s == "norm_out", s[4:].zfill(4))))


def mask_layers(params) -> tuple[str, ...]:
    """Returns the layers whose channels the neuron-mask defenses (ANP, RNP) perturb and
    prune: the normalisation layers where the model has them (BackdoorBench masks the batch
    norms' per-channel affine in its ResNets; here the GroupNorms'), else the conv layers.

    >>> mask_layers({"params": {"conv0": {}, "conv0_bias": 0}})
    ('conv0',)
    """
    return norm_layers(params) or conv_layers(params)


def head_input_layer(params) -> str:
    """Returns the layer whose channels are the inputs of the model's head (the features
    fine-pruning ranks and prunes, as BackdoorBench masks the input features of the final
    linear layer): ``"norm_out"`` where the model has it (:class:`PreActResNet`: masking its
    affine scale and bias zeroes that channel after its ReLU, i.e. the pooled feature
    ``"fc"`` the head reads, post-residual and post-pool), else the last conv layer
    (:class:`SmallCNN`, whose dense layer ``fc`` reads the last conv layer's channels).

    >>> head_input_layer({"params": {"conv0": {}, "conv1": {}, "norm_out": {}}})
    'norm_out'
    >>> head_input_layer({"params": {"conv0": {}, "conv0_bias": 0, "conv1": {}}})
    'conv1'
    """
    if "norm_out" in params["params"]:
        return "norm_out"
    convs = conv_layers(params)
    if not convs:
        raise ValueError("params: expected a model with conv layers or a norm_out layer")
    return convs[-1]


def head_activation(feats, layer: str) -> jax.Array:
    """``[c]``: the mean over images (and positions) of the channels of ``layer`` that the
    head reads (``layer`` from :func:`head_input_layer`; ``feats`` a model's ``features=True``
    output): for a normalisation layer (``norm_out``) the pooled ``"fc"`` features, for a conv
    layer its own post-ReLU output. Fine-pruning ranks channels by it."""
    f = feats[layer] if layer.startswith("conv") else feats["fc"]
    return jnp.mean(f.reshape(-1, f.shape[-1]), axis=0)


def channel_count(params, layer: str) -> int:
    """Returns the number of channels of ``layer`` (a conv or a normalisation layer)."""
    p = params["params"][layer]
    return int((p["kernel"] if "kernel" in p else p["scale"]).shape[-1])


def apply_channel_mask(params, masks: Mapping[str, jax.Array]):
    """Returns ``params`` with channel ``c`` of layer ``l`` scaled by ``masks[l][c]``.

    Scaling a conv kernel's output channel and its bias by the same factor equals scaling
    the pre-activation, so a 0/1 mask prunes conv channels exactly (no batch norm in
    :class:`SmallCNN`). For a normalisation layer the factor scales its affine scale and
    bias, so a zero makes that channel exactly zero after its ReLU, as the models' ``scales``
    and ``bias_scales`` arguments do.

    Args:
      params: SmallCNN parameters.
      masks: layer name -> ``[c]`` per-channel factors.

    >>> p = {"params": {"conv0": {"kernel": jnp.ones((3, 3, 1, 2))}, "conv0_bias": jnp.ones(2)}}
    >>> apply_channel_mask(p, {"conv0": jnp.array([1.0, 0.0])})["params"]["conv0_bias"]
    Array([1., 0.], dtype=float32)
    """
    inner = dict(params["params"])
    for name, m in masks.items():
        if name not in inner or name.endswith("_bias"):
            known = conv_layers(params) + norm_layers(params)
            raise ValueError(f"masks: unknown layer {name!r}; layers: {known}")
        if "scale" in inner[name]:  # a normalisation layer: its affine scale and bias
            g = inner[name]["scale"]
            if m.shape != g.shape:
                raise ValueError(f"masks[{name!r}]: expected shape [{g.shape[0]}], got {m.shape}")
            mm = m.astype(g.dtype)
            inner[name] = {**inner[name], "scale": g * mm, "bias": inner[name]["bias"] * mm}
            continue
        k = inner[name]["kernel"]
        if m.shape != (k.shape[-1],):
            raise ValueError(f"masks[{name!r}]: expected shape [{k.shape[-1]}], got {m.shape}")
        inner[name] = {**inner[name], "kernel": k * _chan(m.astype(k.dtype))}
        inner[f"{name}_bias"] = inner[f"{name}_bias"] * m.astype(k.dtype)
    return {**params, "params": inner}
