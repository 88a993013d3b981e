"""Calibrate the simulated backend (workers/backends/simulated.py) on GPU-recorded data.

Kernel model: the ResNet-50 3x3 replay spaces recorded on H100 (wgmma, 32 spaces) and H200
(mma.sync, 8 spaces), bench/data/replay/resnet50_*.jsonl.gz, each an exhaustively measured
subspace. The split is fixed by layer and batch: every stage-3 space (a layer the fit never
sees) and every batch-16 space (a batch it never sees) is held out, 16 spaces; the fit uses
the other 24 (stages 2, 4 and 5 at batch 1, 8 and 32). The 18 fitted wgmma spaces fit every
constant but the mma.sync path's own (SYNC_FREE), the 6 fitted mma.sync spaces then those.

Baselines: cuDNN fp16 is fitted to the cuDNN fp16 times of bench/data/zoo_h100.json (every
groups=1 conv of six networks, H100); the layers of ResNet-50 (and any layer of another
network with the same shape and batch) are held out. cuDNN fp32 (TF32 off) is fitted to
bench/data/conv_vs_cudnn.json (H100) and conv_vs_cudnn_h200_sync.json (H200): stages 2, 4
and 5; stage 3 is held out.

Per held-out (and fitted) space it prints the Spearman correlation of modelled and recorded
latency, the median absolute relative error, and the recorded latency of the schedule the
model ranks first over the recorded best. The same figures for every layer of other timed
rounds (TIMED): the zoo's (six networks' layers on an H100, each with the 4-21 schedules near
its best that a round timed: how the model carries over from ResNet-50's 3x3 layers to the
stem, 1x1 and strided layers), the halo patch's (H200) and the service's searches of the
zoo's worst layers (H200, held out whole). The others each fit constants of knobs the
replay spaces lack (a persistent block's overlap; a halo stage's cost per filter tap) on the
layers of some networks, the rest held out.

    python -m bench.simulator_fit          # fit, write the constants and the report
    python -m bench.simulator_fit --check  # the committed constants, report only

Writes workers/backends/simulated_fit.json (the constants; not with --check) and
bench/data/simulator_fit.json (rows per space, timed_rows per timed layer, baseline_rows per
layer, speedup_rows: the simulated speedup over modelled cuDNN fp16 next to the recorded
one, and meta).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cli import read_json  # noqa: E402
from bench.zoo import MODELS as ZOO_MODELS  # noqa: E402
from bench.zoo import load_shapes  # noqa: E402
from kernels.space import ScheduleSpace  # noqa: E402
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target, task_key  # noqa: E402
from search.datasets import load_dataset  # noqa: E402
from workers.backends import simulated  # noqa: E402

REPLAY = ROOT / "bench" / "data" / "replay"
ZOO = ROOT / "bench" / "data" / "zoo_h100.json"


@dataclass(frozen=True)
class TimedSet:
    """Timed rounds of other layers (bench/data; every candidate checked on the GPU). Each
    fits only constants of knobs the replay spaces lack (`free`), on its layers of networks
    not in `held_out_models`; the rest, and the held-out replay stages' layers at any batch,
    are held out."""

    patterns: tuple[str, ...]
    free: tuple[str, ...]
    held_out_models: tuple[str, ...]
    gpu: str  # the GPU of rows that do not name theirs (bench.gpu.pipeline_probe's)


TIMED = {
    # The zoo's transfer, ping-pong and 4-warpgroup rounds (H100: 4-21 schedules near each
    # layer's best): how much of a block's fixed cost a persistent block's next tile hides,
    # and what a ping-pong consumer's turn costs per stage.
    "zoo_h100": TimedSet(("zoo_transfer_r*_h100.json.gz", "zoo_pingpong*_h100.json.gz",
                          "zoo_wg4_h100.json.gz"), ("persist_hidden", "pingpong_iter_cycles"),
                         ("mobilenet_v2", "efficientnet_b0"), "h100"),
    # The halo patch's A/B (H200: 26 random HALO=1 schedules per layer beside its record's
    # and their neighbours): what each filter tap of a halo stage costs.
    "halo_h200": TimedSet(("halo_random_ab_h200.json.gz", "halo_local_ab_h200.json.gz"),
                          ("halo_tap_cycles",), ("resnet50", "resnet18", "densenet121"), "h200"),
    # Duplicate-aware loads (H100, mma.sync: 60 random DUP_AWARE=1 schedules of each of
    # ResNet-50's 3x3 layers beside the best without): what a stage's index work costs.
    "dup_h100": TimedSet(("pipeline_probe_dup_h100.json",), ("dup_iter_cycles",), (), "h100"),
    # The service's 128-trial searches of the zoo's layers furthest over their goal (H200,
    # 58 (layer, precision) pairs, most of them 1x1): every one held out, a check of the
    # model on its own search's picks, not a fit.
    "zoo_search_h200": TimedSet(("layer_search_zoo_misses*_h200.json.gz",), (),
                                tuple(ZOO_MODELS), "h200"),
}
MIN_TIMINGS = 4  # a layer's timed set this small says little about ranking
CUDNN_FILES = (ROOT / "bench" / "data" / "conv_vs_cudnn.json",
               ROOT / "bench" / "data" / "conv_vs_cudnn_h200_sync.json")
OUT = ROOT / "bench" / "data" / "simulator_fit.json"
HELD_OUT_STAGES = ("stage3",)
HELD_OUT_BATCHES = (16,)
HELD_OUT_MODEL = "resnet50"  # baseline: its layers (and same-shape layers elsewhere)
# Fast schedules weigh more in the fit: the ranking that matters is at the top.
TOP_WITHIN = 1.3
TOP_WEIGHT = 30.0
# Kernel constants the fit moves (the rest of simulated_fit.json's "kernel" stays as is).
KERNEL_FREE = ("eff_wgmma", "wgmma_n0", "eff_sync", "sync_chains0", "load_bytes_per_clk",
               "tma_load_gain", "smem_bytes_per_clk", "iter_cycles_wgmma", "iter_cycles_sync",
               "iter_cycles_per_warp", "issue_cycles_per_vector", "load_latency_cycles",
               "overlap_p", "epilogue_cycles", "store_bytes_per_clk",
               "prologue_cycles", "dram_eff", "split_launch_us", "launch_us", "line_cycles",
               "tma_line_cycles", "tma_issue_cycles", "tma_prologue_cycles",
               "block_iter_cycles",
               "line_part_cost", "sync_lone_cpi", "epi_value_cycles", "order0_iter_cycles",
               "burst_bytes_per_clk")
# The mma.sync path's own constants: they do not enter a wgmma schedule's latency.
SYNC_FREE = ("eff_sync", "sync_chains0", "iter_cycles_sync", "smem_bytes_per_clk",
             "sync_lone_cpi")
CUDNN_FREE = ("tile", "channels_half", "compute_eff", "dram_eff", "overlap_p", "k_ns", "launch_us",
              "out_dram_share")
# Bounds of every fitted constant, to keep them physical (efficiencies at most 1).
BOUNDS = {"eff_wgmma": (0.05, 1.0), "eff_sync": (0.05, 1.0), "dram_eff": (0.05, 1.0),
          "out_dram_share": (0.01, 1.0),
          "persist_hidden": (1e-3, 1.0), "halo_tap_cycles": (1e-3, 1e4),
          "k_ns": (1e-4, 100.0), "tile": (8.0, 256.0),
          "channels_half": (0.01, 1e4),
          "compute_eff": (0.02, 1.0), "overlap_p": (1.0, 12.0), "tma_load_gain": (0.3, 3.0),
          "burst_bytes_per_clk": (1.0, 1e5)}
DEFAULT_BOUNDS = (1e-3, 1e5)


@dataclass
class Space:
    name: str
    held_out: bool
    real: np.ndarray  # recorded median_us of every schedule that ran ok
    inputs: dict[str, Any]  # simulated.model_inputs of the same schedules
    target: str  # the GPU that recorded it


def held_out_space(name: str) -> bool:
    stage = re.search(r"stage\d", name)
    batch = re.search(r"_n(\d+)_", name)
    return bool((stage and stage.group(0) in HELD_OUT_STAGES) or
                (batch and int(batch.group(1)) in HELD_OUT_BATCHES))


def load_spaces(paths: Sequence[Path]) -> list[Space]:
    out = []
    for path in paths:
        d = load_dataset(path)
        idx = d.space.valid_indices
        real = d.median_us[idx]
        ok = np.isfinite(real)
        idx, real = idx[ok], real[ok]
        inputs = simulated.model_inputs(d.space.shape, d.space.precision, d.space.target,
                                        d.space.columns(idx))
        out.append(Space(d.name, held_out_space(d.name), real, inputs, d.space.target.name))
    return out


def _layer(shape: ConvShape) -> tuple[Any, ...]:
    """A layer without its batch."""
    return (shape.h, shape.w, shape.c, shape.k, shape.r, shape.s, tuple(shape.stride),
            tuple(shape.pad), tuple(shape.dilation), shape.concat)


def held_out_layers(models: Sequence[str]) -> Callable[[ConvShape], bool]:
    """Which zoo layers a fit leaves out: those of `models` only, and every layer of a
    held-out replay stage (its timings would leak into its replay spaces)."""
    owners: dict[tuple[Any, ...], set[str]] = {}
    for model, entry in load_shapes()["models"].items():
        for s in entry["shapes"]:
            owners.setdefault(_layer(ConvShape.from_dict({**s["shape"], "n": 1})),
                              set()).add(model)
    held_replay = {_layer(RESNET50_3X3[st]) for st in HELD_OUT_STAGES}
    held_models = set(models)

    def held(shape: ConvShape) -> bool:
        layer = _layer(shape)
        of = owners.get(layer, set())
        return layer in held_replay or bool(of) and of <= held_models
    return held


def _timings(row: Mapping[str, Any], gpu: str
             ) -> list[tuple[str, ConvShape, dict[str, Any], float]]:
    """(task key, shape, schedule, us) of a row's successful timings: bench.zoo_transfer's
    rows (a layer's key and its `times`), bench.layer_search's (its `trials`, on `gpu`), or
    bench.gpu.pipeline_probe's (one timing, on `gpu`)."""
    shape = ConvShape.from_dict(row["shape"])
    if "trials" in row:
        key = task_key(shape, Precision(row["precision"]), get_target(gpu))
        return [(key, shape, t["schedule"], float(t["median_us"])) for t in row["trials"]
                if t["status"] == "ok" and t.get("median_us")]
    if "times" in row:
        return [(row["key"], shape, t["schedule"], float(t["us"])) for t in row["times"]
                if t["status"] == "ok" and t.get("us")]
    if row["status"] != "ok" or not row.get("median_us"):
        return []
    key = task_key(shape, Precision(row["precision"]), get_target(gpu))
    return [(key, shape, row["schedule"], float(row["median_us"]))]


def load_timed_spaces(patterns: Sequence[str], gpu: str,
                      held_out: Callable[[ConvShape], bool] | None = None) -> list[Space]:
    """One Space per (layer, batch, precision, GPU) of timed rounds (`_timings`): the
    schedules each timed (the last timing of a schedule timed twice), at least MIN_TIMINGS
    of them. Unlike a replay space, a sample of the layer's space. Held out: as `held_out`
    says (None: every one)."""
    times: dict[str, dict[str, float]] = {}
    shapes: dict[str, ConvShape] = {}
    paths = sorted(p for pattern in patterns for p in (ROOT / "bench" / "data").glob(pattern))
    for path in paths:
        for r in read_json(path)["rows"]:
            for key, shape, sched, us in _timings(r, gpu):
                shapes[key] = shape
                times.setdefault(key, {})[json.dumps(sched, sort_keys=True)] = us
    out = []
    for key in sorted(times):
        if len(times[key]) < MIN_TIMINGS:
            continue
        _, prec, target = key.split("|")
        shape, p, t = shapes[key], Precision(prec), get_target(target)
        space = ScheduleSpace(shape, p, t)
        idx = np.array([space.index_of(json.loads(s)) for s in times[key]])
        out.append(Space(key, held_out is None or held_out(shape),
                         np.array(list(times[key].values())),
                         simulated.model_inputs(shape, p, t, space.columns(idx)), t.name))
    return out


def layer_class(name: str) -> str:
    """A layer's class, from its key: "C<8" (the stems, squeeze layers), else 1x1, 3x3, ...
    with /2 where strided."""
    m = re.search(r"_c(\d+)_k\d+_r(\d+)_s(\d+)_st(\d+)x", name)
    assert m is not None, name
    c, r, s, st = (int(x) for x in m.groups())
    return "C<8" if c < 8 else f"{r}x{s}" + (f"/{st}" if st > 1 else "")


def space_metrics(real: np.ndarray, sim: np.ndarray) -> dict[str, float]:
    return {
        "spearman": round(float(spearmanr(sim, real).statistic), 4),
        "median_abs_err": round(float(np.median(np.abs(sim / real - 1.0))), 4),
        "pick_vs_best": round(float(real[int(np.argmin(sim))] / real.min()), 4),
    }


def _bounds(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    lo = np.log([BOUNDS.get(n, DEFAULT_BOUNDS)[0] for n in names])
    hi = np.log([BOUNDS.get(n, DEFAULT_BOUNDS)[1] for n in names])
    return lo, hi


def _fit_constants(spaces: Sequence[Space], start: Mapping[str, float],
                   names: Sequence[str]) -> dict[str, float]:
    """Weighted least squares of `names` on log latency, every space weighing the same."""
    names = list(names)
    weights = []
    for s in spaces:
        w = np.where(s.real <= TOP_WITHIN * s.real.min(), TOP_WEIGHT, 1.0)
        weights.append(np.sqrt(w / w.sum()))

    def consts(v: np.ndarray) -> dict[str, float]:
        return {**start, **dict(zip(names, np.exp(v).tolist(), strict=True))}

    def residuals(v: np.ndarray) -> np.ndarray:
        c = consts(v)
        return np.concatenate([
            w * (np.log(simulated.latency_from_inputs(s.inputs, c)) - np.log(s.real))
            for s, w in zip(spaces, weights, strict=True)])

    lo, hi = _bounds(names)
    v0 = np.clip(np.log([start[n] for n in names]), lo + 1e-9, hi - 1e-9)
    res = least_squares(residuals, v0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                        x_scale=1.0, max_nfev=3000)
    return {k: float(f"{x:.6g}") for k, x in consts(res.x).items()}


def fit_kernel(spaces: Sequence[Space], start: Mapping[str, float]) -> dict[str, float]:
    """The wgmma spaces (H100) fit every constant but the mma.sync path's own; the mma.sync
    spaces (H200) then fit those, the shared ones (load path, epilogue, rounds) held."""
    wgmma = [s for s in spaces if bool(np.all(s.inputs["wg"]))]
    sync = [s for s in spaces if not np.any(s.inputs["wg"])]
    c = _fit_constants(wgmma, start, [n for n in KERNEL_FREE if n not in SYNC_FREE])
    return _fit_constants(sync, c, [n for n in KERNEL_FREE if n in SYNC_FREE]) if sync else c


# Baselines ---------------------------------------------------------------------------------

@dataclass
class Layer:
    name: str
    held_out: bool
    shape: ConvShape
    target: str
    real_us: float


def zoo_layers() -> list[Layer]:
    """One cuDNN fp16 time per distinct (shape, batch) of the zoo (the int8 and fp16 rows of
    a layer time the same cuDNN conv: their mean)."""
    rows = json.loads(ZOO.read_text())["rows"]
    times: dict[str, list[float]] = {}
    shapes: dict[str, ConvShape] = {}
    models: dict[str, set[str]] = {}
    names: dict[str, str] = {}
    for r in rows:
        if r.get("cudnn_fp16_us") is None:
            continue
        shape = ConvShape.from_dict(r["shape"])
        key = shape.key()
        shapes[key] = shape
        times.setdefault(key, []).append(float(r["cudnn_fp16_us"]))
        models.setdefault(key, set()).add(r["model"])
        names.setdefault(key, f"{r['model']}:{r['layer']}:n{shape.n}")
    return [Layer(names[k], HELD_OUT_MODEL in models[k], shapes[k], "h100",
                  float(np.mean(times[k]))) for k in sorted(times)]


def fp32_layers() -> list[Layer]:
    from kernels.spec import RESNET50_3X3

    out = []
    for path in CUDNN_FILES:
        data = json.loads(path.read_text())
        seen = set()
        for r in data["rows"]:
            key = (r["layer"], r["n"])
            if key in seen or r.get("cudnn_fp32_us") is None:
                continue
            seen.add(key)
            base = RESNET50_3X3[r["layer"]]
            shape = ConvShape.from_dict({**base.to_dict(), "n": r["n"]})
            out.append(Layer(f"resnet50:{r['layer']}:n{r['n']}", r["layer"] in HELD_OUT_STAGES,
                             shape, data["target"], float(r["cudnn_fp32_us"])))
    return out


def _baseline_us(kind: str, layer: Layer, c: Mapping[str, float]) -> float:
    """The modelled baseline, unrounded (a fit's finite differences need the digits)."""
    target = get_target(layer.target)
    if kind == "cudnn_fp16":
        return simulated._cudnn_us(layer.shape, target.peak(Precision.FP16) * 1e12, 2.0,
                                   target, c)
    return simulated._cudnn_us(layer.shape, simulated.ffma_peak(target), 4.0, target, c)


def fit_baseline(kind: str, layers: Sequence[Layer], start: Mapping[str, float],
                 free: Sequence[str]) -> dict[str, float]:
    names = list(free)

    def consts(v: np.ndarray) -> dict[str, float]:
        return {**start, **dict(zip(names, np.exp(v).tolist(), strict=True))}

    def residuals(v: np.ndarray) -> np.ndarray:
        c = consts(v)
        return np.array([np.log(_baseline_us(kind, la, c) / la.real_us) for la in layers])

    lo, hi = _bounds(names)
    # A few starts of the serial term: fp16 and fp32 libraries differ in it by 100x, and
    # the fit is local.
    best = None
    for k_ns in (start["k_ns"], 0.1, 1.0, 10.0, 30.0):
        s0 = {**start, "k_ns": k_ns}
        v0 = np.clip(np.log([s0[n] for n in names]), lo + 1e-9, hi - 1e-9)
        res = least_squares(residuals, v0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1,
                            diff_step=1e-3)
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    res = best
    return {k: float(f"{x:.6g}") for k, x in consts(res.x).items()}


def baseline_rows(kind: str, layers: Sequence[Layer], c: Mapping[str, float]) -> list[dict]:
    out = []
    for la in layers:
        sim = _baseline_us(kind, la, c)
        out.append({"baseline": kind, "layer": la.name, "target": la.target,
                    "held_out": la.held_out, "recorded_us": la.real_us, "model_us": round(sim, 3),
                    "abs_err": round(abs(sim / la.real_us - 1.0), 4)})
    return out


def speedup_rows() -> list[dict[str, Any]]:
    """Simulated speedup over the modelled cuDNN fp16 (the best of the whole space, H100,
    ResNet-50 3x3 layers at batch 8) next to the recorded one (conv_vs_cudnn.json)."""
    from kernels.space import ScheduleSpace
    from kernels.spec import RESNET50_3X3
    from workers.backends.base import TaskSpec

    data = json.loads(CUDNN_FILES[0].read_text())
    target = get_target(data["target"])
    backend = simulated.SimulatedBackend(target)
    out = []
    for r in data["rows"]:
        if r["n"] != 8 or r["variant"] != "tuned" or r["precision"] not in ("int8", "fp16"):
            continue
        shape, prec = RESNET50_3X3[r["layer"]], Precision(r["precision"])
        space = ScheduleSpace(shape, prec, target)
        best = float(simulated.simulate_latency_us(shape, prec, target,
                                                   space.columns(space.valid_indices)).min())
        base = backend.baseline_us(TaskSpec(shape, prec, target))
        out.append({"layer": r["layer"], "n": 8, "precision": prec.value,
                    "target": target.name, "sim_best_us": round(best, 3),
                    "sim_baseline_us": base, "sim_speedup": round(base / best, 3),
                    "recorded_speedup": round(r["cudnn_fp16_us"] / r["tuned_us"], 3)})
    return out


def summarize(rows: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for held in (True, False):
        part = [r for r in rows if r["held_out"] is held]
        if not part:
            continue
        label = "held_out" if held else "fitted"
        out[label] = {"count": len(part)}
        for k in keys:
            vals = np.array([r[k] for r in part])
            worst = np.nanmin(vals) if k == "spearman" else np.nanmax(vals)
            out[label][k] = {"median": round(float(np.nanmedian(vals)), 4),
                             "worst": round(float(worst), 4)}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="evaluate the committed constants; fit nothing, write only --out")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)

    fit = {k: dict(v) for k, v in simulated.FIT.items()}
    spaces = load_spaces(sorted(REPLAY.glob("resnet50_*.jsonl.gz")))
    timed = {name: load_timed_spaces(t.patterns, t.gpu, held_out_layers(t.held_out_models))
             for name, t in TIMED.items()}
    zoo, fp32 = zoo_layers(), fp32_layers()
    if not args.check:
        fit["kernel"] = fit_kernel([s for s in spaces if not s.held_out], fit["kernel"])
        for name, t in TIMED.items():
            if t.free:
                fit["kernel"] = _fit_constants([s for s in timed[name] if not s.held_out],
                                               fit["kernel"], t.free)
        fit["cudnn_fp16"] = fit_baseline("cudnn_fp16", [la for la in zoo if not la.held_out],
                                         fit["cudnn_fp16"], CUDNN_FREE)
        # Few layers: the overlap exponent and DRAM shares stay where fp16 puts them.
        fit["cudnn_fp32"] = fit_baseline(
            "cudnn_fp32", [la for la in fp32 if not la.held_out],
            {**fit["cudnn_fp32"], **{k: fit["cudnn_fp16"][k]
                                     for k in ("overlap_p", "dram_eff", "out_dram_share")}},
            ("tile", "channels_half", "compute_eff", "k_ns", "launch_us"))
        # The GPUs whose measurements the constants were fitted to and checked against: on
        # any other target a simulated result is a prediction never checked (its note says so).
        checked = sorted({s.target for s in spaces} |
                         {s.target for sets in timed.values() for s in sets} |
                         {la.target for la in (*zoo, *fp32)})
        simulated.FIT_FILE.write_text(json.dumps({**fit, "checked_targets": checked},
                                                 indent=2) + "\n")
        simulated.FIT.update(fit)  # what follows (the speedups, the baselines) models with it

    rows = []
    print(f"{'space':44s} {'held':>5s} {'spearman':>8s} {'med|err|':>8s} {'pick/best':>9s}")
    for s in spaces:
        m = space_metrics(s.real, simulated.latency_from_inputs(s.inputs, fit["kernel"]))
        rows.append({"dataset": s.name, "held_out": s.held_out, **m})
        print(f"{s.name:44s} {'yes' if s.held_out else '':>5s} {m['spearman']:8.3f} "
              f"{m['median_abs_err']:8.3f} {m['pick_vs_best']:9.3f}")
    timed_rows = [
        {"set": name, "layer": s.name, "held_out": s.held_out, "class": layer_class(s.name),
         "timed": len(s.real),
         **space_metrics(s.real, simulated.latency_from_inputs(s.inputs, fit["kernel"]))}
        for name, sets in timed.items() for s in sets]
    timed_summary = {
        name: {"all": summarize(part, ("spearman", "median_abs_err", "pick_vs_best")),
               **{cls: summarize([r for r in part if r["class"] == cls],
                                 ("median_abs_err", "pick_vs_best"))
                  for cls in sorted({r["class"] for r in part})}}
        for name in timed for part in [[r for r in timed_rows if r["set"] == name]]}
    print(json.dumps({name: v["all"] for name, v in timed_summary.items()}, indent=1))
    base = baseline_rows("cudnn_fp16", zoo, fit["cudnn_fp16"]) + \
        baseline_rows("cudnn_fp32", fp32, fit["cudnn_fp32"])
    summary = summarize(rows, ("spearman", "median_abs_err", "pick_vs_best"))
    base_summary = {kind: summarize([r for r in base if r["baseline"] == kind], ("abs_err",))
                    for kind in ("cudnn_fp16", "cudnn_fp32")}
    print(json.dumps({"kernel": summary, "baselines": base_summary}, indent=1))
    speedups = speedup_rows()
    for r in speedups:
        print(f"{r['layer']} {r['precision']}: simulated speedup {r['sim_speedup']:.2f}, "
              f"recorded {r['recorded_speedup']:.2f}")
    meta = {
        "date": dt.date.today().isoformat(),
        "command": "python -m bench.simulator_fit" + (" --check" if args.check else ""),
        "split": {
            "kernel": f"held out: every space of {', '.join(HELD_OUT_STAGES)} and every "
                      f"space at batch {', '.join(map(str, HELD_OUT_BATCHES))}; fitted: "
                      "the rest",
            **{name: f"{', '.join(t.patterns)} (bench/data): fit {', '.join(t.free)} only; "
                     "held out: " + (f"layers only of {', '.join(t.held_out_models)}, and "
                                     if t.held_out_models else "") +
                     f"{', '.join(HELD_OUT_STAGES)}'s layer at any batch"
               for name, t in TIMED.items()},
            "cudnn_fp16": f"bench/data/zoo_h100.json; held out: layers of "
                          f"{HELD_OUT_MODEL} (and the same shape in other networks)",
            "cudnn_fp32": "conv_vs_cudnn.json (h100), conv_vs_cudnn_h200_sync.json (h200); "
                          f"held out: {', '.join(HELD_OUT_STAGES)}",
        },
        "fit_weights": {"top_within": TOP_WITHIN, "top_weight": TOP_WEIGHT},
        "constants": fit,
        "summary": summary,
        "timed_summary": timed_summary,
        "baseline_summary": base_summary,
    }
    args.out.write_text(json.dumps({"meta": meta, "rows": rows, "timed_rows": timed_rows,
                                    "baseline_rows": base, "speedup_rows": speedups},
                                   indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
