"""A model's input into its first fused layer's domain on the GPU (kernels/quantize.cu), for
deploy's Quantize: float32 or fp16 in (any strides), NHWC out with the layer's channel count
(the few channels of a stem padded with zeros to one 4-, 8- or 16-byte word a pixel; for a
stem over pixel pairs, zero pixels around each row too), int8
quantized with a per-tensor scale exactly as `deploy.calibrate.quantize`, or fp16 cast.
Built, cached and launched as kernels/small_kernel.py says (PDL on sm_90).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kernels.small_kernel import ShapedKernel, compile_small


@dataclass(frozen=True)
class QuantizeShape:
    """An (n, c, h, w) input of `in_fp16` (else float32) values into (n, channels, h, w),
    int8 or (`out_fp16`) fp16."""

    n: int
    c: int
    h: int
    w: int
    channels: int
    in_fp16: bool
    out_fp16: bool
    pad_left: int = 0  # zero pixels before each output row (kernels.spec.pixel_pairs)
    pad_right: int = 0  # and after it

    @property
    def out_w(self) -> int:
        return self.w + self.pad_left + self.pad_right

    def problems(self) -> str | None:
        """Why the kernel cannot run this conversion, or None."""
        if min(self.n, self.c, self.h, self.w) < 1 or min(self.pad_left, self.pad_right) < 0:
            return "sizes must be positive (padding not negative)"
        if self.channels * (2 if self.out_fp16 else 1) not in (4, 8, 16) or \
                self.c > self.channels:
            return ("the kernel writes a pixel as one 4-, 8- or 16-byte word, of at least "
                    "the input's channels")
        return None


def quantize_defines(shape: QuantizeShape) -> dict[str, int]:
    return {"TQ_IN_FP16": int(shape.in_fp16), "TQ_OUT_FP16": int(shape.out_fp16),
            "TQ_PIXELS": shape.n * shape.h * shape.out_w, "TQ_H": shape.h, "TQ_W": shape.w,
            "TQ_PADL": shape.pad_left, "TQ_WO": shape.out_w, "TQ_C": shape.c,
            "TQ_CP": shape.channels}


def compile_quantize(shape: QuantizeShape, sm: int, ptx: bool = False
                     ) -> tuple[bytes | None, str]:
    """NVRTC compile of the kernel for this shape. Returns (image or None, log)."""
    return compile_small("quantize.cu", quantize_defines(shape), sm, ptx)


class QuantizeInput(ShapedKernel):
    """y = the input as the first fused layer reads it (int8 with `scale`, or fp16), NHWC
    with `shape.channels` channels and the shape's zero pixels around each row, on a GPU of
    `sm` (`pdl`: programmatic dependent launch; `ptx`: SmallKernel's)."""

    source, kernel_name, what = "quantize.cu", "tc_quantize", "quantize"
    defines = staticmethod(quantize_defines)

    @staticmethod
    def work(shape: QuantizeShape) -> int:
        return shape.n * shape.h * shape.out_w  # a thread an output pixel

    def __call__(self, x: Any, scale: float | None = None) -> Any:
        import ctypes

        import torch

        s = self.shape
        dtype = torch.float16 if s.in_fp16 else torch.float32
        if tuple(x.shape) != (s.n, s.c, s.h, s.w) or x.dtype != dtype or not x.is_cuda:
            raise ValueError(f"quantize: expected a {dtype} CUDA tensor of shape "
                             f"{(s.n, s.c, s.h, s.w)}, got {x.dtype} {tuple(x.shape)} on "
                             f"{x.device}")
        if (scale is None) != s.out_fp16 or (scale is not None and not scale > 0):
            raise ValueError("quantize: int8 takes a positive scale, fp16 none")
        y = torch.empty((s.n, s.channels, s.h, s.out_w), device=x.device,
                        dtype=torch.float16 if s.out_fp16 else torch.int8,
                        memory_format=torch.channels_last)
        sn, sc, sh, sw = (ctypes.c_longlong(v) for v in x.stride())
        self.launch(x.device, [ctypes.c_void_p(x.data_ptr()), sn, sc, sh, sw,
                               ctypes.c_void_p(y.data_ptr()), ctypes.c_float(scale or 1.0)])
        return y
