"""A max-pool in the conv's epilogue (ConvShape.pool; kernels/conv.cu: POOL) on a CPU: the
layer's key and rules, the tiling of its pool outputs (kernels.space.pool_tiling), its
geometry and schedule rules, its builds for sm_75 / sm_80 / sm_90 with the Tensor Core
instructions they should hold, and the reference. The GPU check is `on_gpu` below and
bench/kernels_check.py (`--pool-count`)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kernels import reference as ref
from kernels.build import BuildJob, Epilogue, defines
from kernels.runtime import Conv2d
from kernels.space import ScheduleSpace, geometry, pool_tiling, schedule_columns
from kernels.spec import ConvShape, Precision, get_target, pixel_pairs
from tests.kernels.builds import assert_all_compile, assert_mma_and_copy, sass_of
from tests.kernels.test_runtime import on_gpu

STEM = ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3, pool=(3, 2, 1))
SMALL = ConvShape(2, 29, 33, 3, 40, 7, 7, stride=2, pad=3, pool=(3, 2, 1))
SYNC = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=2, WARP_ROW_TILES=2, WARP_COL_TILES=2, CHUNK=2,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1,
            FOLD_TAPS=1)
WG = {**SYNC, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 2,
      "WARP_COL_TILES": 2, "STAGES": 4, "MMA": "wgmma"}
SM_TARGET = {75: "t4", 80: "a100", 90: "h100"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pool")


def test_a_pooled_layer_has_its_own_key_and_the_pools_output() -> None:
    assert STEM.key().endswith("_mp3s2p1") and ConvShape.from_key(STEM.key()) == STEM
    assert ConvShape.from_dict(STEM.to_dict()) == STEM
    assert (STEM.p, STEM.q, STEM.out_h, STEM.out_w) == (112, 112, 56, 56)
    plain = replace(STEM, pool=(0, 0, 0))
    assert not plain.pooled and (plain.out_h, plain.out_w) == (112, 112)
    assert "pool" not in plain.to_dict() and "_mp" not in plain.key()
    assert STEM.tensor_elements()["output"] == 8 * 56 * 56 * 64
    # a stem over pixel pairs keeps its pool (the pair layer's output is the stem's)
    paired = pixel_pairs(STEM, 4)
    assert paired is not None and paired[0].pool == STEM.pool
    assert (paired[0].p, paired[0].q) == (112, 112)


@pytest.mark.parametrize("shape,precision,field", [
    (replace(STEM, pool=(3, 4, 1)), "int8", "stride <= kernel"),
    (replace(STEM, pool=(3, 2, 2)), "int8", "2 * pad <= kernel"),
    (replace(STEM, pool=(9, 2, 1)), "int8", "kernel <= 4"),
    (replace(STEM, c=32), "int8", "few channels"),
    (replace(STEM, c=9), "fp16", "few channels"),
    (replace(STEM, k=6), "int8", "4-byte words"),
    (replace(STEM, residual=True), "int8", "no residual"),
    (STEM, "int4", "int8 and fp16"),
    (ConvShape(1, 7, 7, 3, 16, 7, 7, pool=(3, 2, 0)), "int8", "does not fit"),
])
def test_layers_the_pool_cannot_run_say_why(shape: ConvShape, precision: str,
                                            field: str) -> None:
    problems = dict(shape.problems(Precision(precision)))
    assert field in problems.get("pool", "") + problems.get("shape", ""), problems


@pytest.mark.parametrize("shape", [STEM, SMALL, replace(SMALL, pool=(2, 2, 0)),
                                   replace(SMALL, pool=(4, 3, 2)),
                                   replace(SMALL, pool=(3, 1, 1))])
@pytest.mark.parametrize("bm", [64, 128, 256])
def test_pool_tiles_cover_the_output_with_their_patch_within_the_block(
        shape: ConvShape, bm: int) -> None:
    t = pool_tiling(shape, bm)
    assert t is not None
    k, st, _ = shape.pool
    assert (t.patch_rows, t.patch_cols) == ((t.rows - 1) * st + k, (t.cols - 1) * st + k)
    assert t.patch_rows * t.patch_cols <= bm
    assert t.tiles_per_image == math.ceil(shape.out_h / t.rows) * math.ceil(shape.out_w / t.cols)
    # no tiling of the same patch budget has fewer tiles
    for rows in range(1, shape.out_h + 1):
        for cols in range(1, shape.out_w + 1):
            if ((rows - 1) * st + k) * ((cols - 1) * st + k) <= bm:
                assert math.ceil(shape.out_h / rows) * math.ceil(shape.out_w / cols) >= \
                    t.tiles_per_image
    assert pool_tiling(shape, k * k - 1) is None


def test_the_pool_runs_on_the_folded_taps_one_tile_a_block() -> None:
    h100 = get_target("h100")
    space = ScheduleSpace(STEM, Precision.INT8, h100)
    assert space.is_valid(SYNC) and space.is_valid(WG)
    for bad in ({"FOLD_TAPS": 0}, {"SPLIT_K": 2}, {"PACK_OUT": 0}, {"PERSIST": 1}):
        assert not space.is_valid({**SYNC, **bad}), bad
    assert not space.is_valid({**WG, "PACK_OUT": 2, "TMA": 1})
    # every valid schedule of the space folds its taps and stores through the staged tile
    cols = space.columns(space.valid_indices)
    assert len(space.valid_indices) > 100
    assert set(cols["FOLD_TAPS"]) == {1} and set(cols["PACK_OUT"]) == {1}
    assert set(cols["SPLIT_K"]) == {1}


@pytest.mark.parametrize("schedule", [SYNC, WG])
def test_the_grid_is_the_pool_tiles_and_the_build_says_them(schedule: dict) -> None:
    h100 = get_target("h100")
    g = geometry(STEM, Precision.INT8, h100, schedule_columns(schedule))
    t = pool_tiling(STEM, int(g.block_m[0]))
    assert t is not None
    assert int(g.grid_blocks[0]) == STEM.n * t.tiles_per_image * math.ceil(64 / int(g.block_n[0]))
    d = defines(BuildJob(STEM, Precision.INT8, 90, schedule))
    assert (d["TC_POOL_K"], d["TC_POOL_S"], d["TC_POOL_P"]) == STEM.pool
    assert (d["TC_POOL_TR"], d["TC_POOL_TC"]) == (t.rows, t.cols)
    assert "TC_POOL_K" not in defines(BuildJob(replace(STEM, pool=(0, 0, 0)), Precision.INT8, 90,
                                               schedule))
    with pytest.raises(ValueError, match="int8 or fp16 values"):
        defines(BuildJob(STEM, Precision.INT8, 90, schedule, Epilogue("acc")))


@pytest.mark.parametrize("sm", [75, 80, 90])
def test_pooled_layers_compile_on_every_target(cache: Path, sm: int) -> None:
    rng = np.random.default_rng(sm)
    t = get_target(SM_TARGET[sm])
    jobs = []
    for shape in (SMALL, replace(SMALL, pool=(2, 2, 0), c=4, k=24)):
        for p in (Precision.INT8, Precision.FP16):
            space = ScheduleSpace(shape, p, t)
            for i in rng.choice(space.valid_indices, size=3, replace=False):
                jobs.append(BuildJob(shape, p, sm, space.schedule_at(int(i)),
                                     Epilogue(relu=bool(i % 2))))
    assert_all_compile(jobs, cache)


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("sm,schedule,mma,copy", [
    (80, SYNC, "IMMA", "LDGSTS"), (90, WG, "GMMA", "LDGSTS"), (75, SYNC, "IMMA", "LDG")])
def test_pooled_builds_hold_their_matrix_instructions_and_no_spill(
        cache: Path, sm: int, schedule: dict, mma: str, copy: str) -> None:
    s = sass_of(BuildJob(STEM, Precision.INT8, sm, schedule, Epilogue(relu=True)), cache)
    assert_mma_and_copy(s, mma, copy)
    # the pool's maximum of int8 lanes: the SIMD byte max (VIMNMX on sm_90, emulated before)
    if sm == 90:
        assert "VIMNMX" in s.text


def test_the_reference_pools_the_epilogues_output_as_pytorch() -> None:
    torch = pytest.importorskip("torch")
    for precision in (Precision.INT8, Precision.FP16):
        prob = ref.make_problem(SMALL, precision, seed=4)
        mode = "requant" if precision.is_integer else "bias"
        got = prob.expected(mode, relu=False)
        flat = ref.make_problem(replace(SMALL, pool=(0, 0, 0)), precision, seed=4)
        conv = flat.expected(mode, relu=False)
        if not precision.is_integer:
            conv = conv.astype(np.float16).astype(np.float64)
        nchw = torch.from_numpy(np.array(conv)).permute(0, 3, 1, 2).double()
        want = torch.nn.functional.max_pool2d(nchw, 3, 2, 1).permute(0, 2, 3, 1)
        assert got.shape == (2, SMALL.out_h, SMALL.out_w, 40)
        assert np.array_equal(got, want.numpy())
        # the padding is never the maximum: all-negative windows keep their values
        assert got.min() < 0


@on_gpu
@pytest.mark.parametrize("precision,schedule", [
    ("int8", SYNC), ("fp16", SYNC), ("int8", WG), ("fp16", WG)])
def test_on_gpu_the_pooled_layer_equals_the_reference(cache: Path, precision: str,
                                                      schedule: dict) -> None:
    """The pooled stem of a small batch from CuPy, with and without its ReLU, against the
    reference's pool of the epilogue's values (exact for int8, fp16 within its check)."""
    import cupy

    for relu in (False, True):
        op = Conv2d(SMALL, precision, schedule, "h100" if "MMA" in schedule else None,
                    relu=relu, cache_dir=cache)
        prob = ref.make_problem(SMALL, Precision(precision), seed=11)
        x, w = ref.pad_channels(prob.x, op.padded_channels), \
            ref.pad_channels(prob.w, op.padded_channels)
        y = op(*(None if a is None else cupy.asarray(a) for a in
                 (x, w, prob.scale if op.needs_scale else None, prob.bias)))
        assert tuple(y.shape) == op.output_shape == (2, SMALL.out_h, SMALL.out_w, 40)
        got = cupy.asnumpy(y).astype(np.float64 if precision == "fp16" else np.int64)
        ok, stats = ref.check_output(got, prob.expected(op.epilogue.mode, relu),
                                     Precision(precision), 16 if precision == "fp16" else 8)
        assert ok, stats
