"""Two kernel paths on a CPU: folded filter taps for layers with few channels (FOLD_TAPS) and
the residual epilogue. Their rules (kernels.space and the kernel's static_asserts agree),
their geometry, their builds for sm_75 / sm_80 / sm_90 with the Tensor Core instructions they
should hold, and the reference and runtime contracts. The GPU checks are in test_runtime.py
(`on_gpu`) and bench/kernels_check.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels import reference as ref
from kernels.build import BuildJob, Epilogue, build, defines
from kernels.launch import launch
from kernels.runtime import Conv2d
from kernels.space import (
    ScheduleSpace,
    fold_tap_bytes,
    geometry,
    padded_channels,
    schedule_columns,
)
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target
from tests.kernels.builds import assert_all_compile, assert_mma_and_copy, sass_of
from tests.kernels.test_runtime import assert_chain_equal, chain_outputs, on_gpu

STEM = ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3)
ODD = ConvShape(3, 17, 19, 5, 24, 3, 3, pad=1)  # 5 channels: int8 8 bytes, fp16 16 bytes
SYNC = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=2, WARP_ROW_TILES=2, WARP_COL_TILES=4, CHUNK=2,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1)
WG = {**SYNC, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 1,
      "WARP_COL_TILES": 2, "STAGES": 4, "MMA": "wgmma"}
SM_TARGET = {75: "t4", 80: "a100", 90: "h100"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fold_residual")


def cols_of(schedule: dict) -> dict[str, np.ndarray]:
    return schedule_columns(schedule)


# ---- FOLD_TAPS ---------------------------------------------------------------------------
@pytest.mark.parametrize("c,precision,tap_bytes,channels", [
    (3, "int8", 4, 4), (4, "int8", 4, 4), (5, "int8", 8, 8), (16, "int8", 16, 16),
    (3, "fp16", 8, 4), (5, "fp16", 16, 8), (8, "fp16", 16, 8),
    (17, "int8", 0, None), (9, "fp16", 0, None), (3, "int4", 0, None), (3, "fp32_tc", 0, None),
])
def test_fold_pads_channels_to_one_tap_vector(c: int, precision: str, tap_bytes: int,
                                              channels: int | None) -> None:
    shape = ConvShape(2, 20, 20, c, 32, 3, 3, pad=1)
    assert fold_tap_bytes(shape, Precision(precision)) == tap_bytes
    if channels is not None:
        assert padded_channels(shape, Precision(precision), fold=True) == channels


def test_fold_is_valid_only_where_it_applies() -> None:
    h100 = get_target("h100")
    s = {**SYNC, "FOLD_TAPS": 1}
    assert ScheduleSpace(STEM, Precision.INT8, h100).is_valid(s)
    assert ScheduleSpace(STEM, Precision.FP16, h100).is_valid({**WG, "FOLD_TAPS": 1})
    # too many channels to fold; no fold path for int4 and fp32_tc
    assert not ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, h100).is_valid(s)
    assert not ScheduleSpace(ConvShape(2, 20, 20, 4, 32, 3, 3), Precision.INT4,
                             h100).is_valid(s)
    # the loader reads plain NHWC rows: no duplicate-aware rows, NHWCnc, TMA or REORDER
    space = ScheduleSpace(STEM, Precision.INT8, h100)
    for bad in ({"DUP_AWARE": 1}, {"LAYOUT": "nhwcnc"}, {"REORDER_INNER": 1}):
        assert not space.is_valid({**s, **bad})
    assert not space.is_valid({**WG, "FOLD_TAPS": 1, "TMA": 1})
    # one tap slot per thread: 1 warp (32 threads) cannot hold 64 taps per row (CHUNK 8)
    one_warp = {**SYNC, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 1, "CHUNK": 8, "FOLD_TAPS": 1}
    assert not space.is_valid(one_warp)
    # folded spaces exist for the stem on every target
    for t in ("t4", "a100", "h100"):
        assert len(ScheduleSpace(STEM, Precision.INT8, get_target(t),
                                 restrict={"FOLD_TAPS": [1]}).valid_indices) > 1000


def test_fold_geometry_walks_the_taps() -> None:
    h100 = get_target("h100")
    # int8: CHUNK 2 stages hold 64 bytes = 16 taps of 4 bytes: 49 taps in 4 stages
    g = geometry(STEM, Precision.INT8, h100, cols_of({**SYNC, "FOLD_TAPS": 1}))
    assert int(g.k_iters[0]) == 4 and int(g.row_loads[0]) == 16
    # unfolded: a 16-byte vector per tap and stage, half of a 32-channel k-step wasted
    g0 = geometry(STEM, Precision.INT8, h100, cols_of(SYNC))
    assert int(g0.k_iters[0]) == 49
    # fp16 with split-K 2: 8 taps of 8 bytes per stage, 7 stages, 4 per split
    g = geometry(STEM, Precision.FP16, h100, cols_of({**SYNC, "FOLD_TAPS": 1, "SPLIT_K": 2}))
    assert int(g.k_iters[0]) == 4


def test_fold_rule_is_the_kernels(cache: Path) -> None:
    """A folded schedule that breaks a rule fails in the compiler too, with the reason."""
    res = build(BuildJob(STEM, Precision.INT8, 90, {**SYNC, "FOLD_TAPS": 1, "REORDER_INNER": 1}),
                cache)
    assert res.status == "compile_error" and "FOLD_TAPS loads NHWC taps" in res.log
    # the build pads the stem's channels to one tap vector
    assert defines(BuildJob(STEM, Precision.INT8, 90, {**SYNC, "FOLD_TAPS": 1}))["TC_C"] == 4
    assert defines(BuildJob(STEM, Precision.FP16, 90, {**SYNC, "FOLD_TAPS": 1}))["TC_C"] == 4
    assert defines(BuildJob(STEM, Precision.INT8, 90, SYNC))["TC_C"] == 16


def _sample(shape: ConvShape, precision: Precision, sm: int, n: int, seed: int,
            **restrict: list) -> list[BuildJob]:
    space = ScheduleSpace(shape, precision, get_target(SM_TARGET[sm]), restrict=restrict)
    rng = np.random.default_rng(seed)
    picks = rng.choice(space.valid_indices, size=n, replace=False)
    return [BuildJob(shape, precision, sm, space.schedule_at(int(i))) for i in picks]


@pytest.mark.timeout(900)
def test_folded_schedules_compile_for_every_sm(cache: Path) -> None:
    jobs = [j for sm in (75, 80, 90) for shape in (STEM, ODD)
            for p in (Precision.INT8, Precision.FP16)
            for j in _sample(shape, p, sm, 4, seed=sm, FOLD_TAPS=[1])]
    assert_all_compile(jobs, cache)


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("precision,sm,schedule,mma,copy", [
    ("int8", 75, {**SYNC, "STAGES": 1}, "IMMA", "LDG"),
    ("fp16", 80, SYNC, "HMMA", "LDGSTS"),
    ("int8", 90, WG, "GMMA", "LDGSTS"),
    ("fp16", 90, {**WG, "CHUNK": 4}, "GMMA", "LDGSTS"),
])
def test_folded_builds_hold_the_intended_instructions(precision: str, sm: int, schedule: dict,
                                                      mma: str, copy: str, cache: Path) -> None:
    assert_mma_and_copy(
        sass_of(BuildJob(STEM, Precision(precision), sm, {**schedule, "FOLD_TAPS": 1}), cache),
        mma, copy)


# ---- the residual epilogue ---------------------------------------------------------------
def test_residual_epilogue_rules() -> None:
    assert Epilogue("requant", residual=True).resolved(Precision.INT8).residual
    assert Epilogue(residual=True).resolved(Precision.FP16).mode == "bias"
    for p, mode in (("int8", "acc"), ("fp16", "acc"), ("int4", "requant"),
                    ("fp32_tc", "bias")):
        with pytest.raises(ValueError, match="residual"):
            Epilogue(mode, residual=True).resolved(Precision(p))
    d = defines(BuildJob(RESNET50_3X3["stage3"], Precision.INT8, 90, SYNC,
                         Epilogue(residual=True)))
    assert d["TC_RES"] == 1
    # builds without a residual keep their defines (and cached artifacts' metadata)
    assert "TC_RES" not in defines(BuildJob(RESNET50_3X3["stage3"], Precision.INT8, 90, SYNC))
    assert Epilogue().to_dict() == {"mode": "default", "relu": False}


@pytest.mark.timeout(900)
def test_residual_builds_compile_for_every_sm(cache: Path) -> None:
    jobs = [BuildJob(shape, p, sm, j.schedule, Epilogue(relu=relu, residual=True))
            for sm in (75, 80, 90) for p in (Precision.INT8, Precision.FP16)
            for shape in (RESNET50_3X3["stage4"], ConvShape(8, 14, 14, 64, 40, 1, 1))
            for relu, j in zip((False, True), _sample(shape, p, sm, 2, seed=sm + 1),
                               strict=True)]
    assert_all_compile(jobs, cache)


# The 1x1 expand of ResNet-50's stage 4 on a TMA schedule like its H200 record's.
EXPAND = ConvShape(8, 14, 14, 256, 1024, 1, 1)
# (batch 32: grids that are not resident at once, where the region's cost in blocks per SM
# keeps the residual tile after the loop)
EXPAND32 = ConvShape(32, 14, 14, 256, 1024, 1, 1)
EXPAND_TMA = {**WG, "CHUNK": 4, "STAGES": 3, "TMA": 1, "PLAIN_A": 1, "PACK_OUT": 1}


def _residual_geometry(schedule: dict, residual: bool = True, target: str = "h200",  # noqa: ANN202
                       shape: ConvShape = EXPAND):
    return geometry(shape, Precision.INT8, get_target(target), cols_of(schedule),
                    residual=residual)


def test_residual_tile_is_copied_ahead_where_blocks_per_sm_stay_or_the_grid_is_resident(
) -> None:
    g, plain = _residual_geometry(EXPAND_TMA), _residual_geometry(EXPAND_TMA, residual=False)
    # its own region past the pipeline (whose memory the staging tile shares), 16-byte aligned:
    # the tile's padded rows, then the columns' scale and bias as floats
    tile = int(g.block_m[0]) * (int(g.block_n[0]) + 16) + 8 * int(g.block_n[0])
    assert bool(g.res_ahead[0])
    assert int(g.smem_bytes[0]) == -(-int(plain.smem_bytes[0]) // 16) * 16 + tile
    d = defines(BuildJob(EXPAND, Precision.INT8, 90, EXPAND_TMA, Epilogue(residual=True)))
    assert d["TC_RES_AHEAD"] == 1 and d["TC_SMEM_BYTES"] == int(g.smem_bytes[0])
    # not where the larger region would cost a block per SM (3 -> 2 of 228 KB) and the grid
    # is not resident at once (batch 32: 784 tiles, 264 places): copied in after the loop
    # instead, in the staging tile's shadow of the pipeline
    crowded = {**EXPAND_TMA, "WARP_COL_TILES": 4}
    c = _residual_geometry(crowded, shape=EXPAND32)
    c_plain = _residual_geometry(crowded, residual=False, shape=EXPAND32)
    assert int(c.grid_blocks[0]) == 784
    tile = int(c.block_m[0]) * (int(c.block_n[0]) + 16)
    region = tile + 8 * int(c.block_n[0])
    ahead = -(-int(c_plain.smem_bytes[0]) // 16) * 16 + region
    after = max(int(c_plain.smem_bytes[0]), tile + region)
    assert (228 * 1024) // (ahead + 1024) < (228 * 1024) // (after + 1024)
    assert not bool(c.res_ahead[0]) and int(c.smem_bytes[0]) == after
    # at batch 8 (200 tiles) the whole grid is resident with it: no block waits for another's
    # place either way, and the tile is copied ahead
    c8 = _residual_geometry(crowded)
    assert int(c8.grid_blocks[0]) == 200 and bool(c8.res_ahead[0])
    assert int(c8.smem_bytes[0]) == ahead
    # nor without cp.async (sm_75), a residual or a packed epilogue, nor with a persistent
    # grid or split-K
    assert not bool(_residual_geometry({**SYNC, "STAGES": 1, "CHUNK": 1},
                                       target="t4").res_ahead[0])
    assert bool(_residual_geometry({**SYNC, "STAGES": 1, "CHUNK": 1}).res_ahead[0])
    assert not bool(_residual_geometry(EXPAND_TMA, residual=False).res_ahead[0])
    for knobs in ({"PACK_OUT": 0}, {"PERSIST": 1}, {"SPLIT_K": 2, "TMA": 0, "PLAIN_A": 0}):
        assert not bool(_residual_geometry({**EXPAND_TMA, **knobs}).res_ahead[0]), knobs


@pytest.mark.parametrize("sm,schedule,shape,ahead", [
    (90, EXPAND_TMA, EXPAND, 1), (90, {**EXPAND_TMA, "STAGES": 2}, EXPAND32, 0),
    (90, {**SYNC, "STAGES": 1, "CHUNK": 1}, EXPAND, 1),
    (80, {**SYNC, "STAGES": 2}, EXPAND32, 0)])
def test_residual_tile_arrives_by_cp_async_and_converts_without_i2f(
        cache: Path, sass_tools: None, sm: int, schedule: dict, shape: ConvShape,
        ahead: int) -> None:
    job = BuildJob(shape, Precision.INT8, sm, schedule, Epilogue(relu=True, residual=True))
    assert defines(job)["TC_RES_AHEAD"] == ahead
    with_res = sass_of(job, cache)
    without = sass_of(BuildJob(shape, Precision.INT8, sm, schedule, Epilogue(relu=True)), cache)
    assert not with_res.spills

    def count(text: str, op: str) -> int:
        return sum(f" {op}" in ln for ln in text.splitlines())

    # TMA builds copy nothing else by cp.async: the residual tile does, before the main loop
    # (ahead: on sm_90 its copies are in the code twice, before the grid-dependency wait where
    # the launch says the residual is ready, and after it) or after it, all copies in flight
    # at once
    if schedule.get("TMA"):
        assert count(without.text, "LDGSTS") == 0 < count(with_res.text, "LDGSTS")
        lines = with_res.text.splitlines()
        wait = next(i for i, ln in enumerate(lines) if " ACQBULK" in ln)
        before = sum(" LDGSTS" in ln for ln in lines[:wait])
        assert (before > 0) == bool(ahead), before
    # the residual's bytes become floats by adds: the residual adds no conversion instruction
    assert count(with_res.text, "I2F") == count(without.text, "I2F")
    # the columns' scale and bias come with the residual tile (one wait for both): after the
    # main loop the epilogue loads nothing from global memory, where it loads them without
    assert global_loads_after_main_loop(with_res.text) == 0
    assert global_loads_after_main_loop(without.text) > 0


def global_loads_after_main_loop(text: str) -> int:
    lines = text.splitlines()
    last_mma = max(i for i, ln in enumerate(lines) if re.search(r"\s[HI]G?MMA\.", ln))
    return sum(bool(re.search(r"\sLDG\.", ln)) for ln in lines[last_mma:])


def test_residual_reference_is_the_kernels_arithmetic() -> None:
    acc = np.array([[100, -7, 3000]], dtype=np.int64)
    scale = np.array([0.05, 0.5, 0.01], dtype=np.float32)
    bias = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    res = np.array([[-20, 127, -128]], dtype=np.int8)
    got = ref.requantize(acc, scale, bias, 8, relu=False, residual=res, res_scale=0.125)
    # float32: acc*scale, + bias, + res*res_scale, then round half to even and clamp
    v = (acc.astype(np.float32) * scale + bias) + res.astype(np.float32) * np.float32(0.125)
    assert np.array_equal(got, np.rint(np.clip(v, -128, 127)).astype(np.int64))
    assert got.tolist() == [[4, 10, 14]]
    assert ref.requantize(acc, scale, bias, 8, relu=True, residual=res,
                          res_scale=2.0).tolist() == [[0, 127, 0]]
    y = ref.fp_epilogue(np.array([0.5, -1.0]), np.array([0.25, 0.0]), True,
                        np.array([-1.0, 0.5], dtype=np.float16))
    assert y.tolist() == [0.0, 0.0]
    prob = ref.make_problem(ConvShape(1, 6, 6, 16, 16, 3, 3, pad=1), Precision.INT8, seed=1)
    r, rs = prob.residual()
    assert r.shape == (1, 6, 6, 16) and r.dtype == np.int8 and rs > 0
    with_res = prob.expected("requant", False, residual=True)
    assert not np.array_equal(with_res, prob.expected("requant", False))


def test_runtime_residual_contract(cache: Path) -> None:
    from tests.kernels.test_runtime import FakeCupy

    shape = ConvShape(2, 10, 12, 32, 48, 3, 3, pad=1)
    op = Conv2d(shape, "int8", SYNC, "h100", residual=True, cache_dir=cache)
    assert op.epilogue.residual and "+residual" in repr(op)
    x, w = FakeCupy(op.input_shape, "int8"), FakeCupy(op.weight_shape, "int8")
    sc, b = FakeCupy((48,), "float32"), FakeCupy((48,), "float32")
    r = FakeCupy(op.output_shape, "int8")
    assert op.validate(x, w, sc, b, residual=r, res_scale=0.5) == ("cupy", 0)
    with pytest.raises(ValueError, match="residual is required"):
        op.validate(x, w, sc, b)
    with pytest.raises(ValueError, match="res_scale is required"):
        op.validate(x, w, sc, b, residual=r)
    with pytest.raises(ValueError, match="residual"):
        op.validate(x, w, sc, b, residual=FakeCupy((2, 10, 12, 40), "int8"), res_scale=0.5)
    plain = Conv2d(shape, "int8", SYNC, "h100", cache_dir=cache)
    with pytest.raises(ValueError, match="no residual epilogue"):
        plain.validate(x, w, sc, b, residual=r, res_scale=0.5)
    fp16 = Conv2d(shape, "fp16", SYNC, "h100", residual=True, cache_dir=cache)
    with pytest.raises(ValueError, match="res_scale is for int8"):
        fp16.validate(FakeCupy(fp16.input_shape, "float16"),
                      FakeCupy(fp16.weight_shape, "float16"), None,
                      FakeCupy((48,), "float32"), residual=FakeCupy(fp16.output_shape,
                                                                    "float16"), res_scale=1.0)
    with pytest.raises(ValueError, match="int8 'requant' and the fp16 'bias'"):
        Conv2d(shape, "int8", SYNC, "h100", epilogue="acc", residual=True, cache_dir=cache)
    # the launch refuses a residual for a build without one, and the reverse, before any GPU
    with pytest.raises(ValueError, match="takes a residual tensor"):
        launch(None, op.meta, x, w, sc, b, r, None, None)
    with pytest.raises(ValueError, match="no residual epilogue"):
        launch(None, plain.meta, x, w, sc, b, r, None, None, res=r)
    # the residual read before the grid-dependency wait is for PDL launches of residual builds
    with pytest.raises(ValueError, match="pdl=True and a residual"):
        Conv2d(shape, "int8", SYNC, "h100", residual=True, residual_ready=True, cache_dir=cache)
    with pytest.raises(ValueError, match="pdl=True and a residual"):
        Conv2d(shape, "int8", SYNC, "h100", pdl=True, residual_ready=True, cache_dir=cache)
    ready = Conv2d(shape, "int8", SYNC, "h100", residual=True, pdl=True, residual_ready=True,
                   cache_dir=cache)
    assert ready.residual_ready and ready.key == op.key  # the same build, launched otherwise
    with pytest.raises(ValueError, match="needs both"):
        launch(None, op.meta, x, w, sc, b, r, None, None, res=r, res_ready=True)


# ResNet blocks' shape: each conv adds the input of the conv before it (two launches back).
# (batch 32: a grid not resident at once, where the TMA schedule's region would cost a block
# per SM: its tile is copied after the loop)
BLOCK = ConvShape(32, 28, 28, 128, 128, 1, 1)


@on_gpu
@pytest.mark.parametrize("schedule,ahead", [
    ({**WG, "CHUNK": 4}, 1), ({**EXPAND_TMA, "WARP_COL_TILES": 4}, 0)])
def test_on_gpu_residual_read_before_the_wait_equals_plain_launches(
        cache: Path, schedule: dict, ahead: int) -> None:
    """A chain h[i+1] = conv(h[i]) + h[i-1] launched with PDL, each residual ready
    (residual_ready; its writer ran two launches back): a tile copied ahead is copied while
    the kernel waits for the one before, one copied after the loop as before. The plain
    launches' bytes, eagerly and replayed from a CUDA graph, every output poisoned before
    each run."""
    import torch

    job = BuildJob(BLOCK, Precision.INT8, 90, schedule, Epilogue(relu=True, residual=True))
    assert defines(job)["TC_RES_AHEAD"] == ahead
    plain, early = (Conv2d(BLOCK, "int8", schedule, "h100", relu=True, residual=True, pdl=pdl,
                           residual_ready=pdl, cache_dir=cache) for pdl in (False, True))
    prob = ref.make_problem(BLOCK, Precision.INT8, seed=7)
    w = torch.from_numpy(prob.w.reshape(plain.weight_shape)).cuda()
    sc, b = (torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in (prob.scale, prob.bias))
    h0 = torch.from_numpy(prob.x.reshape(plain.input_shape)).cuda()
    hm1 = torch.roll(h0, 1, dims=0).contiguous()  # the first conv's residual
    outs = [torch.empty(plain.output_shape, dtype=torch.int8, device="cuda") for _ in range(6)]

    def chain(op: Conv2d) -> None:
        prev, h = hm1, h0
        for y in outs:
            op(h, w, sc, b, residual=prev, res_scale=0.5, out=y)
            prev, h = h, y

    want = chain_outputs(lambda: chain(plain), outs, graph=False)
    assert_chain_equal(lambda: chain(early), outs, want)
