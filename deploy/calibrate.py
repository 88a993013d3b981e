"""int8 scales: per-output-channel weight scales and per-tensor activation scales.

Everything is symmetric (the kernel's int8 has no zero point): a real value v is q * scale.

Weights: scale[k] = max|W[k]| / 127 over output channel k of the (BN-folded) weight, and
q = clamp(round(W / scale[k]), -127, 127).

Activations (the calibration rule): scale = A / 127 where A is the `percentile`-th
percentile of |x| over the calibration inputs, x the float model's value at that point
(default `percentile` 100: A = max|x|, so no calibration value saturates); over several
calibration batches A is the largest of the batches' values. q = clamp(round(x / scale),
-128, 127) in x's dtype, rounding half to even like the kernel's requantization.

A value that is all zeros gets scale 1 (any scale represents it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx

QMAX = 127  # symmetric: -127..127 for weights; activations may reach -128 (the kernel clamps)
QMIN_ACT = -128


def abs_percentile(t: torch.Tensor, percentile: float = 100.0) -> float:
    """The `percentile`-th percentile of |t| (100: the maximum), lower interpolation."""
    if not 0.0 < percentile <= 100.0:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    a = t.detach().abs().reshape(-1).to(torch.float64)
    if a.numel() == 0:
        return 0.0
    if percentile == 100.0:
        return float(a.max())
    # kthvalue has no size limit (torch.quantile refuses inputs over 2**24 elements).
    k = max(1, min(a.numel(), int(percentile / 100.0 * (a.numel() - 1)) + 1))
    return float(torch.kthvalue(a.cpu(), k).values)


def activation_scale(amax: float) -> float:
    """Per-tensor scale of an activation whose calibrated magnitude is `amax`."""
    if not math.isfinite(amax):
        raise ValueError(f"activation magnitude is not finite ({amax}): cannot calibrate")
    return amax / QMAX if amax > 0 else 1.0


def weight_scales(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel scales (float64 [K]) of a [K][C][R][S] weight."""
    amax = weight.detach().to(torch.float64).abs().reshape(weight.shape[0], -1).amax(dim=1)
    return torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))


def quantize_weight(weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int8 weight: clamp(round(W / scale[k]), -127, 127), computed in float64."""
    w = weight.detach().to(torch.float64) / scales.to(torch.float64).view(-1, 1, 1, 1)
    return torch.round(w).clamp(-QMAX, QMAX).to(torch.int8)


def quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """int8 activation: clamp(round(x / scale), -128, 127), in float32 at least (an fp16
    quotient near 127 would carry 1/32 of rounding error into the round)."""
    x = x.to(torch.promote_types(x.dtype, torch.float32))
    # The divisor as a tensor on x's device: PyTorch's CUDA division by a host scalar
    # multiplies by its reciprocal, which rounds differently from the kernel's and the CPU's
    # division at some quotients (and so the rounding to an integer). Filled there, not
    # copied from the host, so that a CUDA graph can capture it.
    d = torch.full((), scale, dtype=x.dtype, device=x.device)
    return torch.round(x / d).clamp(QMIN_ACT, QMAX).to(torch.int8)


def dequantize(q: torch.Tensor, scale: float, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    return q.to(dtype) * scale


class Observer(fx.Interpreter):
    """Runs a traced module and leaves on each node, right after it ran (before an in-place
    op downstream can change its value): node.meta["deploy_shape"] / ["deploy_dtype"] of
    a tensor output (the first run's), and node.meta["deploy_amax"], the calibrated
    magnitude (the largest over runs)."""

    def __init__(self, gm: fx.GraphModule, percentile: float = 100.0) -> None:
        super().__init__(gm)
        self.percentile = percentile

    def run_node(self, n: fx.Node) -> Any:
        out = super().run_node(n)
        if isinstance(out, torch.Tensor):
            # Shapes are the first run's (the example inputs the kernels are built for).
            n.meta.setdefault("deploy_shape", tuple(int(v) for v in out.shape))
            n.meta.setdefault("deploy_dtype", out.dtype)
            if out.is_floating_point():
                a = abs_percentile(out, self.percentile)
                n.meta["deploy_amax"] = max(a, float(n.meta.get("deploy_amax", 0.0)))
        return out


def observe(gm: fx.GraphModule, batches: Iterable[Sequence[Any]],
            percentile: float = 100.0) -> int:
    """Run every batch (the forward's positional arguments) through the traced float model,
    recording shapes and magnitudes on its nodes; returns the number of batches."""
    count = 0
    obs = Observer(gm, percentile)
    with torch.no_grad():
        for args in batches:
            obs.run(*args)
            count += 1
    if not count:
        raise ValueError("no calibration inputs")
    return count
