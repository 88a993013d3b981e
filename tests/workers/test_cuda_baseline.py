"""The cuDNN baseline of tasks measured on a real GPU (the `cuda` backend).

On a CPU: the cuda backend asks its measuring child for cuDNN fp16 (fp32 for fp32_tc),
without torch it logs once and times nothing, a failure is logged and not retried for the
task; a baseline written by the worker's code path shows in GET /jobs/{id}, GET /schedule,
GET /schedules and POST /schedules/lookup with its name and the speedup (the measuring
child, the one piece that needs a GPU, is a stand-in there); one worker of several times a
task's baseline.

On a GPU (`test_on_gpu_*`, marked gpu, skipped without CuPy, torch and a device): cuDNN is
timed through kernels.cudnn with the candidates' harness, in the measuring child, and the
worker stores it with backend 'cuda':
    python -m pytest -q tests/workers/test_cuda_baseline.py
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from kernels.spec import RESNET50_3X3, TARGETS, ConvShape, Precision
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import Measurement, Task
from store.settings import Settings
from workers import tasks
from workers.backends.base import TaskSpec
from workers.backends.cuda import CudaBackend
from workers.backends.simulated import SimulatedBackend

# torch before anything loads CuPy: on some installs torch's import fails after it
# (docs/design.md, "Measurement protocol"); the conftest's GPU probe imports CuPy after
# collection.
try:
    import torch
except ImportError:  # a GPU worker without torch: only the CPU cases need nothing of it
    torch = None

H100 = TARGETS["h100"]
SMALL = ConvShape(1, 8, 8, 16, 16, 3, 3, pad=(1, 1))  # builds in a tenth of a second
STAGE2 = RESNET50_3X3["stage2"]


class StandInChild:
    """The measuring child (kernels.runner.Runner) where there is no GPU: every request
    recorded, fixed answers."""

    gpu_name = "stand-in"

    def __init__(self, baseline: dict[str, Any] | None = None) -> None:
        self.baseline_result = baseline or {"status": "ok", "median_us": 50.0, "iqr_us": 0.2,
                                            "error": None, "detail": {}}
        self.baselines: list[tuple[ConvShape, str]] = []
        self.measured: list[str] = []

    def ensure_started(self) -> bool:
        return True

    def baseline(self, shape: ConvShape, dtype: str) -> dict[str, Any]:
        self.baselines.append((shape, dtype))
        return dict(self.baseline_result)

    def measure(self, cache_dir: str, key: str, **_: Any) -> dict[str, Any]:
        assert (Path(cache_dir) / f"{key}.cubin").exists(), "measured what was built"
        self.measured.append(key)
        return {"status": "ok", "median_us": 20.0 + 5 * len(self.measured), "iqr_us": 0.1,
                "error": None, "detail": {}}

    def close(self) -> None:
        pass


def cuda_backend(cache: Path, child: StandInChild) -> CudaBackend:
    backend = CudaBackend(cache_dir=cache)
    backend._runner = child  # type: ignore[assignment]
    return backend


# ---- the cuda backend's baseline_us --------------------------------------------------------
@pytest.mark.parametrize("precision,dtype", [("int8", "fp16"), ("fp16", "fp16"),
                                             ("int4", "fp16"), ("fp32_tc", "fp32")])
def test_the_cuda_backend_asks_its_child_for_the_precisions_baseline(
        tmp_path: Path, precision: str, dtype: str) -> None:
    child = StandInChild()
    backend = cuda_backend(tmp_path, child)
    assert backend.baseline_us(TaskSpec(STAGE2, Precision(precision), H100)) == 50.0
    assert child.baselines == [(STAGE2, dtype)]


def test_without_torch_no_baseline_and_one_log_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    backend = CudaBackend(cache_dir=tmp_path)
    assert backend._runner.with_torch is False  # the child does not try to import it
    child = StandInChild()
    backend._runner = child  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="workers.backends.cuda"):
        for precision in (Precision.INT8, Precision.FP32_TC, Precision.INT8):
            assert backend.baseline_us(TaskSpec(STAGE2, precision, H100)) is None
    assert child.baselines == []
    assert [r.getMessage() for r in caplog.records] == [
        "no cuDNN baselines on this worker: torch is not installed"]


def test_a_child_that_cannot_import_torch_turns_baselines_off(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    child = StandInChild({"status": "unavailable", "median_us": None, "iqr_us": None,
                          "error": "ImportError: libcudnn.so.9: cannot open", "detail": {}})
    backend = cuda_backend(tmp_path, child)
    with caplog.at_level(logging.WARNING, logger="workers.backends.cuda"):
        assert backend.baseline_us(TaskSpec(STAGE2, Precision.INT8, H100)) is None
        assert backend.baseline_us(TaskSpec(SMALL, Precision.FP16, H100)) is None
    assert len(child.baselines) == 1, "asked once, then off for the process"
    assert len(caplog.records) == 1 and "libcudnn" in caplog.records[0].getMessage()


def test_a_failed_baseline_is_logged_and_not_retried_for_the_task(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    child = StandInChild({"status": "runtime_error", "median_us": None, "iqr_us": None,
                          "error": "CUDNN_STATUS_NOT_SUPPORTED", "detail": {}})
    backend = cuda_backend(tmp_path, child)
    spec = TaskSpec(STAGE2, Precision.INT8, H100)
    with caplog.at_level(logging.WARNING, logger="workers.backends.cuda"):
        assert tasks._baseline(spec, backend) is None  # what the worker calls
        assert tasks._baseline(spec, backend) is None
    assert len(child.baselines) == 1
    assert "CUDNN_STATUS_NOT_SUPPORTED" in caplog.text
    # Another task still gets its own try.
    child.baseline_result = {"status": "ok", "median_us": 7.5, "iqr_us": 0.1, "error": None,
                             "detail": {}}
    assert tasks._baseline(TaskSpec(SMALL, Precision.INT8, H100), backend) == 7.5


# ---- through the API --------------------------------------------------------------------
def _service(tmp_path: Path) -> tuple[Settings, str]:
    cfg = Settings(data_dir=tmp_path)
    migrate.upgrade(cfg.db_url)
    with session_scope(cfg.db_url) as s:
        token = repo.create_token(s, "t", "tune")
    return cfg, token


def test_a_cuda_tasks_baseline_and_speedup_show_in_every_read(tmp_path: Path) -> None:
    cfg, token = _service(tmp_path)
    child = StandInChild()
    backend = cuda_backend(tmp_path / "cache", child)
    query = dict(n=1, h=8, w=8, c=16, k=16, r=3, s=3, pad=1, precision="int8", target="h100")
    with TestClient(create_app(cfg, dispatcher=False)) as client:
        job = client.post("/tune", headers={"Authorization": f"Bearer {token}"}, json={
            "shape": SMALL.to_dict(), "precision": "int8", "target": "h100", "trials": 3,
            "strategy": "random"}).json()
        before = client.get(f"/jobs/{job['job_id']}").json()
        assert before["task"]["baseline_us"] is None and before["speedup"] is None
        assert before["task"]["baseline"] == "cuDNN fp16"

        # The worker's own code path: lease, baseline, build (NVRTC), measure, write.
        ids = tasks.explore(cfg.db_url, job["job_id"], 3)
        assert tasks.measure_many(cfg.db_url, ids, backend, "gpu0", cfg.lease_s) == 3
        assert child.baselines == [(SMALL, "fp16")] and len(child.measured) == 3

        state = client.get(f"/jobs/{job['job_id']}").json()
        assert state["status"] == "done" and state["simulated"] is False
        assert state["best_us"] == 25.0
        assert state["task"].items() >= {"baseline": "cuDNN fp16", "baseline_us": 50.0,
                                         "baseline_backend": "cuda"}.items()
        assert state["speedup"] == 2.0
        listed = client.get("/jobs").json()[0]
        assert listed["speedup"] == 2.0 and listed["task"]["baseline_us"] == 50.0

        best = client.get("/schedule", params=query).json()
        assert best["latency_us"] == 25.0 and best["backend"] == "cuda"
        assert (best["baseline"], best["baseline_us"], best["baseline_backend"],
                best["speedup"]) == ("cuDNN fp16", 50.0, "cuda", 2.0)

        rows = client.get("/schedules").json()
        assert len(rows) == 1 and rows[0]["speedup"] == 2.0
        assert rows[0]["task"]["baseline_us"] == 50.0
        assert rows[0]["task"]["baseline"] == "cuDNN fp16"
        line = client.get("/schedules", params={"format": "jsonl"}).text
        assert '"speedup": 2.0' in line

        bulk = client.post("/schedules/lookup", json={"layers": [
            {"shape": SMALL.to_dict(), "precision": "int8", "target": "h100"},
            {"shape": SMALL.to_dict(), "precision": "fp32_tc", "target": "h100"}]}).json()
        hit, miss = bulk["results"]
        assert (hit["found"], hit["baseline"], hit["baseline_us"], hit["baseline_backend"],
                hit["speedup"]) == (True, "cuDNN fp16", 50.0, "cuda", 2.0)
        assert (miss["found"], miss["baseline"], miss["baseline_us"], miss["speedup"]) == (
            False, "cuDNN fp32", None, None)


def test_get_schedule_shows_a_baseline_that_came_after_its_cached_answer(tmp_path: Path) -> None:
    """GET /schedule answers from a per-process cache; a baseline written after the best
    schedule (its chunk measured later than another's) still reaches the answer."""
    cfg, token = _service(tmp_path)
    backend = cuda_backend(tmp_path / "cache", StandInChild({
        "status": "runtime_error", "median_us": None, "iqr_us": None, "error": "busy",
        "detail": {}}))
    query = dict(n=1, h=8, w=8, c=16, k=16, r=3, s=3, pad=1, precision="int8", target="h100")
    with TestClient(create_app(cfg, dispatcher=False)) as client:
        job = client.post("/tune", headers={"Authorization": f"Bearer {token}"}, json={
            "shape": SMALL.to_dict(), "precision": "int8", "target": "h100", "trials": 2,
            "strategy": "random"}).json()
        ids = tasks.explore(cfg.db_url, job["job_id"], 2)
        tasks.measure_many(cfg.db_url, ids, backend, "gpu0", cfg.lease_s)
        first = client.get("/schedule", params=query).json()
        assert first["baseline_us"] is None and first["speedup"] is None
        with session_scope(cfg.db_url) as s:
            repo.set_baseline(s, job["task_id"], 60.0, "cuda")
        time.sleep(cfg.schedule_cache_s + 0.1)
        later = client.get("/schedule", params=query).json()
        assert later["baseline_us"] == 60.0
        assert later["speedup"] == round(60.0 / later["latency_us"], 3)


# ---- once per task --------------------------------------------------------------------------
class CountingBaselines(SimulatedBackend):
    """The simulated backend's own baseline, counted; `hold` keeps the first one running
    until it is set (a baseline takes seconds on a GPU)."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        super().__init__(TARGETS["h200"])
        self.calls = 0
        self.started = threading.Event()
        self.hold = hold

    def baseline_us(self, task: TaskSpec) -> float:
        self.calls += 1
        self.started.set()
        if self.hold is not None:
            assert self.hold.wait(60)
        return super().baseline_us(task)


def _job(url: str, trials: int, seed: int = 0) -> int:
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, STAGE2, Precision.INT8, TARGETS["h200"])
        return repo.create_job(s, task, trials, "random", seed).id


def _baseline_of(url: str) -> float | None:
    with session_scope(url) as s:
        return s.scalar(select(Task.baseline_us))


def _measured(url: str) -> list[int]:
    with session_scope(url) as s:
        return list(s.scalars(select(Measurement.id)))


def test_two_workers_on_a_new_tasks_first_round_time_its_baseline_once(db: str) -> None:
    job_id = _job(db, 16)
    ids = tasks.explore_round(db, job_id, 16).ids
    first, second = sorted(ids)[:8], sorted(ids)[8:]
    hold = threading.Event()
    a, b = CountingBaselines(hold), CountingBaselines()
    # Worker A leases the chunk with the job's first open candidate and is still timing
    # the baseline when worker B leases and measures the other chunk.
    worker_a = threading.Thread(target=tasks.measure_chunk, args=(db, first, a, "A", 60))
    worker_a.start()
    try:
        assert a.started.wait(30)
        assert tasks.measure_chunk(db, second, b, "B", 60).written == 8
        assert _baseline_of(db) is None
    finally:
        hold.set()
        worker_a.join(60)
    assert (a.calls, b.calls) == (1, 0)
    assert _baseline_of(db) == SimulatedBackend(TARGETS["h200"]).baseline_us(
        TaskSpec(STAGE2, Precision.INT8, TARGETS["h200"]))

    # Another process (nothing cached) and a second job of the task: read, not timed.
    tasks._baselined.clear()
    tasks._specs.clear()
    job_id = _job(db, 8, seed=1)
    c = CountingBaselines()
    assert tasks.measure_chunk(db, tasks.explore_round(db, job_id, 8).ids, c, "C", 60).written
    assert c.calls == 0


def test_the_worker_with_a_later_chunk_leaves_the_baseline_to_the_first(db: str) -> None:
    job_id = _job(db, 16)
    ids = sorted(tasks.explore_round(db, job_id, 16).ids)
    a, b = CountingBaselines(), CountingBaselines()
    tasks.measure_chunk(db, ids[8:], b, "B", 60)
    assert b.calls == 0 and _baseline_of(db) is None
    tasks.measure_chunk(db, ids[:8], a, "A", 60)
    assert a.calls == 1 and _baseline_of(db) is not None


class FailingOnce(CountingBaselines):
    def baseline_us(self, task: TaskSpec) -> float:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("out of memory")
        return SimulatedBackend.baseline_us(self, task)


def test_a_failed_baseline_is_tried_again_by_the_next_round(db: str) -> None:
    job_id = _job(db, 16)
    backend = FailingOnce()
    tasks.measure_chunk(db, tasks.explore_round(db, job_id, 8).ids, backend, "A", 60)
    assert backend.calls == 1 and _baseline_of(db) is None
    assert len(_measured(db)) == 8, "the results are kept"
    tasks.measure_chunk(db, tasks.explore_round(db, job_id, 8).ids, backend, "A", 60)
    assert backend.calls == 2 and _baseline_of(db) is not None


# ---- on a GPU ----------------------------------------------------------------------------
def _torch_cuda() -> bool:
    return torch is not None and bool(torch.cuda.is_available())


def on_gpu(test: Any) -> Any:
    """Marked `gpu`; skipped too without torch's CUDA (the baseline is timed through it)."""
    return pytest.mark.gpu(pytest.mark.skipif(not _torch_cuda(),
                                              reason="needs torch with CUDA and a GPU")(test))


@on_gpu
def test_on_gpu_cudnn_is_timed_with_the_candidates_harness() -> None:
    from kernels.cudnn import cudnn_baseline
    from kernels.timing import SAMPLES

    assert torch is not None
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flags = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32
    fp16 = cudnn_baseline(STAGE2, "fp16", l2)
    fp32 = cudnn_baseline(STAGE2, "fp32", l2)
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32) == flags
    # fp32 with TF32 off runs on the CUDA cores: several times fp16's Tensor Core time
    # (78 vs 13 us on an H100: bench/RESULTS.md).
    assert fp16.median_us > 0 and fp32.median_us > 2 * fp16.median_us
    for t in (fp16, fp32):
        assert len(t.samples_us) == SAMPLES and t.launches_per_sample >= 1
        assert t.n_sets >= 2, "inputs rotate past L2"
        assert t.iqr_us < 0.5 * t.median_us  # a stable median, not a noisy one


@on_gpu
def test_on_gpu_the_worker_stores_the_cuda_baseline_and_measures_on(tmp_path: Path) -> None:
    cfg, token = _service(tmp_path)
    backend = CudaBackend(cache_dir=tmp_path / "cache")
    try:
        target = backend.target
        if target is None:
            pytest.skip(f"GPU {backend.gpu_model!r} is not a known target")
        spec = TaskSpec(STAGE2, Precision.INT8, target)
        fp16 = backend.baseline_us(spec)
        fp32 = backend.baseline_us(TaskSpec(STAGE2, Precision.FP32_TC, target))
        assert fp16 is not None and fp32 is not None and fp32 > 2 * fp16

        with TestClient(create_app(cfg, dispatcher=False)) as client:
            job = client.post("/tune", headers={"Authorization": f"Bearer {token}"}, json={
                "shape": STAGE2.to_dict(), "precision": "int8", "target": target.name,
                "trials": 4, "strategy": "random"}).json()
            ids = tasks.explore(cfg.db_url, job["job_id"], 4)
            # Timed again for the task (a new process would): then the candidates, in
            # the same child, after cuDNN ran there.
            assert tasks.measure_many(cfg.db_url, ids, backend, "gpu0", cfg.lease_s) == 4
            state = client.get(f"/jobs/{job['job_id']}").json()
    finally:
        backend.close()
    assert state["task"]["baseline_backend"] == "cuda"
    assert state["task"]["baseline_us"] == pytest.approx(fp16, rel=0.25)
    ok = [m for m in state["measurements"] if m["status"] == "ok"]
    assert ok, state["measurements"]
    assert state["speedup"] == round(state["task"]["baseline_us"] / state["best_us"], 3)
