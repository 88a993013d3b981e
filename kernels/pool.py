"""Pooling over NHWC int8 / fp16 tensors on the GPU, for deploy: the max-pool
(kernels/pool.cu, KernelMaxPool2d) between a network's stem and its first block, on the
stem's own output type (a max commutes with a positive scale and with rounding), and the
global average pool (kernels/avg_pool.cu, KernelGlobalAvgPool) before a classifier, on its
last layer's output type (int8 with its scale), fp16 out.

Built, cached and launched as kernels/small_kernel.py says (PDL on sm_90).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernels.small_kernel import ShapedKernel, compile_small
from kernels.spec import pair

VECTOR_BYTES = 16  # a thread's share of a pixel's channels


@dataclass(frozen=True)
class PoolShape:
    """A max-pool of an (n, c, h, w) tensor (ceil_mode off): windows, strides, padding and
    dilation as (rows, columns)."""

    n: int
    h: int
    w: int
    c: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    fp16: bool

    @classmethod
    def of(cls, x_shape: tuple[int, ...], kernel_size: Any, stride: Any, padding: Any,
           dilation: Any, fp16: bool) -> PoolShape:
        """From an NCHW shape and max_pool2d's arguments (stride None or empty: the window)."""
        n, c, h, w = (int(v) for v in x_shape)
        s = stride if stride not in (None, (), []) else kernel_size
        return cls(n, h, w, c, pair(kernel_size), pair(s), pair(padding), pair(dilation), fp16)

    @property
    def out_hw(self) -> tuple[int, int]:
        """Output rows and columns (PyTorch's formula without ceil_mode)."""
        return tuple(  # type: ignore[return-value]
            (size + 2 * p - d * (k - 1) - 1) // s + 1
            for size, k, s, p, d in zip((self.h, self.w), self.kernel, self.stride,
                                        self.padding, self.dilation, strict=True))

    @property
    def vectors(self) -> int:
        """16-byte vectors a pixel."""
        return self.c * (2 if self.fp16 else 1) // VECTOR_BYTES

    def problems(self) -> str | None:
        """Why the kernel cannot run this pooling, or None."""
        if min(self.n, self.h, self.w, self.c, *self.kernel, *self.stride, *self.dilation) < 1:
            return "sizes, windows, strides and dilations must be positive"
        if min(self.padding) < 0 or any(2 * p > d * (k - 1) + 1 for k, p, d in
                                        zip(self.kernel, self.padding, self.dilation,
                                            strict=True)):
            return "padding must be at most half the (dilated) window"
        if self.c * (2 if self.fp16 else 1) % VECTOR_BYTES:
            return f"a pixel's channels must fill 16-byte vectors ({self.c} channels)"
        if min(self.out_hw) < 1:
            return "the window is larger than the padded input"
        return None


def _check_input(what: str, x: Any, s: PoolShape | GlobalPoolShape) -> Any:
    """x's dtype (int8, or fp16 for an fp16 shape), after checking that x is such a CUDA
    tensor of the shape's size in channels_last memory."""
    import torch

    dtype = torch.float16 if s.fp16 else torch.int8
    if tuple(x.shape) != (s.n, s.c, s.h, s.w) or x.dtype != dtype or not x.is_cuda or \
            not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError(f"{what}: expected a {dtype} CUDA tensor of shape "
                         f"{(s.n, s.c, s.h, s.w)} in channels_last memory, got "
                         f"{x.dtype} {tuple(x.shape)} on {x.device}")
    return dtype


def pool_defines(shape: PoolShape) -> dict[str, int]:
    oh, ow = shape.out_hw
    return {"TP_FP16": int(shape.fp16), "TP_N": shape.n, "TP_H": shape.h, "TP_W": shape.w,
            "TP_V": shape.vectors, "TP_OH": oh, "TP_OW": ow, "TP_KH": shape.kernel[0],
            "TP_KW": shape.kernel[1], "TP_SH": shape.stride[0], "TP_SW": shape.stride[1],
            "TP_PH": shape.padding[0], "TP_PW": shape.padding[1], "TP_DH": shape.dilation[0],
            "TP_DW": shape.dilation[1]}


def compile_pool(shape: PoolShape, sm: int, ptx: bool = False) -> tuple[bytes | None, str]:
    """NVRTC compile of the pooling kernel for this shape. Returns (image or None, log)."""
    return compile_small("pool.cu", pool_defines(shape), sm, ptx)


class MaxPool2d(ShapedKernel):
    """y = max_pool2d(x) for int8 / fp16 tensors of `shape` in channels_last memory on a GPU
    of `sm` (`pdl`: programmatic dependent launch, sm_90; `ptx`: SmallKernel's)."""

    source, kernel_name, what = "pool.cu", "tc_max_pool", "max-pool"
    defines = staticmethod(pool_defines)

    @staticmethod
    def work(shape: PoolShape) -> int:
        return shape.n * shape.out_hw[0] * shape.out_hw[1] * shape.vectors

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        s = self.shape
        return (s.n, s.c, *s.out_hw)

    def __call__(self, x: Any) -> Any:
        import torch

        dtype = _check_input("max-pool", x, self.shape)
        y = torch.empty(self.output_shape, dtype=dtype, device=x.device,
                        memory_format=torch.channels_last)
        self.launch(x.device, [x.data_ptr(), y.data_ptr()])
        return y


AVG_VECTORS_A_BLOCK = 8  # avg_pool.cu's VB
MAX_AVG_PIXELS = 1 << 16  # int8 sums stay exact in float32 (avg_pool.cu)


@dataclass(frozen=True)
class GlobalPoolShape:
    """A global average pool of an (n, c, h, w) tensor to (n, c): int8 or fp16 in, fp16 out."""

    n: int
    h: int
    w: int
    c: int
    fp16: bool

    @property
    def vectors(self) -> int:
        """16-byte vectors a pixel."""
        return self.c * (2 if self.fp16 else 1) // VECTOR_BYTES

    def problems(self) -> str | None:
        """Why the kernel cannot run this pooling, or None."""
        if min(self.n, self.h, self.w, self.c) < 1:
            return "sizes must be positive"
        if self.c * (2 if self.fp16 else 1) % VECTOR_BYTES:
            return f"a pixel's channels must fill 16-byte vectors ({self.c} channels)"
        if self.h * self.w > MAX_AVG_PIXELS:
            return f"over {MAX_AVG_PIXELS} pixels an image"
        return None


def avg_pool_defines(shape: GlobalPoolShape) -> dict[str, int]:
    return {"TG_FP16": int(shape.fp16), "TG_HW": shape.h * shape.w, "TG_V": shape.vectors}


class GlobalAvgPool(ShapedKernel):
    """y[n, c] = scale * mean over the pixels of x[n, c] (int8 with its scale, or fp16 and
    no scale) in channels_last memory, fp16 out, on a GPU of `sm` (`pdl`: programmatic
    dependent launch, sm_90, the next kernel let in before this one waits; `ptx`:
    SmallKernel's)."""

    source, kernel_name, what = "avg_pool.cu", "tc_global_avg_pool", "average pool"
    defines = staticmethod(avg_pool_defines)

    @staticmethod
    def work(shape: GlobalPoolShape) -> int:
        blocks = shape.n * math.ceil(shape.vectors / AVG_VECTORS_A_BLOCK)
        return blocks * ShapedKernel.THREADS  # a block a VB-vector share of an image

    def __call__(self, x: Any, scale: float | None = None) -> Any:
        import ctypes

        import torch

        s = self.shape
        _check_input("average pool", x, s)
        if (scale is None) != s.fp16 or (scale is not None and not scale > 0):
            raise ValueError("average pool: int8 takes a positive scale, fp16 none")
        y = torch.empty((s.n, s.c), dtype=torch.float16, device=x.device)
        self.launch(x.device, [x.data_ptr(), y.data_ptr(),
                               ctypes.c_float((scale or 1.0) / (s.h * s.w))])
        return y
