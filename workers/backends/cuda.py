"""The `cuda` backend: NVRTC builds (CPU) and real measurements on the local GPU.

build() compiles into a shared cubin cache (the artifact is the cache key); measure() hands
the key to a long-lived measurement child process (kernels.runner.Runner) that checks the
kernel against the reference and times it. Failures come back as statuses, never raised.
"""

from __future__ import annotations

import os
import time
from typing import Any

from kernels.build import BuildJob, build
from kernels.spec import Target, target_for_gpu_model
from workers.backends.base import BuildOutcome, MeasureOutcome, TaskSpec


class CudaBackend:
    name = "cuda"

    def __init__(self, cache_dir: str | os.PathLike[str], device: int = 0,
                 timeout_s: float = 60.0) -> None:
        from kernels.runner import Runner

        self.cache_dir = str(cache_dir)
        os.makedirs(self.cache_dir, exist_ok=True)
        self._runner = Runner(device=device, timeout_s=timeout_s)

    @property
    def gpu_model(self) -> str:
        self._runner.ensure_started()
        return self._runner.gpu_name or "unknown"

    @property
    def target(self) -> Target | None:
        """The Target of the local GPU, from the driver's device name."""
        return target_for_gpu_model(self.gpu_model)

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

    def close(self) -> None:
        self._runner.close()
