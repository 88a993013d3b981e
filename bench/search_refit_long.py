"""Long replays of the task model's refit schedule: `diversity` (refit=1.5, boosting the last
model between refits) against `diversity:refit=1` (retrained from scratch every batch), 500
trials on the `wide` datasets of the replay table and the development set, 10 seeds.

Per dataset and schedule: the median best-so-far at 200, 300 and 500 trials, the median
trials to the optimum, and the median CPU seconds per 500-trial run (one XGBoost thread).

    python bench/search_refit_long.py [--out bench/data/search_refit_long.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search.replay import init_worker, run_unit, trials_to  # noqa: E402

TRIALS, SEEDS = 500, 10
SCHEDULES = ("diversity:refit=1.5", "diversity:refit=1")


def files() -> list[str]:
    return sorted(glob.glob("bench/data/replay/*wide*.jsonl.gz")) + \
        sorted(glob.glob("bench/data/replay_dev/*wide*.jsonl.gz"))


def unit(d: int, spec: str, seed: int) -> tuple[np.ndarray, float]:
    """One replay in a worker of search.replay's pool, and its CPU seconds."""
    t = time.process_time()
    curve = run_unit(d, spec, seed, TRIALS)
    return curve, time.process_time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/data/search_refit_long.json")
    args = ap.parse_args()
    paths = files()
    jobs = [(d, s, seed) for d in range(len(paths)) for s in SCHEDULES for seed in range(SEEDS)]
    # One XGBoost thread per worker, the datasets loaded once per worker (as the replay does).
    with ProcessPoolExecutor(2, initializer=init_worker, initargs=(paths, None, 1)) as pool:
        res = list(pool.map(unit, *zip(*jobs, strict=True)))
    runs: dict[tuple[str, str], list[tuple[np.ndarray, float]]] = {}
    for (d, spec, _), (curve, cpu) in zip(jobs, res, strict=True):
        runs.setdefault((paths[d], spec.split(":", 1)[1]), []).append((curve, cpu))
    rows = []
    for (path, schedule), v in runs.items():
        curves = np.array([c for c, _ in v])
        rows.append({"dataset": Path(path).name.removesuffix(".jsonl.gz"),
                     "schedule": schedule,
                     **{f"median_best_at_{t}": float(np.median(curves[:, t - 1]))
                        for t in (200, 300, 500)},
                     "trials_to_optimum": trials_to(curves, 1.0),
                     "cpu_s_per_run": float(np.median([c for _, c in v]))})
        print(rows[-1], flush=True)
    Path(args.out).write_text(json.dumps({"trials": TRIALS, "seeds": SEEDS, "rows": rows},
                                         indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
