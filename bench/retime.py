"""Every conv of a model on its recorded best schedule against cuDNN fp16, all in one run.

  python -m bench.model_e2e records bench/data/zoo_h100.json \\
      bench/data/layer_search_r50_h100.json --out R.json                        # CPU
  python -m bench.retime prebuild --records R.json --cache C --models resnet50   # CPU
  python -m bench.retime run --records R.json --cache C --models resnet50 --batches 8 \\
      --out bench/data/retime_r50_h100.json                                     # GPU
  python -m bench.retime table bench/data/retime_r50_h100.json
  ncu ... python -m bench.retime profile --records R.json --cache C --keys K1,K2 --models M

The schedules come from earlier runs (bench/zoo.py's short searches, bench/layer_search.py's
long ones); the ratios do not: each distinct (shape, precision) is built, checked on random
inputs and timed, and cuDNN fp16 timed once per shape, through the GPU worker's backend
(workers/backends/cuda.py, kernels/cudnn.py's baseline: the faster of cuDNN's two algorithm
picks) in this one run. A network row sums its layers weighted by their counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from bench.cli import add_records_target, add_table, commands, geomean, log, print_table, records_on
from bench.zoo import add_layer_args, atomic_write, planned, shape_text
from kernels.spec import Precision, task_key


def network_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, n, precision): the layers' sums weighted by count; None where a layer
    has no time."""
    nets: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        for model, count in r["uses"]:
            nets.setdefault((model, r["n"], r["precision"]), []).append({**r, "count": count})
    out = []
    for (model, n, p), rs in nets.items():
        whole = all(r.get("ours_us") and r.get("cudnn_fp16_us") for r in rs)
        ours = sum(r["ours_us"] * r["count"] for r in rs) if whole else None
        base = sum(r["cudnn_fp16_us"] * r["count"] for r in rs) if whole else None
        out.append({"model": model, "n": n, "precision": p, "layers": sum(r["count"] for r in rs),
                    "ours_us": ours and round(ours, 3), "cudnn_fp16_us": base and round(base, 3),
                    "ratio": round(ours / base, 4) if ours and base else None})
    return out


def prebuild(a: argparse.Namespace) -> int:
    """Build what `run` will measure (NVRTC, no GPU) into --cache, for the run's target."""
    from kernels.build import BuildJob, build_many
    from kernels.spec import get_target

    target = get_target(a.target)
    records = records_on(a.records, target.name, a.records_target)
    jobs = []
    for g in planned(a):
        rec = records.get(task_key(g.shape, Precision(g.precision), target))
        if rec:
            jobs.append(BuildJob(g.shape, Precision(g.precision), target.sm, rec["schedule"]))
    res = build_many(jobs, a.cache)
    log(f"{sum(r.status == 'ok' for r in res)} of {len(jobs)} built into {a.cache}")
    return 0


def run(a: argparse.Namespace) -> int:
    from workers.backends.base import TaskSpec
    from workers.backends.cuda import CudaBackend

    groups = planned(a)
    backend = CudaBackend(a.cache)
    target = backend.target
    if target is None:
        raise SystemExit(f"no target for GPU {backend.gpu_model!r}")
    records = records_on(a.records, target.name, a.records_target)
    rows: list[dict[str, Any]] = []
    cudnn: dict[str, float | None] = {}
    doc: dict[str, Any] = {"gpu": backend.gpu_model, "target": target.name,
                           "date": dt.date.today().isoformat(), "records": a.records, "rows": rows}
    try:
        for g in groups:
            prec = Precision(g.precision)
            spec = TaskSpec(g.shape, prec, target)
            rec = records.get(task_key(g.shape, prec, target))
            row: dict[str, Any] = {
                "layer": g.uses[0].layers[0], "shape": g.shape.to_dict(), "n": g.shape.n,
                "precision": g.precision, "uses": [[u.model, u.count] for u in g.uses],
                "schedule": rec and rec["schedule"], "source": rec and rec.get("source"),
                "ours_us": None, "status": "no record"}
            if rec:
                b = backend.build(spec, rec["schedule"])
                m = backend.measure(spec, rec["schedule"], b)
                row.update(status=m.status, ours_us=m.median_us, iqr_us=m.iqr_us)
            if g.shape.key() not in cudnn:
                cudnn[g.shape.key()] = backend.baseline_us(spec)
            row["cudnn_fp16_us"] = cudnn[g.shape.key()]
            rows.append(row)
            log(f"{g.shape.key()} {g.precision}: {row['status']} {row['ours_us']} us, cuDNN fp16 "
                f"{row['cudnn_fp16_us']} us")
            doc["networks"] = network_rows(rows)
            atomic_write(Path(a.out), json.dumps(doc, indent=1) + "\n")
    finally:
        backend.close()
    return 0


def profile(a: argparse.Namespace) -> int:
    """An ncu target: one checked launch of each picked layer's recorded schedule (--keys:
    shape keys; built into --cache if it lacks them), then three of cuDNN fp16's conv of each
    layer under its heuristic pick (benchmark's pick would profile every algorithm it tries)."""
    import torch
    import torch.nn.functional as F

    from kernels.build import BuildJob, build
    from kernels.cudnn import algorithm_pick
    from kernels.runner import DeviceSession
    from kernels.spec import get_target

    target = get_target(a.target)
    records = records_on(a.records, target.name, a.records_target)
    keys = set(a.keys.split(","))
    groups = [g for g in planned(a) if g.shape.key() in keys]
    sess = DeviceSession()
    for g in groups:
        rec = records.get(task_key(g.shape, Precision(g.precision), target))
        if rec:
            key = build(BuildJob(g.shape, Precision(g.precision), target.sm, rec["schedule"]),
                        a.cache).key
            print(g.shape.key(), g.precision, rec["latency_us"], rec["schedule"],
                  sess.measure(a.cache, key, time_it=False)["status"], flush=True)
    for shape in {g.shape.key(): g.shape for g in groups}.values():
        x = torch.randn(shape.n, shape.c, shape.h, shape.w, device="cuda", dtype=torch.float16)
        w = torch.randn(shape.k, shape.c, shape.r, shape.s, device="cuda", dtype=torch.float16)
        x, w = (t.contiguous(memory_format=torch.channels_last) for t in (x, w))
        with algorithm_pick(False, False, True):
            for _ in range(3):
                F.conv2d(x, w, stride=shape.stride, padding=shape.pad, dilation=shape.dilation)
        torch.cuda.synchronize()
    return 0


def render(doc: dict[str, Any]) -> str:
    lines = [f"{doc['gpu']}, {doc['date']}", "",
             "| model | batch | precision | convs | ours us | cuDNN fp16 us | ours/cuDNN |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["networks"]:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
        lines.append(f"| {r['model']} | {r['n']} | {r['precision']} | {r['layers']} | "
                     f"{r['ours_us'] or '-'} | {r['cudnn_fp16_us'] or '-'} | {ratio} |")
    lines += ["", "| layer | shape | n | precision | ours us | cuDNN fp16 us | ours/cuDNN | "
              "schedule from |", "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        ours, base = r.get("ours_us"), r.get("cudnn_fp16_us")
        ratio = f"{ours / base:.2f}x" if ours and base else "-"
        lines.append(f"| {r['layer']} | {shape_text(r['shape'])} | {r['n']} | {r['precision']} | "
                     f"{ours if ours else r['status']} | {base or '-'} | {ratio} | "
                     f"{(r.get('source') or '-').split(':')[0]} |")
    ratios = [r["ours_us"] / r["cudnn_fp16_us"] for r in doc["rows"]
              if r.get("ours_us") and r.get("cudnn_fp16_us")]
    if ratios:
        lines += ["", f"{len(ratios)} layer measurements: geomean ours/cuDNN "
                  f"{geomean(ratios):.2f}x"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.retime", __doc__)
    r = sub.add_parser("run", help="time on this machine's GPU")
    r.add_argument("--out", required=True)
    pb = sub.add_parser("prebuild", help="build the kernels on a CPU")
    pf = sub.add_parser("profile", help="an ncu target: the --keys layers, ours then cuDNN's")
    pf.add_argument("--keys", required=True, help="comma-separated shape keys")
    for p in (pb, pf):
        p.add_argument("--target", default="h100")
    for p in (r, pb, pf):
        p.add_argument("--records", required=True)
        p.add_argument("--cache", default="/tmp/tctune-retime")
        add_records_target(p)
        add_layer_args(p, models="resnet50", batches="8")
    add_table(sub)
    a = ap.parse_args(argv)
    if print_table(a, render):
        return 0
    return {"run": run, "prebuild": prebuild, "profile": profile}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
