"""The tctune kernels as PyTorch custom ops, `torch.ops.tctune.fused_conv` (the fused
layers; `fused_conv_b2b` those with a back-to-back 1x1 conv), `torch.ops.tctune.max_pool`,
`torch.ops.tctune.quantize`, `torch.ops.tctune.global_avg_pool` and `torch.ops.tctune.linear`
(KernelMaxPool2d, Quantize, KernelGlobalAvgPool and KernelLinear on the GPU), so that
`torch.compile` sees each tctune kernel as one opaque call with a known output (shape, dtype,
channels_last strides) and compiles the PyTorch ops around it (casts, the ops a fused layer
could not absorb) instead of breaking its graph at every layer.

An op takes the activations and the module's id; the module (its weights, scales, executor)
is looked up in a registry of live modules, so its buffers never become graph inputs and a
layer's int8 scales and schedule set after compilation are the ones it runs with. Ids differ
between processes: Inductor's on-disk cache keys a compiled graph by its ops' arguments, and
the code compiled for one process's module 1 must never run another process's module 1,
whose output can differ in shape (a stem over pixel pairs or not) where the graph does not.
"""

from __future__ import annotations

import itertools
import secrets
import weakref
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from deploy.module import FusedConv, SmallKernelModule

_LAYERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_IDS = itertools.count(secrets.randbits(40) << 20)  # this process's ids (see above)
OPS: list[str] = []  # the ops this module defines, as _custom_op adds them


def _custom_op(name: str) -> Any:
    """torch.library.custom_op for `tctune::name`, no mutated arguments, listed in OPS
    (register_inductor_fallbacks)."""
    OPS.append(name)
    return torch.library.custom_op(f"tctune::{name}", mutates_args=())


def register(layer: FusedConv | SmallKernelModule) -> int:
    """A process-unique id for a module that runs a kernel (dropped with the module)."""
    uid = next(_IDS)
    _LAYERS[uid] = layer
    return uid


def _layer(uid: int) -> Any:
    layer = _LAYERS.get(uid)
    if layer is None:
        raise RuntimeError(f"tctune layer {uid} no longer exists")
    return layer


def _channels_last_like(x: torch.Tensor, size: tuple[int, int, int, int],
                        dtype: torch.dtype) -> torch.Tensor:
    """An empty NCHW tensor of this size in channels_last memory (the kernels' NHWC), for
    the fake implementations."""
    n, c, h, w = size
    return x.new_empty_strided(size, (h * w * c, 1, w * c, c), dtype=dtype)


@_custom_op("fused_conv")
def fused_conv(x: torch.Tensor, residual: torch.Tensor | None, x1: torch.Tensor | None,
               uid: int) -> torch.Tensor:
    """y = the fused layer `uid` on x (and its residual, and its second input x1), on the
    layer's executor: NCHW tensors in channels_last memory in and out."""
    return _layer(uid).execute(x, residual, x1)


@fused_conv.register_fake
def _(x: torch.Tensor, residual: torch.Tensor | None, x1: torch.Tensor | None,
      uid: int) -> torch.Tensor:
    layer = _layer(uid)
    return _conv_output_like(x, layer, layer.out_channels)


def _conv_output_like(x: torch.Tensor, layer: Any, channels: int) -> torch.Tensor:
    """An empty output of the fused layer for input x, of `channels` channels (the layer's,
    or its back-to-back conv's)."""
    s = layer.shape_for(x.shape)
    return _channels_last_like(x, (s.n, channels, s.p, s.q), layer.out_dtype)


@_custom_op("fused_conv_b2b")
def fused_conv_b2b(x: torch.Tensor, residual: torch.Tensor | None, x1: torch.Tensor | None,
                   uid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, y2) = the fused layer `uid` with its back-to-back 1x1 conv (FusedConv.take_b2b):
    its output and that conv's, channels_last."""
    return _layer(uid).execute(x, residual, x1)


@fused_conv_b2b.register_fake
def _(x: torch.Tensor, residual: torch.Tensor | None, x1: torch.Tensor | None,
      uid: int) -> tuple[torch.Tensor, torch.Tensor]:
    layer = _layer(uid)
    return _conv_output_like(x, layer, layer.out_channels), \
        _conv_output_like(x, layer, layer.b2b)


@_custom_op("max_pool")
def max_pool(x: torch.Tensor, uid: int) -> torch.Tensor:
    """y = the KernelMaxPool2d `uid` on x (int8 or fp16, channels_last memory) on the GPU."""
    return _layer(uid).execute(x)


@max_pool.register_fake
def _(x: torch.Tensor, uid: int) -> torch.Tensor:
    return _channels_last_like(x, _layer(uid).output_shape_for(x.shape), x.dtype)


@_custom_op("quantize")
def quantize(x: torch.Tensor, uid: int) -> torch.Tensor:
    """y = the Quantize `uid` on x (float32 or fp16) on the GPU: NHWC, padded channels."""
    return _layer(uid).execute(x)


@quantize.register_fake
def _(x: torch.Tensor, uid: int) -> torch.Tensor:
    layer = _layer(uid)
    return _channels_last_like(x, layer.output_shape_for(x.shape), layer.out_dtype)


@_custom_op("global_avg_pool")
def global_avg_pool(x: torch.Tensor, uid: int) -> torch.Tensor:
    """y = the KernelGlobalAvgPool `uid` on x (int8 or fp16, channels_last) on the GPU: fp16
    rows [N, C]."""
    return _layer(uid).execute(x)


@global_avg_pool.register_fake
def _(x: torch.Tensor, uid: int) -> torch.Tensor:
    return x.new_empty(tuple(int(v) for v in x.shape[:2]), dtype=torch.float16)


@_custom_op("linear")
def linear(x: torch.Tensor, uid: int) -> torch.Tensor:
    """y = the KernelLinear `uid` on x (fp16 rows) on the GPU, in the layer's out_dtype."""
    return _layer(uid).execute(x)


@linear.register_fake
def _(x: torch.Tensor, uid: int) -> torch.Tensor:
    layer = _layer(uid)
    return x.new_empty(layer.output_shape_for(x.shape), dtype=layer.out_dtype)


def register_inductor_fallbacks() -> None:
    """Give Inductor each tctune op's fallback before it compiles a model. It would make one
    itself the first time a compiled graph calls the op, and torch 2.11 formats that call
    for a log line as it does, logged or not: each argument's whole IR, which for an op at
    the end of a deep network (the classifier after ResNet-50's 16 residual blocks) grows
    exponentially and stalls the compile. The fallback is the one Inductor would make: the
    layout constraint of the op's tags, else Inductor's default for custom ops."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag

    for name in OPS:
        op = getattr(torch.ops.tctune, name).default
        if op not in lowering.lowerings:
            tag = get_layout_constraint_tag(op, with_default=True)
            lowering.make_fallback(op, layout_constraint=lowering.tag_to_layout_constraint(tag))
