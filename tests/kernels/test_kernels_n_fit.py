"""Column tiles fitted to the output channels (N_FIT) on a CPU: their widths
(kernels.space.fitted_block_n, which conv.cu mirrors), where they are valid and why, and their
sm_90 builds. The GPU checks are in test_runtime.py (`on_gpu`) and bench/kernels_check.py
(`--restrict N_FIT=1,2,3`)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, build, cubin_path
from kernels.sass import cuobjdump_path, summarize
from kernels.space import ScheduleSpace, fitted_block_n
from kernels.spec import ConvShape, Precision, get_target

H100 = get_target("h100")
FIT = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=1, CHUNK=2,
           REORDER_INNER=1, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
           MMA="wgmma", TMA=2, N_FIT=1)
EXPAND = ConvShape(8, 56, 56, 24, 144, 1, 1)  # MobileNet-V2's 1x1 expand 24 -> 144


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("n_fit")


@pytest.mark.parametrize(("k", "widths"), [
    (144, (144, 80, 48)), (672, (224, 112, 80)), (40, (48, 32, 16)), (1152, (240, 128, 80)),
    (96, (96, 48, 32)), (2048, (256, 128, 96))])
def test_widths_are_the_fewest_tiles_share_rounded_up_to_16(k: int, widths: tuple) -> None:
    got = fitted_block_n(k, np.array([1, 2, 3]))
    assert tuple(got.tolist()) == widths
    for n, w in zip((1, 2, 3), widths, strict=True):
        tiles = -(-k // 256) * n
        assert w % 16 == 0 and w <= 256 and w * tiles >= k and (w - 16) * tiles < k
    assert fitted_block_n(k, np.array([0]))[0] == 0


def test_valid_widths_are_those_no_power_of_two_tile_has() -> None:
    """N_FIT never repeats a schedule without it: its power-of-two widths are left out."""
    for k, fits in ((144, {1, 2, 3}), (128, {3}), (64, set()), (40, {1})):
        space = ScheduleSpace(ConvShape(8, 14, 14, 64, k, 1, 1), Precision.INT8, H100)
        idx = space.valid_indices
        cols = space.columns(idx)
        g = space.geometry(idx)
        fit = cols["N_FIT"] > 0
        assert set(np.unique(cols["N_FIT"][fit]).tolist()) == fits
        bn = g.block_n[fit]
        assert ((bn & (bn - 1)) != 0).all()
        assert (cols["WARP_COL_TILES"][fit] == 1).all() and (cols["BLK_COL_WARPS"][fit] == 1).all()
        assert (cols["MMA"][fit] == "wgmma").all()


@pytest.mark.parametrize(("shape", "prec", "sched", "why"), [
    (EXPAND, "int8", {**FIT, "WARP_COL_TILES": 2}, "N_FIT sizes one warpgroup column"),
    (EXPAND, "fp16", {**FIT, "BLK_COL_WARPS": 2}, "N_FIT sizes one warpgroup column"),
    (EXPAND, "int8", {**FIT, "MMA": "sync", "TMA": 0}, "N_FIT sizes one warpgroup column"),
    # int8 rows of 48 bytes: no 32-, 64- or 128-byte column box of a TMA store
    (EXPAND, "int8", {**FIT, "N_FIT": 3, "PACK_OUT": 2}, "TMA stores write"),
])
def test_each_rule_is_a_build_that_fails(cache: Path, shape: ConvShape, prec: str,
                                         sched: dict, why: str) -> None:
    p = Precision(prec)
    assert not ScheduleSpace(shape, p, H100).is_valid(sched)
    res = build(BuildJob(shape, p, 90, sched), cache)
    assert res.status == "compile_error" and why in res.log


@pytest.mark.skipif(cuobjdump_path() is None, reason="needs cuobjdump")
@pytest.mark.parametrize(("shape", "prec", "sched", "width"), [
    (EXPAND, "int8", FIT, 144),
    (EXPAND, "fp16", {**FIT, "N_FIT": 2, "PACK_OUT": 2, "PERSIST": 1}, 80),
    (ConvShape(8, 14, 14, 112, 672, 1, 1), "int8", {**FIT, "TMA": 0}, 224),
    (ConvShape(8, 28, 28, 96, 40, 3, 3, pad=1), "fp16", {**FIT, "PINGPONG": 1, "PERSIST": 1},
     48),
])
def test_builds_issue_wgmma_of_the_fitted_width(cache: Path, shape: ConvShape, prec: str,
                                                sched: dict, width: int) -> None:
    """conv.cu's FIT_N is the space's width: its shared memory (static_assert against the
    geometry) and the instruction's n agree, and nothing spills."""
    p = Precision(prec)
    assert ScheduleSpace(shape, p, H100).is_valid(sched)
    res = build(BuildJob(shape, p, 90, sched), cache)
    assert res.status == "ok", res.log
    s = summarize(cubin_path(cache, res.key))
    assert not s.spills
    assert {int(m) for m in re.findall(r"GMMA\.64x(\d+)x", " ".join(s.mma))} == {width}
