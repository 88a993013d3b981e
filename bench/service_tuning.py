"""A whole model tuned by the service on a GPU (bench/gpu/tune_model.sh): its wall time and
each layer's result against the zoo's best of the same layer (bench/zoo.py, the same GPU).

    python -m bench.service_tuning summarize DIR --out bench/data/service_tuning_r50_h100.json
    python -m bench.service_tuning attach bench/data/service_tuning_r50_h100.json \
        --layer-search bench/data/layer_search_r50_h100.json
    python -m bench.service_tuning table bench/data/service_tuning_r50_h100.json

DIR holds tune_model.sh's outputs: tuning.json, plan_int8.json, plan_fp16.json. `attach`
adds each layer's result against a long search of that layer alone (bench/layer_search.py)
on the same GPU model: `vs_500_trials` is the service's latency over the search's best. The
latencies are compared as they are: one schedule times within a few percent from run to run
and machine to machine, whereas cuDNN's time of a layer moved by up to 1.7x between runs
(kernels/cudnn.py says why), so no ratio to each run's cuDNN is taken.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.cli import geomean
from bench.zoo import ZOO_FILE, zoo_bests


def summarize(folder: Path, zoo: Path = ZOO_FILE) -> dict[str, Any]:
    run = json.loads((folder / "tuning.json").read_text())
    bests = zoo_bests(zoo)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for p in ("int8", "fp16"):
        plan = json.loads((folder / f"plan_{p}.json").read_text())
        for r in plan["results"]:
            if r["task_key"] in seen:  # layers of one shape share a task
                continue
            seen.add(r["task_key"])
            shape_key = r["task_key"].split("|")[0]
            zb = bests.get(f"{shape_key}|{p}")  # bench.zoo.measure_key
            rows.append({"layer": r["name"], "task_key": r["task_key"], "precision": p,
                         "latency_us": r.get("latency_us"), "baseline_us": r.get("baseline_us"),
                         "speedup": r.get("speedup"), "zoo_us": zb,
                         "vs_zoo": (r["latency_us"] / zb if zb and r.get("latency_us")
                                    else None)})
    return {**run, "jobs": len(rows), "rows": rows}


def attach(doc: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    """Each row's `vs_500_trials` against the layer search's best of the same task (rows the
    search did not cover, or without a latency, get none)."""
    found = {r["key"]: r for r in search["rows"] if r.get("best_us")}
    for row in doc["rows"]:
        shape_key, precision = row["task_key"].split("|")[:2]
        s = found.get(f"{shape_key}|{precision}")
        row.pop("vs_500_trials", None)
        if s is None:
            continue
        row.update(search_us=s["best_us"], search_trials=len(s["trials"]))
        if row.get("latency_us"):
            row["vs_500_trials"] = round(row["latency_us"] / s["best_us"], 4)
    doc["layer_search"] = {"gpu": search["gpu"], "date": search["date"],
                           "strategy": search["strategy"]}
    return doc


def render(path: str) -> str:
    d = json.loads(Path(path).read_text())
    lines = [f"{d['model']}, input {d['input_shape']}, {d['trials']} trials per layer, "
             f"{d['gpu']}: {d['jobs']} jobs tuned in {d['tuning_wall_s']:.0f} s", "",
             "| precision | jobs | geomean speedup vs cuDNN fp16 | jobs faster than cuDNN fp16 | "
             "geomean vs zoo best | worst vs zoo best | within 5% of the zoo best |",
             "|---|---|---|---|---|---|---|"]
    for p in ("int8", "fp16"):
        rows = [r for r in d["rows"] if r["precision"] == p and r["latency_us"]]
        vs = [r["vs_zoo"] for r in rows if r["vs_zoo"]]
        sp = [r["speedup"] for r in rows if r["speedup"]]
        lines.append(f"| {p} | {len(rows)} | {geomean(sp):.2f}x | {sum(s > 1 for s in sp)} | "
                     f"{geomean(vs):.2f}x | {max(vs):.2f}x | {sum(v <= 1.05 for v in vs)} |")
    long = [r for r in d["rows"] if r.get("vs_500_trials")]
    if long:
        lines += ["", f"Against a long search of each layer alone ({d['layer_search']['gpu']}, "
                  f"{d['layer_search']['date']}):", "",
                  "| layer | precision | service us | search trials | search best us | "
                  "vs long search |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['layer']} | {r['precision']} | {r['latency_us']:.2f} | "
                  f"{r['search_trials']} | {r['search_us']:.2f} | {r['vs_500_trials']:.2f}x |"
                  for r in long]
        v = [r["vs_500_trials"] for r in long]
        lines += ["", f"{len(v)} layers: geomean {geomean(v):.2f}x, worst {max(v):.2f}x, "
                  f"{sum(x <= 1.05 for x in v)} within 5%."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarize")
    s.add_argument("folder", type=Path)
    s.add_argument("--out", required=True, type=Path)
    s.add_argument("--zoo", type=Path, default=ZOO_FILE)
    at = sub.add_parser("attach")
    at.add_argument("file", type=Path)
    at.add_argument("--layer-search", required=True, type=Path)
    t = sub.add_parser("table")
    t.add_argument("file")
    a = ap.parse_args(argv)
    if a.cmd == "attach":
        doc = attach(json.loads(a.file.read_text()), json.loads(a.layer_search.read_text()))
        a.file.write_text(json.dumps(doc, indent=1))
        print(render(str(a.file)))
    elif a.cmd == "summarize":
        a.out.write_text(json.dumps(summarize(a.folder, a.zoo), indent=1))
        print(render(str(a.out)))
    else:
        print(render(a.file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
