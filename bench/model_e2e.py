"""Whole models through `deploy.optimize` against PyTorch fp16 (channels_last), eager and
compiled with inference freezing (BatchNorm folded, elementwise ops fused), in one run.

  python -m bench.model_e2e records FILE... --out R.json      # schedules from layer_classes
  python -m bench.model_e2e prebuild --cache C [--schedules R.json] [--models ...]  # CPU
  python -m bench.model_e2e run --cache C [--schedules R.json] --out OUT.json      # GPU
  python -m bench.model_e2e table OUT.json

Per (model, batch, precision): one CUDA graph per variant of back-to-back forwards, inputs
rotating past L2 (kernels.timing.time_launches, api "torch", as every baseline is timed);
agreement of the optimized model's logits with the float32 model's on held-out inputs
(fp16: relative L2 error; int8: cosine similarity). Models: torchvision's with random
weights, or bench/nets.py's builds of ResNet-18/50 where torchvision is missing; random
BatchNorm statistics either way. `--schedules`: records keyed by task key (the service's
answers, or `records` made from bench/layer_classes.py's bests); layers without one run the
runtime's default schedule, and fp16 layers whose record is slower than cuDNN keep it.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from kernels.spec import ConvShape, Precision, get_target, task_key

MODELS = ("resnet50", "resnet18", "densenet121")
TARGET = "h100"  # what prebuild builds for; run uses the GPU at hand


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cmd_records(a: argparse.Namespace) -> int:
    """Each layer class's best schedule as a record (its latency, cuDNN fp16's, the ratio)."""
    out: dict[str, Any] = {}
    for path in a.files:
        doc = json.loads(Path(path).read_text())
        target = get_target(doc.get("target", TARGET))
        for g in doc["groups"]:
            if not g.get("best_schedule"):
                continue
            shape, p = ConvShape.from_dict(g["shape"]), Precision(g["precision"])
            out[task_key(shape, p, target)] = {
                "schedule": g["best_schedule"], "latency_us": g["best_us"],
                "baseline_us": g["cudnn_fp16_us"], "baseline": "cuDNN fp16",
                "speedup": g["cudnn_fp16_us"] / g["best_us"],
                "source": f"{Path(path).name}: {g['layer']}"}
    Path(a.out).write_text(json.dumps(out, indent=1))
    log(f"{len(out)} records -> {a.out}")
    return 0


def _schedules(path: str | None) -> dict[str, Any] | None:
    return json.loads(Path(path).read_text()) if path else None


def _optimize(net: Any, x: Any, precision: str, target: Any, schedules: Any, cache: str,
              backend: str) -> Any:
    from deploy import optimize
    from kernels.runtime import DefaultScheduleWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)  # the plan says which
        return optimize(net, x, precision, target, schedules, backend=backend, cache_dir=cache)


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
                opt = _optimize(net, x, p, TARGET, _schedules(a.schedules), a.cache, "cuda")
                log(f"{name} n={n} {p}: {sum(lp.replaced for lp in opt.plan)} of "
                    f"{len(opt.plan)} convs built ({time.perf_counter() - t0:.0f} s)")
    return 0


def _time_forward(fn: Any, inputs: list[Any]) -> float:
    """Median us per forward: one CUDA graph of back-to-back calls over rotating inputs."""
    import torch

    from kernels.timing import time_launches

    outs: list[Any] = [None] * len(inputs)

    def launch(i: int) -> None:
        outs[i] = fn(inputs[i])

    with torch.no_grad():
        return time_launches(launch, len(inputs), api="torch").median_us


def _agreement(got: Any, want: Any) -> tuple[float, float]:
    """(relative L2 error, cosine similarity) of the logits, in float64."""
    g, w = got.double().flatten(), want.double().flatten()
    return float((g - w).norm() / w.norm()), float((g @ w) / (g.norm() * w.norm()))


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from bench.nets import model
    from kernels.spec import target_for_gpu_model
    from kernels.timing import sets_for_l2

    gpu = torch.cuda.get_device_name(0)
    target = target_for_gpu_model(gpu)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    torch.backends.cudnn.benchmark = True
    doc: dict[str, Any] = {"gpu": gpu, "date": dt.date.today().isoformat(),
                           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                           "schedules": a.schedules, "rows": []}
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
            row["eager_fp16_ms"] = _time_forward(eager, inputs) / 1e3
            if not a.no_compile:
                import torch._inductor.config as inductor

                inductor.freezing = True
                t0 = time.perf_counter()
                compiled = torch.compile(eager)
                with torch.no_grad():
                    compiled(inputs[0])
                row["compile_s"] = round(time.perf_counter() - t0, 1)
                row["compiled_fp16_ms"] = _time_forward(compiled, inputs) / 1e3
                torch._dynamo.reset()
            log(f"{name} n={n}: eager {row['eager_fp16_ms']:.3f} ms, compiled "
                f"{row.get('compiled_fp16_ms', float('nan')):.3f} ms")
            net32 = net.cuda()
            for p in a.precisions.split(","):
                opt = _optimize(net32, x.cuda().contiguous(memory_format=torch.channels_last),
                                p, target, _schedules(a.schedules), a.cache, "cuda")
                xin = [t.float().contiguous(memory_format=torch.channels_last) for t in inputs]
                ours_ms = _time_forward(opt, xin) / 1e3
                with torch.no_grad():
                    got = opt(held.cuda().contiguous(memory_format=torch.channels_last))
                rel, cos = _agreement(got.float(), want)
                replaced = sum(lp.replaced for lp in opt.plan)
                r = {**row, "precision": p, "ours_ms": ours_ms, "rel_err": rel, "cosine": cos,
                     "replaced": replaced, "convs": len(opt.plan),
                     "tuned": sum(lp.replaced and not lp.default_schedule for lp in opt.plan),
                     "report": opt.report()}
                doc["rows"].append(r)
                log(f"  {p}: ours {ours_ms:.3f} ms ({replaced}/{len(opt.plan)} convs); "
                    f"rel err {rel:.2e}, cosine {cos:.5f}")
                out.write_text(json.dumps(doc, indent=1))  # a run cut short keeps its rows
            del eager, net, net32
            torch.cuda.empty_cache()
    return 0


def render(path: str) -> str:
    d = json.loads(Path(path).read_text())
    lines = [f"GPU: {d['gpu']}, {d['date']} (torch {d['torch']}, cuDNN {d['cudnn']}); "
             f"schedules: {d['schedules'] or 'the runtime defaults'}", "",
             "| model | batch | precision | convs on tctune (tuned) | ours ms | eager fp16 ms | "
             "compiled fp16 ms | vs eager | vs compiled | rel. L2 error | cosine |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        comp, ours = r.get("compiled_fp16_ms"), r["ours_ms"]
        comp_ms, vs_comp = ("-", "-") if comp is None else (f"{comp:.3f}", f"{comp / ours:.2f}x")
        lines.append(
            f"| {r['model']} | {r['n']} | {r['precision']} | {r['replaced']}/{r['convs']} "
            f"({r['tuned']}) | {ours:.3f} | {r['eager_fp16_ms']:.3f} | {comp_ms} | "
            f"{r['eager_fp16_ms'] / ours:.2f}x | {vs_comp} | {r['rel_err']:.2e} | "
            f"{r['cosine']:.5f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("records")
    r.add_argument("files", nargs="+")
    r.add_argument("--out", required=True)
    for name in ("prebuild", "run"):
        s = sub.add_parser(name)
        s.add_argument("--cache", required=True)
        s.add_argument("--schedules", default=None)
        s.add_argument("--models", default="resnet50")
        s.add_argument("--batches", default="8")
        s.add_argument("--precisions", default="fp16,int8")
        if name == "run":
            s.add_argument("--out", default="bench/data/model_e2e_h100.json")
            s.add_argument("--no-compile", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("file")
    a = ap.parse_args(argv)
    if a.cmd == "table":
        print(render(a.file))
        return 0
    return {"records": cmd_records, "prebuild": cmd_prebuild, "run": cmd_run}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
