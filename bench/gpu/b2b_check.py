"""The back-to-back 1x1 conv (kernels/b2b.cuh) on ResNet-50's bottleneck pairs at batch 8: every
build checked on random inputs (the layer's output and the back-to-back output), then timed against
the same schedule without the b2b and against the two layers alone, each on its record (the
pair's time today), in one process.

A pair is a bottleneck's last conv (1x1, with the block's residual add and ReLU) and the next
block's first (1x1, ReLU) over its output; where a block tile covers the whole K output
channels, one kernel runs both (`Epilogue(b2b=...)`). The sm_75 / sm_80 paths of mma.sync
schedules are checked as PTX (the driver compiles them), not timed.

    python -m bench.gpu.b2b_check prebuild --cache C --per-case 6 --out J.json  # CPU
    python -m bench.gpu.b2b_check run --cache C --jobs J.json --out O.json      # GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.cli import commands, log, read_json
from kernels.spec import ConvShape, Precision, get_target, task_key

# (name, the last conv's shape with its residual, the back-to-back conv's output channels)
PAIRS = [
    ("layer1.x.conv3 -> layer1.y.conv1", ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True), 64),
    ("layer1.2.conv3 -> layer2.0.conv1", ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True), 128),
    ("layer2.x.conv3 -> layer2.y.conv1", ConvShape(8, 28, 28, 128, 512, 1, 1, residual=True), 128),
]
RECORDS = "bench/data/model_e2e_records_r50_chosen_h200.json"


def _epilogue(b2b: int) -> Any:
    from kernels.build import Epilogue

    return Epilogue(relu=True, residual=True, b2b=b2b, b2b_relu=bool(b2b))


def _b2b_schedules(shape: ConvShape, p: Precision, b2b: int, count: int,
                   rng: np.random.Generator) -> list[dict[str, Any]]:
    """Up to `count` random schedules of the search's space of the layer with its
    back-to-back conv (ConvShape.b2b: its rule and shared memory), half of them wgmma where
    there are enough."""
    from kernels.space import ScheduleSpace

    space = ScheduleSpace(replace(shape, b2b=b2b), p, get_target("h200"))
    picked: dict[str, list[dict[str, Any]]] = {"wgmma": [], "sync": []}
    idx = space.valid_indices  # (read-only: the space's cache)
    for i in rng.permutation(len(idx)):
        s = space.schedule_at(int(idx[i]))
        picked[s.get("MMA", "sync")].append(dict(s))
    wg = picked["wgmma"][: count - min(count // 2, len(picked["sync"]))]
    return (wg + picked["sync"])[:count]


def cmd_prebuild(a: argparse.Namespace) -> int:
    """Build every job on the CPU (NVRTC): each back-to-back schedule, its twin without the
    b2b, the back-to-back layer on its record, and PTX of the mma.sync ones for sm_75 / 80."""
    from kernels.build import BuildJob, Epilogue, build

    rng = np.random.default_rng(a.seed)
    records = json.loads(Path(a.records).read_text())
    target = get_target("h200")
    jobs: list[dict[str, Any]] = []
    for name, shape, b2b in PAIRS:
        second = ConvShape(shape.n, shape.p, shape.q, shape.k, b2b, 1, 1)
        for p in (Precision.INT8, Precision.FP16):
            row: dict[str, Any] = {"pair": name, "shape": shape.to_dict(), "b2b": b2b,
                                   "precision": p.value, "builds": []}
            for label, layer, epi in (("first", shape, Epilogue(relu=True, residual=True)),
                                      ("second", second, Epilogue(relu=True))):
                rec = records.get(task_key(layer, p, target))
                if rec:
                    r = build(BuildJob(layer, p, 90, rec["schedule"], epi), a.cache)
                    row[label] = {"schedule": rec["schedule"], "key": r.key, "status": r.status}
            for s in _b2b_schedules(shape, p, b2b, a.per_case, rng):
                b: dict[str, Any] = {"schedule": s}
                ptx = (("ptx75", b2b, 75, True), ("ptx80", b2b, 80, True)) \
                    if s.get("MMA", "sync") == "sync" else ()
                for label, ch, sm, as_ptx in (("b2b", b2b, 90, False),
                                              ("twin", 0, 90, False), *ptx):
                    r = build(BuildJob(shape, p, sm, s, _epilogue(ch), ptx=as_ptx), a.cache)
                    b[label] = {"key": r.key, "status": r.status,
                                **({"log": r.log[-800:]} if r.status != "ok" else {})}
                row["builds"].append(b)
                log(f"{name} {p.value}: {b['b2b']['status']} {s}")
            jobs.append(row)
    Path(a.out).write_text(json.dumps({"records": a.records, "jobs": jobs}, indent=1))
    return 0


def _launcher(fn: Any, meta: dict[str, Any], args: tuple[Any, ...],
              b2b: tuple[Any, ...] | None) -> Any:
    """launch(i) of one build on fixed arguments (x, w, scale, bias, y, ws, counters, res,
    res_scale), for kernels.timing."""
    from kernels.launch import launch

    return lambda i: launch(fn, meta, *args, b2b=b2b)


def _check_job(job: dict[str, Any], fn_of: Any) -> list[dict[str, Any]]:
    """Check and time one pair's builds (bench docstring)."""
    import cupy as cp

    from kernels.launch import alloc_scratch
    from kernels.reference import check_output, make_b2b, make_problem, to_device_bytes
    from kernels.timing import time_launches

    shape, p = ConvShape.from_dict(job["shape"]), Precision(job["precision"])
    b2b = int(job["b2b"])
    prob = make_problem(shape, p)
    ref = make_b2b(prob, b2b, True, True, True)
    xb, wb = prob.device_inputs("nhwc")
    res, res_scale = prob.residual()
    x, w = cp.asarray(xb), cp.asarray(wb)
    r = cp.asarray(to_device_bytes(res, p, "nhwc", 128 // (8 * res.itemsize)))
    sc, bi = cp.asarray(prob.scale), cp.asarray(prob.bias)
    w2, s2, b2 = (cp.asarray(ref.device_weights()), cp.asarray(ref.scale), cp.asarray(ref.bias))
    eb = p.input_bits // 8
    y = cp.empty(shape.gemm_m * shape.k * eb, dtype=cp.uint8)
    y2 = cp.empty(shape.gemm_m * b2b * eb, dtype=cp.uint8)
    want_y = prob.expected("requant" if p.is_integer else "bias", True, True)
    dt_out, dt_cmp = (np.int8, np.int64) if p is Precision.INT8 else (np.float16, np.float64)
    alone: dict[str, float | None] = {"first_us": None, "second_us": None}
    if job.get("first", {}).get("status") == "ok":  # the layer on its record
        fn1, meta1 = fn_of(job["first"]["key"])
        args1 = (x, w, sc, bi, cp.empty_like(y), *alloc_scratch(meta1), r, res_scale)
        alone["first_us"] = time_launches(_launcher(fn1, meta1, args1, None), 1).median_us
    if job.get("second", {}).get("status") == "ok":  # the back-to-back layer alone, on its record
        fn2, meta2 = fn_of(job["second"]["key"])
        y_in = cp.zeros(shape.gemm_m * shape.k * eb, dtype=cp.uint8)
        w_in = cp.zeros(b2b * shape.k * eb, dtype=cp.uint8)
        args2 = (y_in, w_in, s2, b2, cp.empty_like(y2), *alloc_scratch(meta2))
        alone["second_us"] = time_launches(_launcher(fn2, meta2, args2, None), 1).median_us
    rows = []
    for b in job["builds"]:
        out: dict[str, Any] = {"pair": job["pair"], "precision": p.value, "b2b": b2b,
                               "schedule": b["schedule"], **alone}
        for label in ("b2b", "ptx80", "ptx75"):
            if label not in b:
                continue
            if b[label]["status"] != "ok":
                out[label] = {"ok": False, "error": "build: " + b[label].get("log", "")}
                continue
            fn, meta = fn_of(b[label]["key"])
            run = _launcher(fn, meta, (x, w, sc, bi, y, *alloc_scratch(meta), r, res_scale),
                            (w2, s2, b2, y2))
            y.fill(0x5A)
            y2.fill(0x5A)
            try:
                run(0)
                cp.cuda.runtime.deviceSynchronize()
            except Exception as e:  # a fault is this build's result; the context is lost
                out[label] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                rows.append(out)
                return rows
            got_y = cp.asnumpy(y).view(dt_out).reshape(want_y.shape).astype(dt_cmp)
            got_2 = cp.asnumpy(y2).view(dt_out).reshape(ref.expected.shape).astype(dt_cmp)
            ok1, st1 = check_output(got_y, want_y, p, p.output_bits)
            ok2, st2 = check_output(got_2, ref.expected, p, p.output_bits)
            out[label] = {"ok": bool(ok1 and ok2), "y": st1, "y2": st2}
            if label == "b2b" and ok1 and ok2:
                out["b2b_us"] = time_launches(run, 1).median_us
        if b.get("twin", {}).get("status") == "ok" and out.get("b2b_us"):
            fn, meta = fn_of(b["twin"]["key"])
            args = (x, w, sc, bi, y, *alloc_scratch(meta), r, res_scale)
            out["twin_us"] = time_launches(_launcher(fn, meta, args, None), 1).median_us
        rows.append(out)
        log(f"{job['pair']} {p.value}: ok={out['b2b'].get('ok')} "
            f"b2b {out.get('b2b_us')} twin {out.get('twin_us')} alone {alone} "
            f"ptx {[out[k].get('ok') for k in ('ptx80', 'ptx75') if k in out]}")
    return rows


def cmd_run(a: argparse.Namespace) -> int:
    import cupy as cp

    from kernels.build import cubin_path, load_meta
    from kernels.launch import load_function

    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    doc: dict[str, Any] = {"gpu": name.decode() if isinstance(name, bytes) else str(name),
                           "date": dt.date.today().isoformat(), "rows": []}
    mods: list[Any] = []  # each module lives as long as its function is used

    def fn_of(key: str) -> tuple[Any, dict[str, Any]]:
        meta = load_meta(a.cache, key)
        mod, fn = load_function(cubin_path(a.cache, key), meta)
        mods.append(mod)
        return fn, meta

    for job in read_json(a.jobs)["jobs"]:
        doc["rows"] += _check_job(job, fn_of)
        Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.gpu.b2b_check", __doc__)
    s = sub.add_parser("prebuild")
    s.add_argument("--cache", required=True)
    s.add_argument("--records", default=RECORDS)
    s.add_argument("--per-case", type=int, default=6)
    s.add_argument("--seed", type=int, default=5)
    s.add_argument("--out", required=True)
    s = sub.add_parser("run")
    s.add_argument("--cache", required=True)
    s.add_argument("--jobs", required=True)
    s.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    return {"prebuild": cmd_prebuild, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
