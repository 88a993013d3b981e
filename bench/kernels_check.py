"""Kernel correctness on the GPU: random (shape, schedule, epilogue) triples, zero wrong.

Two steps, so that the GPU machine spends no time compiling:
  python -m bench.kernels_check prebuild --cache .cache/kc --count 320   # CPU: NVRTC builds
  python -m bench.kernels_check run --cache .cache/kc --out bench/data/kernels_check.json
The run checks every candidate (poisoned output, exact integer compare, fp16 tolerance)
through kernels.runner.Runner: a fault or hang is recorded as runtime_error / timeout.
Layers with few channels draw folded schedules (FOLD_TAPS) half the time, an int8
requant or fp16 bias epilogue adds a residual a third of the time (`--residual-count N`: N
more that all do), and one random int8 or fp16 layer in eight is a 1x1 layer over two inputs
(ConvShape's `concat`).

`prebuild --ptx-targets t4,a100 --ptx-count 150` adds candidates of those targets built as
PTX (compute_75 / compute_80) that the driver compiles for the GPU at hand: their code paths
(register-staged loads, m8n8k16 / m16n8k32 mma.sync, int4 native) run there for correctness
only; `run --ptx-out bench/data/ptx_check.json` writes their rows apart. Their speed means
nothing and is not recorded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from kernels.build import BuildJob, Epilogue, build_many
from kernels.runtime import schedule_fits
from kernels.space import ScheduleSpace, fold_tap_bytes
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target

PRECISIONS = (Precision.FP16, Precision.INT8, Precision.INT4)


def fixed_shapes() -> list[ConvShape]:
    """Cases the brief names: strided, 1x1, 7x7 with 3 input channels, tails, ResNet; and
    layers over two inputs."""
    s5 = RESNET50_3X3["stage5"]
    s4 = RESNET50_3X3["stage4"]
    return [
        ConvShape(2, 32, 32, 3, 64, 7, 7, stride=2, pad=3),  # stem: 7x7, C=3 (padded)
        ConvShape(3, 21, 19, 5, 40, 3, 3, stride=2, pad=1),  # few channels, tails
        ConvShape(8, 14, 14, 64, 96, 1, 1),  # 1x1
        ConvShape(3, 9, 11, 40, 24, 1, 1),  # 1x1, padded channels, tails
        ConvShape(3, 9, 11, 32, 40, 1, 1, stride=2),  # strided 1x1, tails
        ConvShape(8, 7, 7, 512, 512, 3, 3, pad=1),  # ResNet stage 5
        ConvShape(8, s4.h, s4.w, s4.c, s4.k, 3, 3, pad=1),
        ConvShape(1, 28, 28, 128, 128, 3, 3, pad=1),
        ConvShape(8, 13, 13, 48, 72, 3, 3, stride=2, pad=1),  # strided 3x3, tails
        ConvShape(2, 17, 19, 24, 40, 3, 3, pad=2, dilation=2),  # dilated
        ConvShape(5, 10, 12, 36, 26, 5, 3, stride=(1, 2), pad=(2, 1)),  # rectangular
        ConvShape(16, 6, 6, 64, 64, 3, 3, pad=0),
        s5,
        # two inputs (int8, fp16): a strided projection beside x1, and tails at stride 1
        ConvShape(2, 14, 14, 64 + 32, 64, 1, 1, stride=2, concat=64),
        ConvShape(3, 9, 11, 128 + 40, 40, 1, 1, concat=128),
    ]


def random_shape(rng: np.random.Generator, precision: Precision) -> ConvShape:
    """A random layer; one in eight (int8, fp16) a 1x1 layer over two inputs (ConvShape's
    `concat`: x1's channels at the output's size, then x's at the layer's stride)."""
    if precision is not Precision.INT4 and rng.random() < 1 / 8:
        n = int(rng.choice([1, 2, 3, 8]))
        h, w = int(rng.integers(3, 30)), int(rng.integers(3, 30))
        c1 = int(rng.choice([32, 64, 128, 256]))  # whole stages of the common CHUNKs
        c2 = int(rng.choice([8, 16, 24, 40, 64, 128]))
        k = int(rng.choice([8, 16, 24, 40, 64, 128, 200]))
        shape = ConvShape(n, h, w, c1 + c2, k, 1, 1, stride=int(rng.choice([1, 2])), concat=c1)
        if not shape.problems(precision):
            return shape
    while True:
        r = int(rng.choice([1, 3, 3, 3, 5, 7]))
        s = r if rng.random() < 0.85 else int(rng.choice([1, 3, 5]))
        st = int(rng.choice([1, 1, 1, 2]))
        dil = int(rng.choice([1, 1, 1, 1, 2]))
        n = int(rng.choice([1, 2, 3, 8, 8, 16]))
        h, w = int(rng.integers(3, 36)), int(rng.integers(3, 36))
        c = int(rng.choice([3, 4, 5, 8, 16, 20, 32, 48, 64, 96, 128, 256]))
        k = int(rng.choice([8, 13, 16, 24, 40, 64, 72, 128, 200]))
        if precision is Precision.INT4:
            c, k = c + c % 2, k + k % 2
        pad = int(rng.integers(0, r // 2 + 1)) * dil
        shape = ConvShape(n, h, w, c, k, r, s, stride=st, pad=(pad, pad), dilation=dil)
        if not shape.problems(precision) and shape.gemm_m * shape.gemm_n * shape.gemm_k < 4e9:
            return shape


def random_valid(space: ScheduleSpace, rng: np.random.Generator, tries: int = 400
                 ) -> dict[str, Any] | None:
    """A uniformly drawn valid schedule: rejection sampling first, since enumerating the
    validity of a whole space costs about a second per shape."""
    for _ in range(tries):
        sched = space.schedule_at(int(rng.integers(space.size)))
        if space.is_valid(sched):
            return sched
    valid = space.valid_indices
    return space.schedule_at(int(rng.choice(valid))) if len(valid) else None


# `prebuild --tma-store-count`: the space of TMA stores (wgmma with TMA loads, PACK_OUT=2).
TMA_STORES: dict[str, list[Any]] = {"MMA": ["wgmma"], "TMA": [1, 2], "PACK_OUT": [2]}
# `prebuild --producer-warp-count`: TMA loads issued by a producer warp of their own (TMA=2).
PRODUCER_WARP: dict[str, list[Any]] = {"MMA": ["wgmma"], "TMA": [2]}


def plan(count: int, seed: int, target_name: str, mma: str | None = None, ptx: bool = False,
         restrict: dict[str, list[Any]] | None = None, residual_only: bool = False
         ) -> list[dict[str, Any]]:
    """`mma` restricts the MMA knob (e.g. "wgmma": only the warpgroup path, fp16 and int8),
    `restrict` any knobs; `ptx`: the candidates are built as PTX of the target's sm (see the
    module's doc); `residual_only`: every candidate an int8 requant or fp16 bias epilogue
    with a residual."""
    rng = np.random.default_rng(seed)
    restrict = {**(restrict or {}), **({"MMA": [mma]} if mma else {})}
    wgmma_only = restrict.get("MMA") == ["wgmma"]
    precisions = PRECISIONS if not (wgmma_only or residual_only) else \
        (Precision.FP16, Precision.INT8)
    target = get_target(target_name)
    items: list[dict[str, Any]] = []
    shapes = fixed_shapes()
    i = 0
    while len(items) < count:
        prec = precisions[i % len(precisions)]
        shape = shapes[(i // 3) % len(shapes)] if i < 3 * len(shapes) else random_shape(rng, prec)
        i += 1
        if shape.problems(prec):
            continue
        fold = {"FOLD_TAPS": [1]} if fold_tap_bytes(shape, prec) and rng.random() < 0.5 else {}
        sched = random_valid(ScheduleSpace(shape, prec, target, {**restrict, **fold}), rng)
        if sched is None:
            continue
        # TMA stores write the 8- and 16-bit outputs only (kernels.runtime.schedule_fits).
        modes = ["requant" if prec.is_integer else "bias"]
        if sched.get("PACK_OUT") != 2 and not residual_only:
            modes.append("acc")
        mode = str(rng.choice(modes))
        residual = mode in ("requant", "bias") and prec is not Precision.INT4 and \
            (residual_only or bool(rng.random() < 1 / 3))
        epi = Epilogue(mode, bool(rng.random() < 0.3), residual)
        # The space sizes shared memory for the tuned output; a residual or 32-bit output
        # stages more, which the runtime refuses where it does not fit: so does the plan.
        if schedule_fits(shape, prec, target, sched, epi) is not None:
            continue
        items.append({"shape": shape.to_dict(), "precision": prec.value, "schedule": sched,
                      "epilogue": epi.to_dict(), "sm": target.sm, "target": target.name,
                      "ptx": ptx})
    return items


def jobs_of(items: list[dict[str, Any]]) -> list[BuildJob]:
    return [BuildJob(ConvShape.from_dict(it["shape"]), Precision(it["precision"]), it["sm"],
                     it["schedule"], Epilogue(**it["epilogue"]), ptx=bool(it.get("ptx")))
            for it in items]


def cmd_prebuild(a: argparse.Namespace) -> int:
    items = plan(a.count, a.seed, a.target, a.mma)
    if a.tma_store_count:
        items += plan(a.tma_store_count, a.seed + 2, a.target, restrict=TMA_STORES)
    if a.producer_warp_count:
        items += plan(a.producer_warp_count, a.seed + 3, a.target, restrict=PRODUCER_WARP)
    sub: dict[str, list[Any]] = {}
    for spec in a.restrict:
        name, vals = spec.split("=")
        sub[name] = [int(v) if v.isdigit() else v for v in vals.split(",")]
    if a.restrict_count:
        items += plan(a.restrict_count, a.seed + 4, a.target, restrict=sub)
    if a.residual_count:
        items += plan(a.residual_count, a.seed + 5, a.target, restrict=sub, residual_only=True)
    for name in filter(None, (a.ptx_targets or "").split(",")):
        items += plan(a.ptx_count, a.seed + 1, name.strip(), ptx=True)
        if a.residual_count:
            items += plan(a.residual_count // 2, a.seed + 6, name.strip(), ptx=True,
                          restrict=sub, residual_only=True)
    res = build_many(jobs_of(items), a.cache, a.workers)
    for it, r in zip(items, res, strict=True):
        it["key"], it["build"] = r.key, r.status
        if r.status != "ok":
            it["log"] = r.log[-1500:]
    Path(a.cache).mkdir(parents=True, exist_ok=True)
    (Path(a.cache) / "kernels_check_manifest.json").write_text(json.dumps(items))
    bad = [it for it in items if it["build"] != "ok"]
    print(f"built {len(items)} candidates, {len(bad)} compile errors")
    for it in bad[:5]:
        print(it["shape"], it["precision"], it["schedule"], it["log"][-800:])
    return 1 if bad else 0


def cmd_run(a: argparse.Namespace) -> int:
    from kernels.runner import Runner

    items = json.loads((Path(a.cache) / "kernels_check_manifest.json").read_text())
    runner = Runner(timeout_s=a.timeout)
    rows = []
    for idx, it in enumerate(items):
        if it["build"] != "ok":
            res: dict[str, Any] = {"status": "compile_error", "error": it.get("log", "")}
        else:
            res = runner.measure(a.cache, it["key"], time_it=False)
        row = {k: it[k] for k in ("shape", "precision", "schedule", "epilogue")}
        row.update(target=it.get("target"), ptx=bool(it.get("ptx")), status=res["status"],
                   error=res.get("error"), check=(res.get("detail") or {}).get("check"))
        rows.append(row)
        if res["status"] != "ok":
            print(f"[{idx}] {res['status']}: {it['precision']} {it['shape']} {it['schedule']} "
                  f"{it['epilogue']} :: {str(res.get('error'))[:300]}", flush=True)
    counts = Counter(r["status"] for r in rows)
    by_prec = {p.value: dict(Counter(r["status"] for r in rows if r["precision"] == p.value))
               for p in PRECISIONS}
    out = {"gpu": runner.gpu_name, "date": dt.date.today().isoformat(), "count": len(rows),
           "statuses": dict(counts), "by_precision": by_prec,
           "rows": [r for r in rows if not r["ptx"]]}
    runner.close()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"GPU {out['gpu']}: {len(rows)} candidates: {dict(counts)}; by precision {by_prec}")
    ptx_rows = [r for r in rows if r["ptx"]]
    if ptx_rows and a.ptx_out:
        by_target = {t: dict(Counter(r["status"] for r in ptx_rows if r["target"] == t))
                     for t in sorted({r["target"] for r in ptx_rows})}
        Path(a.ptx_out).write_text(json.dumps({
            "gpu": out["gpu"], "date": out["date"], "by_target": by_target,
            "rows": [{"target": r["target"], "precision": r["precision"], "shape": r["shape"],
                      "schedule": r["schedule"], "epilogue": r["epilogue"],
                      "ok": r["status"] == "ok", "status": r["status"]} for r in ptx_rows]},
            indent=1))
        print(f"PTX targets, JIT-compiled on {out['gpu']}: {by_target}")
    return 0 if counts.get("ok", 0) == len(rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("prebuild")
    b.add_argument("--cache", required=True)
    b.add_argument("--count", type=int, default=320)
    b.add_argument("--seed", type=int, default=3)
    b.add_argument("--target", default="h100")
    b.add_argument("--workers", type=int, default=None)
    b.add_argument("--mma", choices=("sync", "wgmma"), default=None,
                   help="only schedules of this instruction path")
    b.add_argument("--tma-store-count", type=int, default=0,
                   help="more candidates drawn from the TMA-store schedules (PACK_OUT=2)")
    b.add_argument("--producer-warp-count", type=int, default=0,
                   help="more candidates drawn from the producer-warp schedules (TMA=2)")
    b.add_argument("--restrict", action="append", default=[],
                   help="KNOB=V1,V2 (repeatable): the subspace of the --restrict-count and "
                        "--residual-count draws")
    b.add_argument("--restrict-count", type=int, default=0)
    b.add_argument("--ptx-targets", default="",
                   help="comma-separated targets (t4,a100) whose code paths are built as PTX")
    b.add_argument("--ptx-count", type=int, default=150, help="candidates per PTX target")
    b.add_argument("--residual-count", type=int, default=0,
                   help="more candidates, each with the residual epilogue (half as many per "
                        "PTX target), in the --restrict subspace")
    r = sub.add_parser("run")
    r.add_argument("--cache", required=True)
    r.add_argument("--out", default="bench/data/kernels_check.json")
    r.add_argument("--timeout", type=float, default=60.0)
    r.add_argument("--ptx-out", default="bench/data/ptx_check.json")
    a = ap.parse_args(argv)
    return cmd_prebuild(a) if a.cmd == "prebuild" else cmd_run(a)


if __name__ == "__main__":
    sys.exit(main())
