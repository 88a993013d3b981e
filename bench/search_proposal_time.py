"""Time the explorer's proposal of one batch of 32 with 50,000 measurements to learn from,
and every proposal of a long job after it.

The training set is what a busy target accumulates: simulated measurements (h100, int8) of
random schedules of many conv layers as the History's prior, plus 200 trials of the layer
being tuned (ResNet-50 stage3). Timed per strategy:

- cold: a fresh process state (no cached base model): fingerprint the prior, featurize it,
  train the base model, score the space, train on the task's trials, anneal, pick.
- warm: the next batch of the same job (the base model is cached; the task model is
  retrained on 32 more trials), which is what every batch but the first pays.
- job: the same job going on for `--job-trials` more trials in rounds of `--batch`, the
  simulator measuring: proposal p50 / p99 and the explorer's CPU per measurement.
- new jobs: what a job costs the explorer at its start, with the base model already
  trained (as in a fleet): `--new-jobs` layers the prior does not hold (ResNet-50's 3x3
  layers at batches 3 and 5), each its space enumerated, then its first proposal (its
  features, the prior's scores over the space, the pick).

    python bench/search_proposal_time.py [--measurements 50000] [--repeat 5]
        [--strategies diversity,sa] [--job-trials 1000] [--batch 32] [--new-jobs 8]
        [--out bench/data/proposal_time.json]

Every repeat's numbers and the load average before and after go to --out (JSON).
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
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import space as space_module  # noqa: E402
from kernels.space import ScheduleSpace  # noqa: E402
from kernels.spec import RESNET50_3X3, TARGETS, ConvShape, Precision  # noqa: E402
from search import model_based  # noqa: E402
from search.registry import make_strategy  # noqa: E402
from search.replay import parse_strategy  # noqa: E402
from search.strategy import History, PriorTrial, Trial  # noqa: E402
from workers.backends.simulated import simulate_latency_us  # noqa: E402

TASK_TRIALS = 200


def prior_shapes() -> list[ConvShape]:
    """Conv layers of common CNNs (3x3 and 1x1, strides 1 and 2) at batch 1, 8 and 32."""
    out = []
    for n in (1, 8, 32):
        for hw, c in ((56, 64), (28, 128), (14, 256), (7, 512)):
            out.append(ConvShape(n, hw, hw, c, c, 3, 3, pad=(1, 1)))
            out.append(ConvShape(n, hw, hw, c, 4 * c, 1, 1))
            out.append(ConvShape(n, 2 * hw, 2 * hw, c, 2 * c, 3, 3, stride=(2, 2), pad=(1, 1)))
    return [s for s in out if s != RESNET50_3X3["stage3"]]


def measurements(space: ScheduleSpace, count: int, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    idx = rng.choice(space.valid_indices, size=min(count, len(space.valid_indices)),
                     replace=False)
    lat = simulate_latency_us(space.shape, space.precision, space.target, space.columns(idx))
    return idx, lat * np.exp(rng.normal(0.0, 0.015, len(idx)))


def make_history(total: int, precision: Precision, rng: np.random.Generator
                 ) -> tuple[ScheduleSpace, History, list[Trial]]:
    target = TARGETS["h100"]
    shapes = prior_shapes()
    per_shape = -(-(total - TASK_TRIALS) // len(shapes))
    prior: list[PriorTrial] = []
    for shape in shapes:
        sp = ScheduleSpace(shape, precision, target)
        idx, lat = measurements(sp, per_shape, rng)
        prior += [PriorTrial(shape, sched, "ok", float(us))
                  for sched, us in zip(sp.schedules(idx), lat, strict=True)]
    prior = prior[: total - TASK_TRIALS]
    space = ScheduleSpace(RESNET50_3X3["stage3"], precision, target)
    idx, lat = measurements(space, TASK_TRIALS + 32 * 20, rng)
    trials = [Trial(int(i), "ok", float(us)) for i, us in zip(idx, lat, strict=True)]
    # A few failures, as real runs have them.
    for j in range(0, TASK_TRIALS, 25):
        trials[j] = Trial(trials[j].index, "runtime_error", None)
    return space, History(trials=trials[:TASK_TRIALS], prior=prior), trials


def run_job(space: ScheduleSpace, history: History, name: str, options: dict[str, Any],
            trials: int, batch: int) -> dict[str, Any]:
    """A job going on from the history's trials for `trials` more, measured by the
    simulator: every proposal's wall and CPU seconds (what the explorer pays per
    measurement in the steady state of a long job)."""
    rng = np.random.default_rng(1)
    strat = make_strategy(name, space, seed=0, **options)
    h = History(trials=list(history.trials), prior=history.prior)
    strat.propose(h, batch)  # the cold proposal is timed above
    walls, cpus, measured = [], [], 0
    while measured < trials:
        t0, c0 = time.perf_counter(), time.process_time()
        picks = strat.propose(h, batch)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if not picks:
            break
        idx = np.asarray(picks, dtype=np.int64)
        lat = simulate_latency_us(space.shape, space.precision, space.target,
                                  space.columns(idx)) * np.exp(rng.normal(0, 0.015, len(idx)))
        h.trials.extend(Trial(int(i), "ok", float(us)) for i, us in zip(idx, lat, strict=True))
        measured += len(picks)
    if not walls:
        return {"proposals": 0}
    return {"proposals": len(walls), "measurements": measured, "batch": batch,
            "p50_s": float(np.percentile(walls, 50)), "p99_s": float(np.percentile(walls, 99)),
            "cpu_ms_per_measurement": 1e3 * sum(cpus) / max(measured, 1),
            "wall_s": walls, "cpu_s": cpus}


def new_jobs(name: str, options: dict[str, Any], prior: list[PriorTrial], count: int
             ) -> dict[str, list[float]]:
    """CPU seconds of each new job's space enumeration and first proposal, the base model
    on `prior` trained already (the caller's proposals trained it)."""
    shapes = [ConvShape(n, s.h, s.w, s.c, s.k, 3, 3, pad=(1, 1))
              for n in (3, 5) for s in RESNET50_3X3.values()][:count]
    out: dict[str, list[float]] = {"enumerate_cpu_s": [], "first_proposal_cpu_s": []}
    for shape in shapes:
        # An earlier strategy's run enumerated these. The structural survivors stay cached,
        # as in a fleet, whose layers share a handful of traits (the prior's layers had these).
        space_module._VALID_CACHE.clear()
        c0 = time.process_time()
        space = ScheduleSpace(shape, Precision.INT8, TARGETS["h100"])
        len(space.valid_indices)
        c1 = time.process_time()
        make_strategy(name, space, seed=0, **options).propose(History(prior=prior), 32)
        out["enumerate_cpu_s"].append(c1 - c0)
        out["first_proposal_cpu_s"].append(time.process_time() - c1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measurements", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--strategies", default="diversity,sa",
                    help="comma-separated NAME[:key=value...] (options as in the replay)")
    ap.add_argument("--out", default=None, help="write every repeat's numbers here (JSON)")
    ap.add_argument("--job-trials", type=int, default=1000,
                    help="then a job of this many more trials, every proposal timed")
    ap.add_argument("--batch", type=int, default=32, help="candidates per proposal of the job")
    ap.add_argument("--new-jobs", type=int, default=8,
                    help="then this many new jobs' starts, timed (at most 8)")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    space, history, more = make_history(args.measurements, Precision.INT8, rng)
    n_train = len(history.trials) + len(history.prior)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"training set {n_train} measurements ({len(history.prior)} prior over "
          f"{len({t.shape for t in history.prior})} layers + {len(history.trials)} trials); "
          f"space {len(space.valid_indices)} valid schedules")
    results = []
    for spec in args.strategies.split(","):
        name, options, _ = parse_strategy(spec)
        cold, warm, cold_cpu, warm_cpu = [], [], [], []
        for r in range(args.repeat):
            model_based._PRIOR_CACHE.clear()
            strat = make_strategy(name, space, seed=r, **options)
            h = History(trials=list(history.trials), prior=history.prior)
            t0, c0 = time.perf_counter(), time.process_time()
            batch = strat.propose(h, 32)
            cold.append(time.perf_counter() - t0)
            cold_cpu.append(time.process_time() - c0)
            assert len(batch) == 32
            # The next batch of the same job: 32 more trials measured. For sa, cross a plan
            # boundary (64 more) so that its model is retrained too.
            extra = 64 if name == "sa" else 32
            h2 = History(trials=list(history.trials) + more[TASK_TRIALS:TASK_TRIALS + extra],
                         prior=history.prior)
            t0, c0 = time.perf_counter(), time.process_time()
            batch = strat.propose(h2, 32)
            warm.append(time.perf_counter() - t0)
            warm_cpu.append(time.process_time() - c0)
            assert len(batch) == 32
        # CPU seconds (both threads) next to wall time: on a shared machine the wall time
        # includes waiting for the cores; CPU / 2 is what an idle 2-core machine would take.
        job = run_job(space, history, name, options, args.job_trials, args.batch)
        starts = new_jobs(name, options, history.prior, args.new_jobs)
        results.append({"strategy": spec, "cold_wall_s": cold, "cold_cpu_s": cold_cpu,
                        "warm_wall_s": warm, "warm_cpu_s": warm_cpu, "job": job,
                        "new_jobs": starts})
        print(f"{spec:10s} cold: wall median {statistics.median(cold):.3f} s, "
              f"cpu median {statistics.median(cold_cpu):.3f} s | "
              f"warm: wall median {statistics.median(warm):.3f} s, "
              f"cpu median {statistics.median(warm_cpu):.3f} s")
        if job["proposals"]:
            print(f"{'':10s} job of {job['measurements']} trials in rounds of {args.batch}: "
                  f"proposal p50 {job['p50_s']:.3f} s, p99 {job['p99_s']:.3f} s, "
                  f"CPU {job['cpu_ms_per_measurement']:.2f} ms per measurement")
        if starts["enumerate_cpu_s"]:
            print(f"{'':10s} a new job's start (median of {len(starts['enumerate_cpu_s'])}): "
                  f"space enumerated {statistics.median(starts['enumerate_cpu_s']):.3f} s, "
                  f"first proposal {statistics.median(starts['first_proposal_cpu_s']):.3f} s "
                  "of CPU")
    load_after = os.getloadavg()
    print(f"load average (1, 5, 15 min) before: {load_before}, after: {load_after}")
    if args.out:
        meta = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": platform.processor() or platform.machine(),
                "cores": os.cpu_count(), "measurements": n_train,
                "prior": len(history.prior), "trials": len(history.trials),
                "valid_schedules": int(len(space.valid_indices)), "repeat": args.repeat,
                "loadavg_before": load_before, "loadavg_after": load_after}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": results}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
