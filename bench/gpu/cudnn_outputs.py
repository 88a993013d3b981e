"""cuDNN fp16 timed two ways on the layer classes (bench/layer_classes.py): each launch's output
dropped at once (the caching allocator hands its buffer to the next launch, in a graph capture
too, so every launch writes the same L2-resident lines) against outputs rotating with the
inputs past L2 (kernels/cudnn.py, as our kernels' outputs rotate in kernels.runner).

  python -m bench.gpu.cudnn_outputs > OUT.jsonl      # GPU; one JSON line per layer
"""

from __future__ import annotations

import json
import sys

from bench.layer_classes import LAYERS


def main() -> int:
    import torch
    import torch.nn.functional as F

    from kernels.cudnn import time_cudnn_conv
    from kernels.timing import sets_for_l2, time_launches

    torch.backends.cudnn.benchmark = True
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for name, (_, shape) in LAYERS.items():
        x = torch.randn(shape.n, shape.c, shape.h, shape.w, device="cuda", dtype=torch.float16
                        ).contiguous(memory_format=torch.channels_last)
        w = torch.randn(shape.k, shape.c, shape.r, shape.s, device="cuda", dtype=torch.float16
                        ).contiguous(memory_format=torch.channels_last)
        rotated = time_cudnn_conv(shape, x, w, l2)[0].median_us
        n = sets_for_l2((x.numel() + w.numel() + shape.gemm_m * shape.k) * 2, l2)
        xl, wl = [x.clone() for _ in range(n)], [w.clone() for _ in range(n)]

        def dropped(i: int, xl: list = xl, wl: list = wl, s: object = shape) -> None:
            F.conv2d(xl[i], wl[i], stride=s.stride, padding=s.pad)  # type: ignore[attr-defined]

        print(json.dumps({"gpu": torch.cuda.get_device_name(0), "layer": name,
                          "dropped_out_us": round(time_launches(dropped, n, api="torch")
                                                  .median_us, 3),
                          "rotated_out_us": round(rotated, 3), "n_sets": n}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
