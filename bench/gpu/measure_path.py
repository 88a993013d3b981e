"""Where one measurement's time goes in the measuring process (`kernels.runner.DeviceSession`):
ResNet-50's distinct convs at batch 8, int8 and fp16, three schedules each (the runtime's
default and two random valid ones), measured interleaved by layer as a whole model's jobs
reach one GPU, in two passes (the first makes each layer's reference), then the same order
through a `Runner` child (the service's path: its own session, requests over a pipe).

    python -m bench.gpu.measure_path build --cache C      # CPU: NVRTC, sm_90
    python -m bench.gpu.measure_path run --cache C --out F.json   # GPU

Per pass: milliseconds per measurement, in total and in the session's steps (the timing
harness; the output's check: the comparison, the buffer's values, the expected output in the
buffer's order, or the conversion to NHWC values where a problem has no such order; the
reference, the device inputs, module loads); "rest" is the launch set-up, allocation and
bookkeeping.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.zoo import load_shapes
from kernels.build import BuildJob, build_many, load_meta
from kernels.space import ScheduleSpace
from kernels.spec import TARGETS, ConvShape, Precision


def build_jobs(seed: int = 0) -> list[BuildJob]:
    from kernels.runtime import default_schedule

    shapes = load_shapes()["models"]["resnet50"]["shapes"]
    rng = np.random.default_rng(seed)
    jobs = []
    for entry in shapes:
        shape = ConvShape.from_dict({**entry["shape"], "n": 8})
        for p in (Precision.INT8, Precision.FP16):
            space = ScheduleSpace(shape, p, TARGETS["h200"])
            scheds = [default_schedule(shape, p, "h200")[0],
                      *space.schedules(rng.choice(space.valid_indices, 2, replace=False))]
            jobs += [BuildJob(shape, p, 90, dict(s)) for s in scheds]
    return jobs


def interleaved(cache: str, keys: Sequence[str]) -> list[str]:
    """One schedule of each (layer, precision) in turn."""
    by: dict[tuple[str, str], list[str]] = collections.OrderedDict()
    for key in keys:
        meta = load_meta(cache, key)
        by.setdefault((json.dumps(meta["shape"]), meta["precision"]), []).append(key)
    most = max(len(v) for v in by.values())
    return [ks[i] for i in range(most) for ks in by.values() if i < len(ks)]


def run(cache: str) -> dict[str, Any]:
    from kernels import reference, runner

    spent: dict[str, float] = collections.defaultdict(float)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
        return wrapper

    for name in ("time_launches", "verify_output", "device_values", "from_device_output",
                 "make_problem", "load_function"):
        setattr(runner, name, timed(name, getattr(runner, name)))
    # the expected output in the buffer's order, made once per task (check_buffer)
    reference.Problem.expected_image = timed(  # type: ignore[method-assign]
        "expected_image", reference.Problem.expected_image)
    sess = runner.DeviceSession()
    sess.inputs = timed("inputs", sess.inputs)  # type: ignore[method-assign]
    order = interleaved(cache, json.loads(Path(cache, "keys.json").read_text()))
    passes = []
    for label in ("first (each layer's reference made)", "second"):
        spent.clear()
        statuses: collections.Counter[str] = collections.Counter()
        t0 = time.perf_counter()
        for key in order:
            statuses[sess.measure(cache, key)["status"]] += 1
        wall = time.perf_counter() - t0
        steps = {k: round(1e3 * v / len(order), 2) for k, v in sorted(spent.items())}
        steps["rest"] = round(1e3 * (wall - sum(spent.values())) / len(order), 2)
        passes.append({"pass": label, "ms_per_measurement": round(1e3 * wall / len(order), 2),
                       "steps_ms": steps, "statuses": dict(statuses)})
        print(json.dumps(passes[-1]))
    child = runner.Runner(device=0, with_torch=False)
    try:
        child_ms = []
        for _ in range(2):
            t0 = time.perf_counter()
            for key in order:
                child.measure(cache, key)
            child_ms.append(round(1e3 * (time.perf_counter() - t0) / len(order), 2))
        print(json.dumps({"runner_child_ms_per_measurement": child_ms}))
    finally:
        child.close()
    return {"gpu": sess.gpu_name, "date": time.strftime("%Y-%m-%d"), "measurements": len(order),
            "passes": passes, "runner_child_ms_per_measurement": child_ms}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("build", "run"))
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    if args.what == "build":
        results = build_many(build_jobs(), args.cache)
        keys = [r.key for r in results if r.status == "ok"]
        Path(args.cache, "keys.json").write_text(json.dumps(keys))
        print(f"{len(keys)} of {len(results)} built")
        return 0
    doc = run(args.cache)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
