"""The measurement child starts as a plain subprocess, also from a daemonic pool process
(a Celery worker's): on a GPU machine it reports the GPU, elsewhere it says plainly why
there is none."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from kernels.runner import Runner
from tests.conftest import has_gpu

GPU = has_gpu()
without_gpu = pytest.mark.skipif(GPU, reason="a GPU is present: the no-GPU path cannot run")


def _start_runner(_: int) -> tuple[bool, str | None]:
    r = Runner(device=0)
    ok = r.ensure_started()
    r.close()
    return ok, r.start_error


@without_gpu
def test_runner_without_gpu_says_why() -> None:
    ok, err = _start_runner(0)
    assert ok is False
    assert err  # e.g. "ModuleNotFoundError: No module named 'cupy'" or a driver error


@without_gpu
def test_runner_starts_inside_a_daemonic_process_without_gpu() -> None:
    with mp.get_context("fork").Pool(1) as pool:  # pool processes are daemonic
        ok, err = pool.apply(_start_runner, (0,))
    assert ok is False and err and "daemonic" not in err


@pytest.mark.gpu
def test_runner_on_a_gpu_reports_it() -> None:
    r = Runner(device=0)
    try:
        assert r.ensure_started(), r.start_error
        assert r.gpu_name and r.sm and r.sm >= 70
    finally:
        r.close()


@pytest.mark.gpu
def test_runner_starts_inside_a_daemonic_process_on_a_gpu() -> None:
    with mp.get_context("spawn").Pool(1) as pool:  # spawn: no CUDA state forked
        ok, err = pool.apply(_start_runner, (0,))
    assert ok is True, err


def test_the_measuring_child_runs_one_thread_per_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two measuring children with a BLAS pool each as wide as the host made measurements
    1.5x slower on a 2-GPU node: the child's pools are one thread unless the caller chose."""
    from kernels.runner import SINGLE_THREAD_ENV, child_env

    for name in SINGLE_THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = child_env()
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"


@pytest.mark.gpu
def test_runner_checks_and_times_a_layer_over_two_inputs(tmp_path: object) -> None:
    """The service's measuring child gives a layer over two inputs (ConvShape.concat) its x1:
    a right schedule checks ok and is timed; its cuDNN baseline is the two layers it
    replaces."""
    from kernels.build import BuildJob, build
    from kernels.spec import ConvShape, Precision

    shape = ConvShape(8, 28, 28, 384, 256, 1, 1, stride=2, concat=128)
    sched = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2,
                 CHUNK=2, REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4,
                 SPLIT_K=1, MMA="wgmma")
    r = Runner(device=0)
    try:
        for p in (Precision.INT8, Precision.FP16):
            res = build(BuildJob(shape, p, 90, sched), str(tmp_path))
            assert res.status == "ok", res.log[-500:]
            m = r.measure(str(tmp_path), res.key)
            assert m["status"] == "ok" and m["median_us"] > 0, m
    finally:
        r.close()
    import torch

    from kernels.cudnn import cudnn_baseline

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    parts = [cudnn_baseline(ConvShape(8, 14, 14, 128, 256, 1, 1), "fp16", l2),
             cudnn_baseline(ConvShape(8, 28, 28, 256, 256, 1, 1, stride=2), "fp16", l2)]
    both = cudnn_baseline(shape, "fp16", l2)
    assert 0.8 < both.median_us / sum(t.median_us for t in parts) < 1.25  # run to run
