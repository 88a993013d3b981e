"""A bound on fusing each bottleneck's first 1x1 conv into the layer before it: ResNet-50
through `deploy.optimize` (PDL), its forward timed whole and with the kernels of chosen layers
left out (their outputs computed once, then handed on without a launch), in turns.

Every conv1 of a torchvision bottleneck but the first reads the block output the conv3 before
it has just written, a 1x1 layer after a 1x1 layer: the back-to-back conv (kernels/b2b.cuh,
ConvShape.b2b) runs both over one block tile of pixels, the second GEMM's A operand the first's
staged output tile in shared memory, and saves the second layer's launch, its wait on the layer
before and its input's round trip. Left out entirely, those layers show what that could save at
most: it still does their math. Not a valid model (the left-out layers' outputs are stale), a
bound only.

    python -m bench.gpu.b2b_probe --cache C --schedules R.json --schedules-target h200 \\
        --precisions int8,fp16 --out O.json                                   # GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

from bench.cli import log

# Which conv1 layers a variant leaves out: every one that reads a bottleneck's output, or
# those of the first two stages only (where one block tile can hold both layers' weights).
VARIANTS = {
    "all": lambda name: False,
    "no_chained_conv1": lambda name: name.endswith("conv1") and name not in (
        "conv1", "layer1.0.conv1"),
    "no_chained_conv1_stages12": lambda name: name.endswith("conv1") and name.startswith(
        ("layer1.", "layer2.")) and name != "layer1.0.conv1",
}


def _left_out(opt: Any, x: Any, skip: Any) -> list[str]:
    """Make the layers `skip` names return their output of one forward without a launch."""
    from deploy.module import FusedConv

    mods = {m.layer.name: m for m in opt.modules() if isinstance(m, FusedConv)}
    outs: dict[str, Any] = {}
    hooks = [m.register_forward_hook(lambda _m, _i, o, n=n: outs.__setitem__(n, o))
             for n, m in mods.items() if skip(n)]
    opt(x)
    for h in hooks:
        h.remove()
    for n, out in outs.items():
        mods[n].forward = lambda *args, _out=out, **kw: _out
    return sorted(outs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", required=True)
    ap.add_argument("--schedules", required=True)
    ap.add_argument("--schedules-target", required=True)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precisions", default="int8,fp16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch

    from bench.model_e2e import _optimize
    from bench.nets import model
    from deploy.measure import forward_us

    doc: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0),
                           "date": dt.date.today().isoformat(), "model": a.model,
                           "n": a.batch, "schedules": a.schedules, "rows": []}
    records = json.loads(Path(a.schedules).read_text())
    net, _ = model(a.model)
    net = net.cuda()
    x = torch.randn(a.batch, 3, 224, 224, generator=torch.Generator().manual_seed(1)).cuda()
    x = x.contiguous(memory_format=torch.channels_last)
    inputs = [x.clone() for _ in range(2)]
    for p in a.precisions.split(","):
        models = {}
        for v, skip in VARIANTS.items():
            opt = _optimize(net, x, p, a.schedules_target, records, a.cache, "cuda", pdl=True)
            with torch.no_grad():
                left = _left_out(opt, x, skip)
            models[v] = (opt, left)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for _ in range(a.rounds):  # in turns, so that drift reaches every variant alike
            for v, (opt, _) in models.items():
                times[v].append(forward_us(opt, inputs))
        for v, (_, left) in models.items():
            row = {"precision": p, "variant": v, "left_out": left, "us": times[v],
                   "median_us": statistics.median(times[v])}
            doc["rows"].append(row)
            log(f"{p} {v}: {row['median_us']:.1f} us a forward ({len(left)} layers left out)")
        Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
