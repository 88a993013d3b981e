"""PINGPONG on a CPU: two consumers take a persistent block's tiles in turn behind the
producer warp. Where it is valid, what it launches and allocates, and its sm_90 build: each
consumer's named barrier, the barrier of both, no spills. The GPU checks are in
test_runtime.py (`on_gpu`) and bench/kernels_check.py (`--restrict PINGPONG=1`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kernels.build import BuildJob, build, cubin_path, defines, launch_meta
from kernels.sass import cuobjdump_path, summarize
from kernels.space import TMA_MBAR_BYTES, ScheduleSpace, geometry, register_slack
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.test_kernels_fold_residual import cols_of

H100 = get_target("h100")
EXPAND = ConvShape(8, 56, 56, 64, 256, 1, 1)
# one warpgroup of 64 x 128 per consumer, TMA stores, a persistent grid of one block per SM
PP = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=4, CHUNK=2,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=2, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
          MMA="wgmma", TMA=2, PERSIST=1, PLAIN_A=1, PINGPONG=1)


def test_two_consumers_are_launched_each_with_an_epilogue_region() -> None:
    one = {**PP, "PINGPONG": 0}
    g1 = geometry(EXPAND, Precision.INT8, H100, cols_of(one))
    g2 = geometry(EXPAND, Precision.INT8, H100, cols_of(PP))
    # a consumer is one tile's math warps: the loads and epilogue are split as without it
    assert int(g2.threads[0]) == int(g1.threads[0]) == 128
    assert int(g1.block_threads[0]) == 160 and int(g2.block_threads[0]) == 288
    # the pipeline is shared; the epilogue region (64 x 256 B + 1 KB alignment) and a turn
    # mbarrier per consumer are not
    epi = 64 * 128 + 1024
    assert int(g2.smem_bytes[0]) - int(g1.smem_bytes[0]) == epi + TMA_MBAR_BYTES
    # the register cap follows the threads launched: 64K / 160 (255) against 64K / 288 (224)
    s1 = register_slack(EXPAND, Precision.INT8, H100, cols_of(one), g1)
    s2 = register_slack(EXPAND, Precision.INT8, H100, cols_of(PP), g2)
    assert int(s1[0]) - int(s2[0]) == 255 - 224
    job = BuildJob(EXPAND, Precision.INT8, 90, PP)
    meta = launch_meta(job, defines(job))
    assert meta["block"] == [288, 1, 1] and meta["persist"] == 1
    assert defines(job)["TC_PINGPONG"] == 1


def test_valid_only_behind_a_producer_warp_on_a_persistent_grid() -> None:
    space = ScheduleSpace(EXPAND, Precision.FP16, H100, restrict={
        "MMA": ["wgmma"], "TMA": [0, 1, 2], "PERSIST": [0, 1, 2], "PINGPONG": [1],
        "STAGES": [4], "CHUNK": [2]})
    scheds = space.schedules(space.valid_indices)
    assert scheds and all(s["TMA"] == 2 and s["PERSIST"] >= 1 and s["SPLIT_K"] == 1
                          for s in scheds)
    # every ping-pong schedule has its one-consumer twin, which fits wherever it does
    twin = ScheduleSpace(EXPAND, Precision.FP16, H100)
    assert all(twin.is_valid({**s, "PINGPONG": 0}) for s in scheds)
    for breaks in ({"TMA": 1}, {"PERSIST": 0}, {"SPLIT_K": 2, "PERSIST": 0}):
        assert not twin.is_valid({**PP, **breaks})
    # two consumers of 4 warpgroups and the producer warp would exceed 1024 threads
    assert not twin.is_valid({**PP, "BLK_ROW_WARPS": 4, "WARP_COL_TILES": 1, "PLAIN_A": 0})
    assert not ScheduleSpace(EXPAND, Precision.INT8, get_target("a100"),
                             restrict={"PINGPONG": [1]}).valid_indices.size


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pingpong")


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("precision,extra", [
    ("int8", {}), ("fp16", {"PACK_OUT": 1, "PERSIST": 2, "WARP_COL_TILES": 2}),
    ("int8", {"BLK_ROW_WARPS": 2, "PLAIN_A": 0, "STAGES": 2})])
def test_each_consumer_syncs_on_its_own_barrier(cache: Path, precision: str,
                                                extra: dict) -> None:
    """SASS: wgmma, the TMA copies, each consumer's barrier (1 or 2, by register) of its
    threads, barrier 3 of both consumers' threads, no spills."""
    sched = {**PP, **extra}
    assert ScheduleSpace(EXPAND, Precision(precision), H100).is_valid(sched)
    res = build(BuildJob(EXPAND, Precision(precision), 90, sched), cache)
    assert res.status == "ok", res.log[-800:]
    sass = summarize(cubin_path(cache, res.key))
    assert not sass.spills and sass.mma and "GMMA" in sass.mma[0]
    threads = 128 * sched["BLK_ROW_WARPS"]
    assert "UTMALDG" in sass.text
    assert re.search(rf"BAR\.SYNC\.DEFER_BLOCKING R\d+, {threads:#x}\b", sass.text)
    assert f"BAR.SYNC.DEFER_BLOCKING 0x3, {2 * threads:#x}" in sass.text
