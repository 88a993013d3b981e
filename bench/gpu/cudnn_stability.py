"""How stable is cuDNN fp16's time from one process to the next (kernels/cudnn.py's baseline)?

    python bench/gpu/cudnn_stability.py --repeats 3 --out $OUT/cudnn_stability.json   # GPU

Each (mode, repeat) is a fresh process that times every distinct conv of ResNet-50 at batch
8 with kernels.cudnn.cudnn_conv_times: cudnn.benchmark picks an algorithm the first time a
process sees a shape, from one cold run of each candidate, so the pick can differ between
processes. Modes: `benchmark` (cudnn.benchmark's pick), `all` (the same with benchmark_limit
0: every algorithm is a candidate), `eager` (the same with CUDA_MODULE_LOADING=EAGER: no
kernel is loaded lazily during the candidates' runs), `heuristic` (benchmark off: cuDNN's
heuristic pick), `baseline` (the faster of the heuristic's and benchmark's picks: what
kernels.cudnn times).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MODES = {"benchmark": {}, "all": {"LIMIT": "0"}, "eager": {"CUDA_MODULE_LOADING": "EAGER"},
         "heuristic": {"BENCH": "0"}, "baseline": {"BENCH": "both"}}


def child() -> None:
    import cupy
    import torch

    from bench.zoo import load_shapes, with_batch
    from kernels.cudnn import ALGORITHM_PICKS, _random_inputs, time_cudnn_conv

    bench = os.environ.get("BENCH", "1")
    picks = ALGORITHM_PICKS if bench == "both" else ((bench == "1", False),)
    if "LIMIT" in os.environ:
        torch.backends.cudnn.benchmark_limit = int(os.environ["LIMIT"])
    l2 = int(cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
    g = torch.Generator(device="cpu").manual_seed(1234)
    out = {}
    for e in load_shapes()["models"]["resnet50"]["shapes"]:
        shape = with_batch(e["shape"], 8)
        x0, w0 = _random_inputs(shape, torch.float16, g, "cuda")
        t, xl, _ = time_cudnn_conv(shape, x0, w0, l2, picks=picks)
        out[shape.key()] = t.median_us
        del xl
    print(json.dumps(out))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        child()
        return 0
    runs = []
    for r in range(a.repeats):
        for mode in a.modes.split(","):
            env = {**os.environ, **MODES[mode]}
            p = subprocess.run([sys.executable, __file__, "--child", "--out", "-"], env=env,
                               capture_output=True, text=True, check=False)
            if p.returncode:
                print(p.stderr[-2000:], file=sys.stderr)
                continue
            runs.append({"mode": mode, "repeat": r, "us": json.loads(p.stdout.splitlines()[-1])})
            print(mode, r, "done", file=sys.stderr, flush=True)
    import torch

    Path(a.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(0),
                                       "torch": torch.__version__,
                                       "cudnn": torch.backends.cudnn.version(),
                                       "runs": runs}, indent=1))
    for mode in a.modes.split(","):
        rs = [x["us"] for x in runs if x["mode"] == mode]
        if not rs:
            continue
        spread = [max(r[k] for r in rs) / min(r[k] for r in rs) for k in rs[0]]
        best = {k: min(x["us"][k] for x in runs) for k in rs[0]}
        over = [max(r[k] for r in rs) / best[k] for k in rs[0]]
        print(f"{mode}: max/min across repeats: median {sorted(spread)[len(spread) // 2]:.3f}, "
              f"worst {max(spread):.3f}; worst over the best of all modes {max(over):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
