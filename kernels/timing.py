"""The one timing harness for our kernels and every baseline (docs/design.md, "Measurement
protocol").

`time_launches(launch, n_sets, api=...)`: warm-up, then a CUDA graph of back-to-back launches
(rotating over `n_sets` input sets that together exceed L2), replayed as >= `samples` samples
of >= `min_sample_ms` each, timed with CUDA events; returns the per-launch median and IQR.
`api` is "cupy" (our kernels) or "torch" (cuDNN / torch._int_mm baselines); the protocol,
warm-up, sample sizes and statistics are the same code for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_SAMPLE_MS = 1.0
SAMPLES = 7
MAX_LAUNCHES_PER_GRAPH = 4000
L2_FACTOR = 3  # rotate over sets whose bytes exceed 3x the L2 size


@dataclass
class Timing:
    median_us: float
    iqr_us: float
    samples_us: list[float] = field(default_factory=list)
    launches_per_sample: int = 0
    n_sets: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"median_us": self.median_us, "iqr_us": self.iqr_us,
                "samples_us": self.samples_us, "launches_per_sample": self.launches_per_sample,
                "n_sets": self.n_sets}


def sets_for_l2(bytes_per_set: int, l2_bytes: int, cap: int = 256) -> int:
    """How many input/output sets to rotate over so that one pass does not fit in L2."""
    return int(min(cap, max(2, math.ceil(L2_FACTOR * l2_bytes / max(bytes_per_set, 1)))))


class _Api:
    def __init__(self, api: str) -> None:
        self.api = api
        if api == "cupy":
            import cupy

            self.cp = cupy
            self.stream = cupy.cuda.Stream(non_blocking=True)
        elif api == "torch":
            import torch

            self.torch = torch
            self.stream = torch.cuda.Stream()
        else:
            raise ValueError(api)

    def ctx(self) -> Any:
        return self.stream if self.api == "cupy" else self.torch.cuda.stream(self.stream)

    def event(self) -> Any:
        if self.api == "cupy":
            return self.cp.cuda.Event()
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, ev: Any) -> None:
        if self.api == "cupy":
            ev.record(self.stream)
        else:
            ev.record(self.stream)

    def elapsed_ms(self, a: Any, b: Any) -> float:
        if self.api == "cupy":
            return float(self.cp.cuda.get_elapsed_time(a, b))
        return float(a.elapsed_time(b))

    def sync(self) -> None:
        self.stream.synchronize()

    def capture(self, body: Callable[[], None]) -> Callable[[], None]:
        if self.api == "cupy":
            with self.stream:
                self.stream.begin_capture()
                try:
                    body()
                finally:
                    graph = self.stream.end_capture()
            return lambda: graph.launch(self.stream)
        g = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(g, stream=self.stream):
            body()
        return g.replay


def time_launches(launch: Callable[[int], None], n_sets: int = 1, *, api: str = "cupy",
                  min_sample_ms: float = MIN_SAMPLE_MS, samples: int = SAMPLES,
                  use_graph: bool = True) -> Timing:
    """Time `launch(i)` (enqueue one launch on the current stream using input set i)."""
    a = _Api(api)
    with a.ctx():
        for i in range(max(n_sets, 3)):  # warm-up: module load, algorithm choice, caches
            launch(i % n_sets)
        a.sync()
        # Rough per-launch time from a short un-graphed burst sizes the graph.
        e0, e1 = a.event(), a.event()
        burst = max(n_sets, 20)
        a.record(e0)
        for i in range(burst):
            launch(i % n_sets)
        a.record(e1)
        a.sync()
        est_ms = max(a.elapsed_ms(e0, e1) / burst, 1e-4)
        reps = int(min(MAX_LAUNCHES_PER_GRAPH, max(n_sets, math.ceil(min_sample_ms / est_ms))))
        reps = max(n_sets, (reps // n_sets) * n_sets) if reps >= n_sets else reps

        def body() -> None:
            for i in range(reps):
                launch(i % n_sets)

        run = a.capture(body) if use_graph else body
        run()
        a.sync()
        times: list[float] = []
        for _ in range(samples):
            s0, s1 = a.event(), a.event()
            a.record(s0)
            run()
            a.record(s1)
            a.sync()
            ms = a.elapsed_ms(s0, s1)
            if ms < min_sample_ms * 0.9 and reps < MAX_LAUNCHES_PER_GRAPH:
                # The estimate was off (first-launch effects): grow the sample and redo.
                grown = math.ceil(reps * min_sample_ms / max(ms, 1e-4) * 1.2)
                reps = int(min(MAX_LAUNCHES_PER_GRAPH, grown))
                reps = max(n_sets, (reps // n_sets) * n_sets)
                run = a.capture(body) if use_graph else body
                run()
                a.sync()
                times.clear()
                continue
            times.append(ms * 1000.0 / reps)
        while len(times) < samples:  # after a resize, finish the samples
            s0, s1 = a.event(), a.event()
            a.record(s0)
            run()
            a.record(s1)
            a.sync()
            times.append(a.elapsed_ms(s0, s1) * 1000.0 / reps)
    arr = np.array(times)
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return Timing(float(med), float(q3 - q1), [round(float(t), 4) for t in arr], reps, n_sets)
