"""What each precision's speedup is measured against. The tuned kernels of fp16, int8 and
int4 are compared with cuDNN fp16 (the paper's convention: the fastest library conv of the
same accuracy class or better); fp32_tc promises FP32-level accuracy, so its reference is
cuDNN in fp32 with TF32 off, the library conv of that accuracy.

The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources")."""

from __future__ import annotations

BASELINE_PRECISION = {"fp16": "fp16", "int8": "fp16", "int4": "fp16", "fp32_tc": "fp32"}


def baseline_name(precision: str) -> str:
    """'cuDNN fp16' or 'cuDNN fp32': the name shown with every baseline and speedup."""
    return f"cuDNN {BASELINE_PRECISION.get(str(precision), 'fp16')}"


def speedup(baseline_us: float | None, latency_us: float | None) -> float | None:
    """baseline / latency, rounded to 3 places; None until both are known."""
    if baseline_us and latency_us:
        return round(baseline_us / latency_us, 3)
    return None
