"""Long jobs on whole spaces, as a fleet runs them: each strategy's explorer CPU per
measurement and how close its best comes to the space's best, with the simulated backend's
model as the GPU.

The replay (`tctune bench search`) covers 200 trials of measured subspaces, where a model
trained from scratch scores every schedule; a fleet's jobs run thousands of trials on whole
spaces (100,000+ valid schedules), where the task model is retrained only when the trials
have doubled, boosted in between, and scores a candidate set (search/model_based.py). This
runs such jobs: every valid schedule of the layer is modelled (the truth), a prior of the
other layers' modelled measurements, rounds of `--batch` up to `--trials`, the picks
"measured" as the model's latency with 1.5% noise. Per job: the CPU seconds of each
proposal, and after each round the true latency of the best measured schedule over the
space's best (1.0 = found).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.search_proposal_time import measurements  # noqa: E402
from kernels.space import ScheduleSpace  # noqa: E402
from kernels.spec import TARGETS, ConvShape, Precision  # noqa: E402
from search.registry import make_strategy  # noqa: E402
from search.replay import parse_strategy  # noqa: E402
from search.strategy import History, PriorTrial, Trial  # noqa: E402
from workers.backends.simulated import simulate_latency_us  # noqa: E402

# Layers of the jobs: ResNet-50's 3x3 stages and two 1x1 layers at batch 8.
LAYERS = {
    "r50_stage2_3x3": ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 1)),
    "r50_stage3_3x3": ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1)),
    "r50_stage4_3x3": ConvShape(8, 14, 14, 256, 256, 3, 3, pad=(1, 1)),
    "r50_stage5_3x3": ConvShape(8, 7, 7, 512, 512, 3, 3, pad=(1, 1)),
    "r50_1x1_expand": ConvShape(8, 56, 56, 64, 256, 1, 1),
    "r50_1x1_reduce": ConvShape(8, 14, 14, 1024, 256, 1, 1),
}
# The prior's layers (the task's own layer left out of its prior).
PRIOR_LAYERS = [ConvShape(n, hw, hw, c, k, r, r, stride=(st, st), pad=(r // 2, r // 2))
                for n in (1, 8, 32)
                for hw, c in ((56, 64), (28, 128), (14, 256), (7, 512))
                for k, r, st in ((c, 3, 1), (4 * c, 1, 1), (2 * c, 3, 2))]
CHECKPOINTS = (128, 256, 512, 1024, 2048, 4096)
NOISE = 0.015


def truth(space: ScheduleSpace, rugged: float, seed: int) -> np.ndarray:
    """Modelled latency of every valid schedule (rows in `valid_indices` order), each
    times a fixed factor exp(rugged * z) of its own: what the model (and so a prior
    learned from it) does not know about this layer, as a GPU's measurements differ from
    the model's (Spearman about 0.9 within a space, bench/RESULTS.md "Simulator
    calibration"); without it a prior of the model's own latencies points at the best."""
    us = simulate_latency_us(space.shape, space.precision, space.target,
                             space.columns(space.valid_indices))
    z = np.random.default_rng([seed, len(us)]).standard_normal(len(us))
    return us * np.exp(rugged * z)  # type: ignore[no-any-return]


def make_prior(shape: ConvShape, precision: Precision, target: str, per_layer: int,
               seed: int) -> list[PriorTrial]:
    """Modelled measurements (1.5% noise, `measurements`) of `per_layer` random valid
    schedules of each prior layer but the job's own: what a fleet's other tasks have
    measured."""
    rng = np.random.default_rng(seed)
    prior: list[PriorTrial] = []
    for other in PRIOR_LAYERS:
        if other == shape:
            continue
        sp = ScheduleSpace(other, precision, TARGETS[target])
        idx, lat = measurements(sp, per_layer, rng)
        prior += [PriorTrial(other, s, "ok", float(us))
                  for s, us in zip(sp.schedules(idx), lat, strict=True)]
    return prior


def run_job(space: ScheduleSpace, true_us: np.ndarray, prior: Sequence[PriorTrial],
            spec: str, seed: int, trials: int, batch: int) -> dict[str, Any]:
    """One job of `trials` in rounds of `batch`: each proposal's CPU seconds and, after each
    round, the truth of the best measured schedule over the space's best."""
    name, options, _ = parse_strategy(spec)
    strat = make_strategy(name, space, seed=seed, **options)
    history = History(prior=list(prior))
    rng = np.random.default_rng([seed, 99])
    best = float(true_us.min())
    cpu: list[float] = []
    curve: list[tuple[int, float]] = []
    found = np.inf
    while len(history.trials) < trials:
        c0 = time.process_time()
        picks = strat.propose(history, min(batch, trials - len(history.trials)))
        cpu.append(time.process_time() - c0)
        if not picks:
            break
        rows = np.searchsorted(space.valid_indices, np.asarray(picks, dtype=np.int64))
        us = true_us[rows] * np.exp(rng.normal(0.0, NOISE, len(rows)))
        history.trials.extend(Trial(int(i), "ok", float(u)) for i, u in
                              zip(picks, us, strict=True))
        found = min(found, float(true_us[rows].min()))
        curve.append((len(history.trials), found / best))
    at = {str(c): next((r for n, r in curve if n >= c), curve[-1][1])
          for c in CHECKPOINTS if c <= trials}
    # The first proposal trains the prior's base model, which a fleet's explorer shares
    # between the jobs of a target: it is reported apart.
    return {"proposals": len(cpu), "measurements": len(history.trials),
            "cpu_s": [round(c, 4) for c in cpu], "first_cpu_s": cpu[0],
            "cpu_ms_per_measurement": 1e3 * sum(cpu[1:]) / max(1, curve[-1][0] - curve[0][0]),
            "found_vs_best": at, "final_vs_best": curve[-1][1],
            "trials_to_1pct": next((n for n, r in curve if r <= 1.01), None),
            "trials_to_best": next((n for n, r in curve if r <= 1.0), None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strategies", default="diversity",
                    help="comma-separated NAME[:key=value...] (options as in the replay)")
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--precisions", default="int8,fp16")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=192)
    ap.add_argument("--prior-per-layer", type=int, default=400)
    ap.add_argument("--rugged", type=float, default=0.1,
                    help="sigma of each schedule's own log-normal factor on the truth")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = []
    for precision in (Precision(p) for p in args.precisions.split(",")):
        for layer in args.layers.split(","):
            shape = LAYERS[layer]
            space = ScheduleSpace(shape, precision, TARGETS[args.target])
            true_us = truth(space, args.rugged, seed=7)
            prior = make_prior(shape, precision, args.target, args.prior_per_layer, seed=1)
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for spec in args.strategies.split(","):
                    job = run_job(space, true_us, prior, spec, seed, args.trials, args.batch)
                    rows.append({"layer": layer, "precision": precision.value,
                                 "valid": int(len(space.valid_indices)), "seed": seed,
                                 "strategy": spec, **job})
                    print(f"{layer:16s} {precision.value:5s} seed {seed} {spec:40s} "
                          f"CPU {job['cpu_ms_per_measurement']:.3f} ms/meas, found "
                          + " ".join(f"{k}:{v:.3f}" for k, v in job["found_vs_best"].items())
                          + f" | to 1%: {job['trials_to_1pct']}, to best: {job['trials_to_best']}",
                          flush=True)
    print()
    print("| strategy | CPU ms / measurement (median) | "
          + " | ".join(f"best found / space's best at {c} (geomean)" for c in CHECKPOINTS
                       if c <= args.trials) + " |")
    for spec in args.strategies.split(","):
        mine = [r for r in rows if r["strategy"] == spec]
        cells = [f"{statistics.median(r['cpu_ms_per_measurement'] for r in mine):.3f}"]
        for c in CHECKPOINTS:
            if c <= args.trials:
                v = np.array([r["found_vs_best"][str(c)] for r in mine])
                cells.append(f"{float(np.exp(np.log(v).mean())):.4f} (worst {v.max():.3f})")
        print(f"| {spec} | " + " | ".join(cells) + " |")
    if args.out:
        meta = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(),
                "cores": os.cpu_count(), "loadavg": os.getloadavg(), "args": vars(args)}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
