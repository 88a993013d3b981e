"""ResNet-50 end to end: every conv layer through the runtime (int8, fp16) against cuDNN.

torchvision's ResNet-50 at batch 8 has 53 convolutions of 23 distinct shapes. Each shape
runs through `kernels.runtime.Conv2d` on PyTorch CUDA tensors (DLPack, the caller's stream):
  - the four 3x3 stride-1 layers with their recorded exhaustive bests
    (bench/data/conv_vs_cudnn_h200_sync.json; replay datasets bench/data/replay/resnet50_*);
  - the other 19 (7x7 stem, 1x1, strided 3x3, strided 1x1 downsample) with the best of a
    short on-GPU search: the runtime's default, the recorded bests where valid for the shape,
    then random valid schedules, each checked against the reference then timed
    (kernels.runner, a child process), within a time budget.
Agreement: int8 raw accumulators exactly equal to the integer reference of the quantized
inputs (im2col + float64 GEMM on the GPU: every partial sum is an integer below 2^53), and
the requantized int8 output exactly equal to the requantization of that reference; fp16
relative L2 error against cuDNN fp16 (and of both against a float64 reference).
Timing: kernels.timing.time_launches for ours and for cuDNN fp16 (channels_last) alike,
per distinct shape; network totals weight them by their count. Also one CUDA graph of all
53 convs back to back per variant.

  python -m bench.resnet50_e2e prebuild --cache .rtcache          # CPU: plan + NVRTC builds
  python -m bench.resnet50_e2e run --cache .rtcache --out OUT.json  # GPU
  python -m bench.resnet50_e2e table OUT.json                       # markdown for RESULTS.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.cli import log
from kernels.build import BuildJob, Epilogue, build_many
from kernels.cudnn import time_cudnn_conv
from kernels.runtime import RECORDED_BESTS, Conv2d, DefaultScheduleWarning, default_schedule
from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target

PRECISIONS = (Precision.INT8, Precision.FP16)
PLAN_FILE = "resnet50_plan.json"
BATCH = 8


# ---- the network -------------------------------------------------------------------------
def resnet50_convs(n: int = BATCH) -> list[tuple[str, ConvShape]]:
    """torchvision's resnet50 conv layers (v1.5: stride on the 3x3), in forward order.
    The GPU run checks this list against the traced torchvision model."""
    out = [("conv1", ConvShape(n, 224, 224, 3, 64, 7, 7, stride=2, pad=3))]
    c_in, hw = 64, 56
    for li, (blocks, width, stride) in enumerate(((3, 64, 1), (4, 128, 2), (6, 256, 2),
                                                   (3, 512, 2)), start=1):
        for b in range(blocks):
            s = stride if b == 0 else 1
            pre = f"layer{li}.{b}"
            out.append((f"{pre}.conv1", ConvShape(n, hw, hw, c_in, width, 1, 1)))
            out.append((f"{pre}.conv2", ConvShape(n, hw, hw, width, width, 3, 3, stride=s,
                                                  pad=1)))
            hw_out = hw // s
            out.append((f"{pre}.conv3", ConvShape(n, hw_out, hw_out, width, 4 * width, 1, 1)))
            if b == 0:
                out.append((f"{pre}.downsample.0", ConvShape(n, hw, hw, c_in, 4 * width, 1, 1,
                                                             stride=s)))
            c_in, hw = 4 * width, hw_out
    return out


def kind_of(shape: ConvShape) -> str:
    if shape.r == 7:
        return "7x7/2 stem"
    if shape.r == 3:
        return "3x3" if shape.stride == (1, 1) else "3x3/2"
    return "1x1" if shape.stride == (1, 1) else "1x1/2 downsample"


def recorded_layer(shape: ConvShape) -> str | None:
    for name, s in RESNET50_3X3.items():
        if s == shape:
            return name
    return None


def unique_layers(convs: list[tuple[str, ConvShape]]) -> list[dict[str, Any]]:
    by_key: dict[str, dict[str, Any]] = {}
    for name, shape in convs:
        u = by_key.setdefault(shape.key(), {"key": shape.key(), "shape": shape.to_dict(),
                                            "kind": kind_of(shape), "names": []})
        u["names"].append(name)
    for u in by_key.values():
        u["count"] = len(u["names"])
    return list(by_key.values())


# ---- plan and builds (CPU) ---------------------------------------------------------------
def _recorded_rows(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    rows = json.loads(path.read_text())["rows"]
    return {(r["layer"], r["precision"]): r for r in rows
            if r["n"] == BATCH and r["variant"] == "tuned"}


def make_plan(target_name: str, random_per_layer: int, seed: int,
              recorded_path: Path) -> dict[str, Any]:
    target = get_target(target_name)
    rng = np.random.default_rng(seed)
    recorded = _recorded_rows(recorded_path)
    layers = unique_layers(resnet50_convs())
    tasks = []
    for u in layers:
        shape = ConvShape.from_dict(u["shape"])
        for p in PRECISIONS:
            task: dict[str, Any] = {"key": u["key"], "precision": p.value, "candidates": []}
            rec = recorded_layer(shape)
            if rec is not None:
                r = recorded[(rec, p.value)]
                task["candidates"].append({"origin": f"recorded best ({rec}, "
                                                     f"{r['tuned_us']} us on the H200)",
                                           "schedule": r["schedule"]})
                task["recorded"] = True
            else:
                task["recorded"] = False
                space = ScheduleSpace(shape, p, target)
                seen: set[int] = set()

                def add(s: dict[str, Any], origin: str, space: ScheduleSpace = space,
                        seen: set[int] = seen, task: dict[str, Any] = task) -> None:
                    i = space.index_of(s)
                    if i not in seen and space.is_valid(s):
                        seen.add(i)
                        task["candidates"].append({"origin": origin, "schedule": s})

                sched, src = default_schedule(shape, p, target)
                add(sched, f"runtime default: {src}")
                for name, _, s in RECORDED_BESTS[p.value]:
                    add(s, f"recorded best of {name}")
                valid = space.valid_indices
                for i in rng.choice(valid, size=min(random_per_layer, len(valid)),
                                    replace=False):
                    add(space.schedule_at(int(i)), "random")
            tasks.append(task)
    return {"target": target.name, "sm": target.sm, "seed": seed, "layers": layers,
            "tasks": tasks}


def cmd_prebuild(a: argparse.Namespace) -> int:
    plan = make_plan(a.target, a.random, a.seed, Path(a.recorded))
    jobs, where = [], []
    for ti, t in enumerate(plan["tasks"]):
        shape = ConvShape.from_dict(next(u["shape"] for u in plan["layers"]
                                         if u["key"] == t["key"]))
        p = Precision(t["precision"])
        for ci, c in enumerate(t["candidates"]):
            jobs.append(BuildJob(shape, p, plan["sm"], c["schedule"]))
            where.append((ti, ci, "key"))
            if p.is_integer:  # the raw-accumulator twin for the exact agreement check
                jobs.append(BuildJob(shape, p, plan["sm"], c["schedule"], Epilogue("acc")))
                where.append((ti, ci, "acc_key"))
    t0 = time.time()
    res = build_many(jobs, a.cache, a.workers)
    bad = 0
    for (ti, ci, field), r in zip(where, res, strict=True):
        c = plan["tasks"][ti]["candidates"][ci]
        c[field] = r.key if r.status == "ok" else None
        if r.status != "ok":
            bad += 1
            c[f"{field}_error"] = r.log[-500:]
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    (Path(a.cache) / PLAN_FILE).write_text(json.dumps(plan, indent=1))
    log(f"{len(jobs)} builds in {time.time() - t0:.0f} s, {bad} failed; "
        f"{sum(len(t['candidates']) for t in plan['tasks'])} candidates in "
        f"{len(plan['tasks'])} tasks")
    return 0


# ---- GPU: search -------------------------------------------------------------------------
def search(plan: dict[str, Any], cache: str, budget_s: float, samples: int
           ) -> list[dict[str, Any]]:
    """Check then time every candidate of the searched tasks, task by task, each within its
    share of the budget (the runtime default and the recorded bests go first)."""
    from kernels.runner import Runner

    runner = Runner(timeout_s=60)
    if not runner.ensure_started():
        raise RuntimeError(f"no measurement process: {runner.start_error}")
    todo = [t for t in plan["tasks"] if not t["recorded"]]
    t_start = time.time()
    for i, t in enumerate(todo):
        share = (budget_s - (time.time() - t_start)) / max(1, len(todo) - i)
        t0 = time.time()
        for c in t["candidates"]:
            if c.get("key") is None:
                c.update(status="compile_error", median_us=None)
                continue
            if time.time() - t0 > share and c is not t["candidates"][0]:
                c.update(status="skipped (budget)", median_us=None)
                continue
            r = runner.measure(cache, c["key"], samples=samples)
            c.update(status=r["status"], median_us=r.get("median_us"), iqr_us=r.get("iqr_us"),
                     error=(str(r.get("error"))[-300:] if r.get("error") else None))
        ok = [c for c in t["candidates"] if c.get("status") == "ok"]
        best = min(ok, key=lambda c: c["median_us"]) if ok else None
        t["best"] = best
        n_meas = sum(c.get("status") not in (None, "skipped (budget)") for c in t["candidates"])
        log(f"search {t['key']} {t['precision']}: {n_meas} measured, {len(ok)} ok, best "
            f"{best and best['median_us']} us ({best and best['origin']}), default "
            f"{t['candidates'][0].get('median_us')} us, {time.time() - t0:.1f} s")
    runner.close()
    return todo


# ---- GPU: the network through the runtime ------------------------------------------------
def _ref64(x: Any, w: Any, shape: ConvShape) -> Any:
    """x NHWC, w KRSC (real channels), torch CUDA -> float64 NHWC, by im2col + DGEMM (exact
    for integer inputs: every product and partial sum is an integer below 2^53)."""
    import torch.nn.functional as F

    xc = x.permute(0, 3, 1, 2).double()
    cols = F.unfold(xc, (shape.r, shape.s), dilation=shape.dilation, padding=shape.pad,
                    stride=shape.stride)  # (N, C*R*S, P*Q), C outermost
    wm = w.permute(0, 3, 1, 2).reshape(shape.k, -1).double()
    return (wm @ cols).reshape(shape.n, shape.k, shape.p, shape.q).permute(0, 2, 3, 1)


def _requant64(acc: Any, scale: Any, bias: Any) -> Any:
    """kernels.reference.requantize on the GPU: float32 multiply, float32 add (two kernels,
    no FMA), clamp, round half to even."""
    import torch

    v = acc.to(torch.float32) * scale
    v = v + bias
    return torch.round(torch.clamp(v, -128, 127)).to(torch.int64)


def _rel(a: Any, b: Any) -> float:
    import torch

    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


@dataclass
class Operands:
    """Seeded random operands of one shape (NHWC activations, KRSC weights, the layer's own
    channels) with their references: int8 accumulators exact and requantized with per-channel
    scale and bias; fp16 in float64 with the bias."""

    x8: Any
    w8: Any
    scale: Any
    bias: Any
    acc_ref: Any
    q_ref: Any
    x16: Any
    w16: Any
    b16: Any
    f64_ref: Any


def random_operands(sh: ConvShape, seed: int) -> Operands:
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    x8 = torch.randint(-128, 128, (sh.n, sh.h, sh.w, sh.c), generator=g, device=dev,
                       dtype=torch.int8)
    w8 = torch.randint(-128, 128, (sh.k, sh.r, sh.s, sh.c), generator=g, device=dev,
                       dtype=torch.int8)
    acc = _ref64(x8, w8, sh)
    std = float(acc.std()) + 1.0
    scale = (127 * 0.4 / std * (0.8 + 0.45 * torch.rand(sh.k, generator=g, device=dev))).float()
    bias = (torch.rand(sh.k, generator=g, device=dev) * 76 - 38).float()
    x16 = (torch.rand((sh.n, sh.h, sh.w, sh.c), generator=g, device=dev) * 2 - 1).half()
    w16 = (torch.rand((sh.k, sh.r, sh.s, sh.c), generator=g, device=dev) * 2 - 1).half()
    b16 = (torch.rand(sh.k, generator=g, device=dev) - 0.5).float()
    return Operands(x8, w8, scale, bias, acc, _requant64(acc, scale, bias), x16, w16, b16,
                    _ref64(x16, w16, sh) + b16.double())


def op_input(op: Conv2d, x: Any) -> Any:
    """x (NHWC, the layer's channels) zero-padded to the op's channel contract, in its layout."""
    import torch

    xp = torch.zeros((*x.shape[:3], op.padded_channels), dtype=x.dtype, device=x.device)
    xp[..., : x.shape[3]] = x
    return op.to_input_layout(xp)


def rotating(t: Any, n: int) -> list[Any]:
    """n input sets for the timing harness: t and n - 1 copies (together past the L2)."""
    return [t] + [t.clone() for _ in range(n - 1)]


def check_and_time(op: Conv2d, p: str, v: Operands, l2: int) -> tuple[dict[str, Any], Any]:
    """One op on v's operands (int8 requantized with v's scale and bias, fp16 with v's bias):
    its check (int8 exactly equal to the requantized reference, fp16 within 1e-3 of float64)
    and its harness timing (kernels.timing.time_launches over inputs rotating past L2)."""
    import torch

    from kernels.timing import sets_for_l2, time_launches

    x, w = (v.x8, v.w8) if p == "int8" else (v.x16, v.w16)
    xp, wp = op_input(op, x), op.prepare_weight(w)
    y = torch.empty(op.output_shape, dtype=torch.int8 if p == "int8" else torch.float16,
                    device="cuda")

    def call(x: Any, w: Any, y: Any) -> None:
        if p == "int8":
            op(x, w, v.scale, v.bias, out=y)
        else:
            op(x, w, bias=v.b16, out=y)

    y.fill_(-91 if p == "int8" else float("nan"))  # an output the kernel never wrote shows
    call(xp, wp, y)
    torch.cuda.synchronize()
    out = op.from_output_layout(y)
    if p == "int8":
        check: dict[str, Any] = {"mismatches": int((out.to(torch.int64) != v.q_ref).sum())}
        check["ok"] = check["mismatches"] == 0
    else:
        err = _rel(out.double(), v.f64_ref)
        check = {"rel_err_vs_fp64": err, "ok": bool(torch.isfinite(out).all()) and err < 1e-3}
    n = sets_for_l2(sum(int(t.numel() * t.element_size()) for t in (xp, wp, y)), l2)
    xs, ws, ys = rotating(xp, n), rotating(wp, n), [torch.empty_like(y) for _ in range(n)]
    return check, time_launches(lambda i: call(xs[i], ws[i], ys[i]), n, api="torch")


class Layer:
    """One distinct shape: tensors, ops and checks for int8, fp16 and cuDNN fp16."""

    def __init__(self, u: dict[str, Any], scheds: dict[str, tuple[dict[str, Any], str]],
                 target: str, seed: int) -> None:
        import torch
        import torch.nn.functional as F

        self.u = u
        self.shape = sh = ConvShape.from_dict(u["shape"])
        dev = "cuda"
        self.ops: dict[str, Conv2d] = {}
        self.res: dict[str, Any] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DefaultScheduleWarning)
            for p, (sched, src) in scheds.items():
                self.ops[p] = Conv2d(sh, p, sched, target)
                self.ops[p].schedule_source = src
            try:  # the raw-accumulator twin (its int32 staging tile may not fit)
                self.ops["int8_acc"] = Conv2d(sh, "int8", scheds["int8"][0], target,
                                              epilogue="acc")
            except ValueError as e:
                self.res["int8_acc_skipped"] = str(e)
        v = random_operands(sh, seed)
        # int8: quantized inputs, channels zero-padded to the op's contract (zero copy)
        o8, o16 = self.ops["int8"], self.ops["fp16"]
        self.x8, self.w8 = op_input(o8, v.x8), o8.prepare_weight(v.w8)  # NHWCnc if asked
        self.scale, self.bias = v.scale, v.bias
        self.acc_ref, self.q_ref = v.acc_ref, v.q_ref
        # fp16
        self.b16 = v.b16
        self.x16, self.w16 = op_input(o16, v.x16), o16.prepare_weight(v.w16)
        self.f64_ref = v.f64_ref
        # cuDNN fp16 channels_last: an NHWC tensor permuted to NCHW is exactly that
        self.xc, self.wc = v.x16.permute(0, 3, 1, 2), v.w16.permute(0, 3, 1, 2)
        assert self.xc.is_contiguous(memory_format=torch.channels_last)
        self.cudnn_out = F.conv2d(self.xc, self.wc, self.b16.half(), stride=sh.stride,
                                  padding=sh.pad, dilation=sh.dilation).permute(0, 2, 3, 1)
        self.y8 = torch.empty(o8.output_shape, dtype=torch.int8, device=dev)
        acc_op = self.ops.get("int8_acc")
        self.y8acc = torch.empty(acc_op.output_shape if acc_op else (1,), dtype=torch.int32,
                                 device=dev)
        self.y16 = torch.empty(o16.output_shape, dtype=torch.float16, device=dev)

    def check(self) -> None:
        import torch

        s = torch.cuda.Stream()  # a non-default stream, as a caller's would be
        with torch.cuda.stream(s):
            for y in (self.y8, self.y8acc):
                y.fill_(-91)  # poison
            self.y16.fill_(float("nan"))
            if "int8_acc" in self.ops:
                self.ops["int8_acc"](self.x8, self.w8, out=self.y8acc)
            self.ops["int8"](self.x8, self.w8, self.scale, self.bias, out=self.y8)
            self.ops["fp16"](self.x16, self.w16, bias=self.b16, out=self.y16)
        s.synchronize()
        nhwc8 = self.ops["int8"].from_output_layout
        acc_bad = int((nhwc8(self.y8acc).double() != self.acc_ref).sum()) \
            if "int8_acc" in self.ops else None
        q_bad = int((nhwc8(self.y8).to(torch.int64) != self.q_ref).sum())
        self.res["int8_check"] = {"acc_mismatches": acc_bad, "requant_mismatches": q_bad,
                                  "elements": int(self.y8.numel()),
                                  "exact": not acc_bad and q_bad == 0}
        y16 = self.ops["fp16"].from_output_layout(self.y16).double()
        self.res["fp16_check"] = {
            "finite": bool(torch.isfinite(y16).all()),
            "rel_err_vs_cudnn_fp16": _rel(y16, self.cudnn_out),
            "rel_err_vs_fp64": _rel(y16, self.f64_ref),
            "cudnn_rel_err_vs_fp64": _rel(self.cudnn_out, self.f64_ref)}
        del self.acc_ref, self.q_ref, self.f64_ref  # large float64 tensors: not needed again

    # launches used by the timing harness (enqueue on the current stream)
    def _params(self, x: Any, *ts: Any) -> list[Any]:
        """Epilogue vectors in x's framework (the fallback timing path uses CuPy)."""
        if type(x).__module__.startswith("cupy"):
            import cupy

            return [cupy.from_dlpack(t) for t in ts]
        return list(ts)

    def launch_int8(self, x: Any, w: Any, y: Any) -> None:
        scale, bias = self._params(x, self.scale, self.bias)
        self.ops["int8"](x, w, scale, bias, out=y)

    def launch_fp16(self, x: Any, w: Any, y: Any) -> None:
        (bias,) = self._params(x, self.b16)
        self.ops["fp16"](x, w, bias=bias, out=y)

    def time_all(self, l2: int) -> None:
        import torch

        from kernels.timing import sets_for_l2, time_launches

        out: dict[str, Any] = {}
        for name, x, w, y, fn in (("int8", self.x8, self.w8, self.y8, self.launch_int8),
                                  ("fp16", self.x16, self.w16, self.y16, self.launch_fp16)):
            n = sets_for_l2(sum(int(t.numel() * t.element_size()) for t in (x, w, y)), l2)
            xs, ws, ys = rotating(x, n), rotating(w, n), [torch.empty_like(y) for _ in range(n)]
            try:  # torch tensors through DLPack, captured in the harness's CUDA graph
                t = time_launches(lambda i, xs=xs, ws=ws, ys=ys, fn=fn: fn(xs[i], ws[i], ys[i]),
                                  n, api="torch")
                out[f"{name}_path"] = "torch"
            except Exception as e:  # noqa: BLE001 - same op and harness on CuPy arrays
                import cupy

                out[f"{name}_torch_error"] = f"{type(e).__name__}: {e}"[-400:]
                torch.cuda.synchronize()
                cx, cw, cy = ([cupy.from_dlpack(v) for v in vs] for vs in (xs, ws, ys))
                t = time_launches(lambda i, cx=cx, cw=cw, cy=cy, fn=fn: fn(cx[i], cw[i], cy[i]),
                                  n, api="cupy")
                out[f"{name}_path"] = "cupy"
            out[f"{name}_us"], out[f"{name}_iqr_us"] = round(t.median_us, 3), round(t.iqr_us, 3)
            del xs, ws, ys
        t = time_cudnn_conv(self.shape, self.xc, self.wc, l2)[0]
        out["cudnn_fp16_us"], out["cudnn_fp16_iqr_us"] = round(t.median_us, 3), round(t.iqr_us, 3)
        self.res["timing"] = out


def trace_torchvision() -> list[tuple[str, ConvShape]] | None:
    try:
        import torch
        import torchvision

        from api.plan import conv_layers
    except Exception as e:  # noqa: BLE001 - report and use the mirror
        log(f"torchvision trace unavailable: {e!r}")
        return None
    model = torchvision.models.resnet50(weights=None)  # random weights
    found = conv_layers(model, torch.randn(BATCH, 3, 224, 224))
    return [(f["name"], ConvShape.from_dict(f["shape"])) for f in found]


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from kernels.spec import target_for_gpu_model

    t_all = time.time()
    plan = json.loads((Path(a.cache) / PLAN_FILE).read_text())
    gpu = torch.cuda.get_device_name(0)
    target = target_for_gpu_model(gpu)
    tname = target.name if target else plan["target"]
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 50 * 2**20))
    log(f"GPU {gpu} -> target {tname}; torch {torch.__version__}, cuDNN "
        f"{torch.backends.cudnn.version()}")
    out: dict[str, Any] = {"gpu": gpu, "target": tname, "date": dt.date.today().isoformat(),
                           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                           "batch": BATCH, "command": " ".join(sys.argv)}
    convs = resnet50_convs()
    traced = trace_torchvision()
    out["model"] = "torchvision resnet50 (random weights), traced" if traced else \
        "mirror of torchvision resnet50 (torchvision unavailable)"
    if traced is not None and traced != convs:
        log("traced torchvision layers differ from the mirror: using the traced ones")
        convs = traced
    layers = unique_layers(convs)
    out["convs"] = [{"name": n, "key": s.key(), "kind": kind_of(s)} for n, s in convs]

    # 1. search the layers without a recorded best
    t0 = time.time()
    searched = search(plan, a.cache, a.search_budget_s, a.samples) if a.search_budget_s > 0 \
        else []
    out["search"] = {"budget_s": a.search_budget_s, "seconds": round(time.time() - t0, 1),
                     "samples": a.samples, "tasks": searched}
    log(f"search done in {time.time() - t0:.0f} s")

    # 2. every distinct layer through the runtime
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    tasks = {(t["key"], t["precision"]): t for t in plan["tasks"]}
    rows, kept = [], {}
    for li, u in enumerate(layers):
        scheds: dict[str, tuple[dict[str, Any], str]] = {}
        for p in ("int8", "fp16"):
            t = tasks.get((u["key"], p))
            if t is None:
                scheds[p] = (default_schedule(ConvShape.from_dict(u["shape"]), p, tname)[0],
                             "runtime default (not in the plan)")
            elif t["recorded"]:
                scheds[p] = (t["candidates"][0]["schedule"], t["candidates"][0]["origin"])
            elif t.get("best"):
                b = t["best"]
                n_ok = sum(c.get("status") == "ok" for c in t["candidates"])
                scheds[p] = (b["schedule"], f"search best of {n_ok} checked ({b['origin']})")
            else:
                scheds[p] = (t["candidates"][0]["schedule"], "runtime default (search found none)")
        row: dict[str, Any] = {**u, "schedules": {p: {"schedule": s, "source": src}
                                                  for p, (s, src) in scheds.items()}}
        try:
            layer = Layer(u, scheds, tname, seed=1000 + li)
            layer.check()
            layer.time_all(l2)
            row.update(layer.res)
            tm = layer.res["timing"]
            log(f"{u['kind']:>17} {u['key']} x{u['count']}: int8 {tm['int8_us']} fp16 "
                f"{tm['fp16_us']} cuDNN fp16 {tm['cudnn_fp16_us']} us; int8 exact "
                f"{layer.res['int8_check']['exact']}, fp16 rel vs cuDNN "
                f"{layer.res['fp16_check']['rel_err_vs_cudnn_fp16']:.2e}")
            kept[u["key"]] = layer
        except Exception as e:  # noqa: BLE001 - record the layer's failure, go on
            import traceback

            row["error"] = f"{type(e).__name__}: {e}"[-1500:]
            log(f"{u['key']}: FAILED {row['error']}\n{traceback.format_exc()[-1500:]}")
        rows.append(row)
        torch.cuda.empty_cache()
    out["layers"] = rows
    out["totals"] = totals(rows)

    # 3. one CUDA graph of all 53 convs back to back, per variant
    try:
        out["graph_network_us"] = network_graph(convs, kept)
    except Exception as e:  # noqa: BLE001
        out["graph_network_us"] = {"error": f"{type(e).__name__}: {e}"[-800:]}
    log(f"network graph: {out['graph_network_us']}")
    out["seconds"] = round(time.time() - t_all, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(render_table(out))
    return 0


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    acc: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        tm = r.get("timing")
        if not tm:
            continue
        for kind in (r["kind"], "network"):
            d = acc[kind]
            d["convs"] += r["count"]
            for v in ("int8_us", "fp16_us", "cudnn_fp16_us"):
                d[v] += r["count"] * tm[v]
    return {k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in acc.items()}


def network_graph(convs: list[tuple[str, ConvShape]], layers: dict[str, Layer]
                  ) -> dict[str, Any]:
    """All convs of the network in forward order, one input set each, in one CUDA graph."""
    import torch
    import torch.nn.functional as F

    from kernels.timing import time_launches

    seq = [layers[s.key()] for _, s in convs if s.key() in layers]
    ys8 = [torch.empty_like(L.y8) for L in seq]
    ys16 = [torch.empty_like(L.y16) for L in seq]
    xcs = [L.xc.contiguous(memory_format=torch.channels_last) for L in seq]
    wcs = [L.wc.contiguous(memory_format=torch.channels_last) for L in seq]

    def int8(_: int) -> None:
        for L, y in zip(seq, ys8, strict=True):
            L.launch_int8(L.x8, L.w8, y)

    def fp16(_: int) -> None:
        for L, y in zip(seq, ys16, strict=True):
            L.launch_fp16(L.x16, L.w16, y)

    def cudnn(_: int) -> None:
        for L, x, w in zip(seq, xcs, wcs, strict=True):
            F.conv2d(x, w, stride=L.shape.stride, padding=L.shape.pad,
                     dilation=L.shape.dilation)

    res: dict[str, Any] = {"convs": len(seq)}
    for name, fn in (("int8", int8), ("fp16", fp16), ("cudnn_fp16", cudnn)):
        try:
            t = time_launches(fn, 1, api="torch")
        except Exception as e:  # noqa: BLE001 - say so; the per-layer sums still stand
            res[f"{name}_error"] = f"{type(e).__name__}: {e}"[-400:]
            torch.cuda.synchronize()
            continue
        res[f"{name}_us"] = round(t.median_us, 2)
        res[f"{name}_iqr_us"] = round(t.iqr_us, 2)
    return res


# ---- the table ---------------------------------------------------------------------------
KIND_ORDER = ("7x7/2 stem", "3x3", "3x3/2", "1x1", "1x1/2 downsample", "network")


def render_table(d: dict[str, Any]) -> str:
    lines = [f"GPU: {d['gpu']} ({d['date']}; torch {d['torch']}, cuDNN {d['cudnn']}), batch "
             f"{d['batch']}, {d.get('model', '')}.", "",
             "| layer kind | convs | int8 tuned µs | fp16 tuned µs | cuDNN fp16 µs | "
             "int8 / cuDNN fp16 | fp16 / cuDNN fp16 |", "|---|---|---|---|---|---|---|"]
    tot = d["totals"]
    for k in KIND_ORDER:
        if k not in tot:
            continue
        t = tot[k]
        name = "**whole network (sum of layers)**" if k == "network" else k
        lines.append(f"| {name} | {int(t['convs'])} | {t['int8_us']:.1f} | {t['fp16_us']:.1f} | "
                     f"{t['cudnn_fp16_us']:.1f} | {t['int8_us'] / t['cudnn_fp16_us']:.2f} | "
                     f"{t['fp16_us'] / t['cudnn_fp16_us']:.2f} |")
    g = d.get("graph_network_us", {})
    if all(f"{v}_us" in g for v in ("int8", "fp16", "cudnn_fp16")):
        lines.append(f"| whole network, one CUDA graph of all {g['convs']} convs | "
                     f"{g['convs']} | {g['int8_us']:.1f} | {g['fp16_us']:.1f} | "
                     f"{g['cudnn_fp16_us']:.1f} | {g['int8_us'] / g['cudnn_fp16_us']:.2f} | "
                     f"{g['fp16_us'] / g['cudnn_fp16_us']:.2f} |")
    lines += ["", "| layer (batch 8) | kind | × | int8 µs | fp16 µs | cuDNN fp16 µs | int8 exact "
                  "(acc / requant mismatches) | fp16 rel. err vs cuDNN fp16 | ours / cuDNN vs "
                  "fp64 | int8 schedule from | fp16 schedule from |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["layers"]:
        s = r["shape"]
        name = (f"{s['h']}x{s['w']}x{s['c']}→{s['k']} {s['r']}x{s['s']}"
                f"{'/' + str(s['stride'][0]) if s['stride'][0] > 1 else ''}")
        if "timing" not in r:
            lines.append(f"| {name} | {r['kind']} | {r['count']} | failed: "
                         f"{r.get('error', '')[:120]} | | | | | | | |")
            continue
        tm, c8, c16 = r["timing"], r["int8_check"], r["fp16_check"]
        lines.append(
            f"| {name} | {r['kind']} | {r['count']} | {tm['int8_us']:.2f} | {tm['fp16_us']:.2f} | "
            f"{tm['cudnn_fp16_us']:.2f} | {'yes' if c8['exact'] else 'NO'} "
            f"({c8['acc_mismatches']} / {c8['requant_mismatches']}) | "
            f"{c16['rel_err_vs_cudnn_fp16']:.1e} | {c16['rel_err_vs_fp64']:.1e} / "
            f"{c16['cudnn_rel_err_vs_fp64']:.1e} | {_short(r['schedules']['int8']['source'])} | "
            f"{_short(r['schedules']['fp16']['source'])} |")
    return "\n".join(lines)


def _short(src: str) -> str:
    if src.startswith("recorded best ("):
        return "recorded exhaustive best"
    if src.startswith("search best"):
        return src.split(" (")[0].replace("search best of", "search: best of") + \
            (" = runtime default" if "runtime default" in src else "")
    return src


def cmd_table(a: argparse.Namespace) -> int:
    print(render_table(json.loads(Path(a.data).read_text())))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("prebuild")
    b.add_argument("--cache", default=os.environ.get("TCTUNE_KERNEL_CACHE", ".rtcache"))
    b.add_argument("--target", default="h200")
    b.add_argument("--random", type=int, default=10, help="random candidates per layer")
    b.add_argument("--seed", type=int, default=50)
    b.add_argument("--recorded", default="bench/data/conv_vs_cudnn_h200_sync.json")
    b.add_argument("--workers", type=int, default=None)
    r = sub.add_parser("run")
    r.add_argument("--cache", default=os.environ.get("TCTUNE_KERNEL_CACHE", ".rtcache"))
    r.add_argument("--out", default="bench/data/resnet50_e2e.json")
    r.add_argument("--search-budget-s", type=float, default=150.0)
    r.add_argument("--samples", type=int, default=5)
    t = sub.add_parser("table")
    t.add_argument("data", nargs="?", default="bench/data/resnet50_e2e.json")
    a = ap.parse_args(argv)
    return {"prebuild": cmd_prebuild, "run": cmd_run, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
