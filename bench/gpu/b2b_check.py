"""The back-to-back 1x1 conv (kernels/b2b.cuh) on ResNet-50's bottleneck pairs at batch 8: every
build checked on random inputs (the layer's output and the back-to-back output), then timed against
the same schedule without the b2b and against the two layers alone, each on its record (the
pair's time today), in one process.

A pair is a bottleneck's last conv (1x1, with the block's residual add and ReLU) and the next
block's first (1x1, ReLU) over its output; where a block tile covers the whole K output
channels, one kernel runs both (`Epilogue(b2b=...)`). The sm_75 / sm_80 paths of mma.sync
schedules are checked as PTX (the driver compiles them), not timed.

    python -m bench.gpu.b2b_check prebuild --cache C --per-case 8 --near 40 --out J.json  # CPU
    python -m bench.gpu.b2b_check run --cache C --jobs J.json --out O.json                # GPU
    python -m bench.gpu.b2b_check table O.json
    python -m bench.gpu.b2b_check records O.json --base R.json --out R2.json  # for deploy

`--near N` also times the N schedules of the b2b layer's space nearest the first layer's record
(the search's neighbourhood of today's best). `table` ends with the fit of the b2b's time over
its twin's on the second weights its grid reads, and the twin's time when launched with the b2b
build's shared memory (occupancy's part).
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
    ("layer2.3.conv3 -> layer3.0.conv1", ConvShape(8, 28, 28, 128, 512, 1, 1, residual=True), 256),
]
RECORDS = "bench/data/model_e2e_records_r50_chosen_h200.json"


def _epilogue(b2b: int) -> Any:
    from kernels.build import Epilogue

    return Epilogue(relu=True, residual=True, b2b=b2b, b2b_relu=bool(b2b))


def _space_indices(space: Any, mma: str | None) -> np.ndarray:
    """The space's valid schedules, only those of one MMA path where `mma` says so."""
    idx = space.valid_indices  # (read-only: the space's cache)
    if mma:
        idx = idx[np.asarray(space.columns(idx)["MMA"], dtype=object) == mma]
    return idx


def _b2b_schedules(shape: ConvShape, p: Precision, b2b: int, count: int,
                   rng: np.random.Generator, mma: str | None = None) -> list[dict[str, Any]]:
    """Up to `count` random schedules of the search's space of the layer with its
    back-to-back conv (ConvShape.b2b: its rule and shared memory), half of them wgmma where
    there are enough (`mma`: of that path only)."""
    from kernels.space import ScheduleSpace

    space = ScheduleSpace(replace(shape, b2b=b2b), p, get_target("h200"))
    picked: dict[str, list[dict[str, Any]]] = {"wgmma": [], "sync": []}
    idx = _space_indices(space, mma)
    for i in rng.permutation(len(idx)):
        s = space.schedule_at(int(idx[i]))
        picked[s.get("MMA", "sync")].append(dict(s))
    wg = picked["wgmma"][: count - min(count // 2, len(picked["sync"]))]
    return (wg + picked["sync"])[:count]


def _near_schedules(shape: ConvShape, p: Precision, b2b: int, record: dict[str, Any],
                    count: int, rng: np.random.Generator,
                    mma: str | None = None) -> list[dict[str, Any]]:
    """The `count` schedules of the b2b layer's space fewest knobs away from the layer's
    record (ties in random order; `mma`: of that path only): the search's neighbourhood of
    today's best."""
    from kernels.space import ScheduleSpace

    space = ScheduleSpace(replace(shape, b2b=b2b), p, get_target("h200"))
    idx = _space_indices(space, mma)
    idx = idx[rng.permutation(len(idx))]
    cols = space.columns(idx)
    apart = sum((np.asarray(cols[k], dtype=object) != v).astype(int)
                for k, v in record.items() if k in cols)
    return [dict(space.schedule_at(int(idx[i]))) for i in np.argsort(apart, kind="stable")[:count]]


def cmd_prebuild(a: argparse.Namespace) -> int:
    """Build every job on the CPU (NVRTC): the schedules near the record (`--near`), each
    random back-to-back schedule, its twin without the b2b and PTX of the mma.sync ones for
    sm_75 / 80, and the two layers on their records."""
    from kernels.build import BuildJob, Epilogue, build, load_meta

    rng = np.random.default_rng(a.seed)
    records = json.loads(Path(a.records).read_text())
    target = get_target("h200")
    smem_limit = target.smem_per_block_kib * 1024
    jobs: list[dict[str, Any]] = []
    for name, shape, b2b in PAIRS:
        if a.pairs and name not in a.pairs:
            continue
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
            near = _near_schedules(shape, p, b2b, row["first"]["schedule"], a.near, rng,
                                   a.mma) if "first" in row and a.near else []
            for s in near:  # timed only: the random ones below check the paths
                r = build(BuildJob(shape, p, 90, s, _epilogue(b2b)), a.cache)
                row["builds"].append({"schedule": s, "near": True,
                                      "b2b": {"key": r.key, "status": r.status}})
            log(f"{name} {p.value}: {len(near)} near the record")
            for s in _b2b_schedules(shape, p, b2b, a.per_case, rng, a.mma):
                b: dict[str, Any] = {"schedule": s}
                # sm_75's register-staged pipeline is double-buffered at most (conv.cu)
                s75 = {**s, "STAGES": min(int(s.get("STAGES", 2)), 2)}
                ptx = (("ptx75", s75, 75, True), ("ptx80", s, 80, True)) \
                    if s.get("MMA", "sync") == "sync" else ()
                for label, sched, sm, as_ptx in (("b2b", s, 90, False), ("twin", s, 90, False),
                                                 *ptx):
                    ch = 0 if label == "twin" else b2b
                    r = build(BuildJob(shape, p, sm, sched, _epilogue(ch), ptx=as_ptx), a.cache)
                    if r.status == "ok" and \
                            int(load_meta(a.cache, r.key)["smem_bytes"]) > smem_limit:
                        continue  # an sm_75 / sm_80 layout this GPU cannot hold (nor theirs)
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
                               "schedule": b["schedule"], "near": bool(b.get("near")), **alone}
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
            ok2, st2 = check_output(got_2, ref.over(got_y), p, p.output_bits)
            out[label] = {"ok": bool(ok1 and ok2), "y": st1, "y2": st2}
            if label == "b2b" and ok1 and ok2:
                out["b2b_us"] = time_launches(run, 1).median_us
                out["smem_bytes"] = int(meta["smem_bytes"])
        if b.get("twin", {}).get("status") == "ok" and out.get("b2b_us"):
            fn, meta = fn_of(b["twin"]["key"])
            args = (x, w, sc, bi, y, *alloc_scratch(meta), r, res_scale)
            out["twin_us"] = time_launches(_launcher(fn, meta, args, None), 1).median_us
            # The twin launched with the b2b build's shared memory (as few blocks per SM):
            # what of the difference is occupancy, what the second conv's work.
            if out["smem_bytes"] > int(meta["smem_bytes"]):
                fn.max_dynamic_shared_size_bytes = out["smem_bytes"]
                padded = {**meta, "smem_bytes": out["smem_bytes"]}
                out["twin_b2b_smem_us"] = time_launches(
                    _launcher(fn, padded, args, None), 1).median_us
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


def _cell(v: float | None) -> str:
    return f"{v:.2f}" if v else "-"


def table(doc: dict[str, Any]) -> str:
    """Per pair and precision: the builds checked and right (sm_90, and the PTX paths), the
    fastest back-to-back kernel against the two layers on their records, and its twin."""
    lines = ["| pair | precision | right / checked | b2b µs | twin µs | two layers µs "
             "(first + second) | b2b / two layers |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in doc["rows"]:
        groups.setdefault((r["pair"], r["precision"]), []).append(r)
    for (pair, prec), rows in groups.items():
        checks = [r[k] for r in rows for k in ("b2b", "ptx80", "ptx75")
                  if k in r and (k != "b2b" or not r.get("near"))]
        timed = [r for r in rows if r.get("b2b_us")]
        best = min(timed, key=lambda r: r["b2b_us"], default=None)
        twins = [r["twin_us"] for r in rows if r.get("twin_us")]
        first, second = rows[0].get("first_us"), rows[0].get("second_us")
        both = first + second if first and second else None
        b2b_us = best["b2b_us"] if best else None
        ratio = b2b_us / both if b2b_us and both else None
        lines.append(
            f"| {pair} | {prec} | {sum(bool(c.get('ok')) for c in checks)} / {len(checks)} | "
            f"{_cell(b2b_us)} | {_cell(min(twins, default=None))} | "
            f"{_cell(both)} ({_cell(first)} + {_cell(second)}) | {_cell(ratio)} |")
    fit = _overhead_fit(doc["rows"])
    if fit:
        lines.append(f"\nThe b2b kernel's time over its twin's: {fit[1]:.2f} µs + {fit[0]:.3f} µs "
                     f"per MB of second-conv weights its blocks read (blocks x n x K bytes), "
                     f"r = {fit[2]:.2f} over {fit[3]} schedules.")
    padded = sorted(r["twin_b2b_smem_us"] / r["twin_us"] for r in doc["rows"]
                    if r.get("twin_b2b_smem_us"))
    if padded:
        lines.append(f"The twin launched with the b2b build's shared memory: "
                     f"{padded[len(padded) // 2]:.3f}x its time (median), up to {padded[-1]:.2f}x, "
                     f"over {len(padded)} schedules.")
    return "\n".join(lines)


def _overhead_fit(rows: list[dict[str, Any]]) -> tuple[float, float, float, int] | None:
    """Least squares of (b2b - twin) µs on the MB of second weights the grid reads (each
    block reads them all): slope, intercept, correlation, count."""
    from kernels.space import geometry

    names = {name: (shape, b2b) for name, shape, b2b in PAIRS}
    xs, ys = [], []
    for r in rows:
        if not r.get("twin_us") or r["pair"] not in names:
            continue
        shape, b2b = names[r["pair"]]
        p = Precision(r["precision"])
        g = geometry(shape, p, get_target("h200"),
                     {k: np.array([v]) for k, v in r["schedule"].items()}, residual=True, b2b=b2b)
        blocks = int(g.grid_blocks[0])
        if r["schedule"].get("PERSIST"):  # kernels.launch.launch_dims: weights read once a block
            blocks = min(blocks, int(r["schedule"]["PERSIST"]) * get_target("h200").sms)
        xs.append(blocks * b2b * shape.k * p.input_bits // 8 / 1e6)
        ys.append(r["b2b_us"] - r["twin_us"])
    if len(xs) < 3:
        return None
    slope, icept = np.polyfit(xs, ys, 1)
    return float(slope), float(icept), float(np.corrcoef(xs, ys)[0, 1]), len(xs)


def cmd_records(a: argparse.Namespace) -> int:
    """The fastest right build of each pair and precision as the record of the layer with its
    back-to-back conv (ConvShape.b2b), over `--base`'s records, where it beats the two layers
    on their records timed in the same run (its baseline: `deploy.optimize` takes a pair
    where its record is faster than the two layers' records, timed in other runs)."""
    out: dict[str, Any] = json.loads(Path(a.base).read_text()) if a.base else {}
    names = {name: (shape, b2b) for name, shape, b2b in PAIRS}
    target = get_target("h200")
    for path in a.files:
        best: dict[tuple[str, str], dict[str, Any]] = {}
        for r in read_json(path)["rows"]:
            if r.get("b2b_us") and r["b2b"].get("ok") and r["pair"] in names:
                k = (r["pair"], r["precision"])
                if k not in best or r["b2b_us"] < best[k]["b2b_us"]:
                    best[k] = r
        for (pair, prec), r in best.items():
            shape, b2b = names[pair]
            key = task_key(replace(shape, b2b=b2b), Precision(prec), target)
            if key in out and out[key]["latency_us"] <= r["b2b_us"]:
                continue
            two = (r["first_us"] or 0) + (r["second_us"] or 0)
            if not r["first_us"] or not r["second_us"] or r["b2b_us"] >= two:
                log(f"{key}: {r['b2b_us']:.2f} µs, not faster than the two layers ({two:.2f})")
                continue
            out[key] = {"schedule": r["schedule"], "latency_us": r["b2b_us"],
                        "baseline_us": two, "baseline": "its two layers on their records",
                        "speedup": two / r["b2b_us"],
                        "source": f"{Path(path).name}: {pair}"}
            log(f"{key}: {r['b2b_us']:.2f} µs against {two:.2f} for the two layers")
    Path(a.out).write_text(json.dumps(out, indent=1))
    return 0


def cmd_table(a: argparse.Namespace) -> int:
    print(table(read_json(a.data)))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.gpu.b2b_check", __doc__)
    s = sub.add_parser("prebuild")
    s.add_argument("--cache", required=True)
    s.add_argument("--records", default=RECORDS)
    s.add_argument("--per-case", type=int, default=6, help="random schedules, each checked "
                   "on sm_90 (and as sm_75 / sm_80 PTX), timed with its twin")
    s.add_argument("--near", type=int, default=0,
                   help="also time the N schedules nearest the layer's record")
    s.add_argument("--seed", type=int, default=5)
    s.add_argument("--mma", choices=("sync", "wgmma"), help="schedules of this path only")
    s.add_argument("--pairs", nargs="*", help="these pairs only (names as in the table)")
    s.add_argument("--out", required=True)
    s = sub.add_parser("run")
    s.add_argument("--cache", required=True)
    s.add_argument("--jobs", required=True)
    s.add_argument("--out", required=True)
    s = sub.add_parser("table")
    s.add_argument("data")
    s = sub.add_parser("records")
    s.add_argument("files", nargs="+")
    s.add_argument("--base", help="a records file the pairs' records are added to")
    s.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    return {"prebuild": cmd_prebuild, "run": cmd_run, "table": cmd_table,
            "records": cmd_records}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
