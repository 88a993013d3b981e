"""Tuned kernels vs cuDNN on ResNet-50's 3x3 layers, the paper's ablation, replay datasets.

Runs on the GPU machine (builds there too, on all cores):
  python -m bench.conv_vs_cudnn search --out-dir DIR [--seeds probe.json ...]
      per (layer, batch, precision): a random sample of each instruction path (mma.sync,
      and wgmma where the GPU has it), seeded with the fastest schedules of earlier probes,
      then rounds of one-knob local search around the fastest; at batch 8 also the
      optimizations of the paper switched off one at a time on the best (the ablation)
      -> DIR/search.json (every measurement) and DIR/selections_search.json; then
  python -m bench.conv_vs_cudnn table --selections DIR/selections_search.json --out-dir DIR
      every selection re-timed beside the baselines in one run.
The earlier two-phase procedure (H200 tables, replay datasets):
  python -m bench.conv_vs_cudnn phase1 --out P1.json
      measured ceilings; a random sample of the full space per (layer, batch, precision)
  python -m bench.conv_vs_cudnn phase2 --phase1 P1.json --out-dir DIR
      batch 8, fp16 and int8: the other knobs fixed at the best of phase 1, the paper's six
      knobs measured exhaustively (-> DIR/replay/*.jsonl.gz); the ablation (six knobs only,
      + DUP_AWARE, + PACK_OUT, + LAYOUT, same six-knob sample each); then every best
      schedule re-timed beside cuDNN fp16 / fp32 (TF32 off) / tf32 (PyTorch, channels_last)
      and torch._int_mm on the pre-lowered im2col matrix, same run, same harness
      (kernels.timing.time_launches) -> DIR/conv_vs_cudnn.json
Every candidate is checked against the reference before it is timed (kernels.runner).

The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.cli import log, read_json
from kernels.build import BuildJob, build_many
from kernels.space import EXTRA_KNOBS, PAPER_KNOBS, ScheduleSpace, with_defaults
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target, target_for_gpu_model

BATCHES = (1, 8, 32)
EXTRA = list(EXTRA_KNOBS)
SIX = list(PAPER_KNOBS)


def layer_shape(layer: str, n: int) -> ConvShape:
    s = RESNET50_3X3[layer]
    return ConvShape(n, s.h, s.w, s.c, s.k, s.r, s.s, stride=s.stride, pad=s.pad)



# ---- measuring many candidates -----------------------------------------------------------
def measure_jobs(runner: Any, cache: str, jobs: list[BuildJob], samples: int | None = None
                 ) -> list[dict[str, Any]]:
    t0 = time.time()
    builds = build_many(jobs, cache, os.cpu_count())
    t1 = time.time()
    out = []
    for job, b in zip(jobs, builds, strict=True):
        row: dict[str, Any] = {"schedule": dict(job.schedule), "precision": job.precision.value,
                               "shape": job.shape.to_dict(), "int4_s8": job.int4_s8}
        if b.status != "ok":
            row.update(status="compile_error", median_us=None, iqr_us=None, error=b.log[-300:])
        else:
            r = runner.measure(cache, b.key, samples=samples)
            row.update(status=r["status"], median_us=r.get("median_us"), iqr_us=r.get("iqr_us"),
                       error=(r.get("error") or None) and str(r["error"])[-300:])
        out.append(row)
    log(f"  {len(jobs)} candidates: build {t1 - t0:.0f} s, measure {time.time() - t1:.0f} s, "
        f"ok {sum(r['status'] == 'ok' for r in out)}")
    return out


def best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    ok = [r for r in rows if r["status"] == "ok"]
    return min(ok, key=lambda r: r["median_us"]) if ok else None


# ---- baselines (PyTorch / cuDNN / cuBLAS), the same harness --------------------------------
def baselines(shape: ConvShape, l2_bytes: int) -> dict[str, float]:
    import torch

    from kernels.cudnn import cudnn_conv_times
    from kernels.reference import im2col
    from kernels.timing import sets_for_l2, time_launches

    dev = torch.device("cuda")
    variants = (("cudnn_fp16_us", "float16", False), ("cudnn_fp32_us", "float32", False),
                ("cudnn_tf32_us", "float32", True))
    out = {k: round(v, 4) for k, v in cudnn_conv_times(shape, l2_bytes, variants).items()}
    # torch._int_mm on the pre-lowered im2col matrix: an int8 GEMM lower bound that does
    # not pay for the lowering (A is built once, outside the timing).
    rng = np.random.default_rng(5)
    xi = rng.integers(-128, 128, size=(shape.n, shape.h, shape.w, shape.c), dtype=np.int8)
    a0 = torch.from_numpy(im2col(xi, shape)).to(dev).contiguous()
    b0 = torch.from_numpy(rng.integers(-128, 128, size=(shape.gemm_k, shape.k),
                                       dtype=np.int8)).to(dev)
    per = a0.numel() + b0.numel() + 4 * shape.gemm_m * shape.k
    n_sets = sets_for_l2(per, l2_bytes)
    al = [a0] + [a0.clone() for _ in range(n_sets - 1)]
    bl = [b0] + [b0.clone() for _ in range(n_sets - 1)]
    try:
        yl: list[Any] = [None] * n_sets  # outputs rotate as in kernels/cudnn.py

        def int_mm(i: int) -> None:
            yl[i] = torch._int_mm(al[i], bl[i])

        out["int_mm_us"] = round(time_launches(int_mm, n_sets, api="torch").median_us, 4)
    except RuntimeError as e:  # shape limits of _int_mm (M > 16, K, N multiples of 8)
        log(f"  _int_mm unavailable for {shape.key()}: {e}")
        out["int_mm_us"] = float("nan")
    return out


# ---- phase 1: ceilings and a sample of the whole space ------------------------------------
def sample_jobs(shape: ConvShape, prec: Precision, sm: int, target_name: str, count: int,
                rng: np.random.Generator, int4_s8: bool | None = None) -> list[BuildJob]:
    space = ScheduleSpace(shape, prec, get_target(target_name))
    valid = space.valid_indices
    pick = rng.choice(valid, size=min(count, len(valid)), replace=False)
    jobs = []
    for i in pick:
        s = space.schedule_at(int(i))
        if int4_s8 and s["STAGES"] > 2:
            s["STAGES"] = 2  # the register-staged s8 path is double-buffered at most
        jobs.append(BuildJob(shape, prec, sm, s, int4_s8=int4_s8))
    return jobs


def cmd_phase1(a: argparse.Namespace) -> int:
    from bench.gpu.peaks import measure_peaks
    from kernels.runner import Runner

    runner = Runner(timeout_s=60)
    runner.ensure_started()
    target = target_for_gpu_model(runner.gpu_name or "")
    tname, sm = (target.name, target.sm) if target else ("h100", 90)
    log(f"GPU {runner.gpu_name} -> target {tname}")
    peaks = measure_peaks()
    log("peaks", peaks)
    rng = np.random.default_rng(a.seed)
    groups: list[tuple[str, int, Precision, bool | None, list[BuildJob]]] = []
    for layer in RESNET50_3X3:
        for n in BATCHES:
            shape = layer_shape(layer, n)
            plan: list[tuple[Precision, int, bool | None]] = []
            if n == 8:
                plan += [(Precision.FP16, a.n8, None), (Precision.INT8, a.n8, None),
                         (Precision.INT4, a.int4 // 2, None), (Precision.INT4, a.int4 // 2, True)]
            else:
                plan += [(Precision.FP16, a.other, None), (Precision.INT8, a.other, None)]
            for prec, count, s8 in plan:
                groups.append((layer, n, prec, s8,
                               sample_jobs(shape, prec, sm, tname, count, rng, s8)))
    t0 = time.time()
    all_jobs = [j for g in groups for j in g[4]]
    build_many(all_jobs, a.cache, os.cpu_count())
    log(f"built {len(all_jobs)} in {time.time() - t0:.0f} s")
    rows = []
    for layer, n, prec, s8, jobs in groups:
        log(f"{layer} n={n} {prec.value} s8={s8}: {len(jobs)}")
        for r in measure_jobs(runner, a.cache, jobs):
            r.update(layer=layer, n=n)
            rows.append(r)
    runner.close()
    out = {"gpu": runner.gpu_name, "target": tname, "date": dt.date.today().isoformat(),
           "peaks": peaks, "rows": rows}
    Path(a.out).write_text(json.dumps(out))
    for layer in RESNET50_3X3:
        for n in BATCHES:
            for p in ("fp16", "int8", "int4"):
                b = best([r for r in rows if r["layer"] == layer and r["n"] == n
                          and r["precision"] == p])
                if b:
                    log(f"best {layer} n={n} {p}: {b['median_us']:.2f} us s8={b['int4_s8']} "
                        f"{b['schedule']}")
    return 0


# ---- search: sample + seeds + one-knob local search -----------------------------------------
def neighbours(space: ScheduleSpace, sched: dict[str, Any]) -> list[dict[str, Any]]:
    """Every valid schedule that differs from `sched` in one knob."""
    out = []
    for knob, values in space.knobs.items():
        for v in values:
            if v != sched[knob]:
                cand = {**sched, knob: v}
                if space.is_valid(cand):
                    out.append(cand)
    return out


def ablation_of(space: ScheduleSpace, sched: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The best schedule with each of the paper's section-3 optimizations switched off (and
    the blocked layout switched on), where the result is a valid schedule."""
    out = []
    for variant, change in (("-pack_out", {"PACK_OUT": 0}), ("-dup_aware", {"DUP_AWARE": 0}),
                            ("+dup_aware", {"DUP_AWARE": 1}), ("+layout", {"LAYOUT": "nhwcnc"}),
                            ("-layout", {"LAYOUT": "nhwc"})):
        cand = {**sched, **change}
        if cand != sched and space.is_valid(cand):
            out.append((variant, cand))
    return out


class GroupSearch:
    """The measurements of one (layer, batch, precision): each schedule measured once."""

    def __init__(self, runner: Any, cache: str, sm: int, space: ScheduleSpace, layer: str,
                 n: int) -> None:
        self.runner, self.cache, self.sm, self.space = runner, cache, sm, space
        self.layer, self.n = layer, n
        self.seen: dict[str, dict[str, Any]] = {}

    def run(self, scheds: list[dict[str, Any]]) -> None:
        from kernels.space import schedule_hash

        todo = {schedule_hash(s): s for s in scheds if self.space.is_valid(s)}
        jobs = [BuildJob(self.space.shape, self.space.precision, self.sm, s)
                for h, s in todo.items() if h not in self.seen]
        for r in measure_jobs(self.runner, self.cache, jobs):
            r.update(layer=self.layer, n=self.n)
            self.seen[schedule_hash(r["schedule"])] = r

    def top(self, k: int) -> list[dict[str, Any]]:
        return sorted((r for r in self.seen.values() if r["status"] == "ok"),
                      key=lambda r: r["median_us"])[:k]


def cmd_search(a: argparse.Namespace) -> int:
    from kernels.runner import Runner

    runner = Runner(timeout_s=60)
    runner.ensure_started()
    target = target_for_gpu_model(runner.gpu_name or "")
    tname, sm = (target.name, target.sm) if target else ("h100", 90)
    tgt = get_target(tname)
    log(f"GPU {runner.gpu_name} -> target {tname}")
    seeds: list[dict[str, Any]] = []
    for f in a.seeds:
        seeds += [r for r in read_json(f)["rows"] if r["status"] == "ok"]
    rng = np.random.default_rng(a.seed)
    rows: list[dict[str, Any]] = []
    final: list[dict[str, Any]] = []
    batches = [int(b) for b in a.batches.split(",")]
    precs = [Precision(x) for x in a.precisions.split(",")]
    groups = [(layer, n, prec) for layer in RESNET50_3X3 for n in batches for prec in precs
              if prec is not Precision.INT4]
    if Precision.INT4 in precs:  # int4 at batch 8 only
        groups += [(layer, 8, Precision.INT4) for layer in RESNET50_3X3]
    outdir = Path(a.out_dir)
    outdir.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every group: a run stopped at its time limit keeps its work
        (outdir / "search.json").write_text(json.dumps(
            {"gpu": runner.gpu_name, "target": tname, "date": dt.date.today().isoformat(),
             "rows": rows}))
        (outdir / "selections_search.json").write_text(json.dumps(final))

    for layer, n, prec in groups:
        shape = layer_shape(layer, n)
        g = GroupSearch(runner, a.cache, sm, ScheduleSpace(shape, prec, tgt), layer, n)
        batch8 = n == 8 and prec is not Precision.INT4
        start: list[dict[str, Any]] = []
        if batch8:  # the fastest distinct schedules of the earlier probes of this layer
            ok = sorted((r for r in seeds if r["layer"] == layer and r["precision"] == prec.value),
                        key=lambda r: r["median_us"])
            for r in ok:
                if len(start) >= a.seeds_per_group:
                    break
                sched = with_defaults(prec, r["schedule"])
                if sched not in start:
                    start.append(sched)
        for mma, count in (("sync", a.sample_sync), ("wgmma", a.sample_wgmma)):
            sub = ScheduleSpace(shape, prec, tgt, {"MMA": [mma]})
            idx = sub.valid_indices
            if len(idx):
                k = count if batch8 or prec is Precision.INT4 else count // 2
                start += sub.schedules(rng.choice(idx, size=min(k, len(idx)), replace=False))
        g.run(start)
        for _ in range(a.rounds if batch8 else 1):  # one-knob local search around the fastest
            g.run([nb for r in g.top(a.top) for nb in neighbours(g.space, r["schedule"])])
        rows += g.seen.values()
        b = best(list(g.seen.values()))
        if b is None:
            log(f"{layer} n={n} {prec.value}: nothing ran")
            continue
        log(f"best {layer} n={n} {prec.value}: {b['median_us']:.2f} us {b['schedule']} "
            f"({len(g.seen)} measured)")
        final.append({"layer": layer, "n": n, "precision": prec.value, "variant": "tuned",
                      "schedule": b["schedule"], "int4_s8": None})
        if batch8:
            for variant, sched in ablation_of(g.space, b["schedule"]):
                final.append({"layer": layer, "n": n, "precision": prec.value,
                              "variant": variant, "schedule": sched, "int4_s8": None})
        save()
    runner.close()
    return 0


# ---- phase 2 -----------------------------------------------------------------------------
def six_knob_space(shape: ConvShape, prec: Precision, target_name: str,
                   fixed: dict[str, Any], vary: dict[str, list[Any]] | None = None
                   ) -> ScheduleSpace:
    """The paper's six knobs (and the knobs in `vary`, over those values) with the other knobs
    held as in `fixed`."""
    restrict: dict[str, list[Any]] = {k: [v] for k, v in fixed.items()}
    return ScheduleSpace(shape, prec, get_target(target_name),
                         restrict={**restrict, **(vary or {})})


def parse_vary(specs: list[str]) -> dict[str, list[Any]]:
    """--vary NAME=v1,v2 (values as the knob spells them: integers or names)."""
    out: dict[str, list[Any]] = {}
    for spec in specs:
        name, _, vals = spec.partition("=")
        out[name] = [int(v) if v.lstrip("-").isdigit() else v for v in vals.split(",")]
    return out


def write_replay(path: Path, name: str, shape: ConvShape, prec: Precision, target: str,
                 gpu: str, fixed: dict[str, Any], space: ScheduleSpace,
                 measured: dict[str, dict[str, Any]]) -> None:
    from kernels.space import schedule_hash

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        meta = {"dataset": name, "shape": shape.to_dict(), "precision": prec.value,
                "target": target, "gpu": gpu, "simulated": False, "fixed": fixed,
                "date": dt.date.today().isoformat()}
        f.write(json.dumps({"meta": meta}) + "\n")
        for i in range(space.size):
            s = space.schedule_at(i)
            m = measured.get(schedule_hash(s))
            if m is None:
                line = {"schedule": s, "status": "compile_error", "median_us": None,
                        "iqr_us": None}
            else:
                line = {"schedule": s, "status": m["status"], "median_us": m["median_us"],
                        "iqr_us": m["iqr_us"]}
            f.write(json.dumps(line) + "\n")


def cmd_phase2(a: argparse.Namespace) -> int:
    from kernels.runner import Runner
    from kernels.space import schedule_hash

    fixed_batch = a.fixed_batch or a.batch
    if a.fixed_from:  # the extra knobs of a selections file's "tuned" schedules
        p1 = {"rows": [{**r, "status": "ok", "median_us": 0.0, "n": a.batch}
                       for r in json.loads(Path(a.fixed_from).read_text())
                       if r["variant"] == "tuned" and r["n"] == fixed_batch]}
    else:
        p1 = json.loads(Path(a.phase1).read_text())
    vary = parse_vary(a.vary)
    runner = Runner(timeout_s=60)
    runner.ensure_started()
    target = target_for_gpu_model(runner.gpu_name or "")
    tname, sm = (target.name, target.sm) if target else ("h100", 90)
    outdir = Path(a.out_dir)
    rng = np.random.default_rng(a.seed)
    final: list[dict[str, Any]] = []  # (layer, n, precision, variant, schedule, int4_s8)
    layers = a.layers.split(",") if a.layers else list(RESNET50_3X3)
    for layer in layers:
        shape = layer_shape(layer, a.batch)
        for prec in (Precision.FP16, Precision.INT8):
            rows = [r for r in p1["rows"] if r["layer"] == layer and r["n"] == a.batch
                    and r["precision"] == prec.value]
            b1 = best(rows)
            if b1 is None:
                log(f"{layer} {prec.value}: nothing ran in phase 1")
                continue
            sched = with_defaults(prec, b1["schedule"])
            fixed = {k: sched[k] for k in EXTRA if k not in vary}
            space = six_knob_space(shape, prec, tname, fixed, vary)
            valid = space.valid_indices
            log(f"{layer} {prec.value}: exhaustive six knobs, fixed {fixed}: {len(valid)} valid "
                f"of {space.size}")
            jobs = [BuildJob(shape, prec, sm, space.schedule_at(int(i))) for i in valid]
            res = measure_jobs(runner, a.cache, jobs, samples=a.samples)
            measured = {schedule_hash(r["schedule"]): r for r in res}
            name = f"resnet50_{layer}_n{a.batch}_{prec.value}_{tname}{a.suffix}"
            write_replay(outdir / "replay" / f"{name}.jsonl.gz", name, shape, prec, tname,
                         runner.gpu_name or "", fixed, space, measured)
            b2 = best(res)
            if b2:
                final.append({"layer": layer, "n": a.batch, "precision": prec.value,
                              "variant": "tuned", "schedule": b2["schedule"], "int4_s8": None})
            # Ablation: one six-knob sample, four settings of the paper's optimizations.
            if a.ablation == 0:
                continue
            base = {**fixed, "DUP_AWARE": 0, "PACK_OUT": 0, "LAYOUT": "nhwc"}
            steps = [("six_knobs", base), ("+dup_aware", {**base, "DUP_AWARE": 1}),
                     ("+pack_out", {**base, "DUP_AWARE": 1, "PACK_OUT": 1}),
                     ("+layout", {**base, "DUP_AWARE": 1, "PACK_OUT": 1, "LAYOUT": "nhwcnc"})]
            full = ScheduleSpace(shape, prec, get_target(tname))
            six_pick = rng.choice(six_knob_space(shape, prec, tname, base).size,
                                  size=a.ablation, replace=False)
            base_space = six_knob_space(shape, prec, tname, base)
            for variant, extras in steps:
                jobs = []
                for i in six_pick:
                    s = {**base_space.schedule_at(int(i)), **extras}
                    if full.is_valid(s):
                        jobs.append(BuildJob(shape, prec, sm, s))
                # the exhaustive best of this setting is a candidate too, where it applies
                if b2 and all(b2["schedule"][k] == v for k, v in extras.items()):
                    jobs.append(BuildJob(shape, prec, sm, b2["schedule"]))
                log(f"  ablation {variant}: {len(jobs)} schedules")
                bb = best(measure_jobs(runner, a.cache, jobs, samples=a.samples))
                if bb:
                    final.append({"layer": layer, "n": 8, "precision": prec.value,
                                  "variant": variant, "schedule": bb["schedule"],
                                  "int4_s8": None})
    runner.close()
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"selections_{'_'.join(layers)}.json").write_text(json.dumps(final))
    return 0


def cmd_table(a: argparse.Namespace) -> int:
    """Every selected best re-timed beside the baselines, in one run."""
    # torch first, before the runner's child process starts: imported later, on a fresh GPU
    # machine, torch's import failed three times in its own schema parser (docs/design.md,
    # "Measurement protocol").
    import torch  # noqa: F401

    from kernels.runner import Runner

    p1 = json.loads(Path(a.phase1).read_text()) if a.phase1 else {"rows": []}
    final: list[dict[str, Any]] = []
    for f in a.selections:
        final += json.loads(Path(f).read_text())
    have = {(f["layer"], f["n"], f["precision"]) for f in final}
    runner = Runner(timeout_s=60)
    runner.ensure_started()
    target = target_for_gpu_model(runner.gpu_name or "")
    tname, sm = (target.name, target.sm) if target else ("h100", 90)
    outdir = Path(a.out_dir)
    # Phase-1 bests for the other rows (int4 at batch 8, fp16/int8 at batch 1 and 32).
    for layer in RESNET50_3X3:
        for n in BATCHES:
            for prec in ("fp16", "int8", "int4"):
                if (n == 8 and prec != "int4") or (layer, n, prec) in have:
                    continue
                b = best([r for r in p1["rows"] if r["layer"] == layer and r["n"] == n
                          and r["precision"] == prec])
                if b:
                    final.append({"layer": layer, "n": n, "precision": prec,
                                  "variant": "tuned" if n != 8 or prec != "int4" else
                                  "tuned_sample", "schedule": b["schedule"],
                                  "int4_s8": b.get("int4_s8")})
    # The table: every best re-timed beside the baselines, in this run.
    l2 = 50 * 2**20
    try:
        import cupy

        l2 = int(cupy.cuda.runtime.getDeviceProperties(0)["l2CacheSize"])
    except Exception:  # noqa: BLE001 - the default is fine for sizing rotations
        pass
    base_cache: dict[tuple[str, int], dict[str, float]] = {}
    table = []
    for f in final:
        shape = layer_shape(f["layer"], f["n"])
        job = BuildJob(shape, Precision(f["precision"]), sm, f["schedule"],
                       int4_s8=f["int4_s8"])
        r = measure_jobs(runner, a.cache, [job])[0]
        key = (f["layer"], f["n"])
        if key not in base_cache:
            base_cache[key] = baselines(shape, l2)
            log(f"baselines {key}: {base_cache[key]}")
        row = {"layer": f["layer"], "n": f["n"], "precision": f["precision"],
               "variant": f["variant"], "tuned_us": r["median_us"], "tuned_iqr_us": r["iqr_us"],
               "status": r["status"], **base_cache[key], "schedule": f["schedule"],
               "int4_s8": f["int4_s8"]}
        table.append(row)
        log(f"{row['layer']} n={row['n']} {row['precision']} {row['variant']}: "
            f"{row['tuned_us']} us vs cudnn fp16 {row['cudnn_fp16_us']} us")
    runner.close()
    out = {"gpu": runner.gpu_name, "target": tname, "date": dt.date.today().isoformat(),
           "peaks": p1.get("peaks"), "rows": table}
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "conv_vs_cudnn.json").write_text(json.dumps(out, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a1 = sub.add_parser("phase1")
    a1.add_argument("--out", required=True)
    a1.add_argument("--cache", default="/tmp/tctune-cache")
    a1.add_argument("--n8", type=int, default=160)
    a1.add_argument("--int4", type=int, default=80)
    a1.add_argument("--other", type=int, default=50)
    a1.add_argument("--seed", type=int, default=1)
    a2 = sub.add_parser("phase2")
    a2.add_argument("--phase1", default="")
    a2.add_argument("--fixed-from", default="",
                    help="instead of --phase1: a selections file; its tuned schedules (of "
                         "--fixed-batch) fix the knobs outside the six")
    a2.add_argument("--vary", action="append", default=[],
                    help="NAME=v1,v2: a knob enumerated with the six (repeatable)")
    a2.add_argument("--suffix", default="", help="appended to the replay datasets' names")
    a2.add_argument("--batch", type=int, default=8, help="the layers' batch (--fixed-from)")
    a2.add_argument("--fixed-batch", type=int, default=0,
                    help="take --fixed-from's schedules of this batch (default: --batch)")
    a2.add_argument("--out-dir", required=True)
    a2.add_argument("--cache", default="/tmp/tctune-cache")
    a2.add_argument("--ablation", type=int, default=60)
    a2.add_argument("--samples", type=int, default=5)
    a2.add_argument("--seed", type=int, default=2)
    a2.add_argument("--layers", default="")
    a4 = sub.add_parser("search")
    a4.add_argument("--out-dir", required=True)
    a4.add_argument("--cache", default="/tmp/tctune-cache")
    a4.add_argument("--seeds", nargs="*", default=[], help="earlier probe outputs (rows)")
    a4.add_argument("--seeds-per-group", type=int, default=20)
    a4.add_argument("--sample-sync", type=int, default=40)
    a4.add_argument("--sample-wgmma", type=int, default=60)
    a4.add_argument("--rounds", type=int, default=2)
    a4.add_argument("--top", type=int, default=3)
    a4.add_argument("--seed", type=int, default=4)
    a4.add_argument("--batches", default=",".join(map(str, BATCHES)))
    a4.add_argument("--precisions", default="int8,fp16,int4", help="int4 runs at batch 8 only")
    a3 = sub.add_parser("table")
    a3.add_argument("--phase1", default="")
    a3.add_argument("--selections", nargs="+", required=True)
    a3.add_argument("--out-dir", required=True)
    a3.add_argument("--cache", default="/tmp/tctune-cache")
    a = ap.parse_args(argv)
    return {"phase1": cmd_phase1, "phase2": cmd_phase2, "search": cmd_search,
            "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
