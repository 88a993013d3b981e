"""TMA stores (PACK_OUT=2) on a CPU: where they are valid (kernels.space and the kernel's
static_asserts agree), their shared memory, the output tensor map they are launched with, and
their builds for sm_90 with the bulk tensor store and no thread stores. The GPU checks are in
test_runtime.py (`on_gpu`) and bench/kernels_check.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, Epilogue, build
from kernels.runtime import schedule_fits
from kernels.space import ScheduleSpace, geometry
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.builds import assert_all_compile, sass_of
from tests.kernels.test_kernels_fold_residual import cols_of

EXPAND = ConvShape(8, 56, 56, 64, 256, 1, 1)  # ResNet-50's output-bound 1x1
# wgmma + TMA: a 64 x 128 block tile (one warpgroup row, two warpgroup columns of 64).
TMA = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=2, WARP_ROW_TILES=1, WARP_COL_TILES=2, CHUNK=2,
           REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=2, LAYOUT="nhwc", STAGES=3, SPLIT_K=1,
           MMA="wgmma", TMA=1)
H100 = get_target("h100")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tma_store")


def test_tma_stores_are_valid_only_with_tma_loads_and_whole_16_byte_rows() -> None:
    space = ScheduleSpace(EXPAND, Precision.INT8, H100)
    assert space.is_valid(TMA) and space.is_valid({**TMA, "PERSIST": 2})
    assert not space.is_valid({**TMA, "TMA": 0})  # the map comes with the TMA build
    assert not space.is_valid({**TMA, "SPLIT_K": 2})
    assert not space.is_valid({**TMA, "MMA": "sync", "TMA": 0})
    # an output row of 40 int8 channels is not a multiple of 16 bytes: no map stride for it
    odd = ConvShape(8, 14, 14, 64, 40, 1, 1)
    assert not ScheduleSpace(odd, Precision.INT8, H100).is_valid(TMA)
    assert ScheduleSpace(odd, Precision.FP16, H100).is_valid(TMA)  # 80 bytes
    # no TMA before sm_90; fp32_tc and int4 have no TMA path
    assert not len(ScheduleSpace(EXPAND, Precision.INT8, get_target("a100"),
                                 restrict={"PACK_OUT": [2]}).valid_indices)
    assert not len(ScheduleSpace(EXPAND, Precision.INT4, H100,
                                 restrict={"PACK_OUT": [2]}).valid_indices)
    assert len(ScheduleSpace(EXPAND, Precision.FP16, H100,
                             restrict={"PACK_OUT": [2]}).valid_indices) > 1000


def test_tma_stores_stage_a_dense_aligned_tile() -> None:
    g1 = geometry(EXPAND, Precision.INT8, H100, cols_of({**TMA, "PACK_OUT": 1, "PERSIST": 1}))
    g2 = geometry(EXPAND, Precision.INT8, H100, cols_of({**TMA, "PERSIST": 1}))
    padded, dense = 64 * (128 + 16), 64 * 128 + 1024  # + the 1024-byte alignment slack
    assert int(g2.smem_bytes[0]) - int(g1.smem_bytes[0]) == dense - padded
    # the residual tile stays padded beside it, the columns' scale and bias after it
    g2r = geometry(EXPAND, Precision.INT8, H100, cols_of({**TMA, "PERSIST": 1}), residual=True)
    assert int(g2r.smem_bytes[0]) - int(g2.smem_bytes[0]) == padded + 2 * 4 * 128


def test_tma_stores_need_an_8_or_16_bit_output() -> None:
    assert schedule_fits(EXPAND, Precision.INT8, H100, TMA) is None
    why = schedule_fits(EXPAND, Precision.INT8, H100, TMA, Epilogue("acc"))
    assert why is not None and "TMA stores" in why


def test_the_rule_is_the_kernels_and_the_map_is_the_tiles(cache: Path) -> None:
    """A TMA-store build the runtime refuses fails in the compiler too; a valid one carries
    y's map: bytes, K * out bytes wide, 64-row boxes of the widest swizzle of a tile row."""
    res = build(BuildJob(EXPAND, Precision.INT8, 90, TMA, Epilogue("acc")), cache)
    assert res.status == "compile_error" and "TMA stores" in res.log
    for p, row, swb in ((Precision.INT8, 256, 128), (Precision.FP16, 512, 128)):
        meta = build(BuildJob(EXPAND, p, 90, TMA), cache).meta
        y = meta["tma"]["y"]
        assert y["dims"] == [row, EXPAND.gemm_m] and y["strides"] == [row]
        assert y["box"] == [swb, 64] and y["swizzle_bytes"] == swb
    narrow = {**TMA, "BLK_COL_WARPS": 1, "WARP_COL_TILES": 1}  # 32 int8 columns a tile
    assert build(BuildJob(EXPAND, Precision.INT8, 90, narrow), cache).meta["tma"]["y"][
        "box"] == [32, 64]
    assert "y" not in build(BuildJob(EXPAND, Precision.INT8, 90, {**TMA, "PACK_OUT": 1}),
                            cache).meta["tma"]


@pytest.mark.timeout(900)
def test_tma_store_schedules_compile_for_sm90(cache: Path) -> None:
    rng = np.random.default_rng(11)
    jobs = []
    for shape in (EXPAND, ConvShape(2, 17, 17, 64, 96, 3, 3, pad=1),
                  ConvShape(8, 56, 56, 256, 512, 1, 1, stride=2)):
        for p in (Precision.INT8, Precision.FP16):
            space = ScheduleSpace(shape, p, H100, restrict={"PACK_OUT": [2]})
            for i in rng.choice(space.valid_indices, size=4, replace=False):
                jobs.append(BuildJob(shape, p, 90, space.schedule_at(int(i)),
                                     Epilogue(relu=True, residual=bool(rng.random() < 0.5))))
    assert_all_compile(jobs, cache)


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("precision,persist", [("int8", 0), ("int8", 2), ("fp16", 1)])
def test_tma_store_builds_store_through_the_tma_unit(precision: str, persist: int,
                                                     cache: Path) -> None:
    summary = sass_of(BuildJob(EXPAND, Precision(precision), 90, {**TMA, "PERSIST": persist}),
                      cache)
    assert any("GMMA" in m for m in summary.mma) and not summary.spills
    assert re.search(r"\sUTMASTG[\s.]", summary.text)
    # no thread writes y: the only global stores are the TMA unit's
    assert not re.search(r"\sSTG[\s.]", summary.text)
