"""Record exhaustive replay datasets with the simulated backend (labelled simulated).

Until GPU datasets exist this gives the search benchmark something to replay: the four
ResNet-50 3x3 layers at batch 8, int8 and fp16, on the h100 model, in two subspaces:

- `paper6`: the paper's six knobs (section 4.1) exhaustive; the other knobs held at the
  values of the best schedule of the whole space under the same model (1,152 schedules).
- `wide`: everything but LAYOUT and PACK_OUT exhaustive (20,736 schedules), held as above;
  recorded for stage2 int8 (the layer of the paper's figure 14) and stage5 fp16 (the layer
  least like it) to keep the files small.

The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").

Every result comes from `simulated_result`, the same path the simulated measure backend
uses (deterministic model plus seeded noise). Invalid schedules are left out of the file.

    python bench/make_sim_replay.py [--out bench/data/replay]

`--set dev` records other layers instead (1x1, strided, batch 1 and 32, VGG-like; on the
h100, a100 and l4 models): a development set for choosing the search's settings, kept out
of the replay table's datasets so that those stay a held-out test:

    python bench/make_sim_replay.py --set dev --out bench/data/replay_dev
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.space import ScheduleSpace  # noqa: E402
from kernels.spec import RESNET50_3X3, TARGETS, ConvShape, Precision  # noqa: E402
from search.datasets import write_dataset  # noqa: E402
from workers.backends.base import TaskSpec  # noqa: E402
from workers.backends.simulated import simulate_latency_us, simulated_result  # noqa: E402

PAPER6 = ("BLK_ROW_WARPS", "BLK_COL_WARPS", "WARP_ROW_TILES", "WARP_COL_TILES", "CHUNK",
          "REORDER_INNER")
SUBSPACES = {
    "paper6": PAPER6,
    "wide": (*PAPER6, "DUP_AWARE", "STAGES", "SPLIT_K"),
}
WIDE_FOR = {("stage2", "int8"), ("stage5", "fp16")}

# The development set: (name, layer, precision, target, subspace). Layers unlike the four
# ResNet-50 3x3 layers at batch 8 of the replay table (other kernel sizes, strides, batches
# and channel counts) and three GPU models, so that what is chosen on them is not chosen on
# the table's layers.
DEV_LAYERS = {
    "r50_1x1_56": ConvShape(8, 56, 56, 64, 256, 1, 1),
    "r50_1x1_14": ConvShape(8, 14, 14, 1024, 256, 1, 1),
    "r50_3x3s2_28": ConvShape(8, 56, 56, 128, 128, 3, 3, stride=(2, 2), pad=(1, 1)),
    "vgg_3x3_112_b1": ConvShape(1, 112, 112, 128, 128, 3, 3, pad=(1, 1)),
    "3x3_14_b1": ConvShape(1, 14, 14, 256, 256, 3, 3, pad=(1, 1)),
    "3x3_7_b32": ConvShape(32, 7, 7, 512, 512, 3, 3, pad=(1, 1)),
    "3x3_28_c256_b16": ConvShape(16, 28, 28, 256, 128, 3, 3, pad=(1, 1)),
}
DEV_SET = [
    ("r50_1x1_56", "int8", "h100", "paper6"),
    ("r50_1x1_14", "fp16", "a100", "paper6"),
    ("r50_3x3s2_28", "fp16", "h100", "paper6"),
    ("r50_3x3s2_28", "int8", "l4", "paper6"),
    ("vgg_3x3_112_b1", "int8", "a100", "paper6"),
    ("3x3_14_b1", "fp16", "h100", "paper6"),
    ("3x3_7_b32", "int8", "h100", "paper6"),
    ("3x3_28_c256_b16", "fp16", "l4", "paper6"),
    ("r50_3x3s2_28", "int8", "h100", "wide"),
    ("3x3_14_b1", "fp16", "a100", "wide"),
    ("vgg_3x3_112_b1", "fp16", "h100", "wide"),
    ("3x3_28_c256_b16", "int8", "h100", "wide"),
]


def best_schedule(task: TaskSpec) -> dict:
    """The whole space's best schedule under the noise-free model."""
    space = ScheduleSpace(task.shape, task.precision, task.target)
    valid = space.valid_indices
    lat = simulate_latency_us(task.shape, task.precision, task.target, space.columns(valid))
    return space.schedule_at(int(valid[int(np.argmin(lat))]))


def record(task: TaskSpec, layer: str, subspace: str, out: Path,
           prefix: str = "sim") -> Path:
    searched = SUBSPACES[subspace]
    best = best_schedule(task)
    fixed = {k: v for k, v in best.items() if k not in searched}
    space = ScheduleSpace(task.shape, task.precision, task.target,
                          restrict={k: [v] for k, v in fixed.items()})
    rows = []
    for i in space.valid_indices:
        sched = space.schedule_at(int(i))
        res = simulated_result(task, sched)
        rows.append({"schedule": sched, "status": res.status, "median_us": res.median_us,
                     "iqr_us": res.iqr_us})
    name = f"{prefix}_{layer}_{task.precision.value}_{task.target.name}_{subspace}"
    meta = {
        "dataset": name, "shape": task.shape.to_dict(), "precision": task.precision.value,
        "target": task.target.name, "gpu": f"{task.target.model} (simulated)",
        "simulated": True, "fixed": fixed, "subspace": list(searched),
        "date": dt.date.today().isoformat(),
    }
    path = out / f"{name}.jsonl.gz"
    write_dataset(path, meta, rows)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/data/replay")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--set", choices=("table", "dev"), default="table",
                    help="table: the ResNet-50 3x3 layers; dev: the development set")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.set == "dev":
        for layer, prec, tname, subspace in DEV_SET:
            task = TaskSpec(DEV_LAYERS[layer], Precision(prec), TARGETS[tname])
            path = record(task, layer, subspace, out, prefix="dev")
            print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")
        return 0
    target = TARGETS[args.target]
    for prec in (Precision.INT8, Precision.FP16):
        for layer, shape in RESNET50_3X3.items():
            task = TaskSpec(shape, prec, target)
            for subspace in SUBSPACES:
                if subspace == "wide" and (layer, prec.value) not in WIDE_FOR:
                    continue
                path = record(task, layer, subspace, out)
                print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
