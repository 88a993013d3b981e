"""Probe: do deeper pipelines (STAGES > 3) and wider split-K (8) pay on the batch-8 layers?

Every best schedule of bench/data/conv_vs_cudnn.json (batch 8, int8 and fp16) is varied
over STAGES x SPLIT_K x CHUNK, values outside today's space included (the space's knob
tables are widened in this process only), then checked and timed with the kernels' harness
next to cuDNN fp16 and an empty kernel (the harness's per-launch floor) in the same run.

    python -m bench.gpu.pipeline_probe prebuild --cache .cache/probe       # CPU
    python -m bench.gpu.pipeline_probe run --cache .cache/probe --out P.json  # GPU
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path
from typing import Any

from kernels import space
from kernels.build import BuildJob, build_many
from kernels.space import ScheduleSpace
from kernels.spec import Precision, get_target

STAGES = (2, 3, 4, 5, 6)
SPLIT_K = (1, 2, 4, 8)
CHUNK = (2, 4, 8)


def widen() -> None:
    space.EXTRA_KNOBS["STAGES"] = tuple(sorted(set(space.EXTRA_KNOBS["STAGES"]) | set(STAGES)))
    space.EXTRA_KNOBS["SPLIT_K"] = tuple(sorted(set(space.EXTRA_KNOBS["SPLIT_K"]) | set(SPLIT_K)))


def plan(mode: str = "pipeline", per_group: int = 60, seed: int = 0) -> list[dict[str, Any]]:
    """pipeline: the best schedules x STAGES x SPLIT_K x CHUNK. dup: a random sample of the
    duplicate-aware subspace (NHWC, STAGES 3-4, SPLIT_K 1-2) with >= 4 main-loop iterations
    (fewer leave nothing to pipeline), plus each best schedule for reference."""
    import numpy as np

    from bench.conv_vs_cudnn import layer_shape

    widen()
    rng = np.random.default_rng(seed)
    rows = json.loads(Path("bench/data/conv_vs_cudnn.json").read_text())["rows"]
    target = get_target("h200")
    items = []
    for r in rows:
        if r["n"] != 8 or r["variant"] != "tuned" or r["precision"] not in ("int8", "fp16"):
            continue
        shape = layer_shape(r["layer"], 8)
        prec = Precision(r["precision"])
        if mode == "dup":
            items.append({"layer": r["layer"], "precision": prec.value, "base": True,
                          "schedule": r["schedule"], "shape": shape.to_dict()})
            sp = ScheduleSpace(shape, prec, target, {"DUP_AWARE": [1], "LAYOUT": ["nhwc"],
                                                     "STAGES": [3, 4], "SPLIT_K": [1, 2]})
            idx = sp.valid_indices
            idx = idx[sp.geometry(idx).k_iters >= 4]
            for i in rng.choice(idx, size=min(per_group, len(idx)), replace=False):
                items.append({"layer": r["layer"], "precision": prec.value, "base": False,
                              "schedule": sp.schedule_at(int(i)), "shape": shape.to_dict()})
            continue
        sp = ScheduleSpace(shape, prec, target)
        for st, sk, ch in itertools.product(STAGES, SPLIT_K, CHUNK):
            sched = {**r["schedule"], "STAGES": st, "SPLIT_K": sk, "CHUNK": ch}
            if not sp.is_valid(sched):
                continue
            items.append({"layer": r["layer"], "precision": prec.value, "schedule": sched,
                          "base": sched == r["schedule"], "shape": shape.to_dict()})
    return items


def job_of(it: dict[str, Any]) -> BuildJob:
    from kernels.spec import ConvShape

    # The default epilogue, as in conv_vs_cudnn: requantized int8 / fp16 with bias.
    return BuildJob(ConvShape.from_dict(it["shape"]), Precision(it["precision"]), 90,
                    it["schedule"])


def cmd_prebuild(a: argparse.Namespace) -> int:
    items = plan(a.mode, a.per_group)
    res = build_many([job_of(it) for it in items], a.cache, a.workers)
    for it, b in zip(items, res, strict=True):
        it["key"], it["build"] = b.key, b.status
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    (Path(a.cache) / "probe_manifest.json").write_text(json.dumps(items))
    bad = [it for it in items if it["build"] != "ok"]
    print(f"{len(items)} builds, {len(bad)} failed")
    for it in bad[:10]:
        print("  failed:", it["layer"], it["precision"], it["schedule"])
    return 0


def empty_kernel_us() -> float:
    import cupy as cp

    from kernels.timing import time_launches

    k = cp.RawKernel(r'extern "C" __global__ void nop(int* p) { if (p == 0) p[0] = 1; }', "nop")
    buf = cp.zeros(1, dtype=cp.int32)
    return time_launches(lambda i: k((132,), (128,), (buf,)), 1).median_us


def cmd_run(a: argparse.Namespace) -> int:
    from bench.conv_vs_cudnn import baselines, layer_shape
    from kernels.runner import Runner

    items = json.loads((Path(a.cache) / "probe_manifest.json").read_text())
    out: dict[str, Any] = {"empty_kernel_us": empty_kernel_us(), "rows": [], "cudnn": {}}
    print("empty kernel (132x128 threads):", round(out["empty_kernel_us"], 3), "us", flush=True)
    l2 = 60 * 2**20
    for layer in sorted({it["layer"] for it in items}):
        out["cudnn"][layer] = baselines(layer_shape(layer, 8), l2)
        print(layer, out["cudnn"][layer], flush=True)
    runner = Runner()
    try:
        for it in items:
            if it["build"] != "ok":
                continue
            r = runner.measure(a.cache, it["key"])
            out["rows"].append({**it, "status": r["status"], "median_us": r.get("median_us")})
    finally:
        runner.close()
    Path(a.out).write_text(json.dumps(out, indent=1))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in out["rows"]:
        groups.setdefault((r["layer"], r["precision"]), []).append(r)
    for (layer, prec), rs in sorted(groups.items()):
        ok = [r for r in rs if r["status"] == "ok"]
        base = next((r for r in ok if r["base"]), None)
        top = sorted(ok, key=lambda r: r["median_us"])[:3]
        print(layer, prec, "base", base and base["median_us"], "wrong",
              sum(r["status"] == "wrong" for r in rs), "cudnn_fp16",
              out["cudnn"][layer]["cudnn_fp16_us"])
        for r in top:
            s = r["schedule"]
            print(f"   {r['median_us']:.3f} us  STAGES={s['STAGES']} SPLIT_K={s['SPLIT_K']} "
                  f"CHUNK={s['CHUNK']}")
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    """An ncu target: one checked launch of the fastest probed schedule of each precision of a
    layer (from a finished run's --out), then cuDNN fp16 on the same layer."""
    import torch
    import torch.nn.functional as F

    from bench.conv_vs_cudnn import layer_shape
    from kernels.runner import DeviceSession

    rows = json.loads(Path(a.results).read_text())["rows"]
    sess = DeviceSession()
    for prec in ("int8", "fp16"):
        ok = [r for r in rows if r["layer"] == a.layer and r["precision"] == prec
              and r["status"] == "ok"]
        r = min(ok, key=lambda r: r["median_us"])
        print(prec, r["median_us"], r["schedule"],
              sess.measure(a.cache, r["key"], time_it=False)["status"], flush=True)
    shape = layer_shape(a.layer, 8)
    x = torch.randn(8, shape.c, shape.h, shape.w, device="cuda", dtype=torch.float16)
    w = torch.randn(shape.k, shape.c, 3, 3, device="cuda", dtype=torch.float16)
    x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    torch.backends.cudnn.benchmark = True
    for _ in range(3):
        F.conv2d(x, w, padding=1)
    torch.cuda.synchronize()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prebuild")
    p.add_argument("--cache", required=True)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--mode", choices=("pipeline", "dup"), default="pipeline")
    p.add_argument("--per-group", type=int, default=60)
    p.set_defaults(fn=cmd_prebuild)
    p = sub.add_parser("run")
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("profile")
    p.add_argument("--cache", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--layer", default="stage3")
    p.set_defaults(fn=cmd_profile)
    a = ap.parse_args(argv)
    return int(a.fn(a))


if __name__ == "__main__":
    raise SystemExit(main())
