"""A stem run over pixel pairs (kernels.spec.pixel_pairs): the input's rows padded with the
pair layer's zero pixels and seen as pairs, and the weights as the pair layer's. Both are
torch ops; on the GPU the input quantize writes the pairs itself (kernels/quantize.cu)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pair_pixels(x: torch.Tensor, channels: int, left: int, right: int) -> torch.Tensor:
    """x [N][C][H][W] as the pair layer's input [N][2 * channels][H][(W + left + right) / 2]:
    zero channels up to `channels`, `left` / `right` zero pixels around each row, then
    channel t * channels + c of pair k is channel c of pixel 2k + t (channels_last)."""
    n, c, h, w = (int(v) for v in x.shape)
    x = F.pad(x, (left, right, 0, 0, 0, channels - c))
    pairs = (w + left + right) // 2
    x = x.reshape(n, channels, h, pairs, 2).permute(0, 4, 1, 2, 3)
    return x.reshape(n, 2 * channels, h, pairs).contiguous(memory_format=torch.channels_last)


def pair_weights(w: torch.Tensor, channels: int) -> torch.Tensor:
    """Weights [K][C][R][S] as the pair layer's [K][2 * channels][R][ceil(S / 2)]: tap j of
    half t is the layer's tap 2j + t (zero past S and past C)."""
    k, c, r, s = (int(v) for v in w.shape)
    taps = (s + 1) // 2
    w = F.pad(w, (0, 2 * taps - s, 0, 0, 0, channels - c))
    w = w.reshape(k, channels, r, taps, 2).permute(0, 4, 1, 2, 3)
    return w.reshape(k, 2 * channels, r, taps).contiguous()
