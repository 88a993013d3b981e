"""The search goals, read off replay results (`python -m search.replay --out ...` JSON files).

For each strategy in the files: on how many datasets the median seed reaches 95% of the best
within 64 trials and 99% within 200, and its median (over datasets) trials to 95% against
random's and sa's. A dataset whose median seed never got there counts as budget + 1 trials
(201 for the 200-trial table), as the RESULTS tables always did.

    python bench/search_goals.py bench/data/search_replay.json [more.json ...]
        [--random random] [--sa sa] [--only PREFIX,...] [--skip PREFIX,...]

Rows of several files are merged (the same strategy name in two files: the later wins), so
a variant replayed alone is compared with random and sa from the table's file.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def load_rows(paths: list[str]) -> tuple[dict[tuple[str, str], dict[str, Any]], int]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    budget = 0
    for p in paths:
        data = json.loads(Path(p).read_text())
        budget = max(budget, int(data["meta"]["trials"]))
        for r in data["rows"]:
            rows[(r["dataset"], r["strategy"])] = {**r, "budget": int(data["meta"]["trials"])}
    return rows, budget


def trials(r: dict[str, Any], key: str) -> float:
    v = r[key]
    return float(r["budget"] + 1) if v is None else float(v)


def summary(rows: dict[tuple[str, str], dict[str, Any]], datasets: list[str], strategy: str,
            random: str, sa: str) -> dict[str, Any]:
    mine = [rows[(d, strategy)] for d in datasets if (d, strategy) in rows]
    names = [r["dataset"] for r in mine]
    t95 = [trials(r, "trials_to_95") for r in mine]
    t99 = [trials(r, "trials_to_99") for r in mine]
    out: dict[str, Any] = {
        "strategy": strategy, "datasets": len(mine),
        "within64_95": sum(t <= 64 for t in t95),
        "within200_99": sum(t <= 200 and r["budget"] >= 200 for t, r in zip(t99, mine,
                                                                           strict=True)),
        "misses64": {n: t for n, t in zip(names, t95, strict=True) if t > 64},
        "median_t95": statistics.median(t95) if t95 else None,
    }
    for base in (random, sa):
        theirs = [trials(rows[(d, base)], "trials_to_95") for d in names if (d, base) in rows]
        if len(theirs) == len(names) and theirs:
            out[f"vs_{base}"] = round(out["median_t95"] / statistics.median(theirs), 3)
            out[f"median_t95_{base}"] = statistics.median(theirs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--random", default="random")
    ap.add_argument("--sa", default="sa")
    ap.add_argument("--only", default="", help="dataset name prefixes to keep (comma list)")
    ap.add_argument("--skip", default="", help="dataset name prefixes to drop (comma list)")
    ap.add_argument("--per-dataset", action="store_true", help="also print trials to 95%%")
    args = ap.parse_args(argv)
    rows, budget = load_rows(args.files)
    datasets = sorted({d for d, _ in rows})
    if args.only:
        datasets = [d for d in datasets if d.startswith(tuple(args.only.split(",")))]
    if args.skip:
        datasets = [d for d in datasets if not d.startswith(tuple(args.skip.split(",")))]
    strategies = list(dict.fromkeys(s for _, s in rows))
    print(f"{len(datasets)} datasets, budget {budget} trials")
    for s in strategies:
        r = summary(rows, datasets, s, args.random, args.sa)
        misses = ", ".join(f"{k} {v:g}" for k, v in r["misses64"].items())
        print(f"{s:60s} 95%@64 {r['within64_95']:2d}/{r['datasets']}  99%@200 "
              f"{r['within200_99']:2d}/{r['datasets']}  median t95 {r['median_t95']:6.2f}  "
              f"vs random {r.get('vs_' + args.random, '-')}  vs sa {r.get('vs_' + args.sa, '-')}"
              f"{'  misses: ' + misses if misses else ''}")
    if args.per_dataset:
        print("dataset".ljust(45) + "".join(s[:14].rjust(15) for s in strategies))
        for d in datasets:
            cells = ["-" if (d, s) not in rows else f"{trials(rows[(d, s)], 'trials_to_95'):g}"
                     for s in strategies]
            print(d.ljust(45) + "".join(c.rjust(15) for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
