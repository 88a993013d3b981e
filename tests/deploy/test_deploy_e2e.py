"""A small ResNet (BasicBlocks and Bottlenecks, random weights and BN statistics) through
`deploy.optimize`, against the float32 model in eval mode on held-out random inputs.

On a CPU the reference executor runs the kernels' math: fp16 logits within 1e-2 relative L2
error, int8 logits with cosine similarity >= 0.99; int8 activations go from fused layer to
fused layer as int8, NHWC; the CUDA executor's ops build (NVRTC) and its calls match each
op's tensor contract. On a GPU (`test_on_gpu_*`, skipped without CuPy and a device) the real
kernels give the same figures, and the same int8 values as the reference, bit for bit:
    python -m pytest -q tests/deploy/test_deploy_e2e.py
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from deploy import (
    FusedConv,
    KernelGlobalAvgPool,
    KernelLinear,
    KernelMaxPool2d,
    OptimizedModel,
    Quantize,
    optimize,
)
from kernels.runtime import DefaultScheduleWarning
from tests.deploy_nets import small_resnet

CALIB = torch.Generator().manual_seed(10)
X = torch.randn(8, 3, 64, 64, generator=CALIB)  # example and calibration inputs
HELD_OUT = [torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(s))
            for s in (11, 12)]


def build(precision: str, backend: str = "reference", device: str = "cpu",
          target: str | None = "h100", **kw: Any) -> tuple[nn.Module, OptimizedModel]:
    model = small_resnet().to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return model, optimize(model, X.to(device), precision, target, backend=backend, **kw)


@pytest.fixture(scope="module")
def fp16() -> tuple[nn.Module, OptimizedModel]:
    return build("fp16")


@pytest.fixture(scope="module")
def int8() -> tuple[nn.Module, OptimizedModel]:
    return build("int8")


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def cosine(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(F.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0))


def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)


# ---- agreement ---------------------------------------------------------------------------
def test_fp16_logits_within_1e_2_of_float32(fp16: tuple[nn.Module, OptimizedModel]) -> None:
    model, opt = fp16
    assert all(lp.replaced for lp in opt.plan), opt.report()
    for x in HELD_OUT:
        want = logits(model, x)
        got = logits(opt, x)
        assert got.dtype == torch.float32 and got.shape == want.shape
        err = rel_l2(got, want)
        assert err <= 1e-2, err
        assert err > 0  # it really ran in fp16


def test_int8_logits_cosine_at_least_0_99(int8: tuple[nn.Module, OptimizedModel]) -> None:
    model, opt = int8
    assert all(lp.replaced for lp in opt.plan), opt.report()
    for x in HELD_OUT + [torch.randn(3, 3, 64, 64)]:  # another batch size too
        want = logits(model, x)
        got = logits(opt, x)
        assert cosine(got, want) >= 0.99, cosine(got, want)


def test_int8_is_quantized_not_float(int8: tuple[nn.Module, OptimizedModel]) -> None:
    """The agreement is not float arithmetic in disguise: a coarser scale (percentile)
    changes the result, and the int8 result differs from the float one."""
    model, opt = int8
    x = HELD_OUT[0]
    assert rel_l2(logits(opt, x), logits(model, x)) > 1e-3
    _, coarse = build("int8", percentile=99.0)
    assert not torch.equal(logits(coarse, x), logits(opt, x))
    assert cosine(logits(coarse, x), logits(model, x)) > 0.9


# ---- the int8 dataflow -------------------------------------------------------------------
def _module(opt: OptimizedModel, node: fx.Node) -> nn.Module | None:
    return opt.graph_module.get_submodule(str(node.target)) if node.op == "call_module" \
        else None


def test_int8_handoff_has_no_float_round_trip(int8: tuple[nn.Module, OptimizedModel]) -> None:
    _, opt = int8
    # One quantize at the model's input and nothing dequantized: the average pool reads the
    # last layer's int8 with its output scale, and the classifier writes float32 logits.
    assert opt.conversions() == {"quantize": 1, "dequantize": 0}
    g = opt.graph_module.graph
    order = [type(_module(opt, n)).__name__ for n in g.nodes if n.op == "call_module"]
    assert order[0] == "Quantize" and order[1] == "FusedConv"
    assert order[-3:] == ["FusedConv", "KernelGlobalAvgPool", "KernelLinear"]
    (pool,), (fc,) = opt.modules_of(KernelGlobalAvgPool), opt.modules_of(KernelLinear)
    assert pool.scale == opt.plan[-1].out_scale  # with the last layer's output scale
    assert (fc.weight.dtype, fc.out_dtype) == (torch.float16, torch.float32)
    # Every fused layer reads fused layers, the int8 max-pool, or the one Quantize.
    for n in g.nodes:
        if isinstance(_module(opt, n), FusedConv):
            for v in n.all_input_nodes:
                assert isinstance(_module(opt, v), FusedConv | KernelMaxPool2d | Quantize), v
    # At run time: int8 in and out of every fused layer and the max-pool, channels_last.
    seen: list[tuple[str, torch.dtype, torch.dtype, bool]] = []

    def hook(mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        for a in args:
            assert a.dtype == torch.int8
        seen.append((type(mod).__name__, args[0].dtype, out.dtype,
                     out.is_contiguous(memory_format=torch.channels_last)))

    mods = opt.modules_of(FusedConv) + opt.modules_of(KernelMaxPool2d)
    handles = [m.register_forward_hook(hook) for m in mods]
    try:
        logits(opt, HELD_OUT[0])
    finally:
        for h in handles:
            h.remove()
    assert len(seen) == 14 and all(s[1:] == (torch.int8, torch.int8, True) for s in seen), seen


def test_fp16_activations_stay_fp16_channels_last(fp16: tuple[nn.Module, OptimizedModel]
                                                  ) -> None:
    _, opt = fp16
    assert opt.conversions() == {"quantize": 1, "dequantize": 0}
    outs: list[torch.Tensor] = []
    handles = [m.register_forward_hook(lambda m, a, o: outs.append(o))
               for m in opt.modules_of(FusedConv)]
    try:
        logits(opt, HELD_OUT[0])
    finally:
        for h in handles:
            h.remove()
    assert len(outs) == 13
    assert all(o.dtype == torch.float16 and o.is_contiguous(memory_format=torch.channels_last)
               for o in outs)


def test_scales_chain_from_layer_to_layer(int8: tuple[nn.Module, OptimizedModel]) -> None:
    """A layer's input scale is its producer's output scale (the requant epilogue wrote its
    int8 with it); the residual's scale is the residual producer's."""
    _, opt = int8
    p = {lp.name: lp for lp in opt.plan}
    assert p["layer1.0.conv1"].in_scale == p["conv1"].out_scale  # through the max-pool
    assert p["layer1.0.conv2"].in_scale == p["layer1.0.conv1"].out_scale
    assert p["layer1.0.conv2"].residual == "maxpool"
    assert p["layer1.0.conv2"].residual_scale == p["conv1"].out_scale
    assert p["layer1.1.conv2"].residual == "layer1.1.downsample.0"
    assert p["layer1.1.conv2"].residual_scale == p["layer1.1.downsample.0"].out_scale
    assert p["layer2.1.conv3"].residual == "layer2.0.conv3"
    report = opt.report()
    assert "13 of 13 conv layers replaced; 1 quantize, 0 dequantize" in report
    assert "fused=bn,+residual,relu" in report and "res=" in report


# ---- the CUDA executor, without a GPU ----------------------------------------------------
def test_cuda_executor_builds_and_its_calls_match_each_ops_contract(
        int8: tuple[nn.Module, OptimizedModel], tmp_path: Path) -> None:
    """The ops build through NVRTC here; the tensors `kernel_call` hands the runtime (from
    the reference run's real int8 activations) have each op's shapes, dtypes and layout."""
    _, ref = int8
    _, opt = build("int8", backend="cuda", cache_dir=tmp_path)
    inputs: dict[str, tuple[torch.Tensor, ...]] = {}
    handles = [m.register_forward_hook(
        lambda m, a, o: inputs.__setitem__(m.layer.name, a))  # type: ignore[union-attr]
        for m in ref.modules_of(FusedConv)]
    try:
        logits(ref, X)
    finally:
        for h in handles:
            h.remove()
    for mod in opt.modules_of(FusedConv):
        assert isinstance(mod, FusedConv)
        op, args, kwargs = mod.kernel_call(*inputs[mod.layer.name])
        assert op.layout == "nhwc" and op.epilogue == mod.epilogue
        assert op.schedule == mod.layer.schedule
        for name, t in zip(("x", "weight", "scale", "bias"), args, strict=True):
            spec = op.specs[name]
            assert tuple(t.shape) in spec.shapes and str(t.dtype)[6:] in spec.dtypes, name
            assert t.is_contiguous() and t.data_ptr() % 16 == 0, name
        if mod.residual:
            spec = op.specs["residual"]
            r = kwargs["residual"]
            assert tuple(r.shape) in spec.shapes and r.dtype == torch.int8
            assert isinstance(kwargs["res_scale"], float)
        with pytest.raises(ValueError, match="CUDA device"):
            mod(*inputs[mod.layer.name])  # everything checked but the device


# ---- on the GPU --------------------------------------------------------------------------
def _gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0) and torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no CuPy / driver / device
        return False


def on_gpu(test: Any) -> Any:
    return pytest.mark.gpu(pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")(
        test))


@on_gpu
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_on_gpu_kernels_agree_with_float32_and_the_reference(precision: str,
                                                             tmp_path: Path) -> None:
    # PyTorch's head, so that the int8 model is the reference executor's bit for bit (the
    # kernel head's float32 sums differ in order: its own test below)
    _, opt = build(precision, backend="cuda", device="cuda", target=None, cache_dir=tmp_path,
                   kernel_head=False)
    assert opt.backend == "cuda" and all(lp.replaced for lp in opt.plan), opt.report()
    # the blocks' second convs read their residual before their grid-dependency wait (with
    # PDL, on sm_90): the layer-by-layer comparison below covers that path
    assert sum(m.residual_ready for m in opt.modules_of(FusedConv)) >= 2
    model = small_resnet()  # float32 on the CPU: no TF32 in the figure we compare with
    for x in HELD_OUT:
        want = logits(model, x)
        calls: list[tuple[FusedConv, tuple[torch.Tensor, ...], torch.Tensor]] = []
        hs = [m.register_forward_hook(lambda m, a, o, calls=calls: calls.append((m, a, o)))
              for m in opt.modules_of(FusedConv)]
        try:
            got = logits(opt, x.cuda())
        finally:
            for h in hs:
                h.remove()
        assert got.is_cuda and torch.isfinite(got).all()
        got = got.cpu()
        if precision == "fp16":
            assert rel_l2(got, want) <= 1e-2, rel_l2(got, want)
        else:
            assert cosine(got, want) >= 0.99, cosine(got, want)
        # Layer by layer: the kernel's output against the reference executor's on the same
        # inputs, weights, scales and epilogue.
        assert len(calls) == 13
        for mod, args, out in calls:
            with torch.no_grad():
                expect = mod.reference(*args)
            assert out.dtype == expect.dtype and out.shape == expect.shape, mod.layer.name
            if precision == "int8":
                assert torch.equal(out, expect), mod.layer.name  # the requant, bit for bit
            else:
                assert rel_l2(out, expect) < 2e-3, (mod.layer.name, rel_l2(out, expect))
        if precision == "int8":
            # Every int8 layer being exact, so is the whole model on the reference executor.
            opt.set_backend("reference")
            try:
                assert torch.equal(logits(opt, x.cuda()).cpu(), got)
            finally:
                opt.set_backend("cuda")


@on_gpu
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_on_gpu_a_stem_over_pixel_pairs_agrees_with_the_reference(precision: str,
                                                                  tmp_path: Path) -> None:
    """The input quantize's kernel writes the pairs (zero pixels around each row) and the
    stem's kernel runs the pair layer: the stem's output equals the reference executor's on
    the input paired by torch ops (int8 bit for bit), and the logits agree with the float32
    model."""
    from deploy.calibrate import quantize
    from deploy.pairs import pair_pixels
    from tests.deploy.test_deploy_graph import _pair_records

    _, opt = build(precision, backend="cuda", device="cuda", target=None, cache_dir=tmp_path,
                   schedules=_pair_records(X, 1.0))
    stem = opt.modules_of(FusedConv)[0]
    assert stem.pairs == (4, 1, 1)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    h = stem.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    try:
        x = HELD_OUT[0].cuda()
        got = logits(opt, x)
    finally:
        h.remove()
    ((x_in, y),) = seen
    plain = x.half() if precision == "fp16" else quantize(x, opt.plan[0].in_scale)
    pairs = pair_pixels(plain, 4, 1, 1)
    assert torch.equal(x_in, pairs)  # the quantize kernel's pairs are torch's
    with torch.no_grad():
        want = stem.reference(pairs)
    if precision == "int8":
        assert torch.equal(y, want)
        assert cosine(got.cpu(), logits(small_resnet(), HELD_OUT[0])) >= 0.99
    else:
        assert rel_l2(y.float(), want.float()) < 2e-3
        assert rel_l2(got.cpu(), logits(small_resnet(), HELD_OUT[0])) <= 1e-2


@on_gpu
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_on_gpu_the_kernel_head_agrees_with_the_reference(precision: str,
                                                          tmp_path: Path) -> None:
    """kernel_head on the GPU: the average pool's kernel gives the reference executor's
    output (int8: bit for bit, the same exact sum and one rounding), the classifier's
    float32 logits match the reference's float32 sums within float32 rounding, and the
    logits agree with the float32 model as the goals say."""
    from deploy import KernelGlobalAvgPool

    _, opt = build(precision, backend="cuda", device="cuda", target=None, cache_dir=tmp_path,
                   kernel_head=True)
    pool = opt.modules_of(KernelGlobalAvgPool)[0]
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    h = pool.register_forward_hook(lambda m, a, o: seen.append((a[0], o)))
    try:
        x = HELD_OUT[0].cuda()
        got = logits(opt, x)
        opt.set_backend("reference")
        ref = logits(opt, x)
    finally:
        opt.set_backend("cuda")
        h.remove()
    (x_in, y_kernel), (_, y_ref) = seen
    assert y_kernel.dtype == torch.float16 and y_kernel.shape == y_ref.shape
    if precision == "int8":
        assert x_in.dtype == torch.int8 and torch.equal(y_kernel, y_ref)
        assert cosine(got.cpu(), logits(small_resnet(), HELD_OUT[0])) >= 0.99
    else:
        assert rel_l2(y_kernel.float(), y_ref.float()) < 1e-3
        assert rel_l2(got.cpu(), logits(small_resnet(), HELD_OUT[0])) <= 1e-2
    assert got.dtype == torch.float32
    if precision == "int8":  # the same pooled rows: only the order of the float32 sums differs
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-5)
    else:  # the convs' fp16 outputs differ within their own tolerance
        assert rel_l2(got.cpu(), ref.cpu()) < 5e-3


@on_gpu
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_on_gpu_a_bottleneck_with_its_projection_as_one_layer(precision: str,
                                                              tmp_path: Path) -> None:
    """The last conv and the projection as one kernel over two inputs (a record of that
    layer given): the kernel's output equals the reference executor's (int8 bit for bit),
    and the block's output agrees with the float32 block."""
    from bench.nets import Bottleneck, randomize_bn
    from tests.deploy.test_deploy_graph import CONCAT_SCHEDULE, _concat_records

    torch.manual_seed(11)
    m = randomize_bn(Bottleneck(64, 32, stride=2)).eval()
    x = torch.randn(2, 64, 10, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        opt = optimize(m.cuda(), x.cuda(), precision, "h100", backend="cuda",
                       cache_dir=tmp_path,
                       schedules=_concat_records(x, precision, CONCAT_SCHEDULE))
    layer = {mod.layer.name: mod for mod in opt.modules_of(FusedConv)}["conv3"]
    assert layer.concat == 32
    seen: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]] = []
    h = layer.register_forward_hook(lambda mod, a, o: seen.append((a, o)))
    try:
        got = opt(x.cuda().contiguous(memory_format=torch.channels_last)).cpu()
    finally:
        h.remove()
    ((args, out),) = seen
    with torch.no_grad():
        expect = layer.reference(*args)
        want = m.cpu()(x)
    if precision == "int8":
        assert torch.equal(out, expect)
        assert cosine(got, want) >= 0.99
    else:
        assert rel_l2(out.float().cpu(), expect.float().cpu()) <= 1e-3
        assert rel_l2(got, want) <= 1e-2
