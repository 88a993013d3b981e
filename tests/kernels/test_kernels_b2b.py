"""A back-to-back 1x1 conv run by the same kernel over a layer's output (Epilogue.b2b,
kernels/b2b.cuh) on a CPU: where it applies (kernels.space's rule and the kernel's
static_asserts agree), its builds for sm_75 / sm_80 / sm_90 with the instructions they should
hold, the launch contract of its arguments, and its reference. The GPU check is
bench/gpu/b2b_check.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels import reference as ref
from kernels.build import BuildJob, Epilogue, build, defines
from kernels.launch import launch
from kernels.runtime import Conv2d, DefaultScheduleWarning, schedule_fits
from kernels.space import (
    ScheduleSpace,
    b2b_mask,
    b2b_problems,
    geometry,
    schedule_columns,
    with_defaults,
)
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.builds import sass_of
from tests.kernels.test_runtime import FakeCupy, on_gpu

# ResNet-50's layer1 bottleneck's last conv with its residual; the next block's first conv
# (64 channels) back-to-back over its output.
LAST = ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True)
LAST32 = ConvShape(32, 56, 56, 64, 256, 1, 1, residual=True)
WG = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=8, CHUNK=2,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1,
          MMA="wgmma", TMA=0)
SYNC = {**WG, "MMA": "sync", "BLK_COL_WARPS": 4, "WARP_ROW_TILES": 2}  # 64 x 256 tiles


def with_b2b(b2b: int = 64) -> Epilogue:
    return Epilogue(relu=True, residual=True, b2b=b2b, b2b_relu=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("b2b")


def _problem(schedule: dict, precision: Precision = Precision.INT8, b2b: int = 64,
             sm: int = 90, shape: ConvShape = LAST) -> str | None:
    p = Precision(precision)
    s = with_defaults(p, schedule)
    g = geometry(shape, p, get_target("h200"), schedule_columns(s), residual=True, b2b=b2b)
    return b2b_problems(shape, p, sm, s, b2b, g)


def test_where_a_b2b_conv_applies() -> None:
    assert _problem(WG) is None and _problem(SYNC, Precision.FP16, sm=80) is None
    assert _problem(WG, b2b=0) is None  # no b2b: nothing to refuse
    cases = [
        ({**WG, "PACK_OUT": 0}, 64, "PACK_OUT=1"),
        ({**WG, "SPLIT_K": 2}, 64, "SPLIT_K=1"),
        ({**SYNC, "PERSIST": 1}, 64, "PERSIST=0"),
        ({**WG, "WARP_COL_TILES": 4}, 64, "whole output rows"),  # 128 of the 256 columns
        ({**SYNC, "BLK_COL_WARPS": 8}, 60, "16-byte vectors"),
        # under 32-channel multiples a wgmma build's second GEMM is mma.sync's, as above
        ({**WG, "PACK_OUT": 2, "TMA": 1}, 16, "PACK_OUT=1"),
        ({**WG, "PERSIST": 1}, 16, "PERSIST=0"),
    ]
    for sched, b2b, why in cases:
        got = _problem(sched, b2b=b2b)
        assert got is not None and why in got, (sched, got)
    assert "int8 and fp16" in str(_problem(WG, Precision.INT4))
    # On wgmma the second GEMM reads the staged tile in TMA stores' boxes too.
    assert _problem({**WG, "PACK_OUT": 2, "TMA": 1}) is None
    # and a persistent block keeps its weights for all its tiles
    assert _problem({**WG, "PERSIST": 1}) is None
    assert _problem({**WG, "PERSIST": 1, "TMA": 1, "PACK_OUT": 2}) is None
    # K = 8 fp16 channels are 16 bytes: less than one k16 step of the back-to-back reduction
    narrow = ConvShape(8, 14, 14, 64, 8, 1, 1)
    assert "whole steps" in str(_problem({**SYNC, "BLK_COL_WARPS": 1, "WARP_COL_TILES": 1},
                                         Precision.FP16, 16, 80, narrow))
    with pytest.raises(ValueError, match="back-to-back conv follows"):
        Epilogue(mode="acc", b2b=64).resolved(Precision.INT8)
    assert with_b2b().to_dict() == {"mode": "default", "relu": True, "residual": True,
                                   "b2b": 64, "b2b_relu": True}
    assert "b2b" not in Epilogue(relu=True).to_dict()


def test_the_build_refuses_what_the_rule_refuses() -> None:
    with pytest.raises(ValueError, match="whole output rows"):
        defines(BuildJob(LAST, Precision.INT8, 90, {**WG, "WARP_COL_TILES": 4}, with_b2b()))
    d = defines(BuildJob(LAST, Precision.INT8, 90, WG, with_b2b()))
    assert d["TC_B2B"] == 64 and d["TC_B2B_RELU"] == 1
    # mma.sync: rows padded by 16: weights 64 x (256 + 16), output 128 x (64 + 16), the
    # staged tile 64 x (256 + 16) at 0. Copied after the loop, the weights and the output fit
    # in the dead pipeline past the staged tile; copied ahead they would cost a block per SM.
    sync = {**SYNC, "STAGES": 3}
    d = defines(BuildJob(LAST, Precision.INT8, 90, sync, with_b2b()))
    plain = defines(BuildJob(LAST, Precision.INT8, 90, sync, Epilogue(relu=True, residual=True)))
    assert "TC_B2B" not in plain
    assert d["TC_SMEM_BYTES"] == plain["TC_SMEM_BYTES"] >= 64 * 272 + 64 * 272 + 64 * 80
    assert d["TC_B2B_AHEAD"] == 0
    # wgmma: the staged tile dense in swizzled boxes, 128 x 256 from a 1024-byte-aligned base,
    # and the weights dense too (64 x 256, aligned), for the second GEMM's descriptors. (At
    # batch 32, where the residual tile's own region would cost a block per SM with the grid
    # not resident at once: the tile after the loop, and the weights too.)
    d = defines(BuildJob(LAST32, Precision.INT8, 90, WG, with_b2b()))
    assert d["TC_RES_AHEAD"] == 0 and d["TC_B2B_AHEAD"] == 0
    assert d["TC_SMEM_BYTES"] >= (128 * 256 + 1024) + (64 * 256 + 1024) + 128 * 80
    # A deep pipeline (one block per SM either way): the weights ahead, past the rest; the
    # output past the staged tile.
    deep = {**WG, "STAGES": 3, "CHUNK": 4}
    d = defines(BuildJob(LAST, Precision.INT8, 90, deep, with_b2b()))
    plain = defines(BuildJob(LAST, Precision.INT8, 90, deep, Epilogue(relu=True, residual=True)))
    assert d["TC_B2B_AHEAD"] == 1
    assert d["TC_SMEM_BYTES"] == -(-plain["TC_SMEM_BYTES"] // 16) * 16 + 64 * 256 + 1024


@pytest.mark.usefixtures("sass_tools")
@pytest.mark.parametrize("precision,sm,schedule,mmas", [
    ("int8", 75, {**SYNC, "STAGES": 1}, ("IMMA",)),
    ("int8", 80, SYNC, ("IMMA",)),
    ("fp16", 80, SYNC, ("HMMA",)),
    ("int8", 90, SYNC, ("IMMA",)),
    # the main loop's wgmma and the b2b's (64 channels: IGMMA.64x64)
    ("int8", 90, WG, ("IGMMA.64x256", "IGMMA.64x64")),
    ("int8", 90, {**WG, "STAGES": 3, "CHUNK": 4}, ("IGMMA.64x256", "IGMMA.64x64")),  # ahead
    ("fp16", 90, {**WG, "TMA": 1}, ("HGMMA.64x256", "HGMMA.64x64")),
    ("int8", 90, {**WG, "TMA": 1, "PACK_OUT": 2}, ("IGMMA.64x256", "IGMMA.64x64")),  # TMA stores
    # persistent blocks, cp.async and TMA loads; two warpgroups share the 64 channels (n32)
    ("fp16", 90, {**WG, "BLK_ROW_WARPS": 1, "PERSIST": 1}, ("HGMMA.64x256", "HGMMA.64x64")),
    ("int8", 90, {**WG, "PERSIST": 1, "TMA": 1}, ("IGMMA.64x256", "IGMMA.64x64")),
    ("int8", 90, {**WG, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 2, "WARP_COL_TILES": 4},
     ("IGMMA.64x128", "IGMMA.64x32")),
])
def test_b2b_builds_hold_the_intended_instructions(precision: str, sm: int, schedule: dict,
                                                       mmas: tuple[str, ...],
                                                       cache: Path) -> None:
    """The kernel's static_asserts hold (its shared memory is geometry's), and the b2b's
    matrix instructions are there beside the main loop's (mma.sync, or on wgmma builds
    wgmma), without spills."""
    summary = sass_of(BuildJob(LAST, Precision(precision), sm, schedule, with_b2b()), cache)
    assert not summary.spills
    for mma in mmas:
        assert any(m.startswith(mma) for m in summary.mma), (mma, summary.mma)
    plain = sass_of(BuildJob(LAST, Precision(precision), sm, schedule,
                             Epilogue(relu=True, residual=True)), cache)
    assert summary.text.count("MMA") > plain.text.count("MMA")


@pytest.mark.usefixtures("sass_tools")
def test_a_narrow_b2b_of_a_wgmma_build_runs_on_mma_sync(cache: Path) -> None:
    """16 channels (no n32 wgmma tile): the main loop's wgmma, the second GEMM's mma.sync."""
    summary = sass_of(BuildJob(LAST, Precision.INT8, 90, WG, with_b2b(16)), cache)
    assert not summary.spills
    assert any(m.startswith("IGMMA.64x256") for m in summary.mma), summary.mma
    assert any(m.startswith("IMMA") for m in summary.mma), summary.mma
    assert not any(m.startswith("IGMMA.64x16") for m in summary.mma), summary.mma


def test_fp16_b2b_builds_compile_for_sm75(cache: Path) -> None:
    res = build(BuildJob(LAST, Precision.FP16, 75, {**SYNC, "STAGES": 1}, with_b2b(128)),
                cache)
    assert res.status == "ok", res.log[-500:]


def test_launch_contract_of_the_b2b_arguments() -> None:
    """A back-to-back build takes (w2, scale2, bias2, y2) and only such a build does; refused
    before anything reaches a GPU."""
    meta = {"epilogue": {"mode": "requant", "relu": True, "b2b": 64}, "sm": 90}
    with pytest.raises(ValueError, match="back-to-back conv takes"):
        launch(None, meta, *[None] * 7)
    meta["epilogue"] = {"mode": "requant", "relu": True}
    with pytest.raises(ValueError, match="runs no back-to-back conv"):
        launch(None, meta, *[None] * 7, b2b=(None, None, None, None))


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_the_b2b_reference_is_the_second_conv_over_the_first_output(precision: str) -> None:
    """make_b2b's expected output is the reference conv of a 1x1 layer over the layer's
    own expected output (requantized int8 / fp16-rounded), with the back-to-back epilogue."""
    p = Precision(precision)
    shape = ConvShape(2, 5, 7, 32, 48, 1, 1, residual=True)
    prob = ref.make_problem(shape, p)
    mode = "requant" if p is Precision.INT8 else "bias"
    c = ref.make_b2b(prob, 16, True, True, True)
    y = prob.expected(mode, True, True)
    second = ConvShape(2, 5, 7, 48, 16, 1, 1)
    x2 = y.astype(np.int8) if p is Precision.INT8 else y.astype(np.float16)
    acc = ref.conv_ref(x2, c.w.reshape(16, 1, 1, 48), second, p)
    want = ref.requantize(acc, c.scale, c.bias, 8, True) if p is Precision.INT8 else \
        ref.fp_epilogue(acc, c.bias, True)
    np.testing.assert_array_equal(c.expected, want)
    assert c.expected.min() >= 0  # the back-to-back ReLU
    assert c.device_weights().nbytes == 16 * 48 * p.input_bits // 8
    # The check's expected output over the kernel's own y: fp16 follows y (an ulp of y moves
    # it), int8's y is exact.
    np.testing.assert_array_equal(c.over(x2), c.expected)
    y_off = x2.copy().reshape(-1)
    i = int(np.argmax(np.abs(y_off)))
    y_off[i] = np.nextafter(y_off[i], np.float16(np.inf)) if p is Precision.FP16 else 0
    assert (not np.array_equal(c.over(y_off), c.expected)) == (p is Precision.FP16)


# ---- the runtime op ----------------------------------------------------------------------
SMALL = ConvShape(2, 9, 11, 64, 128, 1, 1, residual=True)  # 198 pixels: a partial last tile
SMALL_WG = {**WG, "BLK_ROW_WARPS": 1, "WARP_COL_TILES": 4}  # 64 x 128 tiles
SMALL_SYNC = {**SYNC, "WARP_COL_TILES": 4, "STAGES": 2}  # 64 x 128


def test_runtime_contract_of_the_b2b_conv(cache: Path) -> None:
    op = Conv2d(SMALL, "int8", SMALL_WG, "h100", epilogue=with_b2b(32), cache_dir=cache)
    assert op.b2b_output_shape == (2, 9, 11, 32) and "+b2b32" in repr(op)
    a = {"x": FakeCupy(op.input_shape, "int8"), "weight": FakeCupy(op.weight_shape, "int8"),
         "scale": FakeCupy((128,), "float32"), "bias": FakeCupy((128,), "float32"),
         "residual": FakeCupy(op.output_shape, "int8"), "res_scale": 0.5}
    w2, s2, b2 = (FakeCupy((32, 128), "int8"), FakeCupy((32,), "float32"),
                  FakeCupy((32,), "float32"))
    assert op.validate(**a, b2b=(w2, s2, b2)) == ("cupy", 0)
    with pytest.raises(ValueError, match="b2b is required"):
        op.validate(**a)
    with pytest.raises(ValueError, match=r"b2b_weight must have shape \(32, 128\)"):
        op.validate(**a, b2b=(FakeCupy((32, 64), "int8"), s2, b2))
    with pytest.raises(ValueError, match="scale is required"):
        op.validate(**a, b2b=(w2, None, b2))
    with pytest.raises(ValueError, match="back-to-back conv takes|b2b_out must"):
        op.validate(**a, b2b=(w2, s2, b2), b2b_out=FakeCupy((2, 9, 11, 16), "int8"))
    plain = Conv2d(SMALL, "int8", SMALL_WG, "h100", relu=True, residual=True, cache_dir=cache)
    with pytest.raises(ValueError, match="runs no back-to-back conv"):
        plain.validate(**a, b2b=(w2, s2, b2))
    with pytest.raises(ValueError, match="whole output rows"):
        Conv2d(SMALL, "int8", {**SMALL_WG, "WARP_COL_TILES": 2}, "h100",
               epilogue=with_b2b(32), cache_dir=cache)
    with pytest.warns(DefaultScheduleWarning):  # a default that can b2b
        default = Conv2d(SMALL, "fp16", None, "h100", epilogue=with_b2b(32), cache_dir=cache)
    assert schedule_fits(SMALL, Precision.FP16, get_target("h100"), default.schedule,
                         with_b2b(32)) is None


def test_the_space_mask_agrees_with_the_rule() -> None:
    """b2b_mask (the runtime's default filter) and b2b_problems (the build's) say the
    same of a sample of the layer's valid schedules."""
    rng = np.random.default_rng(3)
    target = get_target("h200")
    for p in (Precision.INT8, Precision.FP16):
        space = ScheduleSpace(LAST, p, target)
        idx = rng.choice(space.valid_indices, 300, replace=False)
        cols = space.columns(idx)
        g = geometry(LAST, p, target, cols, residual=True, b2b=64)
        mask = b2b_mask(LAST, p, 90, cols, 64, g)
        assert 0 < mask.sum() < len(idx)
        for k, i in enumerate(idx):
            s = space.schedule_at(int(i))
            gi = geometry(LAST, p, target, space.columns(np.array([i])), residual=True,
                          b2b=64)
            assert (b2b_problems(LAST, p, 90, s, 64, gi) is None) == bool(mask[k]), s


def _check_b2b_ops(shape: ConvShape, precision: str, target: str,
                   runs: list[tuple[dict, int]], cache: Path) -> None:
    """Both outputs of back-to-back ops, one per (schedule, channels) of `runs`, against the
    reference on the same random inputs."""
    import cupy as cp

    p = Precision(precision)
    prob = ref.make_problem(shape, p)
    res, res_scale = prob.residual()
    dt = np.int8 if p is Precision.INT8 else np.float16
    x, w = (cp.asarray(np.ascontiguousarray(a).astype(dt)) for a in (prob.x, prob.w))
    args = dict(scale=cp.asarray(prob.scale) if p.is_integer else None,
                bias=cp.asarray(prob.bias), residual=cp.asarray(res),
                res_scale=res_scale if p.is_integer else None)
    want_y = prob.expected("requant" if p.is_integer else "bias", True, True)
    cmp = np.int64 if p.is_integer else np.float64
    for sched, n2 in runs:
        c = ref.make_b2b(prob, n2, True, True, True)
        b2b = (cp.asarray(c.w), cp.asarray(c.scale) if p.is_integer else None,
               cp.asarray(c.bias))
        op = Conv2d(shape, p, sched, target, epilogue=with_b2b(n2), cache_dir=cache)
        y, y2 = op(x, w, **args, b2b=b2b)
        ok1, st1 = ref.check_output(cp.asnumpy(y).astype(cmp), want_y, p, p.output_bits)
        ok2, st2 = ref.check_output(cp.asnumpy(y2).astype(cmp), c.over(cp.asnumpy(y)), p,
                                    p.output_bits)
        assert ok1 and ok2, (sched, n2, st1, st2)


@on_gpu
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_b2b_ops_match_the_reference(precision: str, cache: Path) -> None:
    """Both outputs of back-to-back ops (wgmma and mma.sync) against the reference on random
    inputs, a partial last tile included (bench/gpu/b2b_check.py runs sm_75 / sm_80 as
    PTX). wgmma: one warpgroup and 64 x 128 tiles, with TMA stores, and two warpgroups of
    64 x 256 (columns past K); 96 channels: three items of n32 for the warpgroups to share."""
    wide = {**SMALL_WG, "BLK_ROW_WARPS": 2, "WARP_COL_TILES": 8}
    _check_b2b_ops(SMALL, precision, "h100",
                   [(SMALL_WG, 32), ({**SMALL_WG, "TMA": 1, "PACK_OUT": 2}, 32), (wide, 96),
                    (SMALL_WG, 96), (SMALL_SYNC, 32)], cache)


@on_gpu
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_persistent_b2b_ops_keep_their_weights(precision: str, cache: Path) -> None:
    """A persistent wgmma block copies the back-to-back weights once and runs the second GEMM
    after each of its tiles' epilogues: both outputs right over ResNet-50's layer1 pair
    (392 tiles of 64 rows, several a block), cp.async and TMA loads."""
    one = {**WG, "BLK_ROW_WARPS": 1, "PERSIST": 1}
    _check_b2b_ops(LAST, precision, "h200",
                   [(one, 64), ({**one, "TMA": 1, "PACK_OUT": 2}, 64),
                    ({**one, "PERSIST": 2, "STAGES": 1}, 64)], cache)


# ---- a layer tuned with its back-to-back conv (ConvShape.b2b) ---------------------------------
def test_a_b2b_layer_is_a_layer_of_its_own() -> None:
    shape = ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True, b2b=64)
    assert shape.key().endswith("_res_b2b64")
    assert ConvShape.from_key(shape.key()) == shape == ConvShape.from_dict(shape.to_dict())
    two = ConvShape(8, 56, 56, 384, 512, 1, 1, stride=2, concat=128, b2b=128)
    assert ConvShape.from_key(two.key()) == two  # a layer over two inputs too
    assert "b2b" not in LAST.to_dict() and LAST.b2b == 0
    assert shape.flops == LAST.flops + 2 * shape.gemm_m * 256 * 64
    assert shape.tensor_elements()["output"] == LAST.tensor_elements()["output"] * 5 // 4
    assert [f for f, _ in ConvShape(8, 5, 5, 8, 16, 1, 1, b2b=12).problems()] == ["b2b"]
    assert "int8 and fp16" in shape.problems(Precision.INT4)[0][1]
    assert shape.b2b_parts() == (LAST, ConvShape(8, 56, 56, 256, 64, 1, 1))
    job = BuildJob(shape, Precision.INT8, 90, WG)  # builds its b2b
    assert job.epilogue.b2b == 64 and defines(job)["TC_B2B"] == 64


def test_the_space_of_a_b2b_layer_holds_only_schedules_that_run_it() -> None:
    """Every valid schedule of the search's space runs the back-to-back conv (b2b_problems)
    and fits in shared memory with its region; the layer's wider weights leave fewer."""
    target = get_target("h200")
    rng = np.random.default_rng(1)
    for shape, least in ((ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True, b2b=64), 500),
                         (ConvShape(8, 28, 28, 128, 512, 1, 1, residual=True, b2b=128), 1)):
        space = ScheduleSpace(shape, Precision.INT8, target)
        idx = space.valid_indices
        assert len(idx) >= least
        for i in rng.choice(idx, min(60, len(idx)), replace=False):
            s = space.schedule_at(int(i))
            d = defines(BuildJob(shape, Precision.INT8, 90, s))  # raises where it cannot
            assert d["TC_SMEM_BYTES"] <= target.smem_per_block_kib * 1024
        plain = ScheduleSpace(ConvShape.from_dict({**shape.to_dict(), "b2b": 0}),
                              Precision.INT8, target)
        assert len(idx) < len(plain.valid_indices)


@on_gpu
def test_the_measuring_process_checks_both_outputs(tmp_path: Path) -> None:
    """The search's measurement of a back-to-back layer (kernels.runner) checks the layer's
    output and the back-to-back one before it times them."""
    from kernels import runner

    sess = runner.DeviceSession()
    shape = ConvShape.from_dict({**SMALL.to_dict(), "b2b": 32})
    for p in (Precision.INT8, Precision.FP16):
        res = build(BuildJob(shape, p, sess.sm, SMALL_WG if sess.sm >= 90 else SMALL_SYNC),
                    tmp_path)
        assert res.status == "ok", res.log
        out = sess.measure(str(tmp_path), res.key)
        assert out["status"] == "ok" and "b2b" in out["detail"]["check"], out


@on_gpu
def test_the_baseline_of_a_b2b_layer_is_its_two_layers() -> None:
    """cuDNN's time for a layer with a back-to-back conv: the two layers it replaces."""
    import torch

    from kernels.cudnn import cudnn_baseline

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    shape = ConvShape.from_dict({**SMALL.to_dict(), "b2b": 32})
    parts = [cudnn_baseline(part, "fp16", l2) for part in shape.b2b_parts()]
    both = cudnn_baseline(shape, "fp16", l2)
    assert 0.8 < both.median_us / sum(t.median_us for t in parts) < 1.25  # run to run
