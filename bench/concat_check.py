"""Layers over two inputs (kernels.spec.ConvShape's `concat`: a ResNet bottleneck's last conv
and its projection shortcut as one GEMM) on the GPU: random (shape, schedule) pairs checked
on random inputs, zero wrong; and ResNet-50's four such layers per precision searched: the
two layers' recorded bests made valid for two inputs, their neighbours, and random schedules
valid for two inputs, every candidate checked, then timed.

  python -m bench.concat_check prebuild --cache C [--batches 8] [--target h100]  # CPU
  python -m bench.concat_check run --cache C --out bench/data/concat_check_h100.json  # GPU
  python -m bench.concat_check records bench/data/concat_check_h100.json --base B --out R
  python -m bench.concat_check table bench/data/concat_check_h100.json

Candidates are checked and timed in the measuring child of the service's GPU workers
(kernels.runner), against the one-input layer over the concatenation
(kernels.reference.concat_equivalent), with x pixels between the strided ones that the
layer must not read. `records` adds the search's bests to a records file (keyed by the
two-input layer's task key, kernels.spec.two_input_shape), as `bench.model_e2e records`
writes them, for deploy to merge the two layers with. The timing is kernels.timing's protocol
(inputs rotated past L2).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.cli import add_table, commands, log, print_table, read_json
from kernels.build import BuildJob, Epilogue, build_many
from kernels.space import CONCAT_KNOBS, ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target, task_key

TARGET = "h100"  # the default; --target names another's spaces and records
# ResNet-50 at batch 8: (conv3's input channels at the output's size, the projection's
# input channels and size, stride, output channels)
RESNET50 = [("layer1", 64, 64, 56, 1, 256), ("layer2", 128, 256, 56, 2, 512),
            ("layer3", 256, 512, 28, 2, 1024), ("layer4", 512, 1024, 14, 2, 2048)]


def resnet50_shapes(n: int = 8) -> list[tuple[str, ConvShape]]:
    return [(name, ConvShape(n, hw, hw, c1 + c2, k, 1, 1, stride=s, concat=c1))
            for name, c1, c2, hw, s, k in RESNET50]


def _valid(shape: ConvShape, p: Precision, rng: np.random.Generator, count: int,
           target: str = TARGET) -> list[dict[str, Any]]:
    """Up to `count` distinct random schedules valid for the layer (its space applies the
    rules of two inputs)."""
    space = ScheduleSpace(shape, p, get_target(target))
    return [space.schedule_at(int(i)) for i in rng.permutation(space.valid_indices)[:count]]


def _seeds(records: dict[str, Any], shape: ConvShape, p: Precision, target_name: str = TARGET
           ) -> list[dict[str, Any]]:
    """The recorded bests of the two layers (the last conv, the projection) made valid for
    two inputs (cp.async loads, no TMA stores or ping-pong), and their neighbours in CHUNK,
    STAGES and WARP_COL_TILES."""
    target = get_target(target_name)
    space = ScheduleSpace(shape, p, target)
    out: list[dict[str, Any]] = []
    for part in shape.concat_parts():
        rec = records.get(task_key(part, p, target))
        if rec is None:
            continue
        base = {**rec["schedule"], **CONCAT_KNOBS, "PLAIN_A": 0,
                "PINGPONG": 0, "PACK_OUT": min(int(rec["schedule"]["PACK_OUT"]), 1)}
        for knob, values in (("CHUNK", (1, 2, 4, 8)), ("STAGES", (2, 3, 4, 6, 8)),
                             ("WARP_COL_TILES", (1, 2, 4))):
            for v in values:
                s = {**base, knob: v}
                if s not in out and space.is_valid(s):
                    out.append(s)
    return out


def plan(seed: int, checks: int, tune: int, records: dict[str, Any],
         batches: tuple[int, ...] = (8,), target: str = TARGET) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    items: list[dict[str, Any]] = []
    while len(items) < checks:
        p = Precision(rng.choice(["int8", "fp16"]))
        stage = 64 if p is Precision.INT8 else 32  # CHUNK 2's channels
        c1 = int(rng.choice([1, 2, 3])) * stage
        c2 = int(rng.integers(1, 40)) * 8  # padded to the 16-byte vector for int8
        stride = int(rng.choice([1, 2]))
        shape = ConvShape(int(rng.integers(1, 9)), int(rng.integers(4, 30)),
                          int(rng.integers(4, 30)), c1 + c2, int(rng.integers(1, 25)) * 8,
                          1, 1, stride=stride, concat=c1)
        for s in _valid(shape, p, rng, 1, target):
            items.append({"kind": "check", "shape": shape.to_dict(), "precision": p.value,
                          "schedule": s, "relu": bool(rng.integers(2)), "target": target})
    for p in (Precision.INT8, Precision.FP16):
        for name, shape in [ns for n in batches for ns in resnet50_shapes(n)]:
            seeded = _seeds(records, shape, p, target)
            for s in seeded + [s for s in _valid(shape, p, rng, tune, target)
                               if s not in seeded]:
                items.append({"kind": "tune", "layer": name, "shape": shape.to_dict(),
                              "precision": p.value, "schedule": s, "relu": True,
                              "target": target})
    return items


def _job(it: dict[str, Any]) -> BuildJob:
    return BuildJob(ConvShape.from_dict(it["shape"]), Precision(it["precision"]),
                    get_target(it.get("target", TARGET)).sm,
                    it["schedule"], Epilogue(relu=it["relu"]))


def cmd_prebuild(a: argparse.Namespace) -> int:
    items = plan(a.seed, a.checks, a.tune,
                 json.loads(Path(a.seeds).read_text()) if a.seeds else {},
                 tuple(int(b) for b in a.batches.split(",")), a.target)
    res = build_many([_job(it) for it in items], a.cache)
    for it, r in zip(items, res, strict=True):
        it["build"], it["key"] = r.status, r.key
    Path(a.cache, "concat_plan.json").write_text(json.dumps(items) + "\n")
    log(f"{sum(r.status == 'ok' for r in res)} of {len(items)} built into {a.cache}")
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    """Check every candidate, and time the search's, in the measuring child the service's GPU
    workers use (kernels.runner.Runner: a faulting kernel is a status, not a crash)."""
    from kernels.runner import Runner

    items = json.loads(Path(a.cache, "concat_plan.json").read_text())
    doc: dict[str, Any] = {"gpu": None, "date": dt.date.today().isoformat(),
                           "target": items[0].get("target", TARGET) if items else TARGET,
                           "rows": []}
    runner = Runner()
    try:
        for i, it in enumerate(items):
            row = {k: it[k] for k in ("kind", "shape", "precision", "schedule", "relu")}
            row["layer"] = it.get("layer")
            res = runner.measure(a.cache, it["key"], seed=100 + i,
                                 time_it=it["kind"] == "tune") if it["build"] == "ok" \
                else {"status": it["build"]}
            check = (res.get("detail") or {}).get("check") or {}
            row.update(ok=res["status"] == "ok", status=res["status"],
                       **{k: float(v) for k, v in check.items()})
            if res.get("median_us") is not None:
                row.update(us=res["median_us"], iqr_us=res["iqr_us"])
            doc["rows"].append(row)
        doc["gpu"] = runner.gpu_name
    finally:
        runner.close()
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    wrong = [r for r in doc["rows"] if not r["ok"]]
    log(f"{len(doc['rows'])} checked, {len(wrong)} wrong")
    return 1 if wrong else 0


def cmd_records(a: argparse.Namespace) -> int:
    """The search's best per (layer, precision) of a run's data file, added to --base."""
    doc = read_json(a.file)
    records: dict[str, Any] = read_json(a.base) if a.base else {}
    target = get_target(doc.get("target", TARGET))
    for r in doc["rows"]:
        if r["kind"] != "tune" or not r["ok"]:
            continue
        key = task_key(ConvShape.from_dict(r["shape"]), Precision(r["precision"]), target)
        if key not in records or r["us"] < records[key]["latency_us"]:
            records[key] = {"schedule": r["schedule"], "latency_us": r["us"],
                            "source": f"{Path(a.file).name}: {r['layer']} two inputs"}
    Path(a.out).write_text(json.dumps(records, indent=1) + "\n")
    log(f"{len(records)} records -> {a.out}")
    return 0


def render(d: dict[str, Any]) -> str:
    rows = d["rows"]
    checks = [r for r in rows if r["kind"] == "check"]
    lines = [f"{d['gpu']}, {d['date']}: {len(checks)} random (shape, schedule) pairs over two "
             f"inputs, {sum(not r['ok'] for r in checks)} wrong; ResNet-50's layers over two "
             "inputs, best of the candidates valid for them:", "",
             "| layer | shape | precision | candidates | wrong | best µs |",
             "|---|---|---|---|---|---|"]
    batches = sorted({r["shape"]["n"] for r in rows if r["kind"] == "tune"})
    for name, shape in [ns for n in batches for ns in resnet50_shapes(n)]:
        for p in ("int8", "fp16"):
            rs = [r for r in rows if r["kind"] == "tune" and r["layer"] == name and
                  r["precision"] == p and r["shape"]["n"] == shape.n]
            us = [r["us"] for r in rs if r["ok"]]
            best = f"{min(us):.2f}" if us else "-"
            lines.append(f"| {name} | {shape.key()} | {p} | {len(rs)} | "
                         f"{sum(not r['ok'] for r in rs)} | {best} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.concat_check", __doc__)
    b = sub.add_parser("prebuild", help="plan and build the candidates (CPU)")
    b.add_argument("--cache", required=True)
    b.add_argument("--seed", type=int, default=5)
    b.add_argument("--checks", type=int, default=150)
    b.add_argument("--tune", type=int, default=48,
                   help="random candidates per ResNet-50 layer")
    b.add_argument("--seeds", default="bench/data/model_e2e_records_h100.json",
                   help="records whose bests of the two layers seed the search")
    b.add_argument("--batches", default="8", help="ResNet-50's batches to search (comma-separated)")
    b.add_argument("--target", default=TARGET, help="whose spaces (and --seeds' keys)")
    r = sub.add_parser("run", help="check, and time the ResNet-50 candidates (GPU)")
    r.add_argument("--cache", required=True)
    r.add_argument("--out", required=True)
    c = sub.add_parser("records", help="a run's bests as records, added to --base's")
    c.add_argument("file")
    c.add_argument("--base", default="")
    c.add_argument("--out", required=True)
    add_table(sub)
    a = ap.parse_args(argv)
    if print_table(a, render):
        return 0
    return {"prebuild": cmd_prebuild, "run": cmd_run, "records": cmd_records}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
