"""A fully connected layer over a few rows on the GPU (kernels/linear.cu), for deploy's
KernelLinear: a classifier after its network's pooling (ResNet-50's 2048 -> 1000 at batch
8). fp16 x and weights, fp32 sums (on the Tensor Cores) and bias, fp16 or fp32 y. Built,
cached and launched as kernels/small_kernel.py says (PDL on sm_90).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kernels.small_kernel import ShapedKernel, compile_small

OUTPUTS_A_BLOCK = 8  # linear.cu's OUTS: the mma tile's N
MAX_ROWS = 16  # the mma tile's M
MAX_IN_FEATURES = 4096  # a warp's share of its weight rows is held in registers


@dataclass(frozen=True)
class LinearShape:
    """y[rows, out_features] = x[rows, in_features] w^T + bias; y in fp32 or fp16."""

    rows: int
    in_features: int
    out_features: int
    out_fp32: bool = False

    def problems(self) -> str | None:
        """Why the kernel cannot run this layer, or None."""
        if min(self.rows, self.in_features, self.out_features) < 1:
            return "sizes must be positive"
        if self.rows > MAX_ROWS:
            return f"more than {MAX_ROWS} rows (a GEMM's case)"
        if self.in_features % 8:
            return "in_features must be a multiple of 8 (16-byte vectors of fp16)"
        if self.in_features > MAX_IN_FEATURES:
            return f"in_features over {MAX_IN_FEATURES}"
        return None


def linear_defines(shape: LinearShape) -> dict[str, int]:
    return {"TL_N": shape.rows, "TL_C": shape.in_features, "TL_J": shape.out_features,
            "TL_F32": int(shape.out_fp32)}


def compile_linear(shape: LinearShape, sm: int, ptx: bool = False) -> tuple[bytes | None, str]:
    """NVRTC compile of the kernel for this shape. Returns (image or None, log)."""
    return compile_small("linear.cu", linear_defines(shape), sm, ptx)


class Linear(ShapedKernel):
    """y = x w^T + bias for fp16 x [rows, in_features] and w [out_features, in_features]
    (contiguous), fp32 bias, on a GPU of `sm` (`pdl`: programmatic dependent launch, sm_90;
    `ptx`: SmallKernel's)."""

    source, kernel_name, what = "linear.cu", "tc_linear", "linear"
    defines = staticmethod(linear_defines)

    @staticmethod
    def work(shape: LinearShape) -> int:
        return math.ceil(shape.out_features / OUTPUTS_A_BLOCK) * ShapedKernel.THREADS

    def __call__(self, x: Any, weight: Any, bias: Any) -> Any:
        import torch

        s = self.shape
        for name, t, shape, dtype in (("x", x, (s.rows, s.in_features), torch.float16),
                                      ("weight", weight, (s.out_features, s.in_features),
                                       torch.float16),
                                      ("bias", bias, (s.out_features,), torch.float32)):
            if tuple(t.shape) != shape or t.dtype != dtype or not t.is_cuda or \
                    not t.is_contiguous() or t.device != x.device:
                raise ValueError(f"linear: {name} must be a contiguous {dtype} tensor of shape "
                                 f"{shape} on x's GPU, got {t.dtype} {tuple(t.shape)} on "
                                 f"{t.device}")
        y = torch.empty((s.rows, s.out_features), device=x.device,
                        dtype=torch.float32 if s.out_fp32 else torch.float16)
        self.launch(x.device, [x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr()])
        return y
