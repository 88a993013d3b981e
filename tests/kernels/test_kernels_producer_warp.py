"""TMA=2 on a CPU: a producer warp of its own issues the TMA stages. Where it is valid (as
TMA=1, less the registers the extra warp takes), what it launches, and its sm_90 build: the
copies and a named barrier of the math warps only. The GPU checks are in test_runtime.py
(`on_gpu`) and bench/kernels_check.py (`--producer-warp-count`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, build, cubin_path, defines, launch_meta
from kernels.sass import cuobjdump_path, summarize
from kernels.space import ScheduleSpace, geometry, register_slack
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.test_kernels_fold_residual import cols_of

H100 = get_target("h100")
WIDE = ConvShape(8, 56, 56, 256, 256, 3, 3, pad=1)
# wgmma + TMA loads: two warpgroups along M, 64 x 128 each
WS = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=4, CHUNK=4,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
          MMA="wgmma", TMA=2)


def test_one_more_warp_is_launched_and_counted_against_the_registers() -> None:
    g1 = geometry(WIDE, Precision.INT8, H100, cols_of({**WS, "TMA": 1}))
    g2 = geometry(WIDE, Precision.INT8, H100, cols_of(WS))
    # the loads and the epilogue are the math warps' (threads); the block has one warp more
    assert int(g2.threads[0]) == int(g1.threads[0]) == 256
    assert int(g2.block_threads[0]) == 288 and int(g1.block_threads[0]) == 256
    assert int(g2.smem_bytes[0]) == int(g1.smem_bytes[0])
    s1 = register_slack(WIDE, Precision.INT8, H100, cols_of({**WS, "TMA": 1}), g1)
    s2 = register_slack(WIDE, Precision.INT8, H100, cols_of(WS), g2)
    # 64K / 256 = 255 (capped) against 64K / 288 = 227 -> 224 registers a thread
    assert int(s1[0]) - int(s2[0]) == 255 - 224
    job = BuildJob(WIDE, Precision.INT8, 90, WS)
    meta = launch_meta(job, defines(job))
    assert meta["block"] == [288, 1, 1] and meta["tma"] is not None


def test_valid_where_tma_loads_are_unless_the_extra_warp_breaks_a_limit() -> None:
    space = ScheduleSpace(WIDE, Precision.FP16, H100, restrict={
        "MMA": ["wgmma"], "TMA": [1, 2], "DUP_AWARE": [0], "LAYOUT": ["nhwc"],
        "STAGES": [2, 4, 8], "SPLIT_K": [1, 2], "PINGPONG": [0]})  # ping-pong: its own test
    by_tma: dict[int, set[tuple]] = {1: set(), 2: set()}
    for s in space.schedules(space.valid_indices):
        by_tma[s["TMA"]].add(tuple(sorted((k, v) for k, v in s.items() if k != "TMA")))
    # every producer-warp schedule has its TMA=1 twin; the converse fails only where the
    # extra warp takes the registers or the threads (a block's 1024, an SM's) it needs
    assert by_tma[2] <= by_tma[1] and len(by_tma[2]) > 0.8 * len(by_tma[1])
    lost = by_tma[1] - by_tma[2]
    assert lost  # some schedules sit at the register limit
    for key in sorted(lost)[:50]:
        s = {**dict(key), "TMA": 2}
        g = geometry(WIDE, Precision.FP16, H100, cols_of(s))
        threads = int(g.block_threads[0])
        assert (register_slack(WIDE, Precision.FP16, H100, cols_of(s), g)[0] < 0 or
                threads > 1024 or threads * max(s["PERSIST"], 1) > H100.max_threads_per_sm)
    # the producer warp needs TMA loads: never with cp.async or mma.sync
    assert not ScheduleSpace(WIDE, Precision.FP16, H100).is_valid({**WS, "MMA": "sync"})
    assert not ScheduleSpace(WIDE, Precision.INT8, get_target("a100"),
                             restrict={"TMA": [2]}).valid_indices.size


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("producer_warp")


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("precision,extra", [
    ("int8", {"PACK_OUT": 2, "PERSIST": 1}), ("fp16", {}), ("int8", {"SPLIT_K": 2})])
def test_the_math_warps_sync_on_a_named_barrier_and_the_copies_stay_tma(
        cache: Path, precision: str, extra: dict) -> None:
    """SASS: bulk tensor copies (UTMALDG), wgmma, the math warps' named barrier 1 of 256
    threads (0x100) and no spills; the TMA=1 build of the same schedule has no barrier 1."""
    sched = {**WS, **extra}
    res = build(BuildJob(WIDE, Precision(precision), 90, sched), cache)
    assert res.status == "ok", res.log[-800:]
    sass = summarize(cubin_path(cache, res.key))
    assert not sass.spills and sass.mma and "GMMA" in sass.mma[0]
    assert "UTMALDG" in sass.text and "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100" in sass.text
    one = build(BuildJob(WIDE, Precision(precision), 90, {**sched, "TMA": 1}), cache)
    assert one.status == "ok"
    assert "BAR.SYNC.DEFER_BLOCKING 0x1," not in summarize(cubin_path(cache, one.key)).text
    assert np.all(np.array([sass.local_loads, sass.local_stores]) == 0)
