"""SPLIT_CLUSTER on a CPU: a tile's split-K blocks launched as one thread-block cluster, the
first summing the others' partial tiles from their shared memory. Where it is valid, what the
launch and the shared memory see (no global workspace or counters; room for a partial tile),
and its sm_90 builds: the cluster's barriers and loads, no counter atomics, every path
compiling without spills. The GPU checks are in test_runtime.py (`on_gpu`) and
bench/kernels_check.py (`--restrict SPLIT_CLUSTER=1`)."""

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
# ResNet-50's stage-4 3x3 conv: 392 output pixels, a reduction of 4608
STAGE4 = ConvShape(8, 7, 7, 512, 512, 3, 3, pad=1)
CL = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2, CHUNK=8,
          REORDER_INNER=1, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=2,
          MMA="wgmma", TMA=2, SPLIT_CLUSTER=1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("split_cluster")


def test_no_workspace_no_counters_and_room_for_a_partial_tile() -> None:
    glob = {**CL, "SPLIT_CLUSTER": 0}
    for sched, ws in ((glob, True), (CL, False)):
        job = BuildJob(STAGE4, Precision.INT8, 90, sched)
        meta = launch_meta(job, defines(job))
        assert meta["grid"] == [7 * 8, 1, 2]  # 64 x 64 tiles, the split in z
        assert (meta["workspace_bytes"] > 0, meta["counters"] > 0) == (ws, ws)
    assert defines(BuildJob(STAGE4, Precision.INT8, 90, CL))["TC_SPLIT_CLUSTER"] == 1
    # a partial tile (4 bytes an output) larger than the pipeline and the staging tile
    small = {**CL, "CHUNK": 1, "STAGES": 1, "WARP_COL_TILES": 8, "TMA": 0}
    g0 = geometry(STAGE4, Precision.INT8, H100, cols_of({**small, "SPLIT_CLUSTER": 0}))
    g1 = geometry(STAGE4, Precision.INT8, H100, cols_of(small))
    assert g0.smem_bytes[0] < 64 * 256 * 4 == g1.smem_bytes[0]
    for f in ("block_m", "block_n", "block_threads", "grid_blocks", "k_iters"):
        assert np.array_equal(getattr(g0, f), getattr(g1, f)), f


def test_valid_for_split_k_on_sm_90_but_fp32_tc() -> None:
    full = ScheduleSpace(STAGE4, Precision.INT8, H100)
    assert full.is_valid(CL)
    assert full.is_valid({**CL, "MMA": "sync", "TMA": 0, "STAGES": 2, "SPLIT_K": 4})
    assert not full.is_valid({**CL, "SPLIT_K": 1})
    space = ScheduleSpace(STAGE4, Precision.FP16, H100, restrict={"SPLIT_CLUSTER": [1]})
    scheds = space.schedules(space.valid_indices)
    assert scheds and all(s["SPLIT_K"] > 1 for s in scheds)
    for target in ("a100", "t4"):
        assert not ScheduleSpace(STAGE4, Precision.INT8, get_target(target),
                                 restrict={"SPLIT_CLUSTER": [1]}).valid_indices.size
    assert not ScheduleSpace(STAGE4, Precision.FP32_TC, H100,
                             restrict={"SPLIT_CLUSTER": [1]}).valid_indices.size


def test_the_kernel_refuses_a_cluster_of_one_block(cache: Path) -> None:
    res = build(BuildJob(STAGE4, Precision.INT8, 90, {**CL, "SPLIT_K": 1}), cache)
    assert res.status == "compile_error" and "cluster's split-K" in res.log, res.log[-500:]


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_the_splits_meet_at_cluster_barriers_and_no_counter(cache: Path, precision: str) -> None:
    text = {c: sass_of(BuildJob(STAGE4, Precision(precision), 90, {**CL, "SPLIT_CLUSTER": c},
                                Epilogue(relu=True)), cache).text for c in (0, 1)}
    # two cluster barriers (partials written, partials read); the other split's partial
    # tile, 32 values a thread of a 64 x 64 tile, by loads through the cluster's window
    assert text[1].count("UCGABAR_WAIT") == 2 and "UCGABAR" not in text[0]
    assert len(re.findall(r"\bLD\.E\b", text[1])) >= 32 and not re.search(r"\bLD\.E\b", text[0])
    # the global path's counter (an atomic add) and its L2 loads of the partials are gone
    assert re.search(r"\bATOMG?\.", text[0]) and not re.search(r"\bATOMG?\.", text[1])
    assert "LDG.E.STRONG.GPU" in text[0] and "LDG.E.STRONG.GPU" not in text[1]


def test_every_path_compiles(cache: Path) -> None:
    """The cluster's sum reaches every epilogue: requantized (with the residual), fp16 with
    bias (and the residual), raw int32, staged raw (PACK_OUT 0), swapped operands, NHWCnc,
    mma.sync with four splits, the TMA pipeline with and without a producer warp."""
    cases = [
        ("int8", CL, "requant"),
        ("fp16", {**CL, "TMA": 1}, "bias"),
        ("int8", {**CL, "TMA": 0, "PACK_OUT": 0}, "requant"),
        ("int8", {**CL, "SWAP_AB": 1, "TMA": 1}, "acc"),
        ("int8", {**CL, "MMA": "sync", "TMA": 0, "SPLIT_K": 4, "BLK_COL_WARPS": 2,
                  "CHUNK": 2, "STAGES": 3}, "requant"),
        ("int8", {**CL, "MMA": "sync", "TMA": 0, "LAYOUT": "nhwcnc", "CHUNK": 2,
                  "STAGES": 2}, "requant"),
        ("fp16", {**CL, "TMA": 0, "STAGES": 6}, "acc"),
    ]
    jobs = []
    for p, s, mode in cases:
        assert ScheduleSpace(STAGE4, Precision(p), H100).is_valid(s), s
        for residual in ((False, True) if mode != "acc" else (False,)):
            jobs.append(BuildJob(STAGE4, Precision(p), 90, s, Epilogue(mode, True, residual)))
    assert_all_compile(jobs, cache)
