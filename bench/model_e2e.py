"""Whole models through `deploy.optimize` against PyTorch fp16 (channels_last), eager and
compiled with inference freezing (BatchNorm folded, elementwise ops fused), in one run.

  python -m bench.model_e2e records FILE... [--base R0] --out R.json  # layer_classes / zoo bests
  python -m bench.model_e2e prebuild --cache C [--schedules R.json] [--models ...]  # CPU
  python -m bench.model_e2e run --cache C [--schedules R.json] --out OUT.json      # GPU
  python -m bench.model_e2e table OUT.json
  python -m bench.model_e2e profile --cache C [--schedules R.json] --models M --batches N  # GPU
      [--compiled]
  (prebuild, run, profile: `--schedules-target T` looks the records up as GPU model T's, e.g.
  an H100's records on an H200, the same sm)

Per (model, batch, precision): one CUDA graph per variant of back-to-back forwards, inputs
rotating past L2 (deploy.measure, as every baseline is timed);
agreement of the optimized model's logits with the float32 model's on held-out inputs
(fp16: relative L2 error; int8: cosine similarity). Models: torchvision's with random
weights, or bench/nets.py's builds of ResNet-18/50 where torchvision is missing; random
BatchNorm statistics either way. `--schedules`: records keyed by task key (`records` made
from bench/layer_classes.py's and bench/zoo.py's bests), or a tctune service's URL (its
tuned schedules, one bulk lookup); layers without one run the
runtime's default schedule, and fp16 layers whose record is slower than cuDNN keep it.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from bench.cli import log, read_json
from kernels.spec import ConvShape, Precision, get_target, task_key

MODELS = ("resnet50", "resnet18", "densenet121")
# variant -> (programmatic dependent launch, torch.compile with inference freezing around it)
VARIANTS = {"plain": (False, False), "pdl": (True, False), "compiled": (True, True)}
TARGET = "h100"  # what prebuild builds for; run uses the GPU at hand


def cmd_records(a: argparse.Namespace) -> int:
    """Each tuned layer's best schedule as a record (its latency, cuDNN fp16's, the ratio):
    the groups of bench/layer_classes.py's files and the rows of bench/zoo.py's,
    bench/layer_search.py's and bench/retime.py's (a retime of recorded schedules on changed
    kernels measures them again). A layer in several files keeps the fastest schedule: files of
    one GPU model compare by latency (a schedule's time moves by a few percent between runs,
    cuDNN's by up to 1.7x: kernels/cudnn.py). `--base`: a records file the files improve on;
    `--margin M`: a schedule replaces a layer's record only where it is faster by more than the
    fraction M (a time moves by a percent or so between runs)."""
    out: dict[str, Any] = json.loads(Path(a.base).read_text()) if a.base else {}
    for path in a.files:
        doc = read_json(path)
        target = get_target(doc.get("target", TARGET))
        for g in doc.get("groups", []):
            if g.get("best_schedule"):
                _add_record(out, target, g["shape"], g["precision"], g["best_schedule"],
                            g["best_us"], g["cudnn_fp16_us"], f"{Path(path).name}: {g['layer']}",
                            a.margin)
        for r in doc.get("rows", []):
            if r.get("best_schedule") and r.get("cudnn_fp16_us"):  # layer_search
                _add_record(out, target, r["shape"], r["precision"], r["best_schedule"],
                            r["best_us"], r["cudnn_fp16_us"],
                            f"{Path(path).name}: {r['layers'][0]}, {len(r['trials'])} trials",
                            a.margin)
            elif r.get("schedule") and r.get("ours_us") and (
                    r.get("checked") or r.get("status") == "ok"):  # zoo, bench/retime.py
                model = r.get("model") or r["uses"][0][0]
                _add_record(out, target, r["shape"], r["precision"], r["schedule"], r["ours_us"],
                            r["cudnn_fp16_us"], f"{Path(path).name}: {model} {r['layer']}",
                            a.margin)
    Path(a.out).write_text(json.dumps(out, indent=1))
    log(f"{len(out)} records -> {a.out}")
    return 0


def _add_record(out: dict[str, Any], target: Any, shape: dict[str, Any], precision: str,
                schedule: dict[str, Any], us: float, cudnn_us: float, source: str,
                margin: float = 0.0) -> None:
    key = task_key(ConvShape.from_dict(shape), Precision(precision), target)
    if key in out and out[key]["latency_us"] * (1 - margin) <= us:
        return
    out[key] = {"schedule": schedule, "latency_us": us, "baseline_us": cudnn_us,
                "baseline": "cuDNN fp16", "speedup": cudnn_us / us, "source": source}


def _schedules(path: str | None) -> dict[str, Any] | str | None:
    """Records from a file, or a service's URL (deploy.optimize looks every layer up there)."""
    if path and path.startswith(("http://", "https://")):
        return path
    return json.loads(Path(path).read_text()) if path else None


def _optimize(net: Any, x: Any, precision: str, target: Any, schedules: Any, cache: str,
              backend: str, pdl: bool | None = None, kernel_head: bool = True) -> Any:
    from deploy import optimize
    from kernels.runtime import DefaultScheduleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)  # the plan says which
        return optimize(net, x, precision, target, schedules, backend=backend, cache_dir=cache,
                        pdl=pdl, kernel_head=kernel_head)


def cmd_prebuild(a: argparse.Namespace) -> int:
    """Build every kernel the run needs (NVRTC, no GPU): the same plan as on the GPU."""
    import torch

    from bench.nets import model

    for name in a.models.split(","):
        for n in (int(b) for b in a.batches.split(",")):
            net, _ = model(name)
            x = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(1))
            for p in a.precisions.split(","):
                t0 = time.perf_counter()
                opt = _optimize(net, x, p, a.schedules_target or TARGET, _schedules(a.schedules),
                                a.cache, "cuda", kernel_head=a.kernel_head)
                log(f"{name} n={n} {p}: {sum(lp.replaced for lp in opt.plan)} of "
                    f"{len(opt.plan)} convs built ({time.perf_counter() - t0:.0f} s)")
    return 0


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from bench.nets import model
    from deploy.measure import agreement, compile_for_inference, forward_ms
    from kernels.spec import target_for_gpu_model
    from kernels.timing import sets_for_l2

    gpu = torch.cuda.get_device_name(0)
    target = a.schedules_target or target_for_gpu_model(gpu)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    doc: dict[str, Any] = {"gpu": gpu, "date": dt.date.today().isoformat(),
                           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                           "schedules": a.schedules,
                           "schedules_target": getattr(target, "name", target), "rows": []}
    out = Path(a.out)
    for name in a.models.split(","):
        for n in (int(b) for b in a.batches.split(",")):
            net, source = model(name)
            gen = torch.Generator().manual_seed(1)
            x = torch.randn(n, 3, 224, 224, generator=gen)
            held = torch.randn(n, 3, 224, 224, generator=gen)
            with torch.no_grad():
                want = net(held).cuda()  # float32 on the CPU: the reference
            eager = copy.deepcopy(net).cuda().half().to(memory_format=torch.channels_last)
            x16 = x.cuda().half().contiguous(memory_format=torch.channels_last)
            inputs = [x16.clone() for _ in range(sets_for_l2(x16.numel() * 2, l2))]
            row: dict[str, Any] = {"model": name, "source": source, "n": n}
            row["eager_fp16_ms"] = forward_ms(eager, inputs)
            if not a.no_compile:
                t0 = time.perf_counter()
                compiled = compile_for_inference(eager, inputs[0])
                row["compile_s"] = round(time.perf_counter() - t0, 1)
                row["compiled_fp16_ms"] = forward_ms(compiled, inputs)
                torch._dynamo.reset()
            log(f"{name} n={n}: eager {row['eager_fp16_ms']:.3f} ms, compiled "
                f"{row.get('compiled_fp16_ms', float('nan')):.3f} ms")
            net32 = net.cuda()
            for p in a.precisions.split(","):
                for variant in a.variants.split(","):
                    pdl, compiled = VARIANTS[variant]
                    opt = _optimize(net32, x.cuda().contiguous(memory_format=torch.channels_last),
                                    p, target, _schedules(a.schedules), a.cache, "cuda", pdl,
                                    a.kernel_head)
                    xin = [t.float().contiguous(memory_format=torch.channels_last)
                           for t in inputs]
                    fn = compile_for_inference(opt, xin[0]) if compiled else opt
                    ours_ms = forward_ms(fn, xin)
                    with torch.no_grad():
                        got = fn(held.cuda().contiguous(memory_format=torch.channels_last))
                    if compiled:
                        torch._dynamo.reset()
                    rel, cos = agreement(got.float(), want)
                    replaced = sum(lp.replaced for lp in opt.plan)
                    r = {**row, "precision": p, "pdl": pdl, "compiled": compiled,
                         "kernel_head": a.kernel_head,
                         "ours_ms": ours_ms, "rel_err": rel, "cosine": cos,
                         "replaced": replaced, "convs": len(opt.plan),
                         "tuned": sum(lp.replaced and not lp.default_schedule
                                      for lp in opt.plan),
                         "report": opt.report()}
                    doc["rows"].append(r)
                    log(f"  {p} {variant}: ours {ours_ms:.3f} ms ({replaced}/{len(opt.plan)} "
                        f"convs); rel err {rel:.2e}, cosine {cos:.5f}")
                    out.write_text(json.dumps(doc, indent=1))  # a run cut short keeps its rows
            del eager, net, net32
            torch.cuda.empty_cache()
    return 0


def cmd_profile(a: argparse.Namespace) -> int:
    """Where an optimized model's time goes: GPU time per forward of each kernel (tctune's
    convs as one line per build kind), from the profiler over eager forwards (`--compiled`:
    of the compiled variant)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench.nets import model
    from deploy.measure import compile_for_inference
    from deploy.module import FusedConv
    from kernels.spec import target_for_gpu_model

    target = a.schedules_target or target_for_gpu_model(torch.cuda.get_device_name(0))
    reps = 10
    for name in a.models.split(","):
        for n in (int(b) for b in a.batches.split(",")):
            net, _ = model(name)
            x = torch.randn(n, 3, 224, 224, generator=torch.Generator().manual_seed(1))
            xc = x.cuda().contiguous(memory_format=torch.channels_last)
            for p in a.precisions.split(","):
                opt = _optimize(net.cuda(), xc, p, target, _schedules(a.schedules), a.cache,
                                "cuda", pdl=a.compiled or None, kernel_head=a.kernel_head)
                layers = _fused_in_graph_order(opt, FusedConv)
                if a.compiled:  # as `run`'s compiled variant: PDL, the ops around compiled
                    opt = compile_for_inference(opt, xc)
                with torch.no_grad():
                    for _ in range(3):
                        opt(xc)
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(reps):
                            opt(xc)
                        torch.cuda.synchronize()
                rows = sorted(((e.key, e.device_time_total / reps, e.count // reps)
                               for e in prof.key_averages() if e.device_time_total > 0),
                              key=lambda r: -r[1])
                total = sum(r[1] for r in rows)
                print(f"{name} n={n} {p}: {total:.1f} us of kernels per forward")
                for key, us, count in rows[:a.top]:
                    print(f"  {us:8.1f} us  {count:4d}x  {key[:100]}")
                if a.per_kernel:
                    trace = _graph_trace(opt, xc, reps)
                    print(per_kernel_table(critical_path(trace, reps), layers))
                if a.compiled:
                    torch._dynamo.reset()
    return 0


def _fused_in_graph_order(opt: Any, kind: type) -> list[str]:
    """The names of the model's fused layers as its graph calls them (each one kernel):
    the order their kernels launch in, but where a compiled graph reorders independent
    layers (a block's shortcut beside its first conv)."""
    gm = opt.graph_module
    called = (gm.get_submodule(str(n.target)) for n in gm.graph.nodes if n.op == "call_module")
    return [m.layer.name for m in called if isinstance(m, kind)]


def _graph_trace(opt: Any, x: Any, reps: int) -> dict[str, Any]:
    """A profiler trace of `reps` forwards replayed from one CUDA graph, as `run` times them
    (without it the host's launches leave the GPU idle between kernels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    # Warmed up on the stream that captures (a fused layer's scratch is per stream, and
    # allocating it is not allowed during a capture), as kernels.timing does.
    g, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            opt(x)
        side.synchronize()
        with torch.cuda.graph(g, stream=side):
            for _ in range(reps):
                opt(x)
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        return json.loads(Path(f"{tmp}/trace.json").read_text())


def critical_path(trace: dict[str, Any], reps: int) -> list[tuple[str, float, float]]:
    """Each kernel of a forward in launch order, from a profiler trace of `reps` forwards:
    (name, its end minus the end of the kernel before it, its own duration), medians over
    the forwards, in µs. With PDL a kernel starts before the one before it ends, so its
    duration includes that wait; the end-to-end step is what it adds to the forward."""
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in trace["traceEvents"]
                     if e.get("cat") == "kernel")
    per = len(kernels) // reps
    if per == 0 or per * reps != len(kernels):
        raise ValueError(f"{len(kernels)} kernels over {reps} forwards: not a whole number each")
    out = []
    for i in range(per):
        runs = [kernels[f * per + i] for f in range(reps)]
        steps = [end - (kernels[f * per + i - 1][1] if i else start)
                 for f, (start, end, _) in enumerate(runs)]
        out.append((runs[0][2], statistics.median(steps),
                    statistics.median(end - start for start, end, _ in runs)))
    return out


def per_kernel_table(path: list[tuple[str, float, float]], layers: list[str]) -> str:
    """`critical_path` as lines, tctune's conv kernels named by the model's fused layers in
    order (where their counts agree)."""
    convs = [i for i, (name, _, _) in enumerate(path) if name.startswith("tc_conv")]
    names = dict(zip(convs, layers, strict=True)) if len(convs) == len(layers) else {}
    lines = ["  step us   dur us  kernel"]
    for i, (name, step, dur) in enumerate(path):
        lines.append(f"  {step:7.2f}  {dur:7.2f}  {names.get(i, name[:60])}")
    lines.append(f"  {sum(s for _, s, _ in path):7.2f}  (the forward's kernels, end to end)")
    return "\n".join(lines)


def render(path: str) -> str:
    d = json.loads(Path(path).read_text())
    lines = [f"GPU: {d['gpu']}, {d['date']} (torch {d['torch']}, cuDNN {d['cudnn']}); "
             f"schedules: {d['schedules'] or 'the runtime defaults'}", "",
             "| model | batch | precision | ours run as | convs on tctune (tuned) | ours ms | "
             "eager fp16 ms | compiled fp16 ms | vs eager | vs compiled | rel. L2 error | cosine |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        comp, ours = r.get("compiled_fp16_ms"), r["ours_ms"]
        comp_ms, vs_comp = ("-", "-") if comp is None else (f"{comp:.3f}", f"{comp / ours:.2f}x")
        lines.append(
            f"| {r['model']} | {r['n']} | {r['precision']} | {_variant(r)} | "
            f"{r['replaced']}/{r['convs']} "
            f"({r['tuned']}) | {ours:.3f} | {r['eager_fp16_ms']:.3f} | {comp_ms} | "
            f"{r['eager_fp16_ms'] / ours:.2f}x | {vs_comp} | {r['rel_err']:.2e} | "
            f"{r['cosine']:.5f} |")
    return "\n".join(lines)


def _variant(r: dict[str, Any]) -> str:
    if "pdl" not in r:
        return "-"
    how = ("compiled, PDL" if r.get("compiled") else "PDL") if r["pdl"] else "plain"
    return how + (", kernel head" if r.get("kernel_head") else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("records")
    r.add_argument("files", nargs="+")
    r.add_argument("--out", required=True)
    r.add_argument("--base", default="", help="records to start from (default: none)")
    r.add_argument("--margin", type=float, default=0.0,
                   help="replace a record only with a schedule faster by more than this fraction")
    for name in ("prebuild", "run", "profile"):
        s = sub.add_parser(name)
        s.add_argument("--cache", required=True)
        s.add_argument("--schedules", default=None)
        s.add_argument("--models", default="resnet50")
        s.add_argument("--batches", default="8")
        s.add_argument("--precisions", default="fp16,int8")
        s.add_argument("--kernel-head", action=argparse.BooleanOptionalAction, default=True,
                       help="the classifier's average pool and fully connected layer on "
                            "tctune's kernels too (deploy.optimize's kernel_head)")
        s.add_argument("--schedules-target", default=None,
                       help="the GPU model whose schedules to look up (same sm; default: "
                            f"{TARGET} for prebuild, the GPU at hand for run and profile)")
        if name == "run":
            s.add_argument("--out", default="bench/data/model_e2e_h100.json")
            s.add_argument("--no-compile", action="store_true")
            s.add_argument("--variants", default="plain,pdl,compiled",
                           help="how the optimized model runs: plain launches, with programmatic "
                                "dependent launch (pdl), or pdl under torch.compile (compiled)")
        if name == "profile":
            s.add_argument("--top", type=int, default=20)
            s.add_argument("--compiled", action="store_true",
                           help="as run's compiled variant (PDL, torch.compile around)")
            s.add_argument("--per-kernel", action="store_true",
                           help="also each kernel of a forward in order (forwards replayed "
                                "from a CUDA graph): what it adds to the forward end to end, "
                                "and its own duration")
    t = sub.add_parser("table")
    t.add_argument("file")
    a = ap.parse_args(argv)
    if a.cmd == "table":
        print(render(a.file))
        return 0
    return {"records": cmd_records, "prebuild": cmd_prebuild, "run": cmd_run,
            "profile": cmd_profile}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
