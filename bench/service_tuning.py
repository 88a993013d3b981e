"""A whole model tuned by the service on a GPU (bench/gpu/tune_model.sh): its wall time and
each layer's result against the zoo's best of the same layer (bench/zoo.py, the same GPU).

    python -m bench.service_tuning summarize DIR --out bench/data/service_tuning_r50_h100.json
    python -m bench.service_tuning attach bench/data/service_tuning_r50_h100.json \
        --layer-search bench/data/layer_search_r50_h100.json
    python -m bench.service_tuning table bench/data/service_tuning_r50_h100.json
    python -m bench.service_tuning records bench/data/service_tuning_r50_h100.json --out R
    python -m bench.service_tuning versus --service S1,S2 --reference A1,A2,B1,B2

DIR holds tune_model.sh's outputs: tuning.json, plan_int8.json, plan_fp16.json. `attach`
adds each layer's result against a long search of that layer alone (bench/layer_search.py)
on the same GPU model: `vs_500_trials` is the service's latency over the search's best. The
latencies are compared as they are: one schedule times within a few percent from run to run
and machine to machine, whereas cuDNN's time of a layer moved by up to 1.7x between runs
(kernels/cudnn.py says why), so no ratio to each run's cuDNN is taken.
`records` turns a summary's schedules into a records file (`bench.retime run --records`);
`versus` compares `bench.retime` runs of the service's schedules with runs of reference
schedules (a long search's bests, the best known records) timed in the same session: each
layer's service time (mean over its runs) over the fastest reference's (mean over its runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.cli import geomean
from bench.zoo import ZOO_FILE, zoo_bests
from kernels.spec import ConvShape


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
                         "schedule": r.get("schedule"),
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


def records(doc: dict[str, Any]) -> dict[str, Any]:
    """A summary's schedules as a records file (task key -> record), for `bench.retime` and
    `bench.model_e2e`; with each layer's cuDNN baseline where the service timed one, so that
    deploy keeps cuDNN for an fp16 layer whose kernel lost to it, as from the service itself."""
    return {r["task_key"]: {"schedule": r["schedule"], "latency_us": r["latency_us"],
                            "source": f"service, {doc['trials']} trials: {r['layer']}",
                            **({"baseline_us": r["baseline_us"]} if r.get("baseline_us") else {})}
            for r in doc["rows"] if r.get("schedule") and r.get("latency_us")}


def _mean_times(runs: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    """(shape key, precision) -> the mean of its ok times over `bench.retime` runs."""
    times: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        for r in run["rows"]:
            if r.get("status") == "ok" and r.get("ours_us"):
                key = (ConvShape.from_dict(r["shape"]).key(), r["precision"])
                times.setdefault(key, []).append(r["ours_us"])
    return {k: sum(v) / len(v) for k, v in times.items()}


def versus(service: list[dict[str, Any]], references: list[list[dict[str, Any]]]
           ) -> dict[str, Any]:
    """Each layer's service time over its fastest reference's, all timed in one session."""
    ours = _mean_times(service)
    refs = [_mean_times(runs) for runs in references]
    layer = {(ConvShape.from_dict(r["shape"]).key(), r["precision"]): r["layer"]
             for r in service[0]["rows"]}
    rows = []
    for key, us in sorted(ours.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        timed = [(ref[key], i) for i, ref in enumerate(refs) if key in ref]
        if not timed:  # no reference ran this layer: nothing to compare it with
            continue
        best = min(timed)
        rows.append({"layer": layer[key], "shape": key[0], "precision": key[1],
                     "service_us": round(us, 4), "best_us": round(best[0], 4),
                     "best_from": references[best[1]][0]["records"],
                     "vs_best": round(us / best[0], 4)})
    return {"gpu": service[0]["gpu"], "date": service[0]["date"],
            "service": [r["records"] for r in service],
            "references": [[r["records"] for r in runs] for runs in references], "rows": rows}


def render_versus(doc: dict[str, Any]) -> str:
    lines = [f"{doc['gpu']}, {doc['date']}: the service's schedules over the fastest reference, "
             "each the mean of its runs", "",
             "| precision | layers | geomean | worst | within 5% |", "|---|---|---|---|---|"]
    for p in ("int8", "fp16"):
        v = [r["vs_best"] for r in doc["rows"] if r["precision"] == p]
        if v:
            lines.append(f"| {p} | {len(v)} | {geomean(v):.3f}x | {max(v):.3f}x | "
                         f"{sum(x <= 1.05 for x in v)} |")
    miss = [r for r in doc["rows"] if r["vs_best"] > 1.05]
    lines += ["", "Past 5%: " + (", ".join(
        f"{r['layer']} {r['precision']} {r['vs_best']:.3f}x" for r in miss) or "none")]
    return "\n".join(lines)


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
    rc = sub.add_parser("records")
    rc.add_argument("file", type=Path)
    rc.add_argument("--out", required=True, type=Path)
    vs = sub.add_parser("versus")
    vs.add_argument("--service", required=True, help="bench.retime runs of the service's "
                    "records, comma-separated")
    vs.add_argument("--reference", action="append", required=True,
                    help="bench.retime runs of one reference's records, comma-separated; "
                    "once per reference")
    vs.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "records":
        a.out.write_text(json.dumps(records(json.loads(a.file.read_text())), indent=1))
    elif a.cmd == "versus":
        def runs(csv: str) -> list[dict[str, Any]]:
            return [json.loads(Path(f).read_text()) for f in csv.split(",")]
        doc = versus(runs(a.service), [runs(r) for r in a.reference])
        if a.out:
            a.out.write_text(json.dumps(doc, indent=1))
        print(render_versus(doc))
    elif a.cmd == "attach":
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
