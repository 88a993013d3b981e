"""GPU check of the runtime's fp32_tc path: values far outside fp16's range (1e5, 1e-5),
with and without caller-given bounds, on CuPy and torch, against a float64 reference."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernels.reference import conv_ref, fp32_tc_rel_tol  # noqa: E402
from kernels.runtime import Conv2d  # noqa: E402
from kernels.spec import ConvShape, Precision  # noqa: E402


def main() -> int:
    import cupy
    import torch

    shape = ConvShape(2, 14, 14, 64, 32, 3, 3, pad=(1, 1))
    conv = Conv2d(shape, "fp32_tc", target=None)
    rng = np.random.default_rng(7)
    failures = 0
    for mag in (1.0, 1e5, 1e-5):
        x = (rng.uniform(-1, 1, (shape.n, shape.h, shape.w, shape.c)) * mag).astype(np.float32)
        w = rng.uniform(-1, 1, (shape.k, shape.r, shape.s, shape.c)).astype(np.float32)
        ref = conv_ref(x.astype(np.float64), w.astype(np.float64), shape, Precision.FP32_TC)
        ref = ref.reshape(shape.n, shape.p, shape.q, shape.k)
        bound = np.array([np.abs(x).max(), np.abs(w).max()], np.float32)
        runs = {
            "cupy": cupy.asnumpy(conv(cupy.asarray(x), cupy.asarray(w))),
            "cupy+bounds": cupy.asnumpy(conv(cupy.asarray(x), cupy.asarray(w),
                                             scale=cupy.asarray(bound))),
            "torch": conv(torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()).cpu().numpy(),
        }
        for name, y in runs.items():
            err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
            ok = bool(np.isfinite(y).all() and err <= fp32_tc_rel_tol(shape.gemm_k))
            failures += not ok
            print(f"magnitude {mag:g} {name}: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
