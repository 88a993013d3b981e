"""SWAP_AB on a CPU: a warpgroup's tile issued as instructions of 64 output channels (the
weights as wgmma's A) by all its pixels (B). Where it is valid, that it changes nothing the
launch or the shared memory sees, its static_asserts, and its sm_90 builds: fewer, wider
wgmma instructions, every path compiling without spills. The GPU checks are in
test_runtime.py (`on_gpu`) and bench/kernels_check.py (`--restrict SWAP_AB=1`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, Epilogue, build, defines, launch_meta
from kernels.sass import cuobjdump_path
from kernels.space import ScheduleSpace, geometry
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.builds import assert_all_compile, sass_of
from tests.kernels.test_kernels_fold_residual import cols_of

H100 = get_target("h100")
REDUCE = ConvShape(8, 56, 56, 256, 64, 1, 1)  # ResNet-50's 1x1 reduce: 64 output channels
# one warpgroup of 128 pixels x 64 channels: two m64n64 instructions, or one m64n128 swapped
SW = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=2, WARP_COL_TILES=2, CHUNK=2,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
          MMA="wgmma", TMA=0, SWAP_AB=1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("swap_ab")


def test_the_block_and_its_memory_are_those_of_the_unswapped_tile() -> None:
    plain = {**SW, "SWAP_AB": 0}
    g0 = geometry(REDUCE, Precision.INT8, H100, cols_of(plain))
    g1 = geometry(REDUCE, Precision.INT8, H100, cols_of(SW))
    for f in ("block_m", "block_n", "smem_bytes", "block_threads", "acc_regs", "grid_blocks"):
        assert np.array_equal(getattr(g0, f), getattr(g1, f)), f
    job = BuildJob(REDUCE, Precision.INT8, 90, SW)
    assert defines(job)["TC_SWAP_AB"] == 1
    assert defines(BuildJob(REDUCE, Precision.INT8, 90, plain))["TC_SWAP_AB"] == 0
    assert launch_meta(job, defines(job))["block"] == [128, 1, 1]


def test_valid_for_whole_64_channel_instructions_of_a_wgmma_width() -> None:
    space = ScheduleSpace(REDUCE, Precision.INT8, H100, restrict={"SWAP_AB": [1]})
    scheds = space.schedules(space.valid_indices)
    assert scheds
    for s in scheds:
        assert s["MMA"] == "wgmma" and s["HALO"] == 0
        assert s["WARP_COL_TILES"] >= 2 and s["WARP_ROW_TILES"] <= 4  # N = 64-256 pixels
    full = ScheduleSpace(REDUCE, Precision.INT8, H100)
    for breaks in ({"MMA": "sync"}, {"WARP_COL_TILES": 1}, {"WARP_ROW_TILES": 8}):
        assert not full.is_valid({**SW, **breaks})
    # one instruction may hold 128 accumulators (m64n256); several share at most 96
    assert full.is_valid({**SW, "WARP_ROW_TILES": 4})
    assert not full.is_valid({**SW, "WARP_ROW_TILES": 4, "SPLIT_K": 2})  # spilled (acc)
    assert not full.is_valid({**SW, "WARP_ROW_TILES": 2, "WARP_COL_TILES": 4, "CHUNK": 1})
    # the halo patch's per-tap views of A are not swapped; nor exists wgmma before sm_90
    halo = ConvShape(8, 56, 56, 64, 64, 3, 3, pad=1)
    assert not ScheduleSpace(halo, Precision.FP16, H100, restrict={
        "SWAP_AB": [1], "HALO": [1]}).valid_indices.size
    assert not ScheduleSpace(REDUCE, Precision.INT8, get_target("a100"),
                             restrict={"SWAP_AB": [1]}).valid_indices.size


@pytest.mark.parametrize("extra", [{"MMA": "sync"}, {"WARP_COL_TILES": 1}])
def test_the_kernel_refuses_what_validity_refuses(cache: Path, extra: dict) -> None:
    s = {**SW, **extra}
    res = build(BuildJob(REDUCE, Precision.FP16, 90, s), cache)
    assert res.status == "compile_error" and "swapped operands" in res.log, res.log[-500:]


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("precision,plain_mma,swap_mma", [
    ("int8", "IGMMA.64x64x32", "IGMMA.64x128x32"), ("fp16", "HGMMA.64x64x16", "HGMMA.64x128x16")])
def test_swapped_builds_issue_half_as_many_instructions_twice_as_wide(
        cache: Path, precision: str, plain_mma: str, swap_mma: str) -> None:
    plain = sass_of(BuildJob(REDUCE, Precision(precision), 90, {**SW, "SWAP_AB": 0}), cache)
    swap = sass_of(BuildJob(REDUCE, Precision(precision), 90, SW), cache)
    assert [m.startswith(plain_mma) for m in plain.mma] == [True]
    assert [m.startswith(swap_mma) for m in swap.mma] == [True]
    assert not swap.spills
    assert 2 * swap.text.count("GMMA.") == plain.text.count("GMMA.")


def test_every_output_path_compiles(cache: Path) -> None:
    """Swapped fragments reach every epilogue: staged raw (PACK_OUT 0), requantized or
    biased in registers (1), TMA stores (2), raw int32 straight to global, the residual
    tile, split-K partials, the persistent and ping-pong loops, NHWCnc."""
    tma = {**SW, "TMA": 1}
    cases = [
        ("int8", {**SW, "PACK_OUT": 0}, "requant"),
        ("fp16", {**SW, "WARP_ROW_TILES": 4}, "bias"),
        ("int8", {**tma, "PACK_OUT": 2, "PERSIST": 1}, "requant"),
        ("fp16", {**tma, "TMA": 2, "PACK_OUT": 2, "PERSIST": 1, "PINGPONG": 1}, "bias"),
        ("int8", {**SW, "SPLIT_K": 2}, "acc"),
        ("fp16", {**SW, "WARP_COL_TILES": 4, "WARP_ROW_TILES": 1}, "acc"),
        ("int8", {**SW, "LAYOUT": "nhwcnc"}, "requant"),
    ]
    jobs = []
    for p, s, mode in cases:
        assert ScheduleSpace(REDUCE, Precision(p), H100).is_valid(s), s
        for residual in ((False, True) if mode != "acc" else (False,)):
            jobs.append(BuildJob(REDUCE, Precision(p), 90, s, Epilogue(mode, True, residual)))
    assert_all_compile(jobs, cache)


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_swapped_fp16_tiles_are_staged_by_transposing_matrix_stores(cache: Path) -> None:
    """fp16: an instruction's fragment goes to the staging tile as 8x8 matrices stored
    transposed (stmatrix.trans, a 16-byte row a pixel, four matrices an instruction): 128
    pixels x 16 channels a warp in 8 stores where value by value takes 64; value by value
    where the output channels are not whole 8-channel rows, and for int8 (docs/decisions.md)."""
    def stores(job: BuildJob) -> tuple[int, int]:
        text = sass_of(job, cache).text
        return text.count("STSM.16.MT88.4"), len(re.findall(r"\bSTS\.U16\b", text))

    for pack in (1, 2):
        s = {**SW, "TMA": 1, "PACK_OUT": pack}
        for residual in (False, True):
            job = BuildJob(REDUCE, Precision.FP16, 90, s, Epilogue("bias", True, residual))
            assert stores(job) == (8, 0), (pack, residual)
    odd = ConvShape(8, 56, 56, 256, 68, 1, 1)  # K % 8 != 0
    assert ScheduleSpace(odd, Precision.FP16, H100).is_valid(SW)
    tsm, sts = stores(BuildJob(odd, Precision.FP16, 90, SW))
    assert tsm == 0 and sts > 0
    assert "STSM" not in sass_of(BuildJob(REDUCE, Precision.INT8, 90, SW), cache).text
