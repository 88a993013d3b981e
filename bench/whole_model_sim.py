"""A whole model tuned by the embedded service on the simulated backend (no GPU), each layer's
pick against the exhaustive best of the simulated GPU's model.

    python -m bench.whole_model_sim run --trials 48 --out F [--model resnet50] [--batch 8]
        [--target h200] [--delay-s 0.04]
    python -m bench.whole_model_sim table F

`run` starts `tctune serve` on an empty database with the simulated backend, each
measurement taking `--delay-s` (one GPU's check-and-time), submits `tctune plan` of the
model's convs (bench/data/zoo_shapes.json) for int8 and fp16 at once and waits for every
job, as bench/gpu/tune_model.sh does on a GPU. Then each distinct layer's tuned schedule is
priced by the simulated GPU's noise-free model and divided by the fastest valid schedule of
its space under the same model: how close the whole-model tuning gets, on a landscape known
exactly, at a given budget.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._procs import REPO, free_port, start, stop, wait_http
from bench.cli import add_table, commands, geomean, log, print_table
from bench.zoo import load_shapes
from kernels.space import ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target
from store.settings import Settings
from workers.backends.simulated import simulate_latency_us

PRECISIONS = ("int8", "fp16")


def model_file(model: str, batch: int, target: str) -> dict[str, Any]:
    """`tctune plan`'s model file of a zoo model's convs at `batch`."""
    layers = []
    for e in load_shapes()["models"][model]["shapes"]:
        shape = {**e["shape"], "n": batch}
        layers += [{"name": name, "shape": shape} for name in e["layers"]]
    return {"target": target, "layers": layers}


def _serve(data: Path, port: int, delay_s: float) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TCTUNE_AUTH": "off", "TCTUNE_BACKEND": "simulated",
           "TCTUNE_SIM_DELAY_S": str(delay_s), "PYTHONPATH": str(REPO)}
    log_path = data.parent / "serve.log"
    proc = start([sys.executable, "-m", "api.cli", "serve", "--data", str(data), "--port",
                  str(port)], env, log_path)
    wait_http(f"http://127.0.0.1:{port}/healthz", proc, 60, log_path, 0.5, "the service")
    return proc


def proposals(log_text: str) -> dict[str, Any]:
    """The explorer's proposals in a service log (tasks.explore_round's line for each): how
    many, and their wall seconds' median and sum."""
    secs = [float(m) for m in re.findall(r"proposal job=\d+ .* seconds=([0-9.]+)", log_text)]
    return {"proposals": len(secs),
            "proposal_median_s": round(float(np.median(secs)), 4) if secs else None,
            "proposal_sum_s": round(sum(secs), 1)}


def tune(model: dict[str, Any], trials: int, delay_s: float
         ) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """Wall seconds, each precision's `tctune plan --wait` JSON and the explorer's
    proposals (`proposals`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.json"
        path.write_text(json.dumps(model))
        port = free_port()
        server = _serve(Path(tmp) / "data", port, delay_s)
        try:
            t0 = time.perf_counter()
            plans = {p: subprocess.Popen(
                [sys.executable, "-m", "api.cli", "plan", str(path), "--precision", p,
                 "--trials", str(trials), "--wait", "--server", f"http://127.0.0.1:{port}"],
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                for p in PRECISIONS}
            out = {p: json.loads(proc.communicate()[0]) for p, proc in plans.items()}
            wall = time.perf_counter() - t0
        finally:
            stop(server)
        return wall, out, proposals((Path(tmp) / "serve.log").read_text())


def priced(task_key: str, schedule: dict[str, Any]) -> tuple[float, float]:
    """(the schedule's modelled latency, the space's fastest modelled latency), noise-free."""
    shape_key, precision, target = task_key.split("|")
    shape, p, t = ConvShape.from_key(shape_key), Precision(precision), get_target(target)
    space = ScheduleSpace(shape, p, t)
    mine = simulate_latency_us(shape, p, t, space.columns(np.array([space.index_of(schedule)])))
    every = simulate_latency_us(shape, p, t, space.columns(space.valid_indices))
    return float(mine[0]), float(np.min(every))


def run(a: argparse.Namespace) -> int:
    model = model_file(a.model, a.batch, a.target)
    wall, plans, explorer = tune(model, a.trials, a.delay_s)
    rows = []
    for p in PRECISIONS:
        seen = set()
        for r in plans[p]["results"]:
            if r["task_key"] in seen or not r.get("schedule"):
                continue
            seen.add(r["task_key"])
            us, best = priced(r["task_key"], r["schedule"])
            rows.append({"layer": r["name"], "precision": p, "task_key": r["task_key"],
                         "trials": r["trials"], "schedule": r["schedule"],
                         "model_us": round(us, 4), "best_us": round(best, 4),
                         "vs_best": round(us / best, 4)})
    doc = {"model": a.model, "batch": a.batch, "target": a.target, "trials": a.trials,
           "delay_s": a.delay_s, "date": dt.date.today().isoformat(),
           "tuning_wall_s": round(wall, 1),
           "explore_processes": Settings().explore_processes, **explorer, "rows": rows}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    log(f"{a.out}: {len(rows)} layers in {wall:.0f} s")
    print(render_many([doc]))
    return 0


def render_many(docs: list[dict[str, Any]]) -> str:
    lines = ["| model | batch | trials | explorer processes | proposals, median s | tuning wall s "
             "| layers | within 5% of the model's best | geomean | worst |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in docs:
        v = [r["vs_best"] for r in d["rows"]]
        med = d.get("proposal_median_s")
        explorer = f"{d['proposals']}, {med}" if "proposals" in d else ""
        lines.append(f"| {d['model']} | {d['batch']} | {d['trials']} | "
                     f"{d.get('explore_processes', '')} | {explorer} | {d['tuning_wall_s']} | "
                     f"{len(v)} | {sum(x <= 1.05 for x in v)} | {geomean(v):.3f}x | "
                     f"{max(v):.3f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.whole_model_sim", __doc__)
    r = sub.add_parser("run", help="tune a model on the simulated backend (CPU)")
    r.add_argument("--trials", type=int, default=128)
    r.add_argument("--model", default="resnet50")
    r.add_argument("--batch", type=int, default=8)
    r.add_argument("--target", default="h200")
    r.add_argument("--delay-s", type=float, default=0.04)
    r.add_argument("--out", required=True)
    add_table(sub)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        return run(a)
    # a run's file, or one of several runs ({"runs": [...]})
    print_table(a, lambda d: render_many(d.get("runs", [d])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
