"""Each layer's recorded schedule timed plain and with programmatic dependent launch (PDL),
beside cuDNN fp16, in one process: how much of a small layer's time is its launch.

The timing harness (kernels.timing.time_launches) runs a CUDA graph of back-to-back launches
of one op over rotating inputs. With PDL (kernels/launch.py, `pdl`) a launch may begin while
the one before it runs: its blocks become resident, set up and wait at `griddepcontrol.wait`
(kernels/conv.cu), as consecutive layers of a network do under `deploy.optimize`. Each op is
checked first (int8 exactly equal to the requantized reference, fp16 against float64).

    python -m bench.gpu.pdl_probe --records bench/data/zoo_records_h200.json \\
        --models resnet50 --batches 8 --out O.json        # GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import warnings
from pathlib import Path
from typing import Any

from bench.cli import records_on
from bench.resnet50_e2e import check_and_time, log, random_operands
from bench.zoo import add_layer_args, planned
from kernels.spec import Precision, task_key


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", required=True)
    ap.add_argument("--records-target", default=None)
    ap.add_argument("--cache", default="/tmp/tctune-pdl-probe")
    ap.add_argument("--out", required=True)
    add_layer_args(ap, models="resnet50", batches="8")
    a = ap.parse_args(argv)

    import torch

    from kernels.cudnn import time_cudnn_conv
    from kernels.runtime import Conv2d, DefaultScheduleWarning
    from kernels.spec import target_for_gpu_model

    gpu = torch.cuda.get_device_name(0)
    target = target_for_gpu_model(gpu)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    records = records_on(a.records, target.name, a.records_target)
    rows: list[dict[str, Any]] = []
    cudnn: dict[str, float] = {}
    for g in planned(a):
        sh, p = g.shape, g.precision
        rec = records.get(task_key(sh, Precision(p), target))
        if not rec:
            continue
        v = random_operands(sh, 0)
        row: dict[str, Any] = {"layer": g.uses[0].layers[0], "shape": sh.to_dict(),
                               "precision": p, "uses": [[u.model, u.count] for u in g.uses],
                               "schedule": rec["schedule"]}
        for pdl in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DefaultScheduleWarning)
                op = Conv2d(sh, p, rec["schedule"], target.name, cache_dir=a.cache, pdl=pdl)
            check, tm = check_and_time(op, p, v, l2)
            row["pdl_us" if pdl else "plain_us"] = round(tm.median_us, 4)
            row["pdl_check" if pdl else "plain_check"] = check
        if sh.key() not in cudnn:
            cudnn[sh.key()] = round(time_cudnn_conv(sh, v.x16.permute(0, 3, 1, 2),
                                                    v.w16.permute(0, 3, 1, 2), l2)[0].median_us, 4)
        row["cudnn_fp16_us"] = cudnn[sh.key()]
        rows.append(row)
        log(sh.key(), p, row["plain_us"], row["pdl_us"], row["cudnn_fp16_us"],
            row["plain_check"]["ok"] and row["pdl_check"]["ok"])
        Path(a.out).write_text(json.dumps({"gpu": gpu, "target": target.name,
                                           "date": dt.date.today().isoformat(),
                                           "records": a.records, "rows": rows}, indent=1))
    return 0 if all(r["plain_check"]["ok"] and r["pdl_check"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
