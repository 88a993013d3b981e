"""The plain-matrix copy of A (PLAIN_A) on a CPU: where it is valid (kernels.space and the
kernel's static_asserts agree: TMA builds of 1x1, stride-1, unpadded layers, at most 256 block
rows), the tensor map it is launched with, and its sm_90 builds, which copy x with tiled 2-D
boxes and no im2col copy. The GPU checks are in test_runtime.py (`on_gpu`) and
bench/kernels_check.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.build import BuildJob, Epilogue, build, cubin_path
from kernels.sass import cuobjdump_path, summarize
from kernels.space import ScheduleSpace, is_plain_matrix
from kernels.spec import ConvShape, Precision, get_target

EXPAND = ConvShape(8, 56, 56, 64, 256, 1, 1)
TMA = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=4, CHUNK=2,
           REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=2, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
           MMA="wgmma", TMA=1, PLAIN_A=1)
H100 = get_target("h100")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plain_a")


def test_plain_matrix_layers_are_1x1_stride_1_unpadded() -> None:
    assert is_plain_matrix(EXPAND)
    assert not is_plain_matrix(ConvShape(8, 56, 56, 256, 512, 1, 1, stride=2))
    assert not is_plain_matrix(ConvShape(8, 56, 56, 64, 64, 1, 1, pad=1))
    assert not is_plain_matrix(ConvShape(8, 56, 56, 64, 64, 3, 3, pad=1))


def test_plain_a_is_valid_only_on_tma_builds_of_plain_matrix_layers(cache: Path) -> None:
    space = ScheduleSpace(EXPAND, Precision.INT8, H100)
    for extra in ({}, {"TMA": 2}, {"PERSIST": 2}, {"PACK_OUT": 1}):
        assert space.is_valid({**TMA, **extra}), extra
    assert not space.is_valid({**TMA, "TMA": 0})  # cp.async reads such rows plainly already
    assert not space.is_valid({**TMA, "TMA": 0, "MMA": "sync", "PACK_OUT": 1, "STAGES": 3})
    # one tiled box spans at most 256 rows
    big = {**TMA, "BLK_ROW_WARPS": 4, "WARP_ROW_TILES": 2, "WARP_COL_TILES": 1}  # 512 rows
    assert not space.is_valid(big) and space.is_valid({**big, "PLAIN_A": 0})
    for shape in (ConvShape(8, 56, 56, 256, 512, 1, 1, stride=2),
                  ConvShape(8, 28, 28, 64, 64, 3, 3, pad=1)):
        s = ScheduleSpace(shape, Precision.INT8, H100)
        assert s.is_valid({**TMA, "PLAIN_A": 0}) and not s.is_valid(TMA)
        # the kernel refuses what the space refuses
        res = build(BuildJob(shape, Precision.INT8, 90, TMA), cache)
        assert res.status == "compile_error" and "plain-matrix copy" in res.log
    # a space with the knob is as large as before where it cannot apply
    stem = ConvShape(8, 28, 28, 64, 64, 3, 3, pad=1)
    assert len(ScheduleSpace(stem, Precision.FP16, H100).valid_indices) == len(
        ScheduleSpace(stem, Precision.FP16, H100, restrict={"PLAIN_A": [0]}).valid_indices)


def test_plain_a_maps_x_as_a_tiled_matrix_of_block_rows(cache: Path) -> None:
    for p, es in ((Precision.INT8, 1), (Precision.FP16, 2)):
        res = build(BuildJob(EXPAND, p, 90, TMA), cache)
        assert res.status == "ok", res.log
        x = res.meta["tma"]["x"]
        assert x["tiled"] and x["dims"] == [64, 8 * 56 * 56] and x["strides"] == [64 * es]
        assert x["box"] == [64 // es, 128] and x["element_strides"] == [1, 1]
        off = build(BuildJob(EXPAND, p, 90, {**TMA, "PLAIN_A": 0}), cache)
        assert "tiled" not in off.meta["tma"]["x"] and off.meta["tma"]["x"]["pixels"] == 128


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_plain_a_builds_copy_x_with_2d_tiles_not_im2col(cache: Path) -> None:
    for extra in ({}, {"TMA": 2, "PERSIST": 2}):
        for plain in (1, 0):
            res = build(BuildJob(EXPAND, Precision.INT8, 90, {**TMA, **extra, "PLAIN_A": plain},
                                 Epilogue("default", True, True)), cache)
            assert res.status == "ok", res.log
            s = summarize(cubin_path(cache, res.key))
            loads = set(re.findall(r"UTMALDG\.\S+", s.text))
            assert loads == ({"UTMALDG.2D", "UTMALDG.3D"} if plain else
                             {"UTMALDG.4D.IM2COL", "UTMALDG.3D"}), (extra, plain, loads)
            assert "IGMMA" in " ".join(s.mma) and not s.spills and s.stack == 0
