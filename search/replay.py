"""Offline replay of search strategies on exhaustively measured spaces.

Each (dataset, strategy, seed) runs the explorer's loop with the dataset as the GPU: propose
a batch of 32 (`--batch`), look the results up, repeat until the trial budget. Reported per
dataset and strategy (median over seeds): trials to reach 95% and 99% of the dataset's best
throughput, and the standardized score (strategy - random) / (optimum - random) at 64 and
200 trials, where strategy is the median best-so-far and random is the exact expectation of
random search without replacement at that many trials.

    tctune bench search [--dataset PATH ...] [--seeds 10] [--strategies random,grid,sa,diversity]
                        [--trials 200] [--batch 32] [--out bench/data/search_replay.json]
                        [--png ...]

A strategy is NAME[+transfer][:key=value...] with the options it declares (--help lists
them); `main(strategies=...)` replays others (bench/search_ablation.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from search import cost_model
from search.datasets import ReplayDataset, load_dataset
from search.registry import (
    STRATEGIES,
    Registry,
    parse_spec,
    strategies_help,
    strategy_class,
)
from search.strategy import History, PriorTrial, Strategy

DEFAULT_GLOB = "bench/data/replay/*.jsonl.gz"
BATCH = 32
SCORE_AT = (64, 200)
TRANSFER_SUFFIX = "+transfer"


def parse_strategy(spec: str, strategies: Registry = STRATEGIES
                   ) -> tuple[str, dict[str, Any], bool]:
    """'NAME[+transfer][:key=value...]' -> (name, options, transfer), the options as the
    strategy declares them (an unknown one or a bad value is an error). Options make other
    configurations replayable (e.g. diversity:pick=top is the paper's batch pick)."""
    head, sep, rest = spec.strip().partition(":")
    transfer = head.endswith(TRANSFER_SUFFIX)
    if transfer:
        head = head[: -len(TRANSFER_SUFFIX)]
    name, options = parse_spec(head + sep + rest, strategies)
    return name, options, transfer


def run_one(ds: ReplayDataset, strategy: str, seed: int, trials: int,
            prior: Sequence[PriorTrial] = (), batch: int = BATCH,
            options: dict[str, Any] | None = None,
            strategies: Registry = STRATEGIES) -> np.ndarray:
    """Best-so-far throughput (fraction of the dataset's best) after each trial."""
    cls = strategy_class(strategy, strategies)
    strat = cls(ds.space, seed=seed, **(options or {}))
    history = History(prior=list(prior))
    valid = np.zeros(ds.space.size, dtype=bool)
    valid[ds.space.valid_indices] = True
    got: list[float] = []
    while len(got) < trials:
        picks = strat.propose(history, batch)
        if not picks:
            break
        # The replay is also a check of the Strategy contract.
        seen = history.seen
        if len(set(picks)) != len(picks) or any(p in seen or not valid[p] for p in picks):
            raise AssertionError(f"{strategy} proposed an invalid, repeated or seen schedule")
        for p in picks:
            history.trials.append(ds.measure(p))
        got.extend(ds.throughput(np.asarray(picks)).tolist())
    curve = np.maximum.accumulate(np.asarray(got[:trials] or [0.0]))
    if len(curve) < trials:  # the space ran out: the best stays
        curve = np.concatenate([curve, np.full(trials - len(curve), curve[-1])])
    return curve


def random_expectation(throughput: np.ndarray, trials: int) -> np.ndarray:
    """E[best of t draws without replacement] for t = 1..trials (exact)."""
    v = np.sort(np.asarray(throughput, dtype=np.float64))[::-1]
    n = len(v)
    i = np.arange(1, n, dtype=np.float64)
    out = np.empty(trials)
    for t in range(1, trials + 1):
        if t >= n:
            out[t - 1] = v[0]
            continue
        # P(best is the i-th largest) = C(n-i, t-1) / C(n, t): P_1 = t/n and
        # P_{i+1} / P_i = (n-i-t+1) / (n-i).
        ratio = np.clip((n - i - t + 1) / (n - i), 0.0, None)
        p = (t / n) * np.concatenate([[1.0], np.cumprod(ratio)])
        out[t - 1] = float(np.dot(v, p))
    return out


def trials_to(curves: np.ndarray, level: float) -> float | None:
    """Median over seeds of the first trial reaching `level`; None if the median never does."""
    reached = curves >= level - 1e-12
    first = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1.0, np.inf)
    med = float(np.median(first))
    return None if math.isinf(med) else med


def score_at(curves: np.ndarray, rand: np.ndarray, t: int) -> float | None:
    if t > curves.shape[1]:
        return None
    r = rand[t - 1]
    if r >= 1.0 - 1e-12:
        return 1.0
    return float((np.median(curves[:, t - 1]) - r) / (1.0 - r))


def transfer_prior(ds: ReplayDataset, others: Sequence[ReplayDataset]) -> list[PriorTrial]:
    """Measurements of the other layers on the same target and precision (not this shape),
    of the same kind: a GPU-recorded dataset learns from GPU recordings only, a simulated
    one from simulated ones (the simulator's h100 shares the real one's target)."""
    out: list[PriorTrial] = []
    for o in others:
        if (o.space.shape == ds.space.shape or o.space.target != ds.space.target
                or o.space.precision != ds.space.precision
                or o.simulated != ds.simulated):
            continue
        for i in o.space.valid_indices:
            t = o.measure(int(i))
            out.append(PriorTrial(o.space.shape, o.space.schedule_at(int(i)), t.status,
                                  t.median_us))
    return out


_DATASETS: list[ReplayDataset] = []
_PRIORS: dict[tuple[int, str], list[PriorTrial]] = {}
_STRATEGIES: dict[str, type[Strategy]] = dict(STRATEGIES)


def init_worker(paths: Sequence[str], loaded: Sequence[ReplayDataset] | None = None,
                nthread: int | None = None, strategies: Registry | None = None) -> None:
    """A replay process's datasets (loaded here unless given), XGBoost threads and the
    strategies its specs name (the service's unless given)."""
    _DATASETS[:] = list(loaded) if loaded is not None else [load_dataset(p) for p in paths]
    _STRATEGIES.clear()
    _STRATEGIES.update(STRATEGIES if strategies is None else strategies)
    if nthread is not None:
        # Worker processes share the cores: one XGBoost thread each (results are the same).
        cost_model.NTHREAD = nthread
    _PRIORS.clear()


def run_unit(d: int, spec: str, seed: int, trials: int, batch: int = BATCH) -> np.ndarray:
    """One replay of `spec` (NAME[+transfer][:key=value...]) on the worker's dataset d."""
    name, options, transfer = parse_strategy(spec, _STRATEGIES)
    prior: list[PriorTrial] = []
    if transfer:
        if (d, spec) not in _PRIORS:
            _PRIORS[(d, spec)] = transfer_prior(_DATASETS[d], _DATASETS)
        prior = _PRIORS[(d, spec)]
    return run_one(_DATASETS[d], name, seed, trials, prior, batch=batch, options=options,
                   strategies=_STRATEGIES)


def _fmt(v: float | None, budget: int) -> str:
    if v is None:
        return f">{budget}"
    return f"{v:g}"


def main(argv: list[str] | None = None, strategies: Registry | None = None,
         prog: str = "tctune bench search") -> int:
    """The replay's command line; `strategies` replaces the service's registry (a benchmark
    that replays variants the service does not offer)."""
    registry = STRATEGIES if strategies is None else strategies
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="strategies and their options:\n"
                                        + strategies_help(registry))
    ap.add_argument("--dataset", action="append", default=None,
                    help=f"replay dataset (repeatable); default {DEFAULT_GLOB}")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--strategies", default="random,grid,sa,diversity",
                    help="comma-separated NAME[+transfer][:key=value...]; +transfer gives "
                         "the other datasets of the same target and precision as the prior")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--out", default="bench/data/search_replay.json")
    ap.add_argument("--png", default="bench/data/search_replay.png")
    ap.add_argument("--markdown", default=None, help="also write the table as markdown here")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help="candidates per proposal (the service's round; in the fleet rounds "
                         "grow while GPUs wait)")
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error("--batch must be at least 1")

    # Wide enough for the table when the output is a file or a pipe (CI logs).
    console = Console(width=None if Console().is_terminal else 130)
    paths = args.dataset or sorted(str(p) for p in Path().glob(DEFAULT_GLOB))
    if not paths:
        console.print(f"[red]no datasets: pass --dataset or record {DEFAULT_GLOB}[/red]")
        return 2
    specs = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for spec in specs:
        try:
            parse_strategy(spec, registry)
        except ValueError as exc:  # before any dataset is loaded: fail at once
            console.print(f"[red]--strategies {spec}: {exc}[/red]")
            return 2
    datasets = [load_dataset(p) for p in paths]

    rows: list[dict[str, Any]] = []
    curves: dict[str, dict[str, np.ndarray]] = {}
    started = time.time()
    units = [(d, s, seed) for d in range(len(datasets)) for s in specs
             for seed in range(args.seeds)]
    results: dict[tuple[int, str, int], np.ndarray] = {}
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as progress:
        job = progress.add_task("replay", total=len(units))
        if args.jobs > 1:
            # Runs are independent; worker processes load the datasets themselves.
            nthread = max(1, (os.cpu_count() or 1) // args.jobs)
            with ProcessPoolExecutor(args.jobs, initializer=init_worker,
                                     initargs=(paths, None, nthread, registry)) as pool:
                futures = {pool.submit(run_unit, d, s, seed, args.trials, args.batch):
                           (d, s, seed)
                           for d, s, seed in units}
                for fut in as_completed(futures):
                    d, s, seed = futures[fut]
                    results[(d, s, seed)] = fut.result()
                    progress.update(job, advance=1,
                                    description=f"{datasets[d].name} {s} seed {seed}")
        else:
            init_worker(paths, datasets, strategies=registry)
            for d, s, seed in units:
                progress.update(job, description=f"{datasets[d].name} {s} seed {seed}")
                results[(d, s, seed)] = run_unit(d, s, seed, args.trials, args.batch)
                progress.advance(job)

    for d, ds in enumerate(datasets):
        rand = random_expectation(ds.throughput(ds.space.valid_indices), args.trials)
        curves[ds.name] = {}
        for strat in specs:
            c = np.vstack([results[(d, strat, seed)] for seed in range(args.seeds)])
            curves[ds.name][strat] = c
            rows.append({
                "dataset": ds.name, "simulated": ds.simulated, "strategy": strat,
                "seeds": args.seeds, "trials_to_95": trials_to(c, 0.95),
                "trials_to_99": trials_to(c, 0.99),
                "score_64": _round(score_at(c, rand, SCORE_AT[0])),
                "score_200": _round(score_at(c, rand, SCORE_AT[1])),
            })

    print_table(console, rows, args.trials)
    console.print(f"{len(datasets)} datasets x {len(specs)} strategies x {args.seeds} "
                  f"seeds in {time.time() - started:.0f} s")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        meta = {"date": dt.date.today().isoformat(), "trials": args.trials,
                "seeds": args.seeds, "batch": args.batch, "datasets": [str(p) for p in paths],
                # The trees (hence a seed's path) change with XGBoost's version: on the
                # largest spaces a median moved by 15 trials between two installs.
                "versions": {"xgboost": cost_model.xgb.__version__, "numpy": np.__version__}}
        out.write_text(json.dumps({"rows": rows, "meta": meta}, indent=1) + "\n")
        console.print(f"wrote {out}")
    if args.png:
        save_png(Path(args.png), curves, datasets)
        console.print(f"wrote {args.png}")
    if args.markdown:
        Path(args.markdown).write_text(markdown_table(rows, args.trials))
        console.print(f"wrote {args.markdown}")
    return 0


def markdown_table(rows: list[dict[str, Any]], budget: int) -> str:
    lines = ["| dataset | strategy | trials to 95% | trials to 99% | score@64 | score@200 |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        name = r["dataset"] + (" (simulated)" if r["simulated"] else "")
        s64 = "-" if r["score_64"] is None else f"{r['score_64']:.2f}"
        s200 = "-" if r["score_200"] is None else f"{r['score_200']:.2f}"
        lines.append(f"| {name} | {r['strategy']} | {_fmt(r['trials_to_95'], budget)} | "
                     f"{_fmt(r['trials_to_99'], budget)} | {s64} | {s200} |")
    return "\n".join(lines) + "\n"


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def print_table(console: Console, rows: list[dict[str, Any]], budget: int) -> None:
    table = Table(title="Search replay (median over seeds)")
    for col in ("dataset", "strategy", "trials to 95%", "trials to 99%", "score@64",
                "score@200"):
        table.add_column(col, justify="left" if col in ("dataset", "strategy") else "right",
                         no_wrap=True)
    for r in rows:
        name = r["dataset"] + (" (simulated)" if r["simulated"] else "")
        table.add_row(name, r["strategy"], _fmt(r["trials_to_95"], budget),
                      _fmt(r["trials_to_99"], budget),
                      "-" if r["score_64"] is None else f"{r['score_64']:.3f}",
                      "-" if r["score_200"] is None else f"{r['score_200']:.3f}")
    console.print(table)


def save_png(path: Path, curves: dict[str, dict[str, np.ndarray]],
             datasets: Sequence[ReplayDataset]) -> None:
    import matplotlib  # noqa: PLC0415 (only the PNG needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    n = len(curves)
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    sim = {d.name: d.simulated for d in datasets}
    for ax, (name, by_strat) in zip(axes.ravel(), curves.items(), strict=False):
        for strat, c in by_strat.items():
            t = np.arange(1, c.shape[1] + 1)
            line, = ax.plot(t, np.median(c, axis=0), label=strat, lw=1.4)
            ax.fill_between(t, np.quantile(c, 0.25, axis=0), np.quantile(c, 0.75, axis=0),
                            color=line.get_color(), alpha=0.15, lw=0)
        ax.axhline(0.95, color="grey", lw=0.6, ls=":")
        ax.axhline(0.99, color="grey", lw=0.6, ls="--")
        ax.set_ylim(0.5, 1.005)
        ax.set_title(name + (" (simulated)" if sim.get(name) else ""), fontsize=8)
        ax.set_xlabel("trials", fontsize=8)
        ax.set_ylabel("best so far / optimum", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    axes.ravel()[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Best-so-far throughput, median and IQR over seeds", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
