"""BatchNorm folding: conv -> BatchNorm2d (eval) as one conv with per-channel weights and bias.

In eval mode BatchNorm is the per-channel affine map y = (x - mean) / sqrt(var + eps) * gamma
+ beta = x * a[k] + b[k]. After a conv it folds into the conv: W'[k] = W[k] * a[k] and
bias'[k] = bias[k] * a[k] + b[k]. The math runs in float64 so that folding adds no rounding
of its own; the precision's rounding (fp16 cast, int8 quantization) comes after.
"""

from __future__ import annotations

import torch
from torch import nn


def bn_affine(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) float64 [K] with bn(x) = x * a[k] + b[k] in eval mode."""
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("BatchNorm without running statistics cannot be folded")
    mean = bn.running_mean.detach().to(torch.float64)
    var = bn.running_var.detach().to(torch.float64)
    k = mean.numel()
    gamma = bn.weight.detach().to(torch.float64) if bn.weight is not None else \
        torch.ones(k, dtype=torch.float64, device=mean.device)
    beta = bn.bias.detach().to(torch.float64) if bn.bias is not None else \
        torch.zeros(k, dtype=torch.float64, device=mean.device)
    a = gamma / torch.sqrt(var + float(bn.eps))
    return a, beta - mean * a


def fold_conv_bn(weight: torch.Tensor, bias: torch.Tensor | None,
                 bn: nn.BatchNorm2d | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv's weight [K][C][R][S] and bias [K] (or None) with the BatchNorm after it folded
    in (bn None: the conv's own), both float64; bias zero where the conv had none."""
    w = weight.detach().to(torch.float64)
    b = bias.detach().to(torch.float64) if bias is not None else \
        torch.zeros(w.shape[0], dtype=torch.float64, device=w.device)
    if bn is None:
        return w.clone(), b.clone()
    if bn.num_features != w.shape[0]:
        raise ValueError(f"BatchNorm has {bn.num_features} features, the conv {w.shape[0]} "
                         f"output channels")
    a, shift = bn_affine(bn)
    return w * a.view(-1, 1, 1, 1), b * a + shift
