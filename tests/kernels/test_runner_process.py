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


def test_trim_lru_drops_the_least_recently_used_down_to_the_budget() -> None:
    from collections import OrderedDict

    from kernels.runner import trim_lru

    cache = OrderedDict((k, size) for k, size in (("a", 5), ("b", 3), ("c", 4)))
    trim_lru(cache, lambda v: v, 12)
    assert list(cache) == ["a", "b", "c"]  # 12 fits
    cache.move_to_end("a")
    trim_lru(cache, lambda v: v, 9)
    assert list(cache) == ["c", "a"]  # b, the least recently used, went first
    trim_lru(cache, lambda v: v, 0, keep=1)
    assert list(cache) == ["a"]  # the newest stays whatever its size
    trim_lru(cache, lambda v: v, 0)
    assert not cache


@pytest.mark.gpu
def test_interleaved_tasks_keep_their_references(tmp_path: object,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole model's jobs reach the measuring process interleaved: each task's reference
    is computed once, not at every switch, and every measurement still checks out."""
    from kernels import runner
    from kernels.build import BuildJob, build
    from kernels.spec import ConvShape, Precision

    made: list[str] = []
    real = runner.make_problem
    monkeypatch.setattr(runner, "make_problem",
                        lambda shape, p, seed: made.append(shape.key()) or real(shape, p, seed))
    sess = runner.DeviceSession()
    sched = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2,
                 CHUNK=2, REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2,
                 SPLIT_K=1, MMA="sync")
    shapes = [ConvShape(8, 14 * i, 14 * i, 64, 64, 3, 3, pad=1) for i in (1, 2, 3, 4, 5)]
    keys = []
    for shape in shapes:
        res = build(BuildJob(shape, Precision.INT8, sess.sm, sched), str(tmp_path))
        assert res.status == "ok", res.log
        keys.append(res.key)
    for _ in range(3):
        for key in keys:
            out = sess.measure(str(tmp_path), key)
            assert out["status"] == "ok", out
    assert sorted(made) == sorted(s.key() for s in shapes)
