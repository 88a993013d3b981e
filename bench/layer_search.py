"""Long searches of single layers, each alone: the service's search without its database.

  python -m bench.layer_search run --models resnet50 --batches 8 --trials 500 \\
      --out bench/data/layer_search_r50_h100.json [--top 12] [--stop-after S]       # GPU
  python -m bench.layer_search table bench/data/layer_search_r50_h100.json

Per (layer shape, precision), the explorer's loop as a job runs it (workers/tasks.py
explore_round): the first round begins with the runtime's default schedule
(workers/seeds.py), then the default strategy proposes rounds of `--round` from the layer's
own measurements only; with `--prior R` (a records file; R@GPU where R was measured on
another GPU model) every round also seeds the recorded bests of the layer's nearest other
layers, as the service's transfer seeds do. `--misses F` (a bench/retime.py run) searches only
the layers F timed over their precision's per-layer goal, furthest over first; `--skip F...`
leaves out the layers that earlier runs' files F searched; `--residual`
only the layers deploy runs with a residual epilogue, as those layers (ConvShape.residual, as
`tctune plan` submits them); `--pixel-pairs` only the stems that deploy can run over pixel
pairs, as their pair layers (kernels.spec.pixel_pairs).
Measured through the GPU worker's
backend (workers/backends/cuda.py: NVRTC builds, each candidate checked on random inputs,
then timed), with cuDNN fp16 timed by the same backend once per shape. The tasks run a few
at a time so that one's builds overlap another's measurements. The best-so-far after 16, 32,
64, ... trials is recorded per task; `bench/service_tuning.py` compares the service's own
tuning of a model with these bests (`vs_500_trials`), and `bench/model_e2e.py records` takes
them as schedules. A run with the same --out continues each task from its recorded trials
(the strategy's choices depend only on the seed and the history, so it proposes what an
uninterrupted run would).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.cli import add_table, commands, geomean, log, print_table, read_json, records_on
from bench.zoo import (
    GOALS,
    PRECISIONS,
    Group,
    Use,
    add_layer_args,
    atomic_write,
    load_shapes,
    measure_key,
    planned,
    zoo_bests,
)
from kernels.spec import ConvShape, Precision

CURVE_AT = (16, 32, 64, 128, 256, 500)


def curve(trials: Sequence[dict[str, Any]], at: Sequence[int] = CURVE_AT) -> dict[str, Any]:
    """Best ok latency among the first k trials, for each k the task reached."""
    out: dict[str, Any] = {}
    best = math.inf
    marks = sorted(k for k in at if k <= len(trials))
    for i, t in enumerate(trials, 1):
        if t["status"] == "ok" and t["median_us"] is not None:
            best = min(best, float(t["median_us"]))
        if marks and i == marks[0]:
            out[str(marks.pop(0))] = None if math.isinf(best) else round(best, 4)
    return out


def best_trial(trials: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [t for t in trials if t["status"] == "ok" and t["median_us"] is not None]
    return min(ok, key=lambda t: t["median_us"]) if ok else None


def by_miss(groups: Sequence[Group], retimed: dict[str, Any]) -> list[Group]:
    """The groups whose layer a retime run (bench/retime.py) timed over its precision's
    per-layer goal against cuDNN fp16 (bench/zoo.py GOALS), furthest over first."""
    over: dict[str, float] = {}
    for r in retimed["rows"]:
        goal = GOALS.get(r["precision"])
        if goal and r.get("ours_us") and r.get("cudnn_fp16_us"):
            miss = r["ours_us"] / r["cudnn_fp16_us"] / goal.layer
            if miss > 1.0:
                over[measure_key(ConvShape.from_dict(r["shape"]), r["precision"])] = miss
    return sorted((g for g in groups if g.key in over), key=lambda g: -over[g.key])


def unsearched(groups: Sequence[Group], runs: Sequence[dict[str, Any]]) -> list[Group]:
    """The groups whose (layer, precision) none of these layer_search runs searched."""
    searched = {r["key"] for doc in runs for r in doc["rows"]}
    return [g for g in groups if g.key not in searched]


def by_total_time(groups: Sequence[Group], zoo: dict[str, float]) -> list[Group]:
    """Groups in descending order of their share of the model's time (the zoo's latency of
    the shape times its uses); unknown shapes last, in plan order."""
    def weight(g: Group) -> float:
        return zoo.get(g.key, 0.0) * sum(u.count for u in g.uses)
    return sorted(groups, key=lambda g: -weight(g))


def residual_groups(groups: Sequence[Group], shapes_doc: dict[str, Any]) -> list[Group]:
    """The groups' layers that deploy runs with a residual epilogue, as those layers
    (ConvShape.residual): each use's layers that api.plan.fused_layers names on bench.nets'
    module of its model (random weights, one forward at batch 1 on the CPU)."""
    import torch

    from api.plan import conv_layers, fused_layers
    from bench.nets import model

    names: dict[str, set[str]] = {}
    out = []
    for g in groups:
        uses = []
        for u in g.uses:
            if u.model not in names:
                net, _ = model(u.model)
                x = torch.randn(1, *shapes_doc["models"][u.model]["input"])
                names[u.model] = fused_layers(net, x, conv_layers(net, x))[1]
            layers = tuple(name for name in u.layers if name in names[u.model])
            if layers:
                uses.append(Use(u.model, layers, len(layers)))
        if uses:
            out.append(Group(replace(g.shape, residual=True), g.precision, uses))
    return out


def pair_groups(groups: Sequence[Group]) -> list[Group]:
    """The groups' layers that run over pixel pairs, as the pair layers (kernels.spec's
    pair_layer, the rule deploy.optimize applies to a model's input)."""
    from kernels.spec import pair_layer

    out = []
    for g in groups:
        paired = pair_layer(g.shape, g.precision)
        if paired is not None:
            out.append(Group(paired[0], g.precision, g.uses))
    return out


class LayerSearch:
    """One task's search: strategy, history and the measured trials (resumable)."""

    def __init__(self, group: Group, target: Any, trials: list[dict[str, Any]], seed: int,
                 strategy: str, prior: list[Any] | None = None) -> None:
        from kernels.space import ScheduleSpace
        from search.registry import make_strategy
        from workers.backends.base import TaskSpec

        self.group = group
        self.spec = TaskSpec(group.shape, Precision(group.precision), target)
        self.space = ScheduleSpace(group.shape, self.spec.precision, target)
        self.strategy = make_strategy(strategy, self.space, seed=seed)
        self.trials = trials
        self.prior = prior or []  # other layers' bests: transfer seeds (workers/seeds.py)

    def history(self) -> Any:
        from search.strategy import History, Trial

        return History(trials=[Trial(self.space.index_of(t["schedule"]), t["status"],
                                     t["median_us"]) for t in self.trials], prior=self.prior)

    def propose(self, n: int) -> list[dict[str, Any]]:
        from workers.seeds import start_points

        history = self.history()
        seeds = start_points(self.spec, self.space, history)[:n]
        history.pending |= set(seeds)
        picks = seeds + self.strategy.propose(history, n - len(seeds))
        return [self.space.schedule_at(i) for i in picks]


def build_one(args: tuple[Any, dict[str, Any], str]) -> tuple[str, str, str]:
    """In a pool process: the worker backend's build (the same NVRTC job and cache)."""
    from kernels.build import BuildJob, build

    spec, schedule, cache = args
    r = build(BuildJob(spec.shape, spec.precision, spec.target.sm, schedule), cache)
    return r.status, r.key, r.log[-2000:]


def run(groups: Sequence[Group], doc: dict[str, Any], out: Path, backend: Any, cache: str,
        trials: int, round_size: int, parallel: int, seed: int, strategy: str,
        stop_after_s: float = 0.0, priors: dict[str, list[Any]] | None = None) -> int:
    """Search every group to `trials` on `backend` (the cuda one: builds in a process pool
    into `cache`; any other builds in its own call), rewriting `out` after each round.
    Returns the number of tasks left unfinished. `priors`: per precision, other layers'
    measurements for the transfer seeds of every round (`--prior`)."""
    from workers.backends.base import BuildOutcome

    target = backend.target
    if target is None:
        raise SystemExit(f"no target for GPU {backend.gpu_model!r}")
    if doc.get("gpu") and doc["gpu"] != backend.gpu_model:
        raise SystemExit(f"{out} holds timings of {doc['gpu']}, this is {backend.gpu_model}")
    doc.update(gpu=backend.gpu_model, target=target.name, strategy=strategy,
               round=round_size, seed=seed)
    doc.setdefault("date", dt.date.today().isoformat())
    rows: dict[str, dict[str, Any]] = {r["key"]: r for r in doc.setdefault("rows", [])}
    lock = threading.Lock()  # the measuring child takes one request at a time; doc writes
    pool = ProcessPoolExecutor(max_workers=os.cpu_count()) if backend.name == "cuda" else None
    t0 = time.monotonic()

    def save() -> None:
        doc["rows"] = list(rows.values())
        # Compact: every trial's schedule is kept (12,000 of them make 5 MB indented).
        atomic_write(out, json.dumps(doc, separators=(",", ":")) + "\n")

    def builds(spec: Any, picks: list[dict[str, Any]]) -> list[Any]:
        if pool is None:
            return [backend.build(spec, p) for p in picks]
        futs: list[Future[tuple[str, str, str]]] = [
            pool.submit(build_one, (spec, p, cache)) for p in picks]
        return [BuildOutcome(st, artifact=key or None, log=blog)
                for st, key, blog in (f.result() for f in futs)]

    def task(g: Group) -> bool:
        with lock:
            row = rows.setdefault(g.key, {
                "key": g.key, "shape": g.shape.to_dict(), "n": g.shape.n,
                "precision": g.precision,
                "layers": [f"{u.model} {u.layers[0]}" for u in g.uses],
                "count": sum(u.count for u in g.uses), "trials": []})
        s = LayerSearch(g, target, row["trials"], seed, strategy,
                        (priors or {}).get(g.precision))
        if row.get("cudnn_fp16_us") is None:
            with lock:
                row["cudnn_fp16_us"] = backend.baseline_us(s.spec)
        while len(row["trials"]) < trials:
            if stop_after_s and time.monotonic() - t0 > stop_after_s:
                return False
            picks = s.propose(min(round_size, trials - len(row["trials"])))
            if not picks:
                row["note"] = "space exhausted"
                break
            measured = []
            for p, b in zip(picks, builds(s.spec, picks), strict=True):
                with lock:
                    m = backend.measure(s.spec, p, b)
                measured.append({"schedule": p, "status": m.status,
                                 "median_us": m.median_us})
            with lock:
                row["trials"].extend(measured)
                b = best_trial(row["trials"])
                row.update(curve=curve(row["trials"]), best_us=b and b["median_us"],
                           best_schedule=b and b["schedule"],
                           wrong=sum(t["status"] == "wrong" for t in row["trials"]))
                save()
            log(f"{g.shape.key()} {g.precision}: {len(row['trials'])}/{trials} trials, best "
                f"{row['best_us']} us (cuDNN fp16 {row['cudnn_fp16_us']}), "
                f"{time.monotonic() - t0:.0f} s")
        return True

    try:
        with ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
            done = list(ex.map(task, groups))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        save()
    return sum(not d for d in done)


def render(doc: dict[str, Any]) -> str:
    """Per task the best-so-far after k trials; then, over the tasks that reached the last
    mark, each mark's best against the task's final best. (The cuDNN times in the data are
    the backend's of that run; bench/retime.py is where ratios to cuDNN come from.)"""
    from bench.zoo import shape_text

    marks = [str(k) for k in CURVE_AT]
    lines = [f"{doc['gpu']}, strategy {doc['strategy']}, rounds of {doc['round']}, "
             f"{doc['date']}", "",
             "| layer | shape | precision | trials | wrong | "
             + " | ".join(f"best@{k} us" for k in marks) + " |",
             "|---" * (5 + len(marks)) + "|"]
    for r in doc["rows"]:
        c = r.get("curve", {})
        more = f" (+{r['count'] - 1})" if r["count"] > 1 else ""
        points = " | ".join(f"{c[k]:.2f}" if c.get(k) else "-" for k in marks)
        lines.append(f"| {r['layers'][0]}{more} | {shape_text(r['shape'])} | {r['precision']} | "
                     f"{len(r['trials'])} | {r.get('wrong', 0)} | {points} |")
    done = [r for r in doc["rows"] if r.get("curve", {}).get(marks[-1])]
    if done:
        lines += ["", f"Over the {len(done)} tasks searched to {marks[-1]} trials, the best "
                  "after k trials against the task's best:", "",
                  "| k | geomean | worst | within 5% |", "|---|---|---|---|"]
        for k in marks[:-1]:
            v = [r["curve"][k] / r["curve"][marks[-1]] for r in done if r["curve"].get(k)]
            lines.append(f"| {k} | {geomean(v):.3f}x | {max(v):.2f}x | "
                         f"{sum(x <= 1.05 for x in v)}/{len(v)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.layer_search", __doc__)
    r = sub.add_parser("run", help="search layers on this machine's GPU")
    r.add_argument("--out", required=True)
    r.add_argument("--cache", default="/tmp/tctune-layer-search")
    add_layer_args(r, models="resnet50", batches="8")
    r.add_argument("--top", type=int, default=0,
                   help="only the TOP tasks with the largest share of the model's time "
                        "(the zoo's latencies), or with --misses the TOP furthest over; 0: all")
    r.add_argument("--misses", default="",
                   help="a retime run's file (bench.retime run): only the layers it timed over "
                        "their precision's per-layer goal, furthest over first")
    r.add_argument("--pixel-pairs", action="store_true",
                   help="the layers a stem-like conv (stride 2 in width, few channels) is over "
                        "pixel pairs (kernels.spec.pixel_pairs), as deploy runs them where their "
                        "record is faster, in place of the others")
    r.add_argument("--residual", action="store_true",
                   help="only the layers deploy runs with a residual epilogue (the conv before "
                        "a block's add), searched as those layers")
    r.add_argument("--skip", nargs="*", default=[], metavar="FILE",
                   help="layer_search runs' files: leave out the (layer, precision) tasks they "
                        "searched (those of a GPU model's earlier searches)")
    r.add_argument("--trials", type=int, default=500)
    r.add_argument("--round", type=int, default=32)
    r.add_argument("--parallel", type=int, default=3, help="tasks searched at once")
    r.add_argument("--strategy", default="diversity")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--prior", default="",
                   help="a records file (bench.model_e2e records), FILE@GPU where its records "
                        "were measured on another GPU model: its other layers' bests seed "
                        "each round as the service's transfer seeds do (default: none)")
    r.add_argument("--stop-after", type=float, default=0.0,
                   help="seconds; then stop after the rounds in flight (run again to go on)")
    add_table(sub)
    a = ap.parse_args(argv)
    if print_table(a, render):
        return 0
    groups = [g for g in planned(a) if not g.shape.problems(Precision(g.precision))]
    if a.residual:
        groups = residual_groups(groups, load_shapes(a.shapes))
    if a.pixel_pairs:
        groups = pair_groups(groups)
    if a.misses:
        groups = by_miss(groups, read_json(a.misses))
    elif a.top:
        groups = by_total_time(groups, zoo_bests())
    if a.top:
        groups = groups[:a.top]
    groups = unsearched(groups, [read_json(path) for path in a.skip])
    out = Path(a.out)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    from workers.backends.cuda import CudaBackend

    backend = CudaBackend(a.cache)
    priors = {}
    if a.prior and backend.target is not None:
        from bench.zoo_transfer import records_prior

        path, _, measured_on = a.prior.partition("@")
        records = records_on(path, backend.target.name, measured_on or None)
        priors = {p: records_prior(records, p, backend.target.name) for p in PRECISIONS}
        doc["prior"] = a.prior
    try:
        left = run(groups, doc, out, backend, a.cache, a.trials, a.round, a.parallel, a.seed,
                   a.strategy, a.stop_after, priors)
    finally:
        backend.close()
    log(f"{left} tasks left" if left else "complete")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
