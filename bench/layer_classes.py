"""Tuned kernels against cuDNN fp16 on the layer classes of real networks, beyond ResNet-50's
3x3 layers: the 3-channel stem, 1x1 convolutions (stride 1 and 2), wide 3x3 layers, and the
residual epilogue of a bottleneck's last 1x1.

Runs on the GPU machine (builds there too, on all cores):
  python -m bench.layer_classes search --out-dir DIR [--precisions int8,fp16] [--layers ...]
      per (layer, precision): a random sample of each instruction path (mma.sync, and wgmma
      where the GPU has it, and wgmma with TMA loads and TMA stores, PACK_OUT=2; for
      few-channel layers half of each sample folded, FOLD_TAPS=1), then one-knob local search
      around the fastest, then the best schedule with every value of PACK_OUT and PERSIST
      (PAIRED), and the best TMA schedule with 16-byte and with TMA stores (PACK_OUT 1 / 2)
      -> DIR/layer_classes_<precisions>.json with every
      measurement, the best overall and per FOLD_TAPS value, the pairs, and cuDNN fp16
      (channels_last) timed in the same run with the same harness (kernels.timing).
  python -m bench.layer_classes residual --search DIR/layer_classes_*.json --out-dir DIR
      the `residual` layer's best schedule built with and without the residual epilogue,
      beside PyTorch's unfused `y.add_(identity).relu_()` on fp16 tensors of the output shape.
  python -m bench.layer_classes pairs --from DIR/layer_classes_*.json --knob TMA=1,2 --out FILE
      per (layer, precision) of earlier searches: their TOP fastest schedules where every
      value of the knob is valid, each measured with every value in one run (the A/B of a
      knob on good schedules), then ROUNDS of one-knob local search around the fastest
      schedule with each value (what the search would find with it); cuDNN fp16 beside.
      --define NAME=0,1 instead of --knob: the same schedules built with each value of an
      experiment's define (outside the space); --filter KNOB=V1,V2 keeps schedules with those
      values only.
  python -m bench.layer_classes table FILE...   # markdown
Every candidate is checked against the reference before it is timed (kernels.runner).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.cli import log
from bench.conv_vs_cudnn import GroupSearch, baselines, best, measure_jobs, neighbours
from kernels.build import BuildJob, Epilogue
from kernels.space import ScheduleSpace, fold_tap_bytes
from kernels.spec import ConvShape, Precision, get_target, target_for_gpu_model

BATCH = 8
# name -> (network's layer, shape at batch 8)
LAYERS: dict[str, tuple[str, ConvShape]] = {
    "stem": ("ResNet-50 conv1, 7x7/2, C=3",
             ConvShape(BATCH, 224, 224, 3, 64, 7, 7, stride=2, pad=3)),
    "1x1_expand": ("ResNet-50 stage2 1x1, 64->256",
                   ConvShape(BATCH, 56, 56, 64, 256, 1, 1)),
    "1x1_reduce": ("ResNet-50 stage4 1x1, 1024->256",
                   ConvShape(BATCH, 14, 14, 1024, 256, 1, 1)),
    "1x1_stride2": ("ResNet-50 stage3 projection 1x1/2, 256->512",
                    ConvShape(BATCH, 56, 56, 256, 512, 1, 1, stride=2)),
    "3x3_wide": ("VGG-16 conv3, 3x3, 256->256",
                 ConvShape(BATCH, 56, 56, 256, 256, 3, 3, pad=1)),
    "3x3_wide512": ("VGG-16 conv4, 3x3, 512->512",
                    ConvShape(BATCH, 28, 28, 512, 512, 3, 3, pad=1)),
    "residual": ("ResNet-50 stage4 last 1x1, 256->1024 (+ identity)",
                 ConvShape(BATCH, 14, 14, 256, 1024, 1, 1)),
}


# Knobs whose every value is measured on the best schedule: the epilogue staged through
# shared memory with 16-byte stores (PACK_OUT=1) against stores from registers, and the
# persistent grid (PERSIST) against one block per tile.
PAIRED: dict[str, tuple[int, ...]] = {"PACK_OUT": (0, 1, 2), "PERSIST": (0, 1, 2)}
# The stores of the best TMA schedule (PACK_OUT=2 needs TMA=1, which the best may lack).
TMA_STORES = (1, 2)

# The sampled paths: the space restricted to each (mma.sync, wgmma, wgmma with TMA stores).
PATHS: dict[str, dict[str, list[Any]]] = {
    "sync": {"MMA": ["sync"]}, "wgmma": {"MMA": ["wgmma"]},
    "tma_store": {"MMA": ["wgmma"], "TMA": [1, 2], "PACK_OUT": [2]}}


def _us_of(g: GroupSearch, sched: dict[str, Any]) -> float | None:
    from kernels.space import schedule_hash

    r = g.seen.get(schedule_hash(sched))
    return r["median_us"] if r and r["status"] == "ok" else None


def _runner() -> tuple[Any, str, int]:
    import torch  # noqa: F401 - before the runner's child starts (bench/conv_vs_cudnn.py)

    from kernels.runner import Runner

    runner = Runner(timeout_s=60)
    runner.ensure_started()
    target = target_for_gpu_model(runner.gpu_name or "")
    tname, sm = (target.name, target.sm) if target else ("h100", 90)
    log(f"GPU {runner.gpu_name} -> target {tname}")
    return runner, tname, sm


def _l2() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])


def start_sample(space: ScheduleSpace, rng: np.random.Generator, per_path: dict[str, int]
                 ) -> list[dict[str, Any]]:
    """A random sample of each path (PATHS); where taps fold, half of it folded."""
    shape, prec, tgt = space.shape, space.precision, space.target
    folds = [[0], [1]] if fold_tap_bytes(shape, prec) else [[0]]
    out: list[dict[str, Any]] = []
    for path, count in per_path.items():
        for fold in folds:
            sub = ScheduleSpace(shape, prec, tgt, {**PATHS[path], "FOLD_TAPS": fold})
            idx = sub.valid_indices
            k = count // len(folds)
            if len(idx) and k:
                out += sub.schedules(rng.choice(idx, size=min(k, len(idx)), replace=False))
    return out


def cmd_search(a: argparse.Namespace) -> int:
    runner, tname, sm = _runner()
    tgt = get_target(tname)
    rng = np.random.default_rng(a.seed)
    precs = [Precision(p) for p in a.precisions.split(",")]
    names = a.layers.split(",") if a.layers else list(LAYERS)
    outdir = Path(a.out_dir)
    outdir.mkdir(parents=True, exist_ok=True)
    out_path = outdir / f"layer_classes_{'_'.join(p.value for p in precs)}.json"
    doc: dict[str, Any] = {"gpu": runner.gpu_name, "target": tname,
                           "date": dt.date.today().isoformat(), "groups": []}
    l2 = _l2()
    base: dict[str, dict[str, float]] = {}
    per_path = {"sync": a.sample_sync}
    if tgt.sm >= 90:
        per_path["wgmma"] = a.sample_wgmma
        per_path["tma_store"] = a.sample_tma_store
    for name in names:
        what, shape = LAYERS[name]
        for prec in precs:
            space = ScheduleSpace(shape, prec, tgt)
            g = GroupSearch(runner, a.cache, sm, space, name, shape.n)
            g.run(start_sample(space, rng, per_path))
            for _ in range(a.rounds):
                g.run([nb for r in g.top(a.top) for nb in neighbours(space, r["schedule"])])
            # The best schedule with each value of the knobs the layer classes are about,
            # measured as a pair (the other knobs as they are).
            b = best(list(g.seen.values()))
            if b is not None:
                g.run([{**b["schedule"], k: v} for k, vals in PAIRED.items() for v in vals])
            bt = best([r for r in g.seen.values() if r["schedule"].get("TMA", 0) >= 1])
            if bt is not None:
                g.run([{**bt["schedule"], "PACK_OUT": v} for v in TMA_STORES])
            rows = list(g.seen.values())
            if name not in base:
                base[name] = baselines(shape, l2)
            b = best(rows)
            by_fold = {str(f): best([r for r in rows if r["schedule"].get("FOLD_TAPS", 0) == f])
                       for f in (0, 1)}
            paired = {k: {str(v): _us_of(g, {**b["schedule"], k: v}) for v in vals}
                      for k, vals in PAIRED.items()} if b else {}
            group = {"layer": name, "what": what, "shape": shape.to_dict(),
                     "precision": prec.value, "measured": len(rows),
                     "ok": sum(r["status"] == "ok" for r in rows),
                     "wrong": sum(r["status"] == "wrong" for r in rows),
                     "best_us": b and b["median_us"], "best_schedule": b and b["schedule"],
                     "best_by_fold_us": {k: v and v["median_us"] for k, v in by_fold.items()},
                     "paired_us": paired,
                     "tma_stores_us": {str(v): _us_of(g, {**bt["schedule"], "PACK_OUT": v})
                                       for v in TMA_STORES} if bt else {},
                     **base[name], "rows": rows}
            doc["groups"].append(group)
            log(f"{name} {prec.value}: best {group['best_us']} us vs cuDNN fp16 "
                f"{base[name]['cudnn_fp16_us']} us; by fold {group['best_by_fold_us']} "
                f"({len(rows)} measured, {group['wrong']} wrong)")
            out_path.write_text(json.dumps(doc))  # a run stopped at its limit keeps its work
    runner.close()
    return 0


def _knob_values(spec: str) -> tuple[str, list[Any]]:
    name, vals = spec.split("=")
    return name, [int(v) if v.lstrip("-").isdigit() else v for v in vals.split(",")]


def _with_define(name: str, value: Any) -> Any:
    """Builds of this process (and of its build pool's forked children) with -Dname=value
    added: an experiment's switch outside the schedule space, in the cache key too."""
    from kernels import build

    plain = build.nvrtc_options
    build.nvrtc_options = (lambda d, sm, ptx=False: plain(d, sm, ptx) + [f"-D{name}={value}"])
    return plain


def _define_pairs(a: argparse.Namespace, runner: Any, sm: int, space: ScheduleSpace,
                  layer: str, tops: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list]:
    """The top schedules built once per value of an experiment's define (--define)."""
    from kernels import build

    name, values = _knob_values(a.define)
    us: dict[str, list[float | None]] = {}
    rows: list[dict[str, Any]] = []
    for v in values:
        plain = _with_define(name, v)
        try:
            g = GroupSearch(runner, a.cache, sm, space, layer, space.shape.n)
            g.run(tops)
        finally:
            build.nvrtc_options = plain
        us[str(v)] = [_us_of(g, t) for t in tops]
        rows += [{**r, "define": {name: v}} for r in g.seen.values()]
    return [{str(v): us[str(v)][i] for v in values} for i in range(len(tops))], rows


def cmd_pairs(a: argparse.Namespace) -> int:
    runner, tname, sm = _runner()
    tgt = get_target(tname)
    knob, values = _knob_values(a.define or a.knob)
    only = dict(_knob_values(f) for f in a.filter)
    l2 = _l2()
    earlier = [g for f in getattr(a, "from") for g in json.loads(Path(f).read_text())["groups"]]
    doc: dict[str, Any] = {"gpu": runner.gpu_name, "target": tname, "knob": knob,
                           "define": bool(a.define), "filter": a.filter,
                           "values": values, "date": dt.date.today().isoformat(), "groups": []}
    for e in earlier:
        if a.layers and e["layer"] not in a.layers.split(","):
            continue
        shape, prec = ConvShape.from_dict(e["shape"]), Precision(e["precision"])
        space = ScheduleSpace(shape, prec, tgt)
        ok = sorted((r for r in e["rows"] if r["status"] == "ok"), key=lambda r: r["median_us"])
        tops: list[dict[str, Any]] = []
        for r in ok:
            if any(r["schedule"].get(k) not in vs for k, vs in only.items()):
                continue
            variants = [r["schedule"]] if a.define else \
                [{**r["schedule"], knob: v} for v in values]
            if all(space.is_valid(v) for v in variants) and r["schedule"] not in tops:
                tops.append(r["schedule"])
            if len(tops) == a.top:
                break
        if a.define:
            pairs, drows = _define_pairs(a, runner, sm, space, e["layer"], tops)
            doc["groups"].append({"layer": e["layer"], "shape": shape.to_dict(),
                                  "precision": prec.value, "tops": tops, "pairs_us": pairs,
                                  "best_us": {str(v): min((p[str(v)] for p in pairs
                                                           if p[str(v)]), default=None)
                                              for v in values},
                                  "measured": len(drows),
                                  "wrong": sum(r["status"] == "wrong" for r in drows),
                                  **baselines(shape, l2), "rows": drows})
            log(f"{e['layer']} {prec.value}: {a.define} pairs {pairs}")
            Path(a.out).write_text(json.dumps(doc))
            continue
        g = GroupSearch(runner, a.cache, sm, space, e["layer"], shape.n)
        g.run([{**t, knob: v} for t in tops for v in values])
        for _ in range(a.rounds):
            for v in values:
                b = best([r for r in g.seen.values() if r["schedule"].get(knob) == v])
                if b is not None:
                    g.run([nb for nb in neighbours(space, b["schedule"]) if nb.get(knob) == v])
        pairs = [{str(v): _us_of(g, {**t, knob: v}) for v in values} for t in tops]
        best_by = {str(v): best([r for r in g.seen.values() if r["schedule"].get(knob) == v])
                   for v in values}
        rows = list(g.seen.values())
        group = {"layer": e["layer"], "shape": shape.to_dict(), "precision": prec.value,
                 "tops": tops, "pairs_us": pairs,
                 "best_us": {k: b and b["median_us"] for k, b in best_by.items()},
                 "best_schedule": {k: b and b["schedule"] for k, b in best_by.items()},
                 "measured": len(rows), "wrong": sum(r["status"] == "wrong" for r in rows),
                 **baselines(shape, l2), "rows": rows}
        doc["groups"].append(group)
        log(f"{e['layer']} {prec.value}: best by {knob} {group['best_us']} vs cuDNN fp16 "
            f"{group['cudnn_fp16_us']}; pairs {pairs}")
        Path(a.out).write_text(json.dumps(doc))
    runner.close()
    return 0


def render_pairs(path: str) -> str:
    d = json.loads(Path(path).read_text())
    knob, vals = d["knob"], [str(v) for v in d["values"]]
    lines = [f"| layer | precision | cuDNN fp16 us | best us by {knob} = {' / '.join(vals)} | "
             f"pairs: median time ratio {knob}={vals[-1]} / {knob}={vals[0]} (range) | "
             "measured (wrong) |", "|---|---|---|---|---|---|"]
    for g in d["groups"]:
        ratios = [p[vals[-1]] / p[vals[0]] for p in g["pairs_us"] if p[vals[0]] and p[vals[-1]]]
        rcell = (f"{float(np.median(ratios)):.3f} ({min(ratios):.2f}-{max(ratios):.2f}, "
                 f"{len(ratios)} pairs)") if ratios else "-"
        lines.append(f"| {g['layer']} | {g['precision']} | {_fmt(g['cudnn_fp16_us'])} | "
                     f"{' / '.join(_fmt(g['best_us'][v]) for v in vals)} | {rcell} | "
                     f"{g['measured']} ({g['wrong']}) |")
    return "\n".join(lines)


def torch_add_relu_us(shape: ConvShape, l2_bytes: int) -> float:
    """PyTorch's unfused residual tail on fp16 tensors of the output's shape."""
    import torch

    from kernels.timing import sets_for_l2, time_launches

    y0 = torch.rand(shape.n, shape.k, shape.p, shape.q, device="cuda", dtype=torch.float16)
    y0 = y0.contiguous(memory_format=torch.channels_last)
    n_sets = sets_for_l2(3 * y0.numel() * 2, l2_bytes)
    ys = [y0.clone() for _ in range(n_sets)]
    rs = [y0.clone() for _ in range(n_sets)]
    return time_launches(lambda i: ys[i].add_(rs[i]).relu_(), n_sets, api="torch").median_us


def cmd_residual(a: argparse.Namespace) -> int:
    runner, tname, sm = _runner()
    l2 = _l2()
    found: dict[str, dict[str, Any]] = {}
    for f in a.search:
        for g in json.loads(Path(f).read_text())["groups"]:
            if g["layer"] == "residual" and g["best_schedule"]:
                found[g["precision"]] = g
    shape = LAYERS["residual"][1]
    add_relu = torch_add_relu_us(shape, l2)
    rows = []
    for prec, g in sorted(found.items()):
        p = Precision(prec)
        res: dict[str, Any] = {"precision": prec, "schedule": g["best_schedule"],
                               "cudnn_fp16_us": g["cudnn_fp16_us"],
                               "torch_add_relu_us": round(add_relu, 4)}
        for variant, epi in (("plain_relu_us", Epilogue(relu=True)),
                             ("fused_residual_us", Epilogue(relu=True, residual=True))):
            r = measure_jobs(runner, a.cache, [BuildJob(shape, p, sm, g["best_schedule"],
                                                        epilogue=epi)])[0]
            res[variant] = r["median_us"]
            res[variant.replace("_us", "_status")] = r["status"]
        rows.append(res)
        log(f"residual {prec}: {res}")
    runner.close()
    out = {"gpu": runner.gpu_name, "target": tname, "date": dt.date.today().isoformat(),
           "shape": shape.to_dict(), "rows": rows}
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    (Path(a.out_dir) / "layer_classes_residual.json").write_text(json.dumps(out, indent=1))
    return 0


def _fmt(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def render(paths: list[str]) -> str:
    lines = ["| layer | shape (batch 8) | precision | cuDNN fp16 us | tuned us | speedup | "
             "unfolded / folded us | PACK_OUT 0 / 1 / 2 us | PERSIST 0 / 1 / 2 us | "
             "best TMA: PACK_OUT 1 / 2 us | measured (wrong) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    resid = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        if "groups" not in d:
            resid.append(d)
            continue
        for g in d["groups"]:
            s = g["shape"]
            folds = g["best_by_fold_us"]
            fold_cell = (f"{_fmt(folds['0'])} / {_fmt(folds['1'])}"
                         if folds.get("1") is not None else "-")
            speed = (g["cudnn_fp16_us"] / g["best_us"]) if g["best_us"] else None
            pair = g.get("paired_us", {})
            pcells = [" / ".join(_fmt(v) for v in pair.get(k, {}).values()) or "-"
                      for k in PAIRED]
            lines.append(
                f"| {g['layer']} ({g['what']}) | {s['h']}x{s['w']}x{s['c']}->{s['k']}, "
                f"{s['r']}x{s['s']}/{s['stride'][0]} | {g['precision']} | "
                f"{_fmt(g['cudnn_fp16_us'])} | {_fmt(g['best_us'])} | "
                f"{_fmt(speed)}x | {fold_cell} | {pcells[0]} | {pcells[1]} | "
                f"{' / '.join(_fmt(v) for v in g.get('tma_stores_us', {}).values()) or '-'} | "
                f"{g['measured']} ({g['wrong']}) |")
    for d in resid:
        lines += ["", "| precision | conv+ReLU us | conv+residual+ReLU fused us | "
                  "PyTorch add_+relu_ us | fused vs unfused |", "|---|---|---|---|---|"]
        for r in d["rows"]:
            unfused = (r["plain_relu_us"] or math.nan) + r["torch_add_relu_us"]
            lines.append(f"| {r['precision']} | {_fmt(r['plain_relu_us'])} | "
                         f"{_fmt(r['fused_residual_us'])} | {_fmt(r['torch_add_relu_us'])} | "
                         f"{_fmt(unfused / (r['fused_residual_us'] or math.nan))}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search")
    s.add_argument("--out-dir", required=True)
    s.add_argument("--cache", default="/tmp/tctune-cache")
    s.add_argument("--layers", default="", help="comma-separated names (default: all)")
    s.add_argument("--precisions", default="int8,fp16")
    s.add_argument("--sample-sync", type=int, default=24)
    s.add_argument("--sample-wgmma", type=int, default=40)
    s.add_argument("--sample-tma-store", type=int, default=16,
                   help="random wgmma schedules with TMA loads and TMA stores (PACK_OUT=2)")
    s.add_argument("--rounds", type=int, default=1)
    s.add_argument("--top", type=int, default=2)
    s.add_argument("--seed", type=int, default=7)
    r = sub.add_parser("residual")
    r.add_argument("--search", nargs="+", required=True)
    r.add_argument("--out-dir", required=True)
    r.add_argument("--cache", default="/tmp/tctune-cache")
    q = sub.add_parser("pairs")
    q.add_argument("--from", nargs="+", required=True, help="earlier `search` outputs")
    q.add_argument("--knob", default="TMA=1,2", help="NAME=V1,V2,...")
    q.add_argument("--define", default="",
                   help="NAME=V1,V2: an experiment's define instead of a knob (no local search)")
    q.add_argument("--filter", action="append", default=[],
                   help="KNOB=V1,V2: only schedules with these values (repeatable)")
    q.add_argument("--top", type=int, default=6)
    q.add_argument("--rounds", type=int, default=1)
    q.add_argument("--layers", default="", help="comma-separated names (default: all)")
    q.add_argument("--out", required=True)
    q.add_argument("--cache", default="/tmp/tctune-cache")
    t = sub.add_parser("table")
    t.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "table":
        print("\n\n".join(render_pairs(f) if "knob" in json.loads(Path(f).read_text())
                           else render([f]) for f in a.files))
        return 0
    return {"search": cmd_search, "residual": cmd_residual, "pairs": cmd_pairs}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
