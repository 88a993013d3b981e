"""The `cuda` backend: NVRTC builds (CPU) and real measurements on the local GPU.

build() compiles into a shared cubin cache (the artifact is the cache key); measure() hands
the key to a long-lived measurement child process (kernels.runner.Runner) that checks the
kernel against the reference and times it. Failures come back as statuses, never raised.
baseline_us() times the task's cuDNN baseline (store/baselines.py) in the same child with
the same harness (kernels.cudnn); it needs PyTorch, which a GPU worker may lack.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from kernels.build import BuildJob, build
from kernels.spec import Target, target_for_gpu_model
from store.baselines import BASELINE_PRECISION
from workers.backends.base import BuildOutcome, MeasureOutcome, TaskSpec

log = logging.getLogger(__name__)


class CudaBackend:
    name = "cuda"

    def __init__(self, cache_dir: str | os.PathLike[str], device: int = 0,
                 timeout_s: float = 60.0) -> None:
        from kernels.runner import Runner

        self.cache_dir = str(cache_dir)
        os.makedirs(self.cache_dir, exist_ok=True)
        # torch only where it is installed: the measuring child imports it at its start.
        self._has_torch = importlib.util.find_spec("torch") is not None
        self._runner = Runner(device=device, timeout_s=timeout_s, with_torch=self._has_torch)
        self._no_baseline: str | None = None if self._has_torch else "torch is not installed"
        self._warned = False
        self._failed: set[TaskSpec] = set()

    @property
    def gpu_model(self) -> str:
        self._runner.ensure_started()
        return self._runner.gpu_name or "unknown"

    @property
    def target(self) -> Target | None:
        """The Target of the local GPU, from the driver's device name."""
        return target_for_gpu_model(self.gpu_model)

    def prepare(self, items: Sequence[tuple[TaskSpec, dict[str, Any]]]) -> None:
        """Nothing to do ahead (Backend.prepare): each build and measurement is its own."""

    def build(self, task: TaskSpec, schedule: dict[str, Any]) -> BuildOutcome:
        t0 = time.perf_counter()
        res = build(BuildJob(task.shape, task.precision, task.target.sm, schedule), self.cache_dir)
        return BuildOutcome(res.status, artifact=res.key or None, log=res.log[-4000:],
                            seconds=round(time.perf_counter() - t0, 3))

    def measure(self, task: TaskSpec, schedule: dict[str, Any],
                build: BuildOutcome) -> MeasureOutcome:
        if build.status != "ok" or not build.artifact:
            return MeasureOutcome(build.status if build.status != "ok" else "compile_error",
                                  error=(build.log or "no artifact")[-2000:])
        res = self._runner.measure(self.cache_dir, build.artifact)
        detail = dict(res.get("detail") or {})
        detail.setdefault("gpu", self._runner.gpu_name)
        detail["simulated"] = False
        return MeasureOutcome(res["status"], median_us=res.get("median_us"),
                              iqr_us=res.get("iqr_us"), error=res.get("error"), detail=detail)

    def baseline_us(self, task: TaskSpec) -> float | None:
        """cuDNN's latency of the task's layer on this GPU (fp16; fp32 with TF32 off for
        fp32_tc), timed like a candidate. None without torch (logged once per process) or
        for a task whose baseline failed here before (logged when it failed)."""
        if self._no_baseline is None:
            us = self._timed_baseline(task)
            if self._no_baseline is None:
                return us
        if not self._warned:
            self._warned = True
            log.warning("no cuDNN baselines on this worker: %s", self._no_baseline)
        return None

    def _timed_baseline(self, task: TaskSpec) -> float | None:
        if task in self._failed:
            return None
        dtype = BASELINE_PRECISION[task.precision.value]
        res = self._runner.baseline(task.shape, dtype)
        if res["status"] == "unavailable":
            self._no_baseline = res.get("error") or "torch is not available"
            return None
        if res["status"] != "ok" or res.get("median_us") is None:
            # Not retried for every chunk of the task: a failure (an unsupported shape, the
            # memory it needs) would cost each one the child's restart and nothing else.
            self._failed.add(task)
            log.warning("cuDNN %s baseline of %s failed (%s): %s", dtype, task.shape.key(),
                        res["status"], (res.get("error") or "")[-500:])
            return None
        return float(res["median_us"])

    def close(self) -> None:
        self._runner.close()
