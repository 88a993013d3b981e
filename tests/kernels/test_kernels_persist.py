"""The persistent grid (PERSIST) on a CPU: where it is valid (the TMA and cp.async
multistage pipelines; kernels.space and the kernel's static_asserts agree), its shared memory
and register rules, its launch grid, and its builds for sm_80 and sm_90 with the instructions
they should hold. The GPU checks are in test_runtime.py (`on_gpu`) and bench/kernels_check.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, Epilogue, build
from kernels.launch import launch_dims
from kernels.space import ScheduleSpace, geometry, register_slack
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.builds import assert_all_compile, assert_mma_and_copy, sass_of
from tests.kernels.test_kernels_fold_residual import cols_of

EXPAND = ConvShape(8, 56, 56, 64, 256, 1, 1)  # ResNet-50's output-bound 1x1
SYNC = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=4, WARP_ROW_TILES=2, WARP_COL_TILES=4, CHUNK=2,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=3, SPLIT_K=1)
WG = {**SYNC, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 1, "WARP_COL_TILES": 2, "STAGES": 4,
      "MMA": "wgmma"}
H100 = get_target("h100")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("persist")


def test_persist_is_valid_only_on_the_tma_and_multistage_pipelines() -> None:
    space = ScheduleSpace(EXPAND, Precision.INT8, H100)
    for n in (1, 2):
        assert space.is_valid({**SYNC, "PERSIST": n})
        assert space.is_valid({**WG, "PERSIST": n})
        assert space.is_valid({**WG, "PERSIST": n, "TMA": 1})
    # no split-K
    assert not space.is_valid({**SYNC, "PERSIST": 1, "SPLIT_K": 2})
    assert not space.is_valid({**WG, "PERSIST": 1, "TMA": 1, "SPLIT_K": 2})
    # no register-staged pipeline (sm_75; int4 via s8 on sm_90) and no fp32_tc
    assert not ScheduleSpace(EXPAND, Precision.INT8, get_target("t4")).is_valid(
        {**SYNC, "STAGES": 2, "PERSIST": 1})
    assert not ScheduleSpace(EXPAND, Precision.INT4, H100).is_valid(
        {**SYNC, "STAGES": 2, "PERSIST": 1})
    assert ScheduleSpace(EXPAND, Precision.INT4, get_target("a100")).is_valid(
        {**SYNC, "PERSIST": 1})
    assert not ScheduleSpace(EXPAND, Precision.FP32_TC, H100).is_valid(
        {**SYNC, "CHUNK": 1, "PERSIST": 1})
    # persistent spaces exist on sm_80 and sm_90
    for t in ("a100", "h100"):
        assert len(ScheduleSpace(EXPAND, Precision.FP16, get_target(t),
                                 restrict={"PERSIST": [2]}).valid_indices) > 1000


def test_persist_gives_the_epilogue_its_own_shared_memory() -> None:
    g0 = geometry(EXPAND, Precision.INT8, H100, cols_of(SYNC))
    g1 = geometry(EXPAND, Precision.INT8, H100, cols_of({**SYNC, "PERSIST": 1}))
    pipe = 3 * (32 * 64 + 128 * 64)  # STAGES x (A + B) of a 32 x 128 x 64-byte block tile
    epi = 32 * (128 + 16)  # int8 output rows + the padding against bank conflicts
    assert int(g0.smem_bytes[0]) == max(pipe, epi)
    assert int(g1.smem_bytes[0]) == pipe + epi


def test_persist_blocks_per_sm_share_registers_and_shared_memory() -> None:
    s = {**SYNC, "BLK_ROW_WARPS": 2, "PERSIST": 1}  # 256 threads
    slack1 = register_slack(EXPAND, Precision.INT8, H100, cols_of(s))[0]
    slack2 = register_slack(EXPAND, Precision.INT8, H100, cols_of({**s, "PERSIST": 2}))[0]
    assert slack1 - slack2 == 255 - 128  # two blocks of 256 threads: 128 registers each
    # a block of 160 KB fits one per SM, not two
    big = {**WG, "BLK_ROW_WARPS": 2, "WARP_COL_TILES": 8, "CHUNK": 8, "STAGES": 4}
    space = ScheduleSpace(ConvShape(8, 28, 28, 512, 512, 3, 3, pad=1), Precision.FP16, H100)
    g = geometry(space.shape, Precision.FP16, H100, cols_of({**big, "PERSIST": 1}))
    if int(g.smem_bytes[0]) + 1024 > H100.smem_per_sm_kib * 1024 // 2:
        assert not space.is_valid({**big, "PERSIST": 2})


def test_persistent_grid_is_blocks_per_sm_at_most_one_per_tile() -> None:
    meta = {"grid": [1568, 1, 1], "block": [128, 1, 1], "smem_bytes": 1, "persist": 2,
            "tiles": 1568}
    assert launch_dims(meta, sms=132)[0] == (264, 1, 1)
    assert launch_dims({**meta, "tiles": 100, "grid": [100, 1, 1]}, sms=132)[0] == (100, 1, 1)
    assert launch_dims({**meta, "persist": 0}, sms=132)[0] == (1568, 1, 1)


def test_persist_rule_is_the_kernels(cache: Path) -> None:
    """A persistent schedule the space refuses fails in the compiler too, with the reason."""
    res = build(BuildJob(EXPAND, Precision.INT8, 90, {**SYNC, "PERSIST": 1, "SPLIT_K": 2}),
                cache)
    assert res.status == "compile_error" and "persistent grid" in res.log
    meta = build(BuildJob(EXPAND, Precision.INT8, 90, {**SYNC, "PERSIST": 2}), cache).meta
    assert meta["persist"] == 2 and meta["tiles"] == 1568


@pytest.mark.timeout(900)
def test_persistent_schedules_compile_for_sm80_and_sm90(cache: Path) -> None:
    rng = np.random.default_rng(8)
    jobs = []
    for sm, t in ((80, "a100"), (90, "h100")):
        for shape in (EXPAND, ConvShape(3, 17, 19, 5, 24, 3, 3, pad=1)):
            for p in (Precision.INT8, Precision.FP16):
                space = ScheduleSpace(shape, p, get_target(t), restrict={"PERSIST": [1, 2]})
                for i in rng.choice(space.valid_indices, size=4, replace=False):
                    jobs.append(BuildJob(shape, p, sm, space.schedule_at(int(i)),
                                         Epilogue(residual=bool(rng.random() < 0.5))))
    assert_all_compile(jobs, cache)


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("precision,sm,schedule,mma,copy", [
    ("int8", 80, SYNC, "IMMA", "LDGSTS"), ("fp16", 90, SYNC, "HMMA", "LDGSTS"),
    ("int8", 90, WG, "GMMA", "LDGSTS"), ("fp16", 90, {**WG, "TMA": 1}, "GMMA", "UTMALDG"),
])
def test_persistent_builds_hold_the_intended_instructions(precision: str, sm: int,
                                                          schedule: dict, mma: str, copy: str,
                                                          cache: Path) -> None:
    assert_mma_and_copy(
        sass_of(BuildJob(EXPAND, Precision(precision), sm, {**schedule, "PERSIST": 2}), cache),
        mma, copy)
