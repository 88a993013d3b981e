"""MULTICAST on a CPU: clusters of two blocks share one operand's TMA copies. Where it is
valid (which operand a pair shares follows from the tile counts), what it launches (clusters
of two, half boxes of the shared operand, persistent grids of whole pairs) and its sm_90
build (multicast copies, remote mbarrier arrivals, cluster barriers, no spills). The GPU
checks are bench/kernels_check.py's (`--restrict MULTICAST=1`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels.build import BuildJob, build, cubin_path, defines, launch_meta
from kernels.launch import launch_dims
from kernels.sass import cuobjdump_path, summarize
from kernels.space import ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target

H100 = get_target("h100")
# 1x1 64 -> 256 at 56x56: with 128-column tiles, two columns of tiles (the pair shares A)
EXPAND = ConvShape(8, 56, 56, 64, 256, 1, 1)
# 3x3 128 -> 128 at 28x28: one column of 128-column tiles (the pair shares the weights)
NARROW = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))
MC = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=4, CHUNK=2,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=2, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
          MMA="wgmma", TMA=2, PERSIST=0, PLAIN_A=0, PINGPONG=0, MULTICAST=1)


def meta_of(shape: ConvShape, precision: str, sched: dict) -> dict:
    job = BuildJob(shape, Precision(precision), 90, sched)
    return launch_meta(job, defines(job))


def test_the_pair_shares_a_where_the_tiles_have_two_columns_and_b_where_one() -> None:
    a = meta_of(EXPAND, "int8", MC)
    one = meta_of(EXPAND, "int8", {**MC, "MULTICAST": 0})
    assert a["cluster"] == 2 and one["cluster"] == 1 and a["grid"] == one["grid"]
    # A: half the tile's 64 im2col pixels per copy; B: the whole 128 weight rows
    assert a["tma"]["x"]["pixels"] == 32 and one["tma"]["x"]["pixels"] == 64
    assert a["tma"]["w"]["box"][2] == one["tma"]["w"]["box"][2] == 128
    b = meta_of(NARROW, "int8", MC)
    assert b["tma"]["x"]["pixels"] == 64 and b["tma"]["w"]["box"][2] == 64
    # the output's map is the whole tile's: a 128-byte row of int8, one 128-byte swizzle box
    assert b["tma"]["y"] == meta_of(NARROW, "int8", {**MC, "MULTICAST": 0})["tma"]["y"]
    assert b["tma"]["y"]["swizzle_bytes"] == 128
    # PLAIN_A's box of x rows halves as the im2col walk does
    plain = meta_of(EXPAND, "int8", {**MC, "PLAIN_A": 1})
    assert plain["tma"]["x"]["box"] == [64, 32]
    assert defines(BuildJob(EXPAND, Precision.INT8, 90, MC))["TC_MULTICAST"] == 1


def test_valid_behind_a_producer_warp_where_pairs_share_a_tile() -> None:
    space = ScheduleSpace(EXPAND, Precision.FP16, H100)
    assert space.is_valid(MC) and space.is_valid({**MC, "PERSIST": 1, "PINGPONG": 1})
    for breaks in ({"TMA": 1}, {"TMA": 0, "MMA": "sync", "PACK_OUT": 1, "STAGES": 2},
                   {"SPLIT_K": 2, "PACK_OUT": 1}):
        assert space.is_valid({**MC, **breaks, "MULTICAST": 0})
        assert not space.is_valid({**MC, **breaks})
    # three columns of 64-column tiles (K = 192): neither operand is shared by neighbours
    odd = ScheduleSpace(ConvShape(8, 56, 56, 64, 192, 1, 1), Precision.FP16, H100)
    assert odd.is_valid({**MC, "WARP_COL_TILES": 2, "MULTICAST": 0})
    assert not odd.is_valid({**MC, "WARP_COL_TILES": 2})
    # one column and an odd number of rows of tiles (M = 7 x 7 = 49 pixels: one row of tiles)
    tail = ScheduleSpace(ConvShape(1, 7, 7, 128, 128, 3, 3, pad=(1, 1)), Precision.INT8, H100)
    assert tail.is_valid({**MC, "MULTICAST": 0}) and not tail.is_valid(MC)
    # every multicast schedule of a space has the producer warp, no split-K, a valid twin
    sub = ScheduleSpace(NARROW, Precision.INT8, H100, restrict={
        "MULTICAST": [1], "STAGES": [4], "CHUNK": [2]})
    scheds = sub.schedules(sub.valid_indices)
    full = ScheduleSpace(NARROW, Precision.INT8, H100)
    assert scheds and all(s["TMA"] == 2 and s["SPLIT_K"] == 1 for s in scheds)
    assert all(full.is_valid({**s, "MULTICAST": 0}) for s in scheds)
    assert not ScheduleSpace(NARROW, Precision.INT8, get_target("a100"),
                             restrict={"MULTICAST": [1]}).valid_indices.size


def test_a_persistent_grid_is_whole_pairs() -> None:
    meta = meta_of(EXPAND, "int8", {**MC, "PERSIST": 1})
    assert meta["tiles"] % 2 == 0
    assert launch_dims(meta, sms=132)[0] == (132, 1, 1)
    # an odd number of SMs: one block fewer, so no pair is split between clusters
    assert launch_dims(meta, sms=131)[0] == (130, 1, 1)
    assert launch_dims({**meta, "cluster": 1}, sms=131)[0] == (131, 1, 1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("multicast")


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("shape,precision,extra,shared", [
    (EXPAND, "int8", {"PLAIN_A": 1}, "UTMALDG.2D.MULTICAST"),
    (EXPAND, "fp16", {"PERSIST": 1, "PINGPONG": 1, "PLAIN_A": 1}, "UTMALDG.2D.MULTICAST"),
    (NARROW, "fp16", {"PERSIST": 1, "WARP_COL_TILES": 2, "CHUNK": 4},
     "UTMALDG.4D.IM2COL.MULTICAST"),
    (NARROW, "int8", {}, "UTMALDG.3D.MULTICAST")])
def test_the_build_multicasts_the_shared_operand_only(cache: Path, shape: ConvShape,
                                                      precision: str, extra: dict,
                                                      shared: str) -> None:
    """SASS: wgmma, the shared operand's copy multicast and the other's not, the cluster
    barrier, no spills."""
    sched = {**MC, **extra}
    assert ScheduleSpace(shape, Precision(precision), H100).is_valid(sched)
    res = build(BuildJob(shape, Precision(precision), 90, sched), cache)
    assert res.status == "ok", res.log[-800:]
    sass = summarize(cubin_path(cache, res.key))
    assert not sass.spills and sass.mma and "GMMA" in sass.mma[0]
    loads = [ln.split("*/")[1].split()[0] for ln in sass.text.splitlines() if "UTMALDG" in ln]
    assert shared in loads
    assert sum(".MULTICAST" in op for op in loads) == sum(".MULTICAST" not in op for op in loads)
    assert "UCGABAR_ARV" in sass.text and "UCGABAR_WAIT" in sass.text
