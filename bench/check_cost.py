"""The CPU cost of checking one candidate's output, as the measuring process does it: the
output buffer against the expected output in the buffer's own order (`Problem.expected_image`,
made once per task) and, as before it, converted to NHWC values first (`from_device_output`,
still the path of int4, fp32 outputs and fp32_tc). ResNet-50's distinct convs at batch 8,
int8 (requantized) and fp16 (bias), the right output of each as the kernel would write it
(NHWC layout); median of 5 checks each, on this machine's CPU.

    python -m bench.check_cost [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.zoo import load_shapes
from kernels.reference import Problem, make_problem, to_device_bytes
from kernels.runner import check_buffer, check_values
from kernels.spec import ConvShape, Precision

CASES = ((Precision.INT8, "requant", 8), (Precision.FP16, "bias", 16))


def _median_ms(fn: Callable[[], tuple[bool, Any]], repeat: int = 5) -> float:
    fn()  # the task's expected image is made once, before its candidates
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ok, stats = fn()
        times.append(time.perf_counter() - t0)
        assert ok, stats
    return round(1e3 * float(np.median(times)), 3)


def in_buffer_order(prob: Problem, buf: np.ndarray, mode: str, bits: int
                    ) -> tuple[bool, Any]:
    """As the measuring process checks (kernels/runner.py: DeviceSession.measure)."""
    return check_buffer(prob, buf, mode, True, False, "nhwc", bits)


def nhwc_values(prob: Problem, buf: np.ndarray, mode: str, bits: int) -> tuple[bool, Any]:
    """As before the buffer-order check (still the path of the outputs without that order)."""
    return check_values(prob, buf, mode, True, False, "nhwc", bits)


def rows() -> list[dict[str, Any]]:
    out = []
    for entry in load_shapes()["models"]["resnet50"]["shapes"]:
        shape = ConvShape.from_dict({**entry["shape"], "n": 8})
        for prec, mode, bits in CASES:
            prob = make_problem(shape, prec)
            want = prob.expected(mode, True)
            buf = to_device_bytes(want.astype(np.int8 if bits == 8 else np.float16), prec,
                                  "nhwc", 128 // bits)
            out.append({"shape": shape.key(), "precision": prec.value,
                        "elements": int(want.size),
                        "buffer_order_ms": _median_ms(partial(in_buffer_order, prob, buf, mode,
                                                              bits)),
                        "nhwc_values_ms": _median_ms(partial(nhwc_values, prob, buf, mode,
                                                             bits))})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    data = rows()
    summary = {}
    for prec in ("int8", "fp16", "both"):
        part = [r for r in data if prec in ("both", r["precision"])]
        summary[prec] = {k: round(float(np.mean([r[k] for r in part])), 2)
                         for k in ("buffer_order_ms", "nhwc_values_ms")}
        largest = max(part, key=lambda r: r["elements"])
        summary[prec]["largest"] = {k: largest[k] for k in
                                    ("shape", "elements", "buffer_order_ms", "nhwc_values_ms")}
        print(prec, json.dumps(summary[prec]))
    if args.out:
        doc = {"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
               platform.machine(), "command": "python -m bench.check_cost --out " + str(args.out),
               "summary": summary, "rows": data}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
