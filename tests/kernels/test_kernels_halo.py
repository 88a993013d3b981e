"""The halo patch (HALO) on a CPU: its tiling covers every output pixel once with every tap's
read inside the patch (kernels.space.halo_tiling, which conv.cu mirrors), where it is valid,
the tensor map and grid it is launched with, its sm_90 builds, and the register rule of its
one-stage loop. The GPU checks are in test_runtime.py (`on_gpu`) and bench/kernels_check.py
(`--restrict HALO=1`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, build, cubin_path
from kernels.sass import cuobjdump_path
from kernels.space import ScheduleSpace, halo_applies, halo_tiling
from kernels.spec import ConvShape, Precision, get_target

H100 = get_target("h100")
HALO = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2, CHUNK=2,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1,
            MMA="wgmma", TMA=2, PERSIST=1, HALO=1)
STAGE2 = ConvShape(8, 56, 56, 64, 64, 3, 3, pad=1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("halo")


@pytest.mark.parametrize("shape", [
    STAGE2,
    ConvShape(1, 5, 300, 16, 24, 3, 3, pad=1),  # wider than one box: two bands
    ConvShape(2, 7, 7, 32, 40, 3, 3, pad=1),  # tails of every kind
    ConvShape(1, 9, 13, 16, 16, 5, 3, pad=(0, 1)),  # rectangular filter, no row padding
    ConvShape(3, 6, 11, 16, 16, 1, 3, pad=(0, 1)),
])
def test_tiles_cover_every_pixel_once_and_every_tap_reads_inside_the_patch(
        shape: ConvShape) -> None:
    for bm in (64, 128, 256, 512):
        t = halo_tiling(shape, bm)
        assert t is not None and t.pitch <= 256 and t.box_rows <= 256
        assert t.plane_rows >= t.box_rows * t.pitch and t.plane_rows % 32 == 0
        band, tile, row = np.meshgrid(np.arange(t.bands), np.arange(t.tiles_per_band),
                                      np.arange(bm), indexing="ij")
        v = tile * bm + row  # the tile row's position in its band (conv.cu: out_row)
        p, ql = v // t.pitch, v % t.pitch
        q = band * t.cols + ql
        pixel = (ql < t.cols) & (q < shape.q) & (p < shape.p)
        covered = np.unique(p[pixel] * shape.q + q[pixel], return_counts=True)
        assert len(covered[0]) == shape.p * shape.q and (covered[1] == 1).all()
        # Each tap's view starts at the tile's first position in the patch, whose first row
        # is that position's output row: every read lies in the box, and a pixel's reads
        # are its input pixels (row p + r, column q + s, both from -pad).
        first_row = (tile * bm) // t.pitch
        for r in range(shape.r):
            for s in range(shape.s):
                idx = (tile * bm) % t.pitch + row + r * t.pitch + s
                assert idx.max() < t.box_rows * t.pitch
                in_row, in_col = first_row + idx // t.pitch, band * t.cols + idx % t.pitch
                assert (in_row[pixel] == p[pixel] + r).all()
                assert (in_col[pixel] == q[pixel] + s).all()


def test_halo_is_valid_only_on_stride_1_tma_builds_it_can_store() -> None:
    assert halo_applies(STAGE2)
    for shape in (ConvShape(8, 56, 56, 64, 64, 3, 3, stride=2, pad=1),
                  ConvShape(8, 56, 56, 64, 64, 3, 3, pad=2, dilation=2),
                  ConvShape(8, 56, 56, 64, 64, 1, 1)):
        assert not halo_applies(shape)
        assert not ScheduleSpace(shape, Precision.INT8, H100).is_valid(HALO)
    space = ScheduleSpace(STAGE2, Precision.INT8, H100)
    assert space.is_valid(HALO) and space.is_valid({**HALO, "TMA": 1, "PERSIST": 0})
    # TMA stores of 64-row runs of M and split-K: valid without the patch, not with it
    for broken in ({"PACK_OUT": 2}, {"SPLIT_K": 2, "PERSIST": 0}):
        assert not space.is_valid({**HALO, **broken}) and \
            space.is_valid({**HALO, **broken, "HALO": 0}), broken
    # the cp.async loads have no patch; every tap is in the stage (REORDER_INNER means nothing)
    for broken in ({"TMA": 0, "PERSIST": 0}, {"REORDER_INNER": 1}):
        assert not space.is_valid({**HALO, **broken}), broken
    assert ScheduleSpace(STAGE2, Precision.FP16, H100,
                         restrict={"HALO": [1]}).valid_indices.size > 1000


def test_halo_build_copies_one_patch_and_issues_every_tap(cache: Path) -> None:
    p = Precision.FP16
    res = build(BuildJob(STAGE2, p, 90, {**HALO, "CHUNK": 4}), cache)
    assert res.status == "ok", res.log
    t = halo_tiling(STAGE2, 128)
    assert t is not None
    meta = res.meta
    assert meta["defines"]["TC_HALO_COLS"] == t.cols == 56
    assert meta["tiles"] == STAGE2.n * t.tiles_per_image  # one output-channel tile
    assert meta["tma"]["x"] == {"tiled": True, "dims": [64, 56, 56, 8],
                                "strides": [128, 56 * 128, 56 * 56 * 128],
                                "box": [64, t.pitch, t.box_rows, 1],
                                "element_strides": [1, 1, 1, 1]}
    assert meta["defines"]["TC_K_ITERS"] == 1  # one stage of 64 channels, all nine taps
    sass = __import__("subprocess").run(
        [cuobjdump_path(), "--dump-sass", str(cubin_path(cache, res.key))],
        capture_output=True, text=True, check=True).stdout
    # 9 taps x 4 k-steps of m64n64k16, the 4-D tiled copy of x, and nothing spilled
    assert len(re.findall(r"HGMMA\.64x64x16\.F32", sass)) == 9 * 4
    assert re.search(r"UTMALDG\.4D\b", sass) and not re.search(r"UTMALDG\.4D\.IM2COL", sass)
    assert not re.search(r"\bSTL\b", sass)


def test_one_stage_rule_leaves_out_schedules_that_spill(cache: Path) -> None:
    shape = ConvShape(8, 64, 64, 128, 256, 3, 3, pad=1)
    one = {**HALO, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 2, "WARP_ROW_TILES": 2,
           "WARP_COL_TILES": 1, "CHUNK": 4, "STAGES": 1, "PERSIST": 0}
    space = ScheduleSpace(shape, Precision.FP16, H100)
    assert not space.is_valid(one)  # 9 taps x 4 k-steps x 2 row tiles a stage
    assert space.is_valid({**one, "CHUNK": 2})  # 36 MMAs a stage
    res = build(BuildJob(shape, Precision.FP16, 90, one), cache)
    assert res.status == "compile_error" and "spill" in res.log
    assert build(BuildJob(shape, Precision.FP16, 90, {**one, "CHUNK": 2}), cache).status == "ok"
