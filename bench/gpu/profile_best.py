"""Profile target for ncu: our best stage-N int8 schedule and cuDNN fp16 on the same layer.

ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy \
    python -m bench.gpu.profile_best stage3
"""

from __future__ import annotations

import json
import sys

from kernels.build import BuildJob, build
from kernels.runner import DeviceSession
from kernels.spec import ConvShape, Precision


def main() -> None:
    layer = sys.argv[1] if len(sys.argv) > 1 else "stage3"
    with open("bench/data/conv_vs_cudnn.json") as f:
        rows = json.load(f)["rows"]
    for prec in ("int8", "fp16"):
        r = next(x for x in rows if x["layer"] == layer and x["n"] == 8
                 and x["precision"] == prec and x["variant"] == "tuned")
        from bench.conv_vs_cudnn import layer_shape

        shape: ConvShape = layer_shape(layer, 8)
        b = build(BuildJob(shape, Precision(prec), 90, r["schedule"]), "/tmp/prof-cache")
        sess = DeviceSession()
        print(prec, sess.measure("/tmp/prof-cache", b.key, time_it=False)["status"], flush=True)
    import torch
    import torch.nn.functional as F

    x = torch.randn(8, shape.c, shape.h, shape.w, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    w = torch.randn(shape.k, shape.c, 3, 3, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    for _ in range(3):
        F.conv2d(x, w, padding=1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
