"""Tuned kernels against cuDNN fp16 (and CUTLASS) on every groups=1 conv of a zoo of networks:
torchvision's resnet50, resnet18, densenet121, mobilenet_v2 and efficientnet_b0 at 224x224,
and bench/nets.py's U-Net at 256x256.

  python -m bench.zoo shapes [--out bench/data/zoo_shapes.json]        # CPU, needs torchvision
      the distinct groups=1 Conv2d shapes of each model (forward hooks on a meta input), each
      with its count in the model and its layer names; depthwise/grouped convs (mobilenet_v2,
      efficientnet_b0) and the U-Net's transposed convs are not Conv2d with groups=1: counted
      under "excluded", not benchmarked.
  python -m bench.zoo run --out FILE [--models ...] [--batches ...] [--precisions int8,fp16]
                          [--budget N] [--stop-after S] [--cutlass-lib PATH]     # GPU
      per distinct (shape, batch, precision): a short search (below), the best schedule's time,
      cuDNN fp16 (channels_last) timed in the same process with the same harness
      (kernels.timing), and CUTLASS with --cutlass-lib. Batch 8 for every model, ResNet-50
      also 1 and 32 (unless --batches says otherwise). FILE is rewritten after every
      measurement and a run with the same --out skips what FILE already has: the zoo can be
      split over several time-limited runs (--stop-after: start no measurement after S s).
  python -m bench.zoo table FILE [--out bench/ZOO.md]                   # markdown
      every table; with --out the per-layer tables (one row per layer and batch, int8 and
      fp16 side by side, with each layer's floor) go to the file and the networks' sums and
      the zoo's summary (what bench/RESULTS.md keeps) are printed.

The search of one (shape, batch, precision), at most --budget candidates: a start set of half
the budget (up to a quarter from transfer: the best schedules this run found for the same
precision on the nearest shapes; the runtime's default schedule for the shape; the rest random
over mma.sync, wgmma and wgmma with TMA loads and stores, half folded where the taps fold, as
bench/layer_classes.py samples), then one round of one-knob local search around the fastest.
The next group's start set is built while this group is measured (the plan alternates int8
and fp16, so its transfer is already known).
int8 outputs are requantized int8 (the default Epilogue), fp16 outputs fp16 with bias. Every
candidate is checked against the reference before it is timed (kernels.runner).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.cli import geomean, log
from bench.layer_classes import PATHS
from kernels.space import (
    Schedule,
    ScheduleSpace,
    fold_tap_bytes,
    schedule_hash,
    with_defaults,
)
from kernels.spec import (
    ConvShape,
    Precision,
    Target,
    gemm_distance,
    get_target,
    target_for_gpu_model,
)

SHAPES_FILE = Path(__file__).resolve().parent / "data" / "zoo_shapes.json"
ZOO_FILE = Path(__file__).resolve().parent / "data" / "zoo_h100.json"
MODELS = ("resnet50", "resnet18", "densenet121", "mobilenet_v2", "efficientnet_b0", "unet")
INPUT_HW = {"unet": 256}  # every other model at 224x224
DEFAULT_BATCH = 8
EXTRA_BATCHES = {"resnet50": (1, 32)}
PRECISIONS = ("int8", "fp16")
DEFAULT_BUDGET = 16
# GPU time per candidate, builds included (bench/layer_classes.py on an H100 with 16 cores:
# ~95 candidates per (layer, precision) in ~19 s), and per cuDNN baseline (benchmark mode
# tries its algorithms first): for the estimate printed before a run.
SECONDS_PER_CANDIDATE = 0.2
SECONDS_PER_BASELINE = 1.5
# --stop-after for a 10-minute call: start-up (torch, the runner's child) and the last
# measurement (the largest U-Net layers: a few seconds each) fit in the rest.
STOP_AFTER_HINT = 480
NO_CUTLASS = "not run (no --cutlass-lib)"
# What a measurement puts in a row; copied to each model that has the same shape.
MEASURED = ("ours_us", "cudnn_fp16_us", "cutlass_us", "cutlass_note", "checked", "schedule",
            "best_from", "default_us", "measured", "wrong", "failed", "top", "note")


@dataclass(frozen=True)
class Goal:
    """ours / cuDNN fp16 time: every layer at most `layer`, the geometric mean over layers
    at most `geomean`, ResNet-50's 53 convs summed at most `resnet50_sum`."""

    layer: float
    geomean: float
    resnet50_sum: float


GOALS = {"fp16": Goal(1.0, 0.85, 0.85), "int8": Goal(0.7, 0.55, 0.5)}


# ---- shapes: torchvision's models traced with forward hooks -------------------------------
def _import_torchvision() -> Any:
    """torchvision, also where its compiled operators do not load (a wheel built for another
    torch): the model definitions need none of them, only the fake-tensor registrations of
    those operators fail at import time, so they are skipped then."""
    try:
        import torchvision

        return torchvision
    except (RuntimeError, OSError) as e:
        log(f"torchvision import failed ({e}); retrying without its operator registrations")
    import types

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    sys.modules["torchvision._meta_registrations"] = types.ModuleType(
        "torchvision._meta_registrations")
    import torchvision

    return torchvision


def build_model(name: str) -> Any:
    """The model on the meta device (no weights are materialized)."""
    import torch

    from bench.nets import UNet

    with torch.device("meta"):
        if name == "unet":
            return UNet().eval()
        return getattr(_import_torchvision().models, name)(weights=None).eval()


def geometry_key(g: dict[str, Any]) -> tuple[Any, ...]:
    return (g["c"], g["k"], g["h"], g["w"], g["r"], g["s"], tuple(g["stride"]),
            tuple(g["pad"]), tuple(g["dilation"]))


def conv_shapes(net: Any, hw: int, cin: int = 3) -> dict[str, Any]:
    """Every Conv2d call of one forward of `net` on a (1, cin, hw, hw) meta input: the
    distinct groups=1 geometries (batch-free) in order of first call, each with its count
    and layer names; convs that are not groups=1 Conv2d are counted under "excluded"."""
    import torch
    from torch import nn

    names = {m: n for n, m in net.named_modules()}
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    excluded = {"grouped (groups > 1)": 0, "ConvTranspose2d": 0}

    def hook(m: nn.Module, inputs: tuple[Any, ...], _out: Any) -> None:
        if isinstance(m, nn.ConvTranspose2d):
            excluded["ConvTranspose2d"] += 1
            return
        if m.groups != 1:
            excluded["grouped (groups > 1)"] += 1
            return
        _, c, h, w = inputs[0].shape
        g = {"c": int(c), "k": int(m.out_channels), "h": int(h), "w": int(w),
             "r": int(m.kernel_size[0]), "s": int(m.kernel_size[1]),
             "stride": list(m.stride), "pad": list(m.padding), "dilation": list(m.dilation)}
        if isinstance(m.padding, str):  # 'same'/'valid' would need resolving; none here
            raise ValueError(f"{names[m]}: string padding {m.padding!r}")
        e = found.setdefault(geometry_key(g), {"shape": g, "count": 0, "layers": []})
        e["count"] += 1
        e["layers"].append(names[m])

    handles = [m.register_forward_hook(hook) for m in net.modules()
               if isinstance(m, nn.Conv2d | nn.ConvTranspose2d)]
    try:
        with torch.no_grad():
            net(torch.empty(1, cin, hw, hw, device="meta"))
    finally:
        for h in handles:
            h.remove()
    shapes = list(found.values())
    return {"input": [cin, hw, hw], "convs": sum(e["count"] for e in shapes),
            "distinct": len(shapes), "excluded": {k: v for k, v in excluded.items() if v},
            "shapes": shapes}


def cmd_shapes(a: argparse.Namespace) -> int:
    import torch

    tv = _import_torchvision()
    doc: dict[str, Any] = {
        "torchvision": tv.__version__, "torch": torch.__version__,
        "date": dt.date.today().isoformat(),
        "note": "groups=1 nn.Conv2d calls of one forward (batch 1 on the meta device); "
                "geometry without batch: c, k, h, w (input), r, s, stride, pad, dilation. "
                "Grouped/depthwise convs and transposed convs are counted under 'excluded' "
                "and not benchmarked. unet: bench.nets.UNet (3 input channels, 2 classes).",
        "models": {}}
    for name in a.models.split(","):
        hw = INPUT_HW.get(name, 224)
        m = conv_shapes(build_model(name), hw)
        m["source"] = "bench.nets.UNet" if name == "unet" else f"torchvision {tv.__version__}"
        doc["models"][name] = m
        log(f"{name}: {m['convs']} convs, {m['distinct']} distinct, excluded {m['excluded']}")
    distinct = {geometry_key(e["shape"]) for m in doc["models"].values() for e in m["shapes"]}
    log(f"{len(distinct)} distinct shapes over the zoo")
    Path(a.out).write_text(dump_shapes(doc))
    return 0


def dump_shapes(doc: dict[str, Any]) -> str:
    """The shapes file as JSON with one line per shape (a diff shows which layers moved)."""
    def items(d: dict[str, Any], indent: str) -> list[str]:
        return [f"{indent}{json.dumps(k)}: {json.dumps(v)}," for k, v in d.items()]

    lines = ["{", *items({k: v for k, v in doc.items() if k != "models"}, " "), ' "models": {']
    models = list(doc["models"].items())
    for i, (name, m) in enumerate(models):
        lines += [f"  {json.dumps(name)}: {{",
                  *items({k: v for k, v in m.items() if k != "shapes"}, "   "), '   "shapes": [']
        lines += [f"    {json.dumps(e)}{',' if j < len(m['shapes']) - 1 else ''}"
                  for j, e in enumerate(m["shapes"])]
        lines += ["   ]", "  }" + ("," if i < len(models) - 1 else "")]
    return "\n".join([*lines, " }", "}"]) + "\n"


def load_shapes(path: str | Path = SHAPES_FILE) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


# ---- the plan: distinct (shape, batch, precision) measurements and who uses them -----------
@dataclass(frozen=True)
class Use:
    """One model's layers of a measured shape."""

    model: str
    layers: tuple[str, ...]
    count: int


@dataclass
class Group:
    """One measurement: a distinct (shape at batch n, precision), reported for each use."""

    shape: ConvShape
    precision: str
    uses: list[Use] = field(default_factory=list)

    @property
    def key(self) -> str:
        return measure_key(self.shape, self.precision)


def measure_key(shape: ConvShape, precision: str) -> str:
    return f"{shape.key()}|{precision}"


def zoo_bests(path: Path = ZOO_FILE) -> dict[str, float]:
    """measure_key -> the best latency (us) a zoo run recorded; empty without the file."""
    if not path.exists():
        return {}
    return {measure_key(ConvShape.from_dict(r["shape"]), r["precision"]): float(r["ours_us"])
            for r in json.loads(path.read_text())["rows"] if r.get("ours_us")}


def with_batch(g: dict[str, Any], n: int) -> ConvShape:
    return ConvShape.from_dict({**g, "n": n})


def batches_for(model: str, batches: Sequence[int] | None) -> tuple[int, ...]:
    """--batches for every model, or the default: 8, and ResNet-50 at 1 and 32 too."""
    if batches:
        return tuple(batches)
    return (DEFAULT_BATCH, *EXTRA_BATCHES.get(model, ()))


def add_layer_args(p: argparse.ArgumentParser, models: str = ",".join(MODELS),
                   batches: str = "", precisions: str = ",".join(PRECISIONS)) -> None:
    """The options that pick a benchmark's layers: the shapes file, models, batches and
    precisions (`planned` turns them into groups)."""
    p.add_argument("--shapes", default=str(SHAPES_FILE))
    p.add_argument("--models", default=models)
    p.add_argument("--batches", default=batches,
                   help="comma-separated; empty: 8, and ResNet-50 also at 1 and 32")
    p.add_argument("--precisions", default=precisions)


def planned(a: argparse.Namespace, shapes_doc: dict[str, Any] | None = None) -> list[Group]:
    """The groups that `add_layer_args`'s options pick (from `shapes_doc` if the caller has
    read --shapes already)."""
    return plan(shapes_doc or load_shapes(a.shapes), _csv(a.models),
                [int(b) for b in _csv(a.batches)] or None, _csv(a.precisions))


def plan(shapes_doc: dict[str, Any], models: Sequence[str], batches: Sequence[int] | None,
         precisions: Sequence[str]) -> list[Group]:
    """The measurements, batch 8 first (every model's layers), then the other batches; within
    a batch model by model in forward order. A shape that several models (or one model's
    several layers, which conv_shapes merged) have is one group with several uses."""
    groups: dict[str, Group] = {}
    order: list[tuple[int, int, int, int, str]] = []
    for mi, model in enumerate(models):
        if model not in shapes_doc["models"]:
            raise SystemExit(f"{model} is not in the shapes file (has: "
                             f"{', '.join(shapes_doc['models'])})")
        for n in batches_for(model, batches):
            for si, e in enumerate(shapes_doc["models"][model]["shapes"]):
                shape = with_batch(e["shape"], n)
                for pi, p in enumerate(precisions):
                    k = measure_key(shape, p)
                    if k not in groups:
                        groups[k] = Group(shape, p)
                        order.append((n != DEFAULT_BATCH, n, mi, si * len(precisions) + pi, k))
                    groups[k].uses.append(Use(model, tuple(e["layers"]), int(e["count"])))
    return [groups[o[-1]] for o in sorted(order)]


# ---- candidates: transfer, default, random, one-knob neighbours ----------------------------
# The sampled instruction paths (bench/layer_classes.py's PATHS) and their shares of the
# random part on sm_90 (elsewhere mma.sync only).
PATH_SHARE = {"wgmma": 0.5, "tma_store": 0.25, "sync": 0.25}
# FOLD_TAPS=1 needs these (kernels.space.validity): restricting the sample to them keeps
# rejection sampling cheap on the folded half.
FOLD_RESTRICT: dict[str, list[Any]] = {"FOLD_TAPS": [1], "DUP_AWARE": [0],
                                       "REORDER_INNER": [0], "LAYOUT": ["nhwc"], "TMA": [0]}


@dataclass(frozen=True)
class PoolEntry:
    """A schedule measured earlier in the run (for transfer)."""

    shape: ConvShape
    precision: str
    schedule: Schedule
    us: float


def shape_distance(a: ConvShape, b: ConvShape) -> float:
    """How far apart two layers are for transfer: the log2 distance of their implicit GEMMs
    (M, N, K), plus one for another filter size and one for another stride (they change what
    duplicate-aware loads, tap folding and the reduction order do)."""
    return gemm_distance(a, b) + float((a.r, a.s) != (b.r, b.s)) + float(a.stride != b.stride)


def transfer_order(pool: Iterable[PoolEntry], shape: ConvShape, precision: str,
                   per_shape: int = 3) -> list[Schedule]:
    """Schedules of the same precision to try first, best first: the best of each earlier
    shape, nearest shape first, then each one's second best, and so on (so that a few picks
    cover several neighbours rather than one neighbour's near-ties)."""
    by_shape: dict[str, list[PoolEntry]] = {}
    for e in pool:
        if e.precision == precision and e.shape != shape:
            by_shape.setdefault(e.shape.key(), []).append(e)
    ranked = sorted(by_shape.values(), key=lambda es: (shape_distance(shape, es[0].shape),
                                                       es[0].shape.key()))
    tops = [sorted(es, key=lambda e: e.us)[:per_shape] for es in ranked]
    return [es[i].schedule for i in range(per_shape) for es in tops if i < len(es)]


def sample_valid(space: ScheduleSpace, k: int, rng: np.random.Generator,
                 draws: int = 4096, tries: int = 8) -> list[Schedule]:
    """k distinct valid schedules drawn uniformly, by rejection: enumerating the valid set of
    a full space takes seconds (millions of schedules), hundreds of times per zoo run."""
    if k <= 0:
        return []
    got: dict[int, None] = {}
    for _ in range(tries):
        idx = rng.integers(0, space.size, size=min(draws, space.size))
        for i in idx[space.valid_mask(idx)]:
            got.setdefault(int(i))
            if len(got) == k:
                return space.schedules(got)
    if space.size <= 2**20:  # few valid ones: enumerate (cheap at this size)
        left = np.setdiff1d(space.valid_indices, np.fromiter(got, dtype=np.int64))
        more = rng.choice(left, size=min(k - len(got), len(left)), replace=False)
        got.update((int(i), None) for i in more)
    return space.schedules(got)


def random_candidates(space: ScheduleSpace, k: int, rng: np.random.Generator
                      ) -> list[Schedule]:
    """k random valid schedules over the instruction paths (PATH_SHARE on sm_90, mma.sync
    elsewhere); where the layer's taps fold, half of each path's share folded."""
    shape, prec, tgt = space.shape, space.precision, space.target
    paths = PATH_SHARE if tgt.sm == 90 else {"sync": 1.0}
    counts = {p: int(k * s) for p, s in paths.items()}
    counts["sync"] += k - sum(counts.values())
    out: list[Schedule] = []
    for path, count in counts.items():
        folds: list[dict[str, list[Any]]] = [{"FOLD_TAPS": [0]}]
        if fold_tap_bytes(shape, prec) and path != "tma_store":  # TMA does not fold
            folds.append(FOLD_RESTRICT)
        for j, fold in enumerate(folds):
            share = count // len(folds) + (j < count % len(folds))
            try:
                sub = ScheduleSpace(shape, prec, tgt, {**PATHS[path], **fold})
            except ValueError:  # a knob this precision does not have values for
                continue
            out += sample_valid(sub, share, rng)
    return out


def start_candidates(space: ScheduleSpace, transfer: Sequence[Schedule],
                     default: Schedule | None, rng: np.random.Generator, size: int,
                     transfer_max: int) -> list[tuple[str, Schedule]]:
    """(origin, schedule): up to `transfer_max` valid transferred schedules, the default,
    then random ones until `size` distinct valid schedules."""
    out: dict[str, tuple[str, Schedule]] = {}

    def add(origin: str, s: Schedule) -> None:
        s = with_defaults(space.precision, s)  # recorded schedules may predate later knobs
        if len(out) < size and space.is_valid(s):
            out.setdefault(schedule_hash(s), (origin, s))

    for s in transfer:
        if len(out) >= min(transfer_max, size):
            break
        add("transfer", s)
    if default is not None:
        add("default", default)
    for _ in range(3):  # random draws may repeat a transferred schedule: top up
        if len(out) >= size:
            break
        for s in random_candidates(space, size - len(out), rng):
            add("random", s)
    return list(out.values())


def local_candidates(space: ScheduleSpace, sched: Schedule, seen: set[str],
                     rng: np.random.Generator, k: int) -> list[Schedule]:
    """Up to k valid unmeasured schedules one knob away from `sched`, in random order (the
    budget rarely covers all of them)."""
    from bench.conv_vs_cudnn import neighbours

    cand = [s for s in neighbours(space, sched) if schedule_hash(s) not in seen]
    order = rng.permutation(len(cand))
    return [cand[int(i)] for i in order[:max(k, 0)]]


def summarize(rows: Sequence[dict[str, Any]], origin: dict[str, str],
              default: Schedule | None, keep: int = 3) -> dict[str, Any]:
    """A group's measured candidates -> the row fields: the fastest checked schedule, its
    time, where it came from, the default's time, the top `keep` (for transfer)."""
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["median_us"])
    by_hash = {schedule_hash(r["schedule"]): r for r in rows}
    d = by_hash.get(schedule_hash(default)) if default is not None else None
    b = ok[0] if ok else None
    return {
        "ours_us": b and round(b["median_us"], 4), "checked": b is not None,
        "schedule": b and b["schedule"],
        "best_from": b and origin.get(schedule_hash(b["schedule"]), "?"),
        "default_us": d["median_us"] if d and d["status"] == "ok" else None,
        "measured": len(rows), "wrong": sum(r["status"] == "wrong" for r in rows),
        "failed": sum(r["status"] not in ("ok", "wrong") for r in rows),
        "top": [{"schedule": r["schedule"], "us": round(r["median_us"], 4)}
                for r in ok[:keep]],
    }


# ---- running: the backend does the GPU work, run_zoo the bookkeeping -----------------------
class Backend(Protocol):
    gpu: str

    def tune(self, shape: ConvShape, precision: str, transfer: Sequence[Schedule],
             budget: int, transfer_max: int, seed: int) -> dict[str, Any]:
        """The search of one group -> summarize()'s fields."""

    def prefetch(self, shape: ConvShape, precision: str, transfer: Sequence[Schedule],
                 budget: int, transfer_max: int, seed: int) -> None:
        """The next group, with the arguments tune() will likely get: start its builds now
        (they overlap the current group's measurements)."""

    def cudnn_fp16_us(self, shape: ConvShape) -> float | None: ...

    def cutlass(self, shape: ConvShape, precision: str) -> tuple[float | None, str | None]:
        """(us, None), or (None, why it did not run)."""

    def info(self) -> dict[str, Any]: ...


def group_seed(seed: int, key: str) -> int:
    """The same group draws the same candidates in any run (resumed or not)."""
    return int(hashlib.sha256(f"{seed}|{key}".encode()).hexdigest()[:12], 16)


def pool_of(rows: Iterable[dict[str, Any]]) -> list[PoolEntry]:
    out: dict[tuple[str, str, str], PoolEntry] = {}
    for r in rows:
        shape = ConvShape.from_dict(r["shape"])
        for t in r.get("top") or []:
            k = (shape.key(), r["precision"], schedule_hash(t["schedule"]))
            out[k] = PoolEntry(shape, r["precision"], t["schedule"], t["us"])
    return list(out.values())


def network_rows(rows: Sequence[dict[str, Any]], shapes_doc: dict[str, Any]
                 ) -> list[dict[str, Any]]:
    """Per (model, n, precision): each time summed over the model's distinct shapes weighted
    by their counts; null where a layer lacks it (not measured yet, or nothing ran)."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["shape"]["n"], r["precision"]), []).append(r)
    out = []
    for (model, n, prec), rs in groups.items():
        m = shapes_doc["models"].get(model, {})
        total = len(m.get("shapes", [])) or len(rs)
        complete = len(rs) == total

        def weighted(k: str, rs: list[dict[str, Any]] = rs, complete: bool = complete
                     ) -> float | None:
            if not complete or any(r.get(k) is None for r in rs):
                return None
            return round(sum(r[k] * r["count"] for r in rs), 4)

        out.append({"model": model, "n": n, "precision": prec,
                    "ours_us": weighted("ours_us"), "cudnn_fp16_us": weighted("cudnn_fp16_us"),
                    "cutlass_us": weighted("cutlass_us"),
                    "convs": sum(r["count"] for r in rs), "layers": len(rs),
                    "layers_total": total, "complete": complete})
    return out


def atomic_write(path: Path, text: str) -> None:
    """A run killed at its time limit leaves the previous complete file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def estimate_s(groups: Sequence[Group], budget: int, baselines: int) -> float:
    return len(groups) * budget * SECONDS_PER_CANDIDATE + baselines * SECONDS_PER_BASELINE


def run_zoo(groups: Sequence[Group], doc: dict[str, Any], shapes_doc: dict[str, Any],
            backend: Backend, out: Path, budget: int, transfer_max: int | None = None,
            seed: int = 0, stop_after_s: float = 0.0, use_cutlass: bool = False,
            clock: Callable[[], float] = time.monotonic) -> int:
    """Measure every group `doc` lacks, add a row per use, rewrite `out` after each group.
    Returns how many groups are left (0: complete)."""
    tmax = budget // 4 if transfer_max is None else transfer_max
    rows: list[dict[str, Any]] = doc.setdefault("rows", [])
    have_rows = {(r["model"], measure_key(ConvShape.from_dict(r["shape"]), r["precision"]))
                 for r in rows}
    measured = {measure_key(ConvShape.from_dict(r["shape"]), r["precision"]): r for r in rows}
    cudnn = {ConvShape.from_dict(r["shape"]).key(): r["cudnn_fp16_us"] for r in rows
             if r.get("cudnn_fp16_us") is not None}
    pool = pool_of(rows)

    def add_rows(g: Group, m: dict[str, Any]) -> None:
        for u in g.uses:
            if (u.model, g.key) in have_rows:
                continue
            rows.append({"model": u.model, "layer": u.layers[0], "layers": list(u.layers),
                         "shape": g.shape.to_dict(), "n": g.shape.n, "precision": g.precision,
                         "count": u.count, **{k: m.get(k) for k in MEASURED}})
            have_rows.add((u.model, g.key))

    def save() -> None:
        doc["networks"] = network_rows(rows, shapes_doc)
        atomic_write(out, json.dumps(doc, indent=1) + "\n")

    # Rows of models added since a shape was measured: no GPU work. Measurements made
    # without --cutlass-lib get CUTLASS's time only (`late`).
    todo, late = [], []
    for g in groups:
        if g.key in measured:
            add_rows(g, measured[g.key])
            if use_cutlass and measured[g.key].get("cutlass_note") == NO_CUTLASS:
                late.append(g)
        else:
            todo.append(g)
    save()
    n_base = len({g.shape.key() for g in todo} - set(cudnn))
    est = estimate_s(todo, budget, n_base)
    log(f"{len(groups)} measurements planned, {len(groups) - len(todo)} in {out} already "
        f"({len(late)} of them without CUTLASS); {len(todo)} to do ({n_base} cuDNN "
        f"baselines), budget {budget} candidates: about {est:.0f} s of GPU time "
        f"(~{math.ceil(est / STOP_AFTER_HINT)} runs of --stop-after {STOP_AFTER_HINT} in "
        f"10-minute calls)")
    t0 = clock()
    for j, g in enumerate(late):
        if stop_after_s and clock() - t0 > stop_after_s:
            return len(todo) + len(late) - j
        us, note = backend.cutlass(g.shape, g.precision)
        measured[g.key].update(cutlass_us=us, cutlass_note=note)
        for r in rows:
            if measure_key(ConvShape.from_dict(r["shape"]), r["precision"]) == g.key:
                r.update(cutlass_us=us, cutlass_note=note)
        save()
        log(f"CUTLASS {g.shape.key()} {g.precision}: {us} us {note or ''}")
    for i, g in enumerate(todo):
        spent = clock() - t0
        if stop_after_s and spent > stop_after_s:
            log(f"stopping after {spent:.0f} s: {len(todo) - i} measurements left; run again "
                f"with the same --out to go on")
            return len(todo) - i
        prec, shape = g.precision, g.shape
        uses = ", ".join(f"{u.model} {u.layers[0]}" + (f" (x{u.count})" if u.count > 1 else "")
                         for u in g.uses)
        log(f"[{i + 1}/{len(todo)}] {shape.key()} {prec}: {uses}")
        probs = shape.problems(Precision(prec))
        if probs:
            m: dict[str, Any] = {"ours_us": None, "checked": False, "note": "; ".join(
                f"{k}: {v}" for k, v in probs)}
        else:
            if i + 1 < len(todo):  # the plan alternates precisions: its transfer is final
                nxt = todo[i + 1]
                backend.prefetch(nxt.shape, nxt.precision,
                                 transfer_order(pool, nxt.shape, nxt.precision), budget, tmax,
                                 group_seed(seed, nxt.key))
            transfer = transfer_order(pool, shape, prec)
            m = backend.tune(shape, prec, transfer, budget, tmax, group_seed(seed, g.key))
        if shape.key() not in cudnn:
            cudnn[shape.key()] = backend.cudnn_fp16_us(shape)
        m["cudnn_fp16_us"] = cudnn[shape.key()]
        if use_cutlass:
            m["cutlass_us"], m["cutlass_note"] = backend.cutlass(shape, prec)
        else:
            m["cutlass_us"], m["cutlass_note"] = None, NO_CUTLASS
        measured[g.key] = m
        pool += [PoolEntry(shape, prec, t["schedule"], t["us"]) for t in m.get("top") or []]
        add_rows(g, m)
        save()
        ours, base = m.get("ours_us"), m["cudnn_fp16_us"]
        ratio = f"{ours / base:.2f}x" if ours and base else "-"
        done_s = clock() - t0
        eta = done_s / (i + 1) * (len(todo) - i - 1)
        log(f"  ours {ours} us ({m.get('best_from')}), cuDNN fp16 {base} us: {ratio}; "
            f"cutlass {m['cutlass_us']}; {done_s:.0f} s so far, about {eta:.0f} s to go")
    log(f"complete: {len(rows)} rows in {out}")
    return 0


class GpuBackend:
    """The project's measure path: builds on this machine's cores (kernels.build), each
    candidate checked then timed in the runner's child (kernels.runner), cuDNN fp16 in this
    process with the same harness (kernels.cudnn), CUTLASS through bench.cutlass_conv."""

    def __init__(self, cache: str, cutlass_lib: str | None = None) -> None:
        # torch before the runner's child starts (bench/conv_vs_cudnn.py's cmd_table says why)
        import cupy
        import torch

        from kernels.runner import Runner

        self.torch = torch
        self.cache = cache
        self.runner = Runner(timeout_s=60)
        self.runner.ensure_started()
        self.gpu = self.runner.gpu_name or ""
        t = target_for_gpu_model(self.gpu)
        self.target: Target = t if t is not None else get_target("h100")
        self.sm = self.target.sm
        self.l2 = int(cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
        log(f"GPU {self.gpu} -> target {self.target.name}, L2 {self.l2 >> 20} MiB")
        # Builds of the next group's start set run here while this group is measured.
        self._pool = ProcessPoolExecutor(max_workers=os.cpu_count())
        self._prefetched: dict[str, list[Future[Any]]] = {}
        self.cutlass_lib: Any = None
        if cutlass_lib:
            from bench.cutlass_conv import CutlassLib  # only with --cutlass-lib

            self.cutlass_lib = CutlassLib(cutlass_lib)

    def info(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "target": self.target.name, "torch": self.torch.__version__,
                "cudnn": self.torch.backends.cudnn.version()}

    def _start(self, shape: ConvShape, precision: str, transfer: Sequence[Schedule],
               budget: int, transfer_max: int, seed: int
               ) -> tuple[ScheduleSpace, Schedule | None, list[tuple[str, Schedule]],
                          np.random.Generator]:
        """The group's start set; the same arguments give the same set (prefetch, tune)."""
        from kernels.runtime import default_schedule

        prec = Precision(precision)
        rng = np.random.default_rng(seed)
        space = ScheduleSpace(shape, prec, self.target)
        try:
            default: Schedule | None = default_schedule(shape, prec, self.target)[0]
        except ValueError as e:  # no valid schedule at all: the search will say so too
            log(f"  no default schedule: {e}")
            default = None
        start = start_candidates(space, transfer, default, rng, budget - budget // 2,
                                 transfer_max)
        return space, default, start, rng

    def prefetch(self, shape: ConvShape, precision: str, transfer: Sequence[Schedule],
                 budget: int, transfer_max: int, seed: int) -> None:
        from kernels.build import BuildJob, build

        _, _, start, _ = self._start(shape, precision, transfer, budget, transfer_max, seed)
        jobs = [BuildJob(shape, Precision(precision), self.sm, s) for _, s in start]
        self._prefetched[measure_key(shape, precision)] = [
            self._pool.submit(build, j, self.cache) for j in jobs]

    def tune(self, shape: ConvShape, precision: str, transfer: Sequence[Schedule],
             budget: int, transfer_max: int, seed: int) -> dict[str, Any]:
        from bench.conv_vs_cudnn import GroupSearch, best

        for f in self._prefetched.pop(measure_key(shape, precision), []):
            f.exception()  # wait; a failed build is built again below and reported there
        space, default, start, rng = self._start(shape, precision, transfer, budget,
                                                 transfer_max, seed)
        origin = {schedule_hash(s): o for o, s in start}
        g = GroupSearch(self.runner, self.cache, self.sm, space, "zoo", shape.n)
        g.run([s for _, s in start])
        b = best(list(g.seen.values()))
        if b is not None and budget > len(g.seen):
            local = local_candidates(space, b["schedule"], set(g.seen), rng,
                                     budget - len(g.seen))
            origin.update((schedule_hash(s), "local") for s in local)
            g.run(local)
        return summarize(list(g.seen.values()), origin, default)

    def cudnn_fp16_us(self, shape: ConvShape) -> float | None:
        from kernels.cudnn import cudnn_conv_times

        try:
            t = cudnn_conv_times(shape, self.l2, (("cudnn_fp16_us", "float16", False),))
            return round(t["cudnn_fp16_us"], 4)
        except RuntimeError as e:  # cuDNN has no algorithm / out of memory: say so, go on
            log(f"  cuDNN fp16 failed: {e}")
            return None
        finally:
            self.torch.cuda.empty_cache()

    def cutlass(self, shape: ConvShape, precision: str) -> tuple[float | None, str | None]:
        try:
            us, note = self.cutlass_lib.time_us(shape, Precision(precision), self.l2)
        except Exception as e:  # noqa: BLE001 - a CUTLASS failure is a note, not the end
            return None, f"{type(e).__name__}: {e}"[:300]
        return (None if us is None else round(float(us), 4)), note

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)
        self.runner.close()


def _csv(s: str) -> list[str]:
    return [x for x in s.split(",") if x]


def cmd_run(a: argparse.Namespace) -> int:
    shapes_doc = load_shapes(a.shapes)
    groups = planned(a, shapes_doc)
    out = Path(a.out)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    have = {measure_key(ConvShape.from_dict(r["shape"]), r["precision"]): r
            for r in doc.get("rows", [])}
    todo = sum(1 for g in groups if g.key not in have or (
        a.cutlass_lib and have[g.key].get("cutlass_note") == NO_CUTLASS))
    if not todo:  # only rows to copy: no GPU needed
        backend: Any = None
    else:
        try:
            backend = GpuBackend(a.cache, a.cutlass_lib)
        except ImportError as e:
            raise SystemExit(f"run measures on a GPU: it needs torch and CuPy ({e})") from e
        if doc.get("gpu") and doc["gpu"] != backend.gpu:
            backend.close()
            raise SystemExit(f"{out} holds timings of {doc['gpu']}, this is {backend.gpu}: "
                             f"use another --out")
    info = backend.info() if backend else {}
    doc = {"gpu": doc.get("gpu") or info.get("gpu"), "date": doc.get("date")
           or dt.date.today().isoformat(), **{k: v for k, v in doc.items()
                                              if k not in ("gpu", "date")}}
    doc.setdefault("target", info.get("target"))
    doc.setdefault("shapes_torchvision", shapes_doc.get("torchvision"))
    doc.setdefault("runs", []).append({"date": dt.date.today().isoformat(), **info,
                                       "budget": a.budget, "seed": a.seed,
                                       "cutlass_lib": a.cutlass_lib})
    doc.setdefault("rows", [])
    try:
        left = run_zoo(groups, doc, shapes_doc, backend, out, a.budget, a.transfer, a.seed,
                       a.stop_after, use_cutlass=bool(a.cutlass_lib))
    finally:
        if backend is not None:
            backend.close()
    if left:
        log(f"{left} measurements left for the next run")
    return 0


# ---- the table -----------------------------------------------------------------------------
def roofline_us(shape: ConvShape, precision: str, target: Target) -> float:
    """The layer's floor on `target`: max(bytes / DRAM bandwidth, 2 * MACs / Tensor Core
    peak). Bytes: the activations and weights read once and the output written once (and a
    residual read once) in the precision's width (int8: 1 byte each; fp16: 2), C not padded,
    plus the epilogue's fp32 vectors (int8: scale and bias; fp16: bias); peak: kernels.spec's
    dense Tensor Core figure for the precision. Neither bound counts the other, so no kernel
    can beat it."""
    p = Precision(precision)
    el = shape.tensor_elements()
    vec = 2 if p.is_integer else 1
    nbytes = ((el["input"] + el["weight"]) * p.input_bits
              + (el["output"] + el["residual"]) * p.output_bits) / 8 \
        + vec * 4 * shape.k
    mem_s = nbytes / (target.bandwidth_gbs * 1e9)
    math_s = shape.flops / (target.peak(p) * 1e12)
    return max(mem_s, math_s) * 1e6


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _fx(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def shape_text(s: dict[str, Any]) -> str:
    st, pad, dil = s["stride"], s["pad"], s["dilation"]
    out = f"{s['h']}x{s['w']}x{s['c']}->{s['k']}, {s['r']}x{s['s']}/{st[0]}"
    if st[0] != st[1]:
        out += f"x{st[1]}"
    if any(pad):
        out += f" p{pad[0]}" + (f"x{pad[1]}" if pad[0] != pad[1] else "")
    if dil != [1, 1]:
        out += f" d{dil[0]}x{dil[1]}"
    return out


def _verdict(ratios: list[float | None], prec: str, summed: float | None = None
             ) -> tuple[float | None, str]:
    """(geomean, text) of per-layer ours/cuDNN ratios against the precision's goals, with the
    summed goal where `summed` (ResNet-50's summed ratio) is given; a layer without a ratio
    (nothing ran) counts as over the layer goal."""
    goal = GOALS.get(prec)
    have = [r for r in ratios if r is not None]
    gm = geomean(have)
    if goal is None:
        return gm, ""
    over = sum(r is None or r > goal.layer for r in ratios)
    checks = [(f"layers <= {goal.layer:.2f}x: {len(ratios) - over}/{len(ratios)}", over == 0),
              (f"geomean <= {goal.geomean:.2f}x", gm is not None and gm <= goal.geomean)]
    if summed is not None:
        checks.append((f"summed <= {goal.resnet50_sum:.2f}x", summed <= goal.resnet50_sum))
    parts = [text if i == 0 else f"{text}: {'met' if ok else 'not met'}"
             for i, (text, ok) in enumerate(checks)]
    every = all(ok for _, ok in checks)
    return gm, "; ".join(parts) + f" ({'all met' if every else 'not all met'})"


def _row_order(r: dict[str, Any]) -> tuple[Any, ...]:
    """Batch 8 first, then the other batches; int8 before fp16 (PRECISIONS); a stable sort
    keeps the forward order of the layers within."""
    p = r["precision"]
    return (r["n"] != DEFAULT_BATCH, r["n"],
            PRECISIONS.index(p) if p in PRECISIONS else len(PRECISIONS), p)


def _pair(a: str, b: str) -> str:
    return a if a == b else f"{a} / {b}"


def layer_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, dict[str, Any]]]:
    """One model's rows joined per layer: [{precision: row}], batch 8 first, then the other
    batches, the layers in forward order within each batch."""
    out: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["n"] != DEFAULT_BATCH, r["n"])):
        key = (r["n"], r["layer"], ConvShape.from_dict(r["shape"]).key())
        out.setdefault(key, {})[r["precision"]] = r
    return list(out.values())


LAYER_HEADER = ("| layer | shape | n | count | int8 us | fp16 us | cuDNN fp16 us | "
                "CUTLASS int8 / fp16 us | int8/cuDNN | fp16/cuDNN | floor int8 / fp16 us |")


def layer_line(by_prec: dict[str, dict[str, Any]], target: Target) -> str:
    """One table row per layer with both precisions side by side ("-": not measured, or
    nothing ran); cuDNN fp16 is one figure unless the two precisions' runs timed it apart."""
    first = next(iter(by_prec.values()))
    shape = ConvShape.from_dict(first["shape"])
    layer = first["layer"] + (f" (+{len(first['layers']) - 1})"
                              if len(first["layers"]) > 1 else "")
    i8, f16 = by_prec.get("int8", {}), by_prec.get("fp16", {})
    cudnn = _pair(_f(i8.get("cudnn_fp16_us")), _f(f16.get("cudnn_fp16_us"))) \
        if i8 and f16 else _f(first.get("cudnn_fp16_us"))
    ratios = [_fx(_ratio(r.get("ours_us"), r.get("cudnn_fp16_us"))) for r in (i8, f16)]
    floors = " / ".join(f"{roofline_us(shape, p, target):.3g}" for p in PRECISIONS)
    return (f"| {layer} | {shape_text(first['shape'])} | {first['n']} | {first['count']} | "
            f"{_f(i8.get('ours_us'))} | {_f(f16.get('ours_us'))} | {cudnn} | "
            f"{_f(i8.get('cutlass_us'))} / {_f(f16.get('cutlass_us'))} | "
            f"{ratios[0]} | {ratios[1]} | {floors} |")


def _header(doc: dict[str, Any], target: Target) -> str:
    return (f"GPU: {doc.get('gpu')}, {doc.get('date')}. ours/cuDNN < 1: ours faster. "
            f"floor = max(bytes / DRAM bandwidth, 2 * MACs / Tensor Core peak), bytes = x and "
            f"w read once, y written once in the precision's width (+ the epilogue's fp32 "
            f"vectors), with {target.name}'s {target.bandwidth_gbs:g} GB/s and dense fp16 "
            f"{target.peak(Precision.FP16):g} / int8 {target.peak(Precision.INT8):g} TFLOP/s "
            f"(kernels/spec.py). Goals (ours / cuDNN fp16): "
            + "; ".join(f"{p}: every layer <= {g.layer}x, geomean <= {g.geomean}x, "
                        f"ResNet-50 summed <= {g.resnet50_sum}x" for p, g in GOALS.items()))


def _target(doc: dict[str, Any]) -> Target:
    return target_for_gpu_model(doc.get("gpu") or "") or get_target("h100")


def render_layers(doc: dict[str, Any]) -> list[str]:
    """Per model, one row per layer and batch with both precisions."""
    target = _target(doc)
    rows = doc.get("rows", [])
    lines: list[str] = []
    for model in dict.fromkeys(r["model"] for r in rows):
        lines += ["", f"### {model}", "", LAYER_HEADER, "|---" * 11 + "|"]
        lines += [layer_line(by_prec, target)
                  for by_prec in layer_rows([r for r in rows if r["model"] == model])]
    return lines


def render_summary(doc: dict[str, Any]) -> list[str]:
    """Each network's sums against the goals, then the zoo: each distinct (shape, batch) once
    per precision."""
    rows = doc.get("rows", [])
    lines = ["", "### Networks (convs summed, weighted by count)", "",
             "| model | n | precision | layers (convs) | ours us, summed | cuDNN fp16 us, summed "
             "| CUTLASS us, summed | ours/cuDNN summed | geomean of layers | goals |",
             "|---" * 10 + "|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        rs = [r for r in rows if r["model"] == model]
        for net in sorted((x for x in doc.get("networks", []) if x["model"] == model),
                          key=_row_order):
            ratios = [_ratio(r["ours_us"], r["cudnn_fp16_us"]) for r in rs
                      if r["n"] == net["n"] and r["precision"] == net["precision"]]
            total = _ratio(net["ours_us"], net["cudnn_fp16_us"])
            gm, verdict = _verdict(ratios, net["precision"],
                                   total if model == "resnet50" and total is not None else None)
            part = "" if net["complete"] else f" of {net['layers_total']}"
            lines.append(f"| {model} | {net['n']} | {net['precision']} | {net['layers']}{part} "
                         f"({net['convs']}) | {_f(net['ours_us'])} | {_f(net['cudnn_fp16_us'])} "
                         f"| {_f(net['cutlass_us'])} | {_f(total)}x | {_f(gm)}x | {verdict} |")
    lines += ["", "### The zoo (each distinct shape and batch once)", "",
              "| precision | measurements | geomean ours/cuDNN | worst | goals |",
              "|---|---|---|---|---|"]
    for prec in dict.fromkeys(r["precision"] for r in rows):
        uniq = {measure_key(ConvShape.from_dict(r["shape"]), prec): r for r in rows
                if r["precision"] == prec}
        ratios = [_ratio(r["ours_us"], r["cudnn_fp16_us"]) for r in uniq.values()]
        gm, verdict = _verdict(ratios, prec)
        worst = max((x for x in ratios if x is not None), default=None)
        lines.append(f"| {prec} | {len(uniq)} | {_f(gm)}x | {_f(worst)}x | {verdict} |")
    return lines


def render(doc: dict[str, Any]) -> str:
    """The whole table: the header, each model's layers, the networks' sums and the zoo."""
    return "\n".join([_header(doc, _target(doc)), *render_layers(doc), *render_summary(doc)])


ZOO_MD_TITLE = "# The zoo, layer by layer"


def render_zoo_md(doc: dict[str, Any], source: str) -> str:
    """bench/ZOO.md: the per-layer tables of every model with their sums, generated."""
    return "\n".join([
        ZOO_MD_TITLE, "",
        f"Generated from `{source}` by `python -m bench.zoo table {source} --out "
        f"bench/ZOO.md`. What it measures, the commands and the summary: bench/RESULTS.md, "
        f"\"A zoo of real layers\".",
        "", _header(doc, _target(doc)), *render_layers(doc), *render_summary(doc)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shapes", help="regenerate the shapes file from torchvision (CPU)")
    s.add_argument("--out", default=str(SHAPES_FILE))
    s.add_argument("--models", default=",".join(MODELS))
    r = sub.add_parser("run", help="measure on the GPU (resumable)")
    r.add_argument("--out", required=True)
    add_layer_args(r)
    r.add_argument("--budget", type=int, default=DEFAULT_BUDGET,
                   help="candidates per (shape, batch, precision)")
    r.add_argument("--transfer", type=int, default=None,
                   help="transferred schedules at most (default: a quarter of the budget)")
    r.add_argument("--stop-after", type=float, default=0.0,
                   help="start no measurement after this many seconds (0: no limit)")
    r.add_argument("--cutlass-lib", default=None)
    r.add_argument("--cache", default="/tmp/tctune-cache")
    r.add_argument("--seed", type=int, default=11)
    t = sub.add_parser("table", help="markdown: everything, or with --out the per-layer "
                       "document written to OUT and the summary printed")
    t.add_argument("file")
    t.add_argument("--out", default=None,
                   help="write the per-layer tables here (bench/ZOO.md) and print only the "
                        "networks' sums and the zoo's summary")
    a = ap.parse_args(argv)
    if a.cmd == "table":
        doc = json.loads(Path(a.file).read_text())
        if a.out is None:
            print(render(doc))
        else:
            atomic_write(Path(a.out), render_zoo_md(doc, a.file))
            print("\n".join([_header(doc, _target(doc)), *render_summary(doc)]))
        return 0
    return {"shapes": cmd_shapes, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
