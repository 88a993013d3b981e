"""What scoring part of a whole space costs in search quality.

The replay datasets are subspaces (at most 15,000 valid schedules), below the size where
the default strategy scores a candidate set when it retrains from scratch and a shortlist
of it at the boosting steps in between (`search.model_based.SHORTLIST_MIN_ROWS`). Here the
GPU is the analytical model over a layer's whole valid space (simulated; 1.5% noise), and
the default strategy runs per seed as it is, with every retraining scoring the whole space
(the shortlist kept), and with every retraining and boosting step scoring the whole space;
`long jobs as short ones` runs it with the schedule of its first 256 trials throughout
(retrained as the trials grow by half, boosted every 32 trials and at each proposal's count);
`five bags and voices in long jobs` with the task model's five bags and the extra voices
past 256 trials too (`long_bags=5:long_voices=1`).
Reported as the replay reports (`tctune bench search`): trials to 95% / 99% of the space's
best (median over seeds) and the score at 64 / 200 / the last trial against random search.

    python bench/search_shortlist.py [--seeds 5] [--trials 400] [--jobs 2]
        [--variants NAME,...] [--out bench/data/search_shortlist.json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.space import ScheduleSpace  # noqa: E402
from kernels.spec import RESNET50_3X3, TARGETS, Precision  # noqa: E402
from search import model_based  # noqa: E402
from search.datasets import ReplayDataset, ReplaySpace  # noqa: E402
from search.replay import random_expectation, run_one, score_at, trials_to  # noqa: E402
from workers.backends.simulated import simulate_latency_us  # noqa: E402

SPACES = [("stage3", Precision.INT8), ("stage2", Precision.FP16)]
# Each variant's settings of search.model_based (a threshold above any space turns a part
# off).
VARIANTS: dict[str, dict[str, int]] = {
    "candidates (default)": {},
    "whole space at retrainings": {"SCREEN_TREES": 1 << 62},
    "whole space": {"SHORTLIST_MIN_ROWS": 1 << 62},
    # Long jobs on the schedule of short ones: retrained as the trials grow by half,
    # boosted every 32 trials and at each proposal's count.
    "long jobs as short ones": {"LONG_FROM": 1 << 62},
    "five bags and voices in long jobs": {},
    "three bags and voices in long jobs": {},
    "five bags without voices in long jobs": {},
}
# Strategy options of a variant (the rest: the strategy's defaults).
VARIANT_OPTIONS: dict[str, dict[str, int]] = {
    "five bags and voices in long jobs": {"long_bags": 5, "long_voices": 1},
    "three bags and voices in long jobs": {"long_bags": 3, "long_voices": 1},
    "five bags without voices in long jobs": {"long_bags": 5, "long_voices": 0},
}
DEFAULTS = {name: getattr(model_based, name) for v in VARIANTS.values() for name in v}


def whole_space(stage: str, precision: Precision) -> ReplayDataset:
    """A dataset of every valid schedule of the layer's space, timed by the simulator."""
    full = ScheduleSpace(RESNET50_3X3[stage], precision, TARGETS["h100"])
    valid = full.valid_indices
    lat = simulate_latency_us(full.shape, precision, full.target, full.columns(valid))
    lat = lat * np.exp(np.random.default_rng(0).normal(0.0, 0.015, len(valid)))
    space = ReplaySpace(full.shape, precision, full.target, None, valid)
    status = np.full(space.size, "", dtype=object)
    status[valid] = "ok"
    median = np.full(space.size, np.inf)
    median[valid] = lat
    return ReplayDataset(name=f"sim_whole_{stage}_{precision.value}_h100", path=Path("-"),
                         meta={"simulated": True}, space=space, status=status,
                         median_us=median)


def _run(stage: str, precision: str, variant: str, seed: int, trials: int) -> list[float]:
    # A pool's process runs several units: every setting back to its default first.
    for name, value in {**DEFAULTS, **VARIANTS[variant]}.items():
        setattr(model_based, name, value)
    ds = whole_space(stage, Precision(precision))
    return run_one(ds, "diversity", seed, trials,
                   options=VARIANT_OPTIONS.get(variant)).tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--spaces", default=",".join(f"{st}:{p.value}" for st, p in SPACES),
                    help="comma-separated STAGE:PRECISION")
    ap.add_argument("--out", default="bench/data/search_shortlist.json")
    args = ap.parse_args(argv)
    spaces = [(st, Precision(p)) for st, p in (x.split(":") for x in args.spaces.split(","))]
    variants = args.variants.split(",")
    if unknown := set(variants) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}")
    units = [(st, p.value, v, seed) for st, p in spaces for v in variants
             for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        curves = list(pool.map(_run, *zip(*units, strict=True),
                               [args.trials] * len(units)))
    rows: list[dict[str, Any]] = []
    for st, p in spaces:
        ds = whole_space(st, p)
        rand = random_expectation(ds.throughput(ds.space.valid_indices), args.trials)
        for v in variants:
            c = np.array([cv for u, cv in zip(units, curves, strict=True)
                          if u[:3] == (st, p.value, v)])
            rows.append({"space": ds.name, "valid": int(len(ds.space.valid_indices)),
                         "variant": v, "trials_to_95": trials_to(c, 0.95),
                         "trials_to_99": trials_to(c, 0.99),
                         "score_64": score_at(c, rand, 64), "score_200": score_at(c, rand, 200),
                         f"score_{args.trials}": score_at(c, rand, args.trials),
                         "curves": c.round(5).tolist()})
            r = rows[-1]
            scores = " ".join(f"{k} {r[k]:.3f}" for k in r
                              if k.startswith("score_") and r[k] is not None)
            print(f"{ds.name:28s} {v:20s} t95 {r['trials_to_95']} t99 {r['trials_to_99']} "
                  f"{scores}", flush=True)
    meta = {"date": dt.date.today().isoformat(), "seeds": args.seeds, "trials": args.trials,
            "shortlist_rows": model_based.SHORTLIST_ROWS,
            "screen_trees": model_based.SCREEN_TREES, "screen_rows": model_based.SCREEN_ROWS,
            "random_rows": model_based.RANDOM_ROWS}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
