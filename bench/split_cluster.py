"""Split-K summed in a thread-block cluster against split-K through global memory.

  python -m bench.split_cluster prebuild --records R --keys-from F --cache C --target h200  # CPU
  python -m bench.split_cluster run --records R --keys-from F --cache C --out OUT           # GPU
  python -m bench.split_cluster table OUT
  python -m bench.split_cluster records OUT --base R --out R2                               # CPU

The layers are those a whole-model run (`bench.model_e2e run`'s file F) ran on records of R.
Each layer's record and the record's variants with SPLIT_K 2 and 4 (each with the record's
pipeline depth and with 2, 3 and 4 stages), the partial tiles summed
through a global workspace and a counter (SPLIT_CLUSTER 0) or in a cluster over distributed
shared memory (1; docs/kernels/levels-and-pipelines.md, "Epilogue"), where valid: built, checked
on random inputs and timed through the GPU worker's backend (workers/backends/cuda.py), all in
one run. A record whose schedule runs one tile a block with a loop of its own (PERSIST,
PINGPONG), the halo patch or TMA stores, none of which split-K has, is split without them.
`records` takes a layer's fastest cluster variant in place of its record where it is faster
than the record by more than --margin, timed in this run both. (`bench.zoo_transfer variants`
makes such variants of the zoo's plain layers; this takes the layers as a model ran them, with
a residual, over two inputs or over pixel pairs, and sets the two sums side by side.)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

from bench.cli import (
    add_records_target,
    add_table,
    commands,
    geomean,
    log,
    print_table,
    read_json,
    records_on,
)
from bench.zoo import atomic_write
from kernels.spec import ConvShape, Precision, task_key

SPLITS = (2, 4)
# Pipeline depths tried with each split besides the record's: a split grid has SPLIT_K times
# the blocks, which shallower pipelines (less shared memory) keep resident together.
SPLIT_STAGES = (2, 3, 4)
# What split-K cannot run with, and the value each is set to in a split variant.
SPLIT_RESETS = {"PERSIST": 0, "PINGPONG": 0, "HALO": 0}


def layer_keys(model_run: str | Path, models: str = "", batches: str = "") -> list[str]:
    """The task keys of the records a whole-model run's layers ran on (its deploy report's
    "schedule: given (KEY)"), in forward order, each once; of its rows of these models and
    batches (comma-separated; empty: all)."""
    keys: list[str] = []
    for row in read_json(model_run)["rows"]:
        if (models and row["model"] not in models.split(",")) or \
                (batches and str(row["n"]) not in batches.split(",")):
            continue
        for k in re.findall(r"schedule: given \(([^)]+)\)", row.get("report", "")):
            if k not in keys:
                keys.append(k)
    return keys


def variants(shape: ConvShape, precision: Precision, target: Any,
             schedule: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(name, schedule): the record's, then its valid split variants."""
    from kernels.space import ScheduleSpace

    space = ScheduleSpace(shape, precision, target)
    out = [("record", dict(schedule))]
    base = {**schedule, **SPLIT_RESETS,
            "PACK_OUT": min(int(schedule.get("PACK_OUT", 1)), 1)}
    for k in SPLITS:
        for stages in sorted({int(schedule["STAGES"]), *SPLIT_STAGES}):
            for cluster in (0, 1):
                v = {**base, "SPLIT_K": k, "STAGES": stages, "SPLIT_CLUSTER": cluster}
                if space.is_valid(v):
                    out.append((f"split{k}_st{stages}_{'cluster' if cluster else 'global'}", v))
    return out


def _jobs(a: argparse.Namespace, target: Any) -> list[tuple[str, Precision, ConvShape, Any]]:
    records = records_on(a.records, target.name, a.records_target)
    out = []
    for key in layer_keys(a.keys_from, a.models, a.batches):
        shape_key, prec, _ = key.split("|")
        if prec not in a.precisions.split(","):
            continue
        shape, precision = ConvShape.from_key(shape_key), Precision(prec)
        tkey = task_key(shape, precision, target)
        if tkey in records:
            out.append((tkey, precision, shape, records[tkey]))
    return out


def prebuild(a: argparse.Namespace) -> int:
    from kernels.build import BuildJob, build_many
    from kernels.spec import get_target

    target = get_target(a.target)
    jobs = [BuildJob(shape, prec, target.sm, s)
            for _, prec, shape, rec in _jobs(a, target)
            for _, s in variants(shape, prec, target, rec["schedule"])]
    res = build_many(jobs, a.cache)
    log(f"{sum(r.status == 'ok' for r in res)} of {len(jobs)} built into {a.cache}")
    return 0


def run(a: argparse.Namespace) -> int:
    from workers.backends.base import TaskSpec
    from workers.backends.cuda import CudaBackend

    backend = CudaBackend(a.cache)
    target = backend.target
    if target is None:
        raise SystemExit(f"no target for GPU {backend.gpu_model!r}")
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"gpu": backend.gpu_model, "target": target.name,
                           "date": dt.date.today().isoformat(), "records": a.records,
                           "layers_of": a.keys_from, "rows": rows}
    try:
        for key, prec, shape, rec in _jobs(a, target):
            spec = TaskSpec(shape, prec, target)
            times: dict[str, Any] = {}
            for name, s in variants(shape, prec, target, rec["schedule"]):
                m = backend.measure(spec, s, backend.build(spec, s))
                times[name] = {"schedule": s, "status": m.status, "us": m.median_us}
            rows.append({"key": key, "precision": prec.value, "variants": times})
            log(key, {n: v["us"] for n, v in times.items()})
            atomic_write(Path(a.out), json.dumps(doc, indent=1) + "\n")
    finally:
        backend.close()
    return 0


def best(row: dict[str, Any], kind: str) -> tuple[str, float] | None:
    """The fastest variant of a kind ("global", "cluster") that passed its check."""
    ok = [(n, v["us"]) for n, v in row["variants"].items()
          if n.endswith(kind) and v["status"] == "ok" and v["us"]]
    return min(ok, key=lambda t: t[1]) if ok else None


def render(doc: dict[str, Any]) -> str:
    lines = [f"{doc['gpu']}, {doc['date']}", "",
             "| layer | precision | record us | split-K, global: best us | in a cluster: best us "
             "| cluster / global | cluster / record |", "|---|---|---|---|---|---|---|"]
    vs_global, vs_record = [], []
    for r in doc["rows"]:
        rec = r["variants"]["record"]
        g, c = best(r, "global"), best(r, "cluster")
        cg = c[1] / g[1] if c and g else None
        cr = c[1] / rec["us"] if c and rec["us"] else None
        if cg:
            vs_global.append(cg)
        if cr:
            vs_record.append(cr)
        cells = [r["key"].split("|")[0], r["precision"], rec["us"] or rec["status"],
                 f"{g[1]} ({g[0]})" if g else "-", f"{c[1]} ({c[0]})" if c else "-",
                 f"{cg:.3f}" if cg else "-", f"{cr:.3f}" if cr else "-"]
        lines.append("| " + " | ".join(str(x) for x in cells) + " |")
    if vs_global:
        lines += ["", f"{len(vs_global)} layers: geomean cluster / global "
                  f"{geomean(vs_global):.3f}; cluster / record {geomean(vs_record):.3f}, faster "
                  f"than the record on {sum(x < 1 for x in vs_record)}"]
    return "\n".join(lines)


def records(a: argparse.Namespace) -> int:
    base: dict[str, Any] = json.loads(Path(a.base).read_text())
    doc = read_json(a.file)
    taken = 0
    for r in doc["rows"]:
        rec, c = r["variants"]["record"], best(r, "cluster")
        if c and rec["us"] and c[1] < rec["us"] * (1 - a.margin) and r["key"] in base:
            base[r["key"]] = {**base[r["key"]], "schedule": r["variants"][c[0]]["schedule"],
                              "latency_us": c[1],
                              "source": f"{Path(a.file).name}: {c[0]} of the record"}
            taken += 1
    atomic_write(Path(a.out), json.dumps(base, indent=1, sort_keys=True) + "\n")
    log(f"{taken} records replaced -> {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.split_cluster", __doc__)
    r = sub.add_parser("run", help="time on this machine's GPU")
    r.add_argument("--out", required=True)
    pb = sub.add_parser("prebuild", help="build the kernels on a CPU")
    pb.add_argument("--target", default="h100")
    for p in (r, pb):
        p.add_argument("--records", required=True)
        p.add_argument("--keys-from", required=True, help="a bench.model_e2e run's file")
        p.add_argument("--cache", default="/tmp/tctune-split-cluster")
        p.add_argument("--precisions", default="int8,fp16")
        p.add_argument("--models", default="", help="the run's rows of these models (all)")
        p.add_argument("--batches", default="", help="the run's rows of these batches (all)")
        add_records_target(p)
    rc = sub.add_parser("records", help="records with the faster cluster variants")
    rc.add_argument("file")
    rc.add_argument("--base", required=True)
    rc.add_argument("--out", required=True)
    rc.add_argument("--margin", type=float, default=0.02)
    add_table(sub)
    a = ap.parse_args(argv)
    if print_table(a, render):
        return 0
    return {"run": run, "prebuild": prebuild, "records": records}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
