"""The runtime's default schedules on sm_90: wgmma first (the recorded H100 wgmma bests) against
the mma.sync defaults, over every distinct conv shape of ResNet-50 at batch 8.

Per shape and precision (int8 requantized, fp16 with bias; the runtime's default epilogue):
  default       `default_schedule(...)`: the wgmma bests first on sm_90
  default_sync  `default_schedule(..., wgmma=False)`: the mma.sync defaults (the old rule)
  wgmma:<layer> each recorded wgmma best that fits the shape (to see which rule would be best)
Each op goes through `kernels.runtime.Conv2d` on torch tensors, is checked (int8 exactly equal
to the requantized integer reference, fp16 against a float64 reference) and timed with
`kernels.timing.time_launches` beside cuDNN fp16 (channels_last), all in one process.

    python -m bench.gpu.runtime_defaults prebuild --cache C     # CPU: NVRTC builds
    python -m bench.gpu.runtime_defaults run --cache C --out O  # GPU
    python -m bench.gpu.runtime_defaults table O                # markdown
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.resnet50_e2e import (
    BATCH,
    check_and_time,
    log,
    random_operands,
    resnet50_convs,
    unique_layers,
)
from kernels.build import BuildJob, Epilogue, build_many
from kernels.cudnn import time_cudnn_conv
from kernels.runtime import WGMMA_BESTS, _adapt, default_schedule, schedule_fits
from kernels.spec import ConvShape, Precision, get_target

PRECISIONS = (Precision.INT8, Precision.FP16)


def candidates(target_name: str) -> list[dict[str, Any]]:
    """Every (shape, precision, variant) to run, with its schedule."""
    t = get_target(target_name)
    out: list[dict[str, Any]] = []
    for u in unique_layers(resnet50_convs()):
        shape = ConvShape.from_dict(u["shape"])
        for p in PRECISIONS:
            epi = Epilogue("default").resolved(p)
            rows = [("default", *default_schedule(shape, p, t, epi)),
                    ("default_sync", *default_schedule(shape, p, t, epi, wgmma=False))]
            for name, _, sched in WGMMA_BESTS[p.value]:
                s = _adapt(sched, p, t)
                if schedule_fits(shape, p, t, s, epi) is None:
                    rows.append((f"wgmma:{name}", s, f"recorded wgmma best of {name}"))
            for variant, sched, src in rows:
                out.append({"key": u["key"], "kind": u["kind"], "count": u["count"],
                            "shape": u["shape"], "precision": p.value, "variant": variant,
                            "schedule": sched, "source": src})
    return out


def cmd_prebuild(a: argparse.Namespace) -> int:
    t = get_target(a.target)
    jobs = {}
    for c in candidates(a.target):
        p = Precision(c["precision"])
        job = BuildJob(ConvShape.from_dict(c["shape"]), p, t.sm, c["schedule"],
                       Epilogue("default").resolved(p))
        jobs[json.dumps([c["key"], c["precision"], c["schedule"]], sort_keys=True)] = job
    res = build_many(list(jobs.values()), a.cache, a.workers)
    bad = [r for r in res if r.status != "ok"]
    log(f"{len(res)} builds, {len(bad)} failed")
    for r in bad[:5]:
        log(r.status, r.log[-500:])
    return 1 if bad else 0


def run_shape(shape: ConvShape, cands: list[dict[str, Any]], target: str, cache: str,
              l2: int) -> tuple[list[dict[str, Any]], float]:
    """Check and time each candidate op of one shape; cuDNN fp16 on the same inputs."""
    from kernels.runtime import Conv2d, DefaultScheduleWarning

    sh = shape
    v = random_operands(sh, 0)
    rows = []
    for c in cands:
        p = c["precision"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DefaultScheduleWarning)
            op = Conv2d(sh, p, c["schedule"], target, cache_dir=cache)
        check, tm = check_and_time(op, p, v, l2)
        rows.append({**c, "check": check, "us": round(tm.median_us, 3),
                     "iqr_us": round(tm.iqr_us, 3)})
        log(c["key"], p, c["variant"], rows[-1]["us"], "ok" if check["ok"] else check)
    tm = time_cudnn_conv(sh, v.x16.permute(0, 3, 1, 2), v.w16.permute(0, 3, 1, 2), l2)[0]
    return rows, round(tm.median_us, 3)


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from kernels.spec import target_for_gpu_model

    gpu = torch.cuda.get_device_name(0)
    target = target_for_gpu_model(gpu).name
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    torch.backends.cudnn.benchmark = True
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in candidates(target):
        by_key[c["key"]].append(c)
    rows: list[dict[str, Any]] = []
    cudnn: dict[str, float] = {}
    for key, cands in by_key.items():
        r, cudnn[key] = run_shape(ConvShape.from_dict(cands[0]["shape"]), cands, target,
                                  a.cache, l2)
        rows += r
        # Written after every shape: a run cut short still leaves what it measured.
        Path(a.out).write_text(json.dumps({
            "gpu": gpu, "target": target, "date": dt.date.today().isoformat(),
            "batch": BATCH, "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "cudnn_fp16_us": cudnn, "rows": rows},
            indent=1))
    wrong = [r for r in rows if not r["check"]["ok"]]
    log(f"{len(rows)} ops, {len(wrong)} wrong")
    return 1 if wrong else 0


def summarize(d: dict[str, Any]) -> str:
    """Network sums (each shape weighted by its count) per variant and kind, and the
    geometric mean over shapes of each variant against the best candidate of that shape."""
    rows = [r for r in d["rows"] if r["check"]["ok"]]
    best: dict[tuple[str, str], float] = {}
    for r in rows:
        k = (r["key"], r["precision"])
        best[k] = min(best.get(k, math.inf), r["us"])
    lines = ["| precision | variant | network µs (53 convs) | cuDNN fp16 µs | / cuDNN fp16 | "
             "geomean vs best candidate per shape | shapes |", "|---|---|---|---|---|---|---|"]
    variants = sorted({r["variant"] for r in rows}, key=lambda v: (v != "default",
                                                                    v != "default_sync", v))
    for p in ("int8", "fp16"):
        for v in variants:
            sel = [r for r in rows if r["precision"] == p and r["variant"] == v]
            if not sel:
                continue
            tot = sum(r["us"] * r["count"] for r in sel)
            ref = sum(d["cudnn_fp16_us"][r["key"]] * r["count"] for r in sel)
            gm = math.exp(sum(math.log(r["us"] / best[(r["key"], p)]) for r in sel) / len(sel))
            lines.append(f"| {p} | {v} | {tot:.1f} | {ref:.1f} | {tot / ref:.2f} | {gm:.3f} | "
                         f"{len(sel)} |")
    lines += ["", "| layer kind | convs | int8 default µs | int8 mma.sync default µs | "
              "fp16 default µs | fp16 mma.sync default µs | cuDNN fp16 µs |",
              "|---|---|---|---|---|---|---|"]
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        if r["variant"] in ("default", "default_sync"):
            kinds[r["kind"]][f"{r['precision']} {r['variant']}"] += r["us"] * r["count"]
    for u in unique_layers(resnet50_convs()):
        kinds[u["kind"]]["convs"] += u["count"]
        kinds[u["kind"]]["cudnn"] += d["cudnn_fp16_us"][u["key"]] * u["count"]
    for kind, v in kinds.items():
        lines.append(f"| {kind} | {int(v['convs'])} | {v['int8 default']:.1f} | "
                     f"{v['int8 default_sync']:.1f} | {v['fp16 default']:.1f} | "
                     f"{v['fp16 default_sync']:.1f} | {v['cudnn']:.1f} |")
    return "\n".join(lines)


def cmd_table(a: argparse.Namespace) -> int:
    print(summarize(json.loads(Path(a.results).read_text())))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prebuild")
    p.add_argument("--cache", required=True)
    p.add_argument("--target", default="h100")
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(fn=cmd_prebuild)
    p = sub.add_parser("run")
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("table")
    p.add_argument("results")
    p.set_defaults(fn=cmd_table)
    a = ap.parse_args(argv)
    return int(a.fn(a))


if __name__ == "__main__":
    raise SystemExit(main())
