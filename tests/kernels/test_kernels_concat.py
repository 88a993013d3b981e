"""A 1x1 layer over two inputs concatenated along the channels (ConvShape.concat, conv.cu: CAT)
on a CPU: where it applies (the shape's problems, kernels.space's rules and the kernel's
static_assert agree), its builds for sm_75 / sm_80 / sm_90 with the Tensor Core instructions
they should hold, the runtime's contract for x1, and the reference's problems of such layers.
The GPU checks are in test_runtime.py (`on_gpu`), bench/concat_check.py and below (x read
before the grid-dependency wait, and the measuring process's check of it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels import reference as ref
from kernels.build import BuildJob, Epilogue, build, defines
from kernels.launch import launch
from kernels.runtime import Conv2d, DefaultScheduleWarning
from kernels.sass import cuobjdump_path
from kernels.space import ScheduleSpace, concat_problems
from kernels.spec import ConvShape, Precision, get_target, two_input_shape
from tests.kernels.builds import assert_mma_and_copy, sass_of
from tests.kernels.test_runtime import FakeCupy, assert_chain_equal, chain_outputs, on_gpu

# ResNet-50 layer2's last conv (128 channels at 28x28) and its projection (256 at 56x56, /2)
BOTTLENECK = ConvShape(8, 56, 56, 384, 512, 1, 1, stride=2, concat=128)
WG = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=2, WARP_COL_TILES=2, CHUNK=2,
          REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
          MMA="wgmma")
SYNC = {**WG, "MMA": "sync", "BLK_ROW_WARPS": 2, "STAGES": 2}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("concat")


def with_concat(shape: ConvShape, concat: int) -> ConvShape:
    return ConvShape.from_dict({**shape.to_dict(), "concat": concat})


def test_where_two_inputs_apply() -> None:
    assert concat_problems(BOTTLENECK, Precision.INT8, 90, WG) is None
    assert concat_problems(BOTTLENECK, Precision.FP16, 80, SYNC) is None
    assert BOTTLENECK.key().endswith("_cat128")
    assert ConvShape.from_key(BOTTLENECK.key()) == BOTTLENECK
    assert ConvShape.from_dict(BOTTLENECK.to_dict()) == BOTTLENECK
    assert "concat" not in with_concat(BOTTLENECK, 0).to_dict()  # one input: as before
    # the layer itself
    for concat in (384, 400):
        assert [f for f, _ in with_concat(BOTTLENECK, concat).problems()] == ["concat"]
    three = ConvShape(8, 28, 28, 384, 512, 3, 3, pad=1, concat=128)
    assert "1x1" in three.problems()[0][1]
    assert "int8 and fp16" in BOTTLENECK.problems(Precision.INT4)[0][1]
    # its schedules
    cases = [
        ({**WG, "TMA": 1}, 128, "TMA=0"),
        ({**SYNC, "DUP_AWARE": 1}, 128, "DUP_AWARE=0"),
        ({**SYNC, "LAYOUT": "nhwcnc"}, 128, "LAYOUT=nhwc"),
        # int8 CHUNK 4: stages of 128 channels; x1's 64 would share one with x's
        ({**WG, "CHUNK": 4}, 64, "whole stages of 128"),
    ]
    for sched, concat, why in cases:
        got = concat_problems(with_concat(BOTTLENECK, concat), Precision.INT8, 90, sched)
        assert got is not None and why in got, (sched, concat, got)
    # sm_75's int8 instruction is k16: CHUNK 2 stages hold 32 channels there
    assert concat_problems(with_concat(BOTTLENECK, 32), Precision.INT8, 75,
                           {**SYNC, "STAGES": 1}) is None
    assert concat_problems(with_concat(BOTTLENECK, 32), Precision.INT8, 80, SYNC) is not None
    assert concat_problems(with_concat(BOTTLENECK, 0), Precision.INT8, 90,
                           {**WG, "TMA": 1}) is None


def test_the_space_holds_only_schedules_two_inputs_can_run() -> None:
    """The search's space of such a layer is what concat_problems admits."""
    for p in (Precision.INT8, Precision.FP16):
        space = ScheduleSpace(BOTTLENECK, p, get_target("h100"))
        idx = space.valid_indices
        assert idx.size > 100
        rng = np.random.default_rng(0)
        for i in rng.choice(idx, 200, replace=False):
            assert concat_problems(BOTTLENECK, p, 90, space.schedule_at(int(i))) is None
        plain = ScheduleSpace(with_concat(BOTTLENECK, 0), p, get_target("h100"))
        assert plain.valid_indices.size > idx.size  # TMA and the rest are its own


def test_the_build_refuses_what_the_rule_refuses(cache: Path) -> None:
    res = build(BuildJob(BOTTLENECK, Precision.INT8, 90, {**WG, "TMA": 1}), cache)
    assert res.status == "compile_error" and "TMA=0" in res.log
    d = defines(BuildJob(BOTTLENECK, Precision.INT8, 90, WG))
    assert d["TC_CAT"] == 128
    plain = with_concat(BOTTLENECK, 0)
    assert "TC_CAT" not in defines(BuildJob(plain, Precision.INT8, 90, WG))


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
@pytest.mark.parametrize("precision,sm,schedule,mma,copy", [
    ("int8", 75, {**SYNC, "STAGES": 1, "CHUNK": 2}, "IMMA", "LDG"),
    ("int8", 80, SYNC, "IMMA", "LDGSTS"),
    ("fp16", 80, {**SYNC, "CHUNK": 4}, "HMMA", "LDGSTS"),
    ("int8", 90, WG, "GMMA", "LDGSTS"),
    ("fp16", 90, {**WG, "CHUNK": 4, "PERSIST": 1}, "GMMA", "LDGSTS"),
])
def test_two_input_builds_hold_the_intended_instructions(precision: str, sm: int,
                                                         schedule: dict, mma: str, copy: str,
                                                         cache: Path) -> None:
    assert_mma_and_copy(sass_of(BuildJob(BOTTLENECK, Precision(precision), sm, schedule,
                                         Epilogue(relu=True)), cache), mma, copy)


def test_fp16_two_input_builds_compile_for_sm75(cache: Path) -> None:
    """(fp16's register-staged sm_75 builds keep a local array with one input as with two;
    the SASS check above takes int8 there.)"""
    res = build(BuildJob(BOTTLENECK, Precision.FP16, 75, {**SYNC, "STAGES": 1},
                         Epilogue(relu=True)), cache)
    assert res.status == "ok", res.log[-500:]


def test_runtime_contract_of_the_second_input(cache: Path) -> None:
    op = Conv2d(BOTTLENECK, "int8", WG, "h100", relu=True, cache_dir=cache)
    assert op.input_shape == (8, 56, 56, 256) and op.weight_shape == (512, 1, 1, 384)
    assert op.specs["x1"].shapes == ((8, 28, 28, 128),)
    x, w = FakeCupy(op.input_shape, "int8"), FakeCupy(op.weight_shape, "int8")
    s, b = FakeCupy((512,), "float32"), FakeCupy((512,), "float32")
    with pytest.raises(ValueError, match="x1 is required"):
        op.validate(x, w, s, b)
    with pytest.raises(ValueError, match=r"x1 must have shape \(8, 28, 28, 128\)"):
        op.validate(x, w, s, b, x1=FakeCupy((8, 56, 56, 128), "int8"))
    assert op.validate(x, w, s, b, x1=FakeCupy((8, 28, 28, 128), "int8")) == ("cupy", 0)
    one = Conv2d(with_concat(BOTTLENECK, 0), "int8", WG, "h100", cache_dir=cache)
    with pytest.raises(ValueError, match="one input"):
        one.validate(FakeCupy(one.input_shape, "int8"), FakeCupy(one.weight_shape, "int8"),
                     s, b, x1=FakeCupy((8, 28, 28, 128), "int8"))
    with pytest.raises(ValueError, match="TMA=0"):
        Conv2d(BOTTLENECK, "int8", {**WG, "TMA": 1}, "h100", cache_dir=cache)
    with pytest.warns(DefaultScheduleWarning):  # a default valid for two inputs
        default = Conv2d(BOTTLENECK, "fp16", None, "h100", cache_dir=cache)
    assert concat_problems(BOTTLENECK, Precision.FP16, 90, default.schedule) is None
    # x read before the grid-dependency wait is for PDL launches of layers over two inputs
    with pytest.raises(ValueError, match="pdl=True and a layer over two inputs"):
        Conv2d(BOTTLENECK, "int8", WG, "h100", x_ready=True, cache_dir=cache)
    with pytest.raises(ValueError, match="pdl=True and a layer over two inputs"):
        Conv2d(with_concat(BOTTLENECK, 0), "int8", WG, "h100", pdl=True, x_ready=True,
               cache_dir=cache)
    ready = Conv2d(BOTTLENECK, "int8", WG, "h100", relu=True, pdl=True, x_ready=True,
                   cache_dir=cache)
    assert ready.x_ready and ready.key == op.key  # the same build, launched otherwise
    with pytest.raises(ValueError, match="needs both"):
        launch(None, op.meta, x, w, s, b, FakeCupy(op.output_shape, "int8"), None, None,
               x1=FakeCupy((8, 28, 28, 128), "int8"), x_ready=True)


def test_x_is_ready_only_where_the_op_reads_it_as_given(cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An x narrower than the kernel's channels is copied into the op's padded buffer just
    before the launch: that copy is not ready, so the launch says x is not (the GPU parts of
    the call stubbed: the launch's arguments are what is checked)."""
    import kernels.launch

    shape = ConvShape(8, 28, 28, 104, 64, 1, 1, concat=64)  # x: 40 channels, padded to 48
    op = Conv2d(shape, "int8", WG, "h100", relu=True, pdl=True, x_ready=True, cache_dir=cache)
    assert op.input_shape[-1] == 48
    seen: list[dict] = []
    monkeypatch.setattr(kernels.launch, "launch", lambda *a, **kw: seen.append(kw))
    monkeypatch.setattr(op, "_function", lambda dev: None)
    monkeypatch.setattr(op, "_scratch_for", lambda dev, ptr: {"zeros_k": None, "ws": None,
                                                              "counters": None})
    monkeypatch.setattr(op, "_padded", lambda sc, name, a, full: a if tuple(a.shape) == full
                        else FakeCupy(full, "int8"))
    x1, w = FakeCupy((8, 28, 28, 64), "int8"), FakeCupy(op.weight_shape, "int8")
    y = FakeCupy(op.output_shape, "int8")
    for x in (FakeCupy(op.input_shape, "int8"), FakeCupy((8, 28, 28, 40), "int8")):
        op._enqueue(0, 0, x, w, None, None, y, x1=x1)
    assert [kw["x_ready"] for kw in seen] == [True, False]
    assert all(kw["pdl"] for kw in seen)


@pytest.mark.skipif(cuobjdump_path() is None, reason="cuobjdump not installed")
def test_sm90_two_input_builds_wait_before_x1s_first_stage(cache: Path) -> None:
    """x's channel blocks come first; the grid-dependency wait is at the start (x not
    ready) and in the loader, before x1's first stage (x ready: in each of the loader's
    inlined copies); sm_80 builds have none (no PDL)."""
    def waits(shape: ConvShape, sm: int) -> int:
        text = sass_of(BuildJob(shape, Precision.INT8, sm, WG if sm >= 90 else SYNC,
                                Epilogue(relu=True)), cache).text
        return sum(" ACQBULK" in ln for ln in text.splitlines())

    assert waits(BOTTLENECK, 90) >= 2
    assert waits(BOTTLENECK, 80) == 0


# A chain of layers over two inputs: y[i+1] = conv(x1 = y[i], x = y[i-1]), 1x1 at stride 1.
CHAIN2 = ConvShape(8, 14, 14, 128, 64, 1, 1, concat=64)


@on_gpu
@pytest.mark.parametrize("precision,schedule", [
    ("int8", {**WG, "CHUNK": 2}), ("fp16", {**WG, "CHUNK": 4}), ("int8", SYNC)])
def test_on_gpu_x_reduced_before_the_wait_equals_plain_launches(
        precision: str, schedule: dict, cache: Path) -> None:
    """Each layer's x (written two launches back) reduced while the kernel waits for the
    one before (x_ready, PDL), eagerly and replayed from a CUDA graph, every output poisoned
    before each run: the plain launches' bytes, and the first against the reference."""
    import torch

    p = Precision(precision)
    plain, early = (Conv2d(CHAIN2, precision, schedule, "h100", relu=True, pdl=pdl,
                           x_ready=pdl, cache_dir=cache) for pdl in (False, True))
    prob = ref.make_problem(CHAIN2, p, seed=5)
    dt = torch.int8 if p is Precision.INT8 else torch.float16

    def dev(a: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a).reshape(shape)).cuda()

    w = dev(prob.w, plain.weight_shape)
    sc = dev(prob.scale, (64,)) if p is Precision.INT8 else None
    b = dev(prob.bias, (64,))
    x0 = dev(prob.x, plain.input_shape)
    x10 = dev(prob.x1, plain.specs["x1"].shapes[0])
    outs = [torch.empty(plain.output_shape, dtype=dt, device="cuda") for _ in range(6)]

    def chain(op: Conv2d) -> None:
        prev, h = x0, x10
        for y in outs:
            op(prev, w, sc, b, x1=h, out=y)
            prev, h = h, y

    want = chain_outputs(lambda: chain(plain), outs, graph=False)
    first = prob.expected("requant" if p is Precision.INT8 else "bias", True)
    if p is Precision.INT8:
        assert np.array_equal(want[0].astype(np.int64), first)
    else:
        assert np.allclose(want[0].astype(np.float64), first, rtol=1e-2, atol=1e-2)
    assert_chain_equal(lambda: chain(early), outs, want)


@on_gpu
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_on_gpu_the_ready_check_catches_an_input_read_before_the_wait(
        precision: str, cache: Path) -> None:
    """The measuring process's check of an sm_90 build runs it again behind a kernel that
    writes one input late (x1 here), every other input ready: a right build passes. Told that
    the late input is ready (x_ready while x is the one written late), the kernel reads x's
    poison before its wait and the check's comparison fails."""
    import cupy

    from kernels import runner
    from kernels.build import load_meta
    from kernels.launch import alloc_scratch

    sess = runner.DeviceSession()
    p = Precision(precision)
    res = build(BuildJob(CHAIN2, p, 90, {**WG, "CHUNK": 2 if p is Precision.INT8 else 4}),
                cache)
    assert res.status == "ok", res.log[-500:]
    out = sess.measure(str(cache), res.key, time_it=False)
    assert out["status"] == "ok" and out["detail"]["check"]["ready"] == "same", out
    meta = load_meta(str(cache), res.key)
    prob = sess.problem(CHAIN2, p, None)
    dev = sess.inputs(prob, meta["layout"], 1, int(meta["c_padded"]))
    y = cupy.full(runner.output_bytes(CHAIN2, int(meta["out_bits"])), runner.POISON,
                  dtype=cupy.uint8)
    ws, counters = alloc_scratch(meta)
    fn = sess.function(str(cache), res.key, meta)
    sess.ready_launch(dev["x"][0], lambda: launch(
        fn, meta, dev["x"][0], dev["w"][0], dev["scale"], dev["bias"], y, ws, counters,
        pdl=True, x1=dev["x1"][0], x_ready=True))
    ok, _ = runner.check_buffer(prob, cupy.asnumpy(y), meta["epilogue"]["mode"],
                                bool(meta["epilogue"]["relu"]), False, meta["layout"],
                                int(meta["out_bits"]))
    assert not ok


def test_the_reference_problem_of_two_inputs() -> None:
    """make_problem gives x1 and x whose concatenation at the output's pixels is the
    one-input equivalent's input, with the equivalent's accumulators."""
    shape = ConvShape(2, 9, 11, 96, 40, 1, 1, stride=2, concat=32)
    eq = ref.concat_equivalent(shape)
    assert (eq.h, eq.w, eq.c, eq.stride, eq.concat) == (shape.p, shape.q, 96, (1, 1), 0)
    prob = ref.make_problem(shape, Precision.INT8, 1)
    want = ref.make_problem(eq, Precision.INT8, 1)
    assert prob.x1 is not None and prob.x1.shape == (2, 5, 6, 32) and prob.x.shape == (2, 9, 11, 64)
    assert np.array_equal(np.concatenate([prob.x1, prob.x[:, ::2, ::2]], axis=-1), want.x)
    assert np.array_equal(prob.acc, want.acc)
    # the pixels between the strided ones hold values too: a kernel reading them is caught
    assert np.count_nonzero(prob.x[:, 1::2]) > 0
    xb, wb = prob.device_inputs("nhwc", 96)
    assert xb.size == 2 * 9 * 11 * 64 and prob.device_x1().size == 2 * 5 * 6 * 32


def test_the_rule_of_two_layers_as_one_over_two_inputs() -> None:
    """kernels.spec.two_input_shape (planning and deploy's one rule) and concat_parts, its
    inverse."""
    last = ConvShape(8, 28, 28, 128, 512, 1, 1)
    proj = ConvShape(8, 56, 56, 256, 512, 1, 1, stride=2)
    assert two_input_shape(last, proj) == BOTTLENECK
    assert BOTTLENECK.concat_parts() == (last, proj)
    for bad_last, bad_proj in (
            (ConvShape(8, 28, 28, 128, 512, 3, 3, pad=1), proj),  # a 3x3 last conv
            (ConvShape(8, 56, 56, 128, 512, 1, 1, stride=2), proj),  # a strided last conv
            (last, ConvShape(8, 56, 56, 256, 512, 1, 1, stride=2, pad=1)),  # padding
            (ConvShape(8, 28, 28, 128, 256, 1, 1), proj),  # other outputs
            (last, ConvShape(8, 58, 58, 256, 512, 1, 1, stride=2))):  # another resolution
        assert two_input_shape(bad_last, bad_proj) is None
