"""A network's stem and the max-pool after it, timed as deploy runs them: the stem's kernel,
then tctune's max-pool after the whole stem (plain), or the stem signalling the bands of
output rows it wrote and the pool started on each as soon as its rows are written (bands:
kernels.build.Epilogue's `bands`, kernels/pool.cu's band mode); and the stem alone. One
CUDA graph of back-to-back (stem, pool) pairs with programmatic dependent launch, inputs in
L2 as a network's are (kernels.timing). Each pair's output is checked first: both ways give
PyTorch's max-pool of the stem's output, exactly.

    python -m bench.gpu.bands_probe --records bench/data/model_e2e_records_r50_pairs_h200.json \\
        --out O.json                                    # GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from bench.cli import records_on
from bench.resnet50_e2e import op_input, random_operands
from kernels.spec import ConvShape, Precision, task_key

# ResNet-50's (and ResNet-18's) stem at batch 8: int8 over pixel pairs (kernels.spec.pixel_pairs,
# as deploy runs it on the H200's records), fp16 plain; the max-pool after it.
STEMS = {"int8": ConvShape(8, 224, 113, 8, 64, 7, 4, stride=(2, 1), pad=(3, 1)),
         "fp16": ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3)}
POOL = (3, 2, 1, 1)


def probe(sh: ConvShape, precision: str, sched: dict[str, Any], target: Any,
          cache: str) -> dict[str, Any]:
    """One stem's row: the pair checked both ways, then the stem alone, the pair plain and the
    pair with bands, each pair twice in turn (µs per forward)."""
    import torch
    import torch.nn.functional as F

    from kernels.build import Epilogue
    from kernels.pool import MaxPool2d, PoolShape
    from kernels.runtime import Conv2d
    from kernels.timing import time_launches

    int8 = precision == "int8"
    v = random_operands(sh, 0)
    ps = PoolShape.of((sh.n, sh.k, sh.p, sh.q), *POOL, fp16=not int8, bands=True)
    ops = {bands: Conv2d(sh, precision, sched, target, pdl=True, cache_dir=cache,
                         epilogue=Epilogue(relu=True, bands=ps.band_signal if bands else None))
           for bands in (False, True)}
    pools = {bands: MaxPool2d(PoolShape.of((sh.n, sh.k, sh.p, sh.q), *POOL, not int8, bands),
                              target.sm, True, cache) for bands in (False, True)}
    x = op_input(ops[False], v.x8 if int8 else v.x16)
    w = ops[False].prepare_weight(v.w8 if int8 else v.w16, layout="krsc")
    scale, bias = (v.scale, v.bias) if int8 else (None, v.b16)
    counters = torch.zeros(ops[True].band_rows, dtype=torch.int32, device="cuda")
    y = torch.empty(ops[False].output_shape, dtype=torch.int8 if int8 else torch.float16,
                    device="cuda")

    def pair(bands: bool) -> Any:  # the pool's own output, as deploy's op allocates it
        ops[bands](x, w, scale, bias, out=y, bands=counters if bands else None)
        return pools[bands](y.permute(0, 3, 1, 2), counters if bands else None)

    got = {}
    for bands in (False, True):
        got[bands] = pair(bands).float()
        torch.cuda.synchronize()
        assert not counters.any()
    want = F.max_pool2d(y.permute(0, 3, 1, 2).float(), *POOL)
    assert torch.equal(got[False], want) and torch.equal(got[True], want), precision
    row: dict[str, Any] = {"precision": precision, "shape": sh.to_dict(), "schedule": sched,
                           "checked": True}
    row["stem_us"] = time_launches(lambda _: ops[False](x, w, scale, bias, out=y), 1,
                                   api="torch").median_us
    for name, bands in (("plain_us", False), ("bands_us", True), ("plain_again_us", False),
                        ("bands_again_us", True)):
        row[name] = time_launches(lambda _, b=bands: pair(b), 1, api="torch").median_us
    assert not counters.any()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", required=True)
    ap.add_argument("--records-target", default=None)
    ap.add_argument("--cache", default="/tmp/tctune-bands-probe")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import torch

    from kernels.spec import target_for_gpu_model

    gpu = torch.cuda.get_device_name(0)
    target = target_for_gpu_model(gpu)
    records = records_on(a.records, target.name, a.records_target)
    rows = []
    for precision, sh in STEMS.items():
        row = probe(sh, precision, records[task_key(sh, Precision(precision), target)]["schedule"],
                    target, a.cache)
        print(json.dumps({k: row[k] for k in row if k.endswith("_us")} | {"precision": precision}),
              flush=True)
        rows.append(row)
    Path(a.out).write_text(json.dumps({"gpu": gpu, "date": dt.date.today().isoformat(),
                                       "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
