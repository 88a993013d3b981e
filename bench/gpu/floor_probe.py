"""What no kernel of a layer can beat in the timing harness: the launch, and moving the layer's
bytes once. Per distinct zoo shape, in one run and one harness (kernels.timing's CUDA graph,
input sets rotating past L2): cuDNN fp16, an empty kernel (one wave), and a copy kernel that
reads the input and the weights and writes an output of the layer's size, 16-byte vectors
over one wave of blocks, for int8 (1 byte per element) and fp16 (2). A conv kernel must do at
least that much traffic, so `copy_int8_us` is a floor for an int8 kernel of the layer; where
0.55 x cuDNN fp16 is below it, the int8 goal (bench/RESULTS.md, "A zoo of real layers")
cannot be met by any kernel of the layer (the copy moves the same bytes with no arithmetic).

  python -m bench.gpu.floor_probe run --models M --batches 8 --out F    # GPU
  python -m bench.gpu.floor_probe table F
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from bench.cli import commands, geomean, log, read_json
from bench.gpu.pipeline_probe import empty_kernel_us
from bench.zoo import add_layer_args, atomic_write, planned
from kernels.spec import ConvShape

INT8_GOAL = 0.55  # the zoo's int8 geomean goal, as a ratio to cuDNN fp16's time
SMS_WAVES = 4     # blocks of 256 threads per SM in the copy's one wave

_COPY = r"""
extern "C" __global__ void __launch_bounds__(256) copy_floor(
    const uint4* __restrict__ x, long long nx, const uint4* __restrict__ w, long long nw,
    uint4* __restrict__ y, long long ny) {
  // Every vector of x and w read once, every vector of y written once. A thread issues all
  // its loads (x and w alike) before its first store, so a layer that fits in one pass pays
  // one memory round trip, as a conv's block loads its tile's operands together.
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long n = nx > ny ? nx : ny;
  n = n > nw ? n : nw;
  for (long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x; i0 < n; i0 += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long i = i0 + u * stride;
      v[u] = i < nx ? __ldg(x + i) : make_uint4(0, 0, 0, 0);
      if (i < nw) {
        const uint4 b = __ldg(w + i);
        v[u].x ^= b.x; v[u].y ^= b.y; v[u].z ^= b.z; v[u].w ^= b.w;
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const long long i = i0 + u * stride;
      if (i < ny) y[i] = v[u];
    }
  }
}
"""


def _vectors(elems: int, bytes_per: int) -> int:
    return -(-elems * bytes_per // 16)


def copy_us(shape: ConvShape, bytes_per: int, l2: int, sms: int) -> float:
    import cupy as cp

    from kernels.timing import sets_for_l2, time_launches

    mod = cp.RawModule(code=_COPY)
    k = mod.get_function("copy_floor")
    nx = _vectors(shape.n * shape.h * shape.w * shape.c, bytes_per)
    nw = _vectors(shape.k * shape.r * shape.s * shape.c, bytes_per)
    ny = _vectors(shape.gemm_m * shape.k, bytes_per)
    sets = sets_for_l2(16 * (nx + nw + ny), l2)
    xs = [cp.zeros(nx * 4, dtype=cp.uint32) for _ in range(sets)]
    ws = [cp.zeros(nw * 4, dtype=cp.uint32) for _ in range(sets)]
    ys = [cp.empty(ny * 4, dtype=cp.uint32) for _ in range(sets)]
    blocks = max(1, min(sms * SMS_WAVES, -(-max(nx, ny, nw) // 256)))
    t = time_launches(lambda i: k((blocks,), (256,), (xs[i], cp.int64(nx), ws[i], cp.int64(nw),
                                                     ys[i], cp.int64(ny))), sets)
    return round(t.median_us, 4)


def run(a: argparse.Namespace) -> int:
    import cupy as cp

    from kernels.cudnn import cudnn_conv_times

    props = cp.cuda.runtime.getDeviceProperties(0)
    sms, l2 = props["multiProcessorCount"], props["l2CacheSize"]
    shapes: dict[str, ConvShape] = {}
    uses: dict[str, list[list[Any]]] = {}
    for g in planned(a):
        shapes.setdefault(g.shape.key(), g.shape)
        uses.setdefault(g.shape.key(), [[u.model, u.count] for u in g.uses])
    doc: dict[str, Any] = {"gpu": props["name"].decode(), "date": dt.date.today().isoformat(),
                           "empty_kernel_us": round(empty_kernel_us(sms), 4), "rows": []}
    log(f"empty kernel ({sms} blocks): {doc['empty_kernel_us']} us")
    for key, sh in shapes.items():
        t = cudnn_conv_times(sh, l2, (("cudnn_fp16_us", "float16", False),))
        row = {"shape": sh.to_dict(), "uses": uses[key],
               "cudnn_fp16_us": round(t["cudnn_fp16_us"], 4),
               "copy_int8_us": copy_us(sh, 1, l2, sms), "copy_fp16_us": copy_us(sh, 2, l2, sms)}
        doc["rows"].append(row)
        log(f"{key}: cuDNN fp16 {row['cudnn_fp16_us']} us, copy int8 {row['copy_int8_us']}, "
            f"fp16 {row['copy_fp16_us']}")
        atomic_write(Path(a.out), json.dumps(doc, indent=1) + "\n")
    return 0


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    rows = doc["rows"]
    f8 = [r["copy_int8_us"] / r["cudnn_fp16_us"] for r in rows]
    f16 = [r["copy_fp16_us"] / r["cudnn_fp16_us"] for r in rows]
    return {"shapes": len(rows), "empty_kernel_us": doc["empty_kernel_us"],
            "copy_int8_over_cudnn_geomean": round(geomean(f8), 3),
            "copy_fp16_over_cudnn_geomean": round(geomean(f16), 3),
            "int8_goal_below_copy": sum(f > INT8_GOAL for f in f8),
            "int8_goal_below_copy_under_5us": sum(
                f > INT8_GOAL for f, r in zip(f8, rows, strict=True) if r["cudnn_fp16_us"] < 5)}


def table(a: argparse.Namespace) -> int:
    doc = read_json(a.file)
    print(json.dumps(summary(doc), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, sub = commands("python -m bench.gpu.floor_probe", __doc__)
    r = sub.add_parser("run", help="time on this machine's GPU")
    add_layer_args(r, batches="8", precisions="int8")
    r.add_argument("--out", required=True)
    t = sub.add_parser("table", help="the summary of a run's file")
    t.add_argument("file")
    a = ap.parse_args(argv)
    return {"run": run, "table": table}[a.cmd](a)


if __name__ == "__main__":
    raise SystemExit(main())
