"""Guarantee: every candidate is checked against the reference before its time is stored.

Without a GPU the check-then-time path runs with the CPU reference standing in for the
kernel's output and a fake timing callable: `verify_output` (the check of every precision)
must refuse a wrong, unwritten or non-finite output, `check_then_time` must not time what
failed the check, and the cuda backend's results must reach the database that way (a
wrong candidate stored as `wrong` without a latency). On a GPU (`gpu`) the same path runs
on a real build whose reference is made wrong on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from kernels.build import cubin_path
from kernels.reference import (
    Problem,
    from_device_output,
    make_problem,
    to_device_bytes,
)
from kernels.runner import (
    POISON,
    check_buffer,
    check_then_time,
    check_values,
    fp32_tc_abs_ref,
    verify_output,
)
from kernels.spec import RESNET50_3X3, TARGETS, ConvShape, Precision
from kernels.timing import Timing
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import BestSchedule, Measurement
from workers import tasks

pytestmark = pytest.mark.guarantee

SHAPE = ConvShape(2, 6, 7, 8, 16, 3, 3, pad=1)
# precision -> (epilogue mode, output bits): what the kernel writes for each.
OUTPUTS = {"int8": ("requant", 8), "int4": ("requant", 4), "fp16": ("bias", 16),
           "fp32_tc": ("bias", 32)}


def _case(precision: str) -> tuple[Problem, np.ndarray, Precision, int, str]:
    prec = Precision(precision)
    mode, bits = OUTPUTS[precision]
    prob = make_problem(SHAPE, prec, seed=7)
    return prob, prob.expected(mode, False), prec, bits, mode


def _device_image(values: np.ndarray, prec: Precision, bits: int) -> np.ndarray:
    """The bytes a correct kernel writes for `values` (NHWC), read back as the check does."""
    if bits == 32:
        buf = np.ascontiguousarray(values.astype(np.float32)).view(np.uint8).reshape(-1)
    else:
        buf = to_device_bytes(values, prec, "nhwc", 128 // bits)
    return from_device_output(buf, SHAPE, bits, prec, "nhwc")


def _verify(precision: str, got: np.ndarray) -> tuple[bool, dict[str, Any]]:
    prob, want, prec, bits, mode = _case(precision)
    abs_ref = fp32_tc_abs_ref(prob, mode) if prec is Precision.FP32_TC else None
    return verify_output(got, want, prec, bits, SHAPE.gemm_k, abs_ref)


def _wrong_outputs(precision: str) -> dict[str, np.ndarray]:
    _, want, prec, bits, _ = _case(precision)
    good = _device_image(want, prec, bits)
    off = good.copy()
    i = np.unravel_index(np.argmax(np.abs(good)), good.shape)
    if prec.is_integer:  # one step: an exact check sees it
        off[i] = off[i] - 1 if off[i] > -(2 ** (bits - 1)) else off[i] + 1
    else:  # one element 10% off: far beyond any tolerance
        off[i] = off[i] * 1.1 + 0.1
    poisoned = np.full(SHAPE.n * SHAPE.p * SHAPE.q * SHAPE.k * bits // 8, POISON, np.uint8)
    out = {"one element off": off,
           "never written (poison)": from_device_output(poisoned, SHAPE, bits, prec, "nhwc"),
           "zeros": np.zeros_like(good)}
    if not prec.is_integer:
        nan = good.copy()
        nan[i] = np.nan
        out["a NaN"] = nan
    return out


@pytest.mark.parametrize("precision", list(OUTPUTS))
def test_the_check_accepts_the_reference_output(precision: str) -> None:
    _, want, prec, bits, _ = _case(precision)
    ok, stats = _verify(precision, _device_image(want, prec, bits))
    assert ok, stats


@pytest.mark.parametrize("precision", list(OUTPUTS))
def test_the_check_refuses_wrong_outputs(precision: str) -> None:
    for what, got in _wrong_outputs(precision).items():
        ok, stats = _verify(precision, got)
        assert not ok, f"{precision}: an output with {what} passed the check ({stats})"


class FakeTimer:
    """Stands in for kernels.timing.time_launches: counts calls, returns a fixed time."""

    def __init__(self, us: float = 5.0) -> None:
        self.calls = 0
        self.us = us

    def __call__(self) -> Timing:
        self.calls += 1
        return Timing(self.us, 0.1, [self.us] * 5, 100, 2)


@pytest.mark.parametrize("precision", list(OUTPUTS))
def test_check_then_time_times_only_what_passed(precision: str) -> None:
    _, want, prec, bits, _ = _case(precision)
    for what, got in _wrong_outputs(precision).items():
        timer = FakeTimer()
        res = check_then_time(lambda got=got: _verify(precision, got), timer, {})
        assert res["status"] == "wrong", what
        assert res["median_us"] is None and timer.calls == 0, f"{what}: timed anyway"
    timer = FakeTimer(3.25)
    res = check_then_time(lambda: _verify(precision, _device_image(want, prec, bits)), timer,
                          {"gpu": "cpu"})
    assert res["status"] == "ok" and res["median_us"] == 3.25 and timer.calls == 1
    assert res["detail"]["check"] is not None and res["detail"]["gpu"] == "cpu"
    # Check only (time_it=False): no timing, no latency.
    timer = FakeTimer()
    res = check_then_time(lambda: _verify(precision, _device_image(want, prec, bits)), None, {})
    assert res["status"] == "ok" and res["median_us"] is None and timer.calls == 0


class CpuRunner:
    """The cuda backend's measuring process with the CPU reference as its kernel: a build
    whose meta says `wrong` writes an output one step off."""

    gpu_name = "cpu reference"

    def __init__(self) -> None:
        self.timer = FakeTimer(4.0)

    def measure(self, cache_dir: str, key: str, **_: Any) -> dict[str, Any]:
        meta = json.loads((Path(cache_dir) / f"{key}.json").read_text())
        _, want, prec, bits, _ = _case("int8")
        got = _device_image(want, prec, bits)
        if meta["wrong"]:
            got = _wrong_outputs("int8")["one element off"]
        return check_then_time(lambda: _verify("int8", got), self.timer, {"gpu": self.gpu_name})

    def close(self) -> None:
        pass


def test_a_wrong_candidate_is_stored_without_a_time_and_never_best(tmp_path: Path) -> None:
    from workers.backends.cuda import CudaBackend

    url = f"sqlite:///{tmp_path / 'g.db'}"
    migrate.upgrade(url)
    cache = tmp_path / "cubins"
    backend = CudaBackend(cache)
    runner = CpuRunner()
    backend._runner = runner  # type: ignore[assignment]
    shape, h200 = RESNET50_3X3["stage3"], TARGETS["h200"]
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, shape, Precision.INT8, h200)
        job_id = repo.create_job(s, task, 8, "random", 0).id
    ids = tasks.explore_round(url, job_id, 8).ids
    wrong = set(ids[::2])
    for cid in ids:  # "built": a cubin and its meta in the worker's cache
        key = f"k{cid}"
        cubin_path(cache, key).write_bytes(b"\0")
        (cache / f"{key}.json").write_text(json.dumps({"wrong": cid in wrong}))
    with session_scope(url) as s:
        repo.record_builds(s, [(cid, "ok", f"k{cid}", "") for cid in ids])
    assert tasks.measure_chunk(url, ids, backend, "gpu0", 60).written == len(ids)
    assert runner.timer.calls == len(ids) - len(wrong), "only checked-ok candidates are timed"
    with session_scope(url) as s:
        rows = {m.id: m for m in s.scalars(select(Measurement))}
        by_status: dict[str, list[Measurement]] = {}
        for m in rows.values():
            by_status.setdefault(m.status, []).append(m)
        best = s.get(BestSchedule, task.id)
        assert len(by_status["wrong"]) == len(wrong)
        assert all(m.median_us is None and "differs" in (m.error or "")
                   for m in by_status["wrong"])
        assert all(m.median_us == 4.0 for m in by_status["ok"])
        assert best is not None and rows[best.measurement_id].status == "ok"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_on_gpu_a_kernel_that_disagrees_with_the_reference_is_not_timed(
        precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real build, measured by DeviceSession: with the reference moved by one step the
    result is `wrong` and nothing is timed; with the true reference it is timed."""
    from kernels import runner as runner_mod
    from kernels.build import BuildJob, build
    from kernels.runtime import default_schedule
    from kernels.spec import target_for_gpu_model

    shape = ConvShape(8, 14, 14, 64, 64, 3, 3, pad=1)
    sess = runner_mod.DeviceSession(0)
    target = target_for_gpu_model(sess.gpu_name)
    assert target is not None, f"{sess.gpu_name} is not a known target"
    sched, _ = default_schedule(shape, precision, target)
    res = build(BuildJob(shape, Precision(precision), target.sm, sched), tmp_path)
    assert res.status == "ok", res.log[-500:]
    timed: list[int] = []
    real_time = runner_mod.time_launches
    monkeypatch.setattr(runner_mod, "time_launches",
                        lambda *a, **k: timed.append(1) or real_time(*a, **k))
    good = sess.measure(str(tmp_path), res.key, samples=5)
    assert good["status"] == "ok" and good["median_us"] > 0 and timed == [1]
    expected, image = Problem.expected, Problem.expected_image

    def off_by_one(self: Problem, *a: Any, **k: Any) -> np.ndarray:
        return expected(self, *a, **k) + 1

    def image_off_by_one(self: Problem, *a: Any, **k: Any) -> np.ndarray | None:
        out = image(self, *a, **k)  # the buffer-order reference the session compares with
        return None if out is None else out + 1

    monkeypatch.setattr(Problem, "expected", off_by_one)
    monkeypatch.setattr(Problem, "expected_image", image_off_by_one)
    bad = sess.measure(str(tmp_path), res.key, samples=5)
    assert bad["status"] == "wrong" and bad["median_us"] is None and timed == [1]


@pytest.mark.parametrize("layout", ["nhwc", "nhwcnc"])
@pytest.mark.parametrize(("precision", "mode", "bits"), [
    ("int8", "requant", 8), ("fp16", "bias", 16), ("int8", "acc", 32), ("int4", "acc", 32)])
def test_the_check_in_the_buffers_order_agrees_with_the_nhwc_check(
        precision: str, mode: str, bits: int, layout: str) -> None:
    """The measuring process compares the output buffer's elements with the expected output
    in the buffer's own order (`Problem.expected_image`): for every output, right or wrong,
    the same verdict and the same figures as the check of its NHWC values."""
    from kernels.reference import device_values, nhwc_to_nhwcnc

    shape = ConvShape(8, 5, 6, 16, 32, 3, 3, pad=1)  # NHWCnc: N and K in whole blocks
    prec = Precision(precision)
    prob = make_problem(shape, prec, seed=3)
    want = prob.expected(mode, True)
    vals = want.astype(np.int32 if bits == 32 else np.float16 if bits == 16 else np.int8)
    if bits == 32:  # raw accumulators: four int32 to a 16-byte vector
        laid = nhwc_to_nhwcnc(vals, 4) if layout == "nhwcnc" else vals
        good = np.ascontiguousarray(laid).view(np.uint8).reshape(-1)
    else:
        good = to_device_bytes(vals, Precision.FP16 if bits == 16 else Precision.INT8, layout,
                               128 // bits)
    image = prob.expected_image(mode, True, False, layout, bits)
    assert image is not None and not image.flags.writeable
    bufs = {"right": good, "never written (poison)": np.full_like(good, POISON),
            "zeros": np.zeros_like(good)}
    off = good.copy()
    v = device_values(off, bits, prec)
    i = int(np.argmax(np.abs(v.astype(np.float64))))
    v[i] = v[i] * 1.1 + 0.1 if bits == 16 else v[i] - 1
    bufs["one element off"] = off
    if bits == 16:
        nan = good.copy()
        device_values(nan, bits, prec)[i] = np.nan
        bufs["a NaN"] = nan
    for what, buf in bufs.items():
        fast = check_buffer(prob, buf, mode, True, False, layout, bits)
        slow = check_values(prob, buf, mode, True, False, layout, bits)
        assert fast[0] == slow[0] == (what == "right"), (what, fast, slow)
        assert fast[1].keys() == slow[1].keys()
        for key, value in slow[1].items():  # the sums' order differs in NHWCnc
            assert fast[1][key] == pytest.approx(value, rel=1e-12, nan_ok=True), (what, key)
