"""A batch split into halves run on two streams at once: does the second stream fill the SMs
the first leaves idle between and under small layers?

Per (model, precision): the optimized model at batch N (one stream, `deploy.optimize`'s
compiled PDL variant) against two optimized models at N/2, one per stream, forked and joined
inside the same CUDA graph (deploy.measure.forward_ms), and against the N/2 model alone and
twice one after the other. The halves run the batch-N records' schedules (`--schedules`,
re-keyed to N/2 by `keys`). Logits of both ways are checked against the float32 model's.

    python -m bench.model_e2e prebuild --cache C --schedules R --batches 8  # CPU
    python -m bench.gpu.stream_split_probe keys --schedules R --n 8 --out R4
    python -m bench.model_e2e prebuild --cache C --schedules R4 --batches 4  # CPU
    python -m bench.gpu.stream_split_probe run --cache C --schedules R4 --n 8 --out O.json  # GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from bench.model_e2e import _optimize, log


def halved(records: dict[str, Any], n: int) -> dict[str, Any]:
    """The batch-n records re-keyed to batch n/2 (same layers, same schedules)."""
    pre, half = f"n{n}_", f"n{n // 2}_"
    return {half + k[len(pre):]: v for k, v in records.items() if k.startswith(pre)}


def two_streams(fn: Any, half: int) -> Any:
    """fn over the first `half` images on the current stream and the rest on a second one."""
    import torch

    side = torch.cuda.Stream()

    def run(x: Any) -> Any:
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        a = fn(x[:half])
        with torch.cuda.stream(side):
            b = fn(x[half:])
        cur.wait_stream(side)
        return torch.cat([a, b])

    return run


def twice(fn: Any, half: int) -> Any:
    import torch

    return lambda x: torch.cat([fn(x[:half]), fn(x[half:])])


def cmd_run(a: argparse.Namespace) -> int:
    import torch

    from bench.nets import model
    from deploy.measure import agreement, compile_for_inference, forward_ms
    from kernels.timing import sets_for_l2

    records = json.loads(Path(a.schedules).read_text())
    n, half = a.n, a.n // 2
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "n": n,
                           "date": dt.date.today().isoformat(), "schedules": a.schedules,
                           "rows": []}
    for name in a.models.split(","):
        net, _ = model(name)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(n, 3, 224, 224, generator=gen)
        held = torch.randn(n, 3, 224, 224, generator=gen)
        with torch.no_grad():
            want = net(held).cuda()
        net = net.cuda()
        xc = x.cuda().contiguous(memory_format=torch.channels_last)
        inputs = [xc.clone() for _ in range(sets_for_l2(xc.numel() * 4, l2))]
        for p in a.precisions.split(","):
            full = compile_for_inference(
                _optimize(net, xc, p, a.target, records, a.cache, "cuda", True), xc)
            part = compile_for_inference(
                _optimize(net, xc[:half], p, a.target, records, a.cache, "cuda", True),
                xc[:half])
            alone = f"batch {half} alone"
            ways = {f"one stream, batch {n}": full,
                    "two streams, two halves": two_streams(part, half),
                    "one stream, two halves": twice(part, half), alone: part}
            for way, fn in ways.items():
                ms = forward_ms(fn, [t[:half] for t in inputs] if way == alone else inputs)
                row: dict[str, Any] = {"model": name, "precision": p, "way": way, "ms": ms}
                if way != alone:
                    with torch.no_grad():
                        got = fn(held.cuda().contiguous(memory_format=torch.channels_last))
                    row["rel_err"], row["cosine"] = agreement(got.float(), want)
                doc["rows"].append(row)
                log(f"{name} {p} {way}: {ms:.4f} ms {row.get('cosine', '')}")
                Path(a.out).write_text(json.dumps(doc, indent=1))
            torch._dynamo.reset()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keys")
    k.add_argument("--schedules", required=True)
    k.add_argument("--n", type=int, default=8)
    k.add_argument("--out", required=True)
    r = sub.add_parser("run")
    r.add_argument("--cache", required=True)
    r.add_argument("--schedules", required=True)
    r.add_argument("--target", default="h200")
    r.add_argument("--n", type=int, default=8)
    r.add_argument("--models", default="resnet50")
    r.add_argument("--precisions", default="int8,fp16")
    r.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "keys":
        recs = json.loads(Path(a.schedules).read_text())
        Path(a.out).write_text(json.dumps({**recs, **halved(recs, a.n)}, indent=1))
        return 0
    return cmd_run(a)


if __name__ == "__main__":
    raise SystemExit(main())
