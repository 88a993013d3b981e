"""Probes of the batch-8 layers, each beside the best schedules of
bench/data/conv_vs_cudnn.json, checked and timed with the kernels' harness next to cuDNN
fp16 and an empty kernel (the harness's per-launch floor) in the same run:
  --mode pipeline  do deeper pipelines (STAGES > 3) and wider split-K (8) pay? Each best
                   schedule varied over STAGES x SPLIT_K x CHUNK, values outside today's
                   space included (the knob tables are widened in this process only).
  --mode dup       a sample of the duplicate-aware subspace.
  --mode wgmma     a sample of the wgmma subspace (MMA=wgmma, sm_90a).
  --mode variants  the fastest wgmma schedules of an earlier run (--from, --top) and a sample
                   of the wgmma subspace with pipelines up to 8 stages deep, each built once per
                   value of an experiment's define (--define NAME=0,1), outside the space,
                   or of a knob of the space (--knob NAME=0,1; pairs where every value is valid).

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
WG_STAGES = (2, 3, 4, 6, 8)
SPLIT_K = (1, 2, 4, 8)
CHUNK = (2, 4, 8)


def widen() -> None:
    space.EXTRA_KNOBS["STAGES"] = tuple(sorted(set(space.EXTRA_KNOBS["STAGES"]) | set(STAGES)
                                               | set(WG_STAGES)))
    space.EXTRA_KNOBS["SPLIT_K"] = tuple(sorted(set(space.EXTRA_KNOBS["SPLIT_K"]) | set(SPLIT_K)))


def top_of(earlier: list[dict[str, Any]], layer: str, prec: str, k: int) -> list[dict[str, Any]]:
    """The k fastest distinct wgmma schedules of (layer, precision) in an earlier run's rows."""
    ok = sorted((r for r in earlier if r["layer"] == layer and r["precision"] == prec
                 and r["status"] == "ok" and r["schedule"].get("MMA") == "wgmma"),
                key=lambda r: r["median_us"])
    out: list[dict[str, Any]] = []
    for r in ok:
        if r["schedule"] not in out:
            out.append(r["schedule"])
        if len(out) == k:
            break
    return out


def plan(mode: str = "pipeline", per_group: int = 60, seed: int = 0,
         values: tuple[int, ...] = (0,), earlier: list[dict[str, Any]] | None = None,
         top: int = 0, knob: str = "") -> list[dict[str, Any]]:
    """pipeline: the best schedules x STAGES x SPLIT_K x CHUNK. dup: a random sample of the
    duplicate-aware subspace (NHWC, STAGES 3-4, SPLIT_K 1-2) with >= 4 main-loop iterations
    (fewer leave nothing to pipeline), plus each best schedule for reference. wgmma: a
    random sample of the MMA=wgmma subspace, plus each best schedule. variants: each of those
    once per value (of a define, or of `knob` in the schedule: "pair" names the pair)."""
    import numpy as np

    from bench.conv_vs_cudnn import layer_shape

    widen()
    earlier = earlier or []
    rng = np.random.default_rng(seed)
    rows = json.loads(Path("bench/data/conv_vs_cudnn.json").read_text())["rows"]
    target = get_target("h200")
    items = []
    for r in rows:
        if r["n"] != 8 or r["variant"] != "tuned" or r["precision"] not in ("int8", "fp16"):
            continue
        shape = layer_shape(r["layer"], 8)
        prec = Precision(r["precision"])
        if mode == "variants":
            fixed: dict[str, Any] = {"MMA": ["wgmma"], "STAGES": WG_STAGES}
            if knob:
                fixed[knob] = [values[0]]
            sp = ScheduleSpace(shape, prec, target, fixed)
            full = ScheduleSpace(shape, prec, target)
            picks = [sp.schedule_at(int(i)) for i in rng.choice(
                sp.valid_indices, size=min(per_group, len(sp.valid_indices)), replace=False)]
            scheds = [(True, r["schedule"])] + [
                (False, s) for s in top_of(earlier, r["layer"], prec.value, top) + picks]
            for base, sched in scheds:
                variants = [{**sched, knob: v} if knob else sched for v in values]
                if knob and not all(full.is_valid(v) for v in variants):
                    continue
                pair = json.dumps({k: v for k, v in sched.items() if k != knob}, sort_keys=True)
                for value, v in zip(values, variants, strict=True):
                    items.append({"layer": r["layer"], "precision": prec.value, "base": base,
                                  "schedule": v, "shape": shape.to_dict(), "variant": value,
                                  "pair": pair})
            continue
        if mode in ("dup", "wgmma"):
            items.append({"layer": r["layer"], "precision": prec.value, "base": True,
                          "schedule": r["schedule"], "shape": shape.to_dict()})
            if mode == "dup":
                sp = ScheduleSpace(shape, prec, target, {"DUP_AWARE": [1], "LAYOUT": ["nhwc"],
                                                         "STAGES": [3, 4], "SPLIT_K": [1, 2]})
                idx = sp.valid_indices
                idx = idx[sp.geometry(idx).k_iters >= 4]
            else:
                sp = ScheduleSpace(shape, prec, target, {"MMA": ["wgmma"]})
                idx = sp.valid_indices
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
    from bench.cli import read_json
    from kernels import build

    name, _, vals = (a.define or a.knob or "X=0").partition("=")
    values = tuple(int(v) for v in vals.split(","))
    earlier = read_json(a.from_)["rows"] if a.from_ else []
    items = plan(a.mode, a.per_group, values=values, earlier=earlier, top=a.top,
                 knob=name if a.knob else "")
    plain = build.nvrtc_options
    for value in values:
        # An experiment's define, outside the schedule space: added to the options (and so to
        # the cache key) of this process's builds only.
        build.nvrtc_options = (lambda d, sm, v=value: plain(d, sm) + [f"-D{name}={v}"]
                               ) if a.define else plain
        part = [it for it in items if it.get("variant", 0) == value]
        res = build_many([job_of(it) for it in part], a.cache, a.workers)
        for it, b in zip(part, res, strict=True):
            it["key"], it["build"] = b.key, b.status
    build.nvrtc_options = plain
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    (Path(a.cache) / "probe_manifest.json").write_text(json.dumps(items))
    bad = [it for it in items if it["build"] != "ok"]
    print(f"{len(items)} builds, {len(bad)} failed")
    for it in bad[:10]:
        print("  failed:", it["layer"], it["precision"], it["schedule"])
    return 0


def empty_kernel_us(blocks: int = 132) -> float:
    """One launch of an empty kernel of `blocks` x 128 threads in the timing harness: the
    per-launch floor (bench/gpu/floor_probe.py times it on one wave of the GPU at hand)."""
    import cupy as cp

    from kernels.timing import time_launches

    k = cp.RawKernel(r'extern "C" __global__ void nop(int* p) { if (p == 0) p[0] = 1; }', "nop")
    buf = cp.zeros(1, dtype=cp.int32)
    return time_launches(lambda i: k((blocks,), (128,), (buf,)), 1).median_us


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
            short = " ".join(f"{k}={v}" for k, v in r["schedule"].items())
            print(f"   {r['median_us']:.3f} us  {short} variant={r.get('variant', 0)}")
        # Paired: the same schedule built with define / knob values 0 and 1 (variants mode).
        pairs: dict[str, dict[int, float]] = {}
        for r in ok:
            pairs.setdefault(r.get("pair") or json.dumps(r["schedule"], sort_keys=True), {})[
                r.get("variant", 0)] = r["median_us"]
        ratios = sorted(p[1] / p[0] for p in pairs.values() if 0 in p and 1 in p)
        if ratios:
            print(f"   variant 1 / 0, {len(ratios)} pairs: median "
                  f"{ratios[len(ratios) // 2]:.3f}, best {ratios[0]:.3f}, worst {ratios[-1]:.3f}")
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    """An ncu target: one checked launch of the fastest probed schedule of each precision of a
    layer (from a finished run's --out; built here if the cache lacks it) and of the run's
    base schedule, then cuDNN fp16 on the same layer."""
    import torch
    import torch.nn.functional as F

    from bench.cli import read_json
    from bench.conv_vs_cudnn import layer_shape
    from kernels.build import build
    from kernels.runner import DeviceSession

    widen()  # the probed schedules may use knob values outside today's space
    rows = read_json(a.results)["rows"]
    sess = DeviceSession()
    for prec in ("int8", "fp16"):
        ok = [r for r in rows if r["layer"] == a.layer and r["precision"] == prec
              and r["status"] == "ok" and not r.get("variant")]
        for r in (min(ok, key=lambda r: r["median_us"]), next(r for r in ok if r["base"])):
            key = build(job_of(r), a.cache).key
            print(prec, r["median_us"], r["schedule"],
                  sess.measure(a.cache, key, time_it=False)["status"], flush=True)
    shape = layer_shape(a.layer, 8)
    x = torch.randn(8, shape.c, shape.h, shape.w, device="cuda", dtype=torch.float16)
    w = torch.randn(shape.k, shape.c, 3, 3, device="cuda", dtype=torch.float16)
    x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
    torch.backends.cudnn.benchmark = True
    for _ in range(3):
        F.conv2d(x, w, padding=1)
    torch.cuda.synchronize()
    return 0


def cmd_profile_table(a: argparse.Namespace) -> int:
    """An ncu target: one checked launch of each batch-8 'tuned' schedule of a conv_vs_cudnn
    table for the given layers and precision (built here if the cache lacks it)."""
    from bench.cli import read_json
    from bench.conv_vs_cudnn import layer_shape
    from kernels.build import build
    from kernels.runner import DeviceSession

    sess = DeviceSession()
    for r in read_json(a.table)["rows"]:
        if (r["layer"] in a.layers.split(",") and r["precision"] == a.precision
                and r["n"] == 8 and r["variant"] == "tuned"):
            job = BuildJob(layer_shape(r["layer"], 8), Precision(a.precision), 90,
                           r["schedule"])
            key = build(job, a.cache).key
            print(r["layer"], r["tuned_us"], r["schedule"],
                  sess.measure(a.cache, key, time_it=False)["status"], flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prebuild")
    p.add_argument("--cache", required=True)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--mode", choices=("pipeline", "dup", "wgmma", "variants"),
                   default="pipeline")
    p.add_argument("--define", default="", help="variants: NAME=0,1 (an experiment's define)")
    p.add_argument("--knob", default="", help="variants: NAME=0,1 (a knob of the space)")
    p.add_argument("--from", dest="from_", default="", help="variants: an earlier --out JSON")
    p.add_argument("--top", type=int, default=0, help="variants: its fastest K per group")
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
    p = sub.add_parser("profile-table")
    p.add_argument("--cache", required=True)
    p.add_argument("--table", default="bench/data/conv_vs_cudnn.json")
    p.add_argument("--layers", default="stage2,stage5")
    p.add_argument("--precision", default="int8")
    p.set_defaults(fn=cmd_profile_table)
    a = ap.parse_args(argv)
    return int(a.fn(a))


if __name__ == "__main__":
    raise SystemExit(main())
