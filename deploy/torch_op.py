"""The fused layers as one PyTorch custom op, `torch.ops.tctune.fused_conv`, so that
`torch.compile` sees each tctune kernel as one opaque call with a known output (shape, dtype,
channels_last strides) and compiles the PyTorch ops around it (casts, pooling, the ops a
fused layer could not absorb) instead of breaking its graph at every layer.

The op takes the activations and the layer's id; the layer (its weights, scales, executor)
is looked up in a registry of live `FusedConv` modules, so its buffers never become graph
inputs and a layer's int8 scales set after compilation are the ones it runs with.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from deploy.module import FusedConv

_LAYERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


def register(layer: FusedConv) -> int:
    """A process-unique id for a fused layer (dropped with the layer)."""
    uid = next(_IDS)
    _LAYERS[uid] = layer
    return uid


def _layer(uid: int) -> FusedConv:
    layer = _LAYERS.get(uid)
    if layer is None:
        raise RuntimeError(f"tctune fused layer {uid} no longer exists")
    return layer  # type: ignore[no-any-return]


@torch.library.custom_op("tctune::fused_conv", mutates_args=())
def fused_conv(x: torch.Tensor, residual: torch.Tensor | None, x1: torch.Tensor | None,
               uid: int) -> torch.Tensor:
    """y = the fused layer `uid` on x (and its residual, and its second input x1), on the
    layer's executor: NCHW tensors in channels_last memory in and out."""
    return _layer(uid).execute(x, residual, x1)


@fused_conv.register_fake
def _(x: torch.Tensor, residual: torch.Tensor | None, x1: torch.Tensor | None,
      uid: int) -> torch.Tensor:
    layer = _layer(uid)
    s = layer.shape_for(x.shape)
    size = (s.n, layer.out_channels, s.p, s.q)
    stride = (s.p * s.q * layer.out_channels, 1, s.q * layer.out_channels, layer.out_channels)
    return x.new_empty_strided(size, stride, dtype=layer.out_dtype)
