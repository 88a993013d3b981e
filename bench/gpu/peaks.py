"""Measured ceilings for the roofline floors: mma.sync throughput and device copy bandwidth.

Run on the GPU machine: python -m bench.gpu.peaks  (prints JSON). Each warp issues long
chains of independent mma.sync on register operands (no memory traffic); the copy counts
bytes read plus bytes written. Timed with the shared harness (kernels.timing).
"""

from __future__ import annotations

import json
from typing import Any

MMA_SRC = r"""
extern "C" __global__ void peak_{name}(int iters, int* out) {
  unsigned a0 = threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 ^ 1u, b1 = a0 ^ 2u;
  {acc_t} d[8][4];
  for (int i = 0; i < 8; ++i) for (int j = 0; j < 4; ++j) d[i][j] = 0;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      asm volatile("{instr} {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
                   : "+{c}"(d[i][0]), "+{c}"(d[i][1]), "+{c}"(d[i][2]), "+{c}"(d[i][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  {acc_t} s = 0;
  for (int i = 0; i < 8; ++i) for (int j = 0; j < 4; ++j) s += d[i][j];
  if (s == ({acc_t})12345) out[0] = 1;  // keeps the chains alive
}
"""

KINDS = {
    "int8": ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", "int", "r", 16 * 8 * 32),
    "fp16": ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "float", "f", 16 * 8 * 16),
}


def measure_peaks() -> dict[str, Any]:
    import cupy as cp

    from kernels.timing import time_launches

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = props["multiProcessorCount"]
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    out: dict[str, Any] = {"gpu": name, "sms": sms}
    flag = cp.zeros(1, dtype=cp.int32)
    for kind, (instr, acc_t, c, macs) in KINDS.items():
        src = MMA_SRC.replace("{name}", kind).replace("{acc_t}", acc_t).replace(
            "{instr}", instr).replace("{c}", c).replace("{{", "{").replace("}}", "}")
        fn = cp.RawKernel(src, f"peak_{kind}", options=("-std=c++17",))
        iters, blocks, threads = 4096, sms * 4, 256

        def launch(_i: int, fn: Any = fn, blocks: int = blocks, threads: int = threads,
                   iters: int = iters) -> None:
            fn((blocks,), (threads,), (cp.int32(iters), flag))

        t = time_launches(launch, 1, api="cupy", min_sample_ms=5.0, samples=5)
        ops = 2.0 * macs * 8 * iters * blocks * threads / 32
        out[f"mma_sync_{kind}_tops"] = round(ops / (t.median_us * 1e-6) / 1e12, 1)
    n = 1 << 28  # 256 MiB
    a = cp.ones(n, dtype=cp.uint8)
    b = cp.empty_like(a)

    def copy(_i: int) -> None:
        b[...] = a

    t = time_launches(copy, 1, api="cupy", min_sample_ms=5.0, samples=5)
    out["copy_gbs"] = round(2 * n / (t.median_us * 1e-6) / 1e9, 1)
    return out


if __name__ == "__main__":
    print(json.dumps(measure_peaks()))
