"""A layer with its residual (ConvShape.residual) is a layer of its own to tune: its key,
validation, build, space, seeds, simulated latency, cuDNN baseline (the conv, then PyTorch's
add) and measurement all see the residual; deploy runs the conv before a block's add with
it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kernels.build import BuildJob, defines
from kernels.space import ScheduleSpace, geometry
from kernels.spec import TARGETS, ConvShape, Precision
from workers.backends.base import TaskSpec
from workers.backends.simulated import cudnn_fp16_us, simulate_latency_us
from workers.seeds import shape_distance

EXPAND = ConvShape(8, 56, 56, 64, 256, 1, 1)  # ResNet-50's first bottleneck's last conv
EXPAND_RES = replace(EXPAND, residual=True)
H200 = TARGETS["h200"]


def test_the_key_and_dict_round_trip_and_keep_the_layers_apart() -> None:
    assert EXPAND_RES.key() == EXPAND.key() + "_res"
    assert ConvShape.from_key(EXPAND_RES.key()) == EXPAND_RES
    assert ConvShape.from_key(EXPAND.key()) == EXPAND
    assert ConvShape.from_dict(EXPAND_RES.to_dict()) == EXPAND_RES
    assert "residual" not in EXPAND.to_dict()  # earlier tasks' stored shapes read the same
    cat = ConvShape(8, 56, 56, 320, 512, 1, 1, stride=2, concat=64)
    assert ConvShape.from_key(cat.key()) == cat
    task = TaskSpec(EXPAND_RES, Precision.INT8, H200)
    assert TaskSpec.from_dict(task.to_dict()) == task
    el = EXPAND_RES.tensor_elements()
    assert el["residual"] == el["output"] == 8 * 56 * 56 * 256
    assert EXPAND.tensor_elements()["residual"] == 0


@pytest.mark.parametrize("precision,shape,field,reason", [
    (Precision.INT4, EXPAND_RES, "residual", "int8 and fp16"),
    (Precision.FP32_TC, EXPAND_RES, "residual", "int8 and fp16"),
    (Precision.INT8, replace(ConvShape(8, 56, 56, 320, 512, 1, 1, stride=2, concat=64),
                             residual=True), "residual", "two inputs"),
])
def test_a_residual_where_no_epilogue_adds_one_is_a_problem(
        precision: Precision, shape: ConvShape, field: str, reason: str) -> None:
    problems = dict(shape.problems(precision, H200))
    assert reason in problems.get(field, ""), problems


def test_int8_and_fp16_residual_layers_have_no_problems() -> None:
    for p in (Precision.INT8, Precision.FP16):
        assert EXPAND_RES.problems(p, H200) == []


def test_the_space_sizes_shared_memory_with_the_residual_tile() -> None:
    """Schedules whose staged output tile leaves no room for the residual's are valid for
    the conv alone and not for the layer with its residual; every schedule valid with the
    residual is valid without it."""
    for p in (Precision.INT8, Precision.FP16):
        plain = set(ScheduleSpace(EXPAND, p, H200).valid_indices.tolist())
        res_space = ScheduleSpace(EXPAND_RES, p, H200)
        with_res = set(res_space.valid_indices.tolist())
        assert with_res < plain
        lost = sorted(plain - with_res)
        cols = res_space.columns(np.array(lost[:50]))
        g = geometry(EXPAND_RES, p, H200, cols)
        assert np.array_equal(g.smem_bytes, geometry(EXPAND, p, H200, cols,
                                                     residual=True).smem_bytes)
        assert np.all((g.smem_bytes > H200.smem_per_block_kib * 1024) |
                      (np.asarray(cols["PERSIST"]) > 0))


def test_a_residual_layer_builds_the_residual_epilogue() -> None:
    space = ScheduleSpace(EXPAND_RES, Precision.INT8, H200)
    sched = space.schedule_at(int(space.valid_indices[0]))
    job = BuildJob(EXPAND_RES, Precision.INT8, 90, sched)
    assert job.epilogue.residual
    d = defines(job)
    assert d["TC_RES"] == 1 and "TC_RES_AHEAD" in d
    assert "TC_RES" not in defines(BuildJob(EXPAND, Precision.INT8, 90, sched))


def test_the_simulated_layer_with_its_residual_is_slower_than_the_conv_alone() -> None:
    for p in (Precision.INT8, Precision.FP16):
        space = ScheduleSpace(EXPAND_RES, p, H200)
        idx = space.valid_indices[:: max(1, len(space.valid_indices) // 200)]
        cols = space.columns(idx)
        res = simulate_latency_us(EXPAND_RES, p, H200, cols)
        plain = simulate_latency_us(EXPAND, p, H200, cols)
        assert np.all(res > plain)
    # ...and so is its modelled baseline: the conv, then a pass over three outputs' bytes.
    assert cudnn_fp16_us(EXPAND_RES, H200) > cudnn_fp16_us(EXPAND, H200) + 3 * \
        EXPAND.gemm_m * EXPAND.k * 2 / (H200.bandwidth_gbs * 1e3)


def test_the_conv_alone_is_the_nearest_other_layer_of_a_residual_layer() -> None:
    assert shape_distance(EXPAND_RES, EXPAND_RES) == 0.0
    assert 0.0 < shape_distance(EXPAND_RES, EXPAND) < \
        shape_distance(EXPAND_RES, ConvShape(8, 56, 56, 64, 128, 1, 1))


@pytest.mark.gpu
def test_runner_checks_and_times_a_residual_layer_and_its_baseline_adds_too(
        tmp_path: object) -> None:
    """The measuring child gives a residual layer its residual inputs (rotated with the
    other inputs), checks the sum, and times it; cuDNN's baseline is the conv, then
    PyTorch's add."""
    import torch

    from kernels.build import build
    from kernels.cudnn import cudnn_baseline
    from kernels.runner import Runner

    r = Runner(device=0)
    try:
        for p in (Precision.INT8, Precision.FP16):
            space = ScheduleSpace(EXPAND_RES, p, H200)
            sched = space.schedule_at(int(space.valid_indices[len(space.valid_indices) // 2]))
            res = build(BuildJob(EXPAND_RES, p, 90, sched), str(tmp_path))
            assert res.status == "ok", res.log[-500:]
            meta_res = res.meta["epilogue"].get("residual")
            m = r.measure(str(tmp_path), res.key)
            assert meta_res and m["status"] == "ok" and m["median_us"] > 0, m
            assert m["detail"]["n_sets"] > 1  # rotated past L2, the residual too
    finally:
        r.close()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    alone, with_res = (cudnn_baseline(s, "fp16", l2) for s in (EXPAND, EXPAND_RES))
    # the add is a pass of its own over three outputs' worth of bytes
    assert with_res.median_us > alone.median_us * 1.1
