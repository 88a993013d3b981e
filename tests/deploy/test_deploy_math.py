"""deploy's arithmetic: BatchNorm folding, int8 scales, and the reference executor against
the kernel module's own numpy reference (kernels/reference.py) of the epilogue."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deploy import calibrate
from deploy.fold import bn_affine, fold_conv_bn
from deploy.module import FusedConv
from deploy.plan import LayerPlan
from kernels import reference as ref
from kernels.spec import ConvShape, Precision, get_target

H100 = get_target("h100")


# ---- pixel pairs --------------------------------------------------------------------------
@pytest.mark.parametrize("h,w,c,r,s,stride,pad", [
    (224, 224, 3, 7, 7, (2, 2), (3, 3)),  # ResNet's stem
    (224, 224, 3, 3, 3, (2, 2), (1, 1)),  # MobileNet's
    (20, 17, 2, 3, 3, (2, 2), (0, 0)),    # odd width, no padding
    (16, 16, 4, 3, 5, (1, 2), (2, 1)),    # stride 1 in height
    (15, 22, 8, 2, 6, (3, 2), (1, 2)),    # an even filter, 8 channels
])
def test_a_layer_over_pixel_pairs_is_the_layer(h: int, w: int, c: int, r: int, s: int,
                                               stride: tuple[int, int],
                                               pad: tuple[int, int]) -> None:
    """The pair layer on the paired input with the paired weights is the layer, exactly
    (float64 sums of integers), with the layer's output size."""
    from deploy.pairs import pair_pixels, pair_weights
    from kernels.spec import pixel_pairs

    shape = ConvShape(2, h, w, c, 16, r, s, stride=stride, pad=pad)
    channels = 4 if c <= 4 else 8
    paired = pixel_pairs(shape, channels)
    assert paired is not None
    ps, left, right = paired
    assert (ps.p, ps.q, ps.c, ps.stride[1], ps.s) == (shape.p, shape.q, 2 * channels, 1,
                                                     (s + 1) // 2)
    g = torch.Generator().manual_seed(h + w)
    x = torch.randint(-9, 9, (2, c, h, w), generator=g).double()
    wt = torch.randint(-9, 9, (16, c, r, s), generator=g).double()
    xp = pair_pixels(x, channels, left, right)
    assert tuple(xp.shape) == (2, ps.c, h, ps.w)
    want = F.conv2d(x, wt, stride=stride, padding=pad)
    got = F.conv2d(xp, pair_weights(wt, channels), stride=ps.stride, padding=ps.pad)
    assert torch.equal(got, want)


def test_only_a_stride_two_width_of_few_channels_runs_over_pairs() -> None:
    from kernels.spec import pair_channels, pixel_pairs

    stem = ConvShape(8, 224, 224, 3, 64, 7, 7, stride=(2, 2), pad=(3, 3))
    assert (pair_channels(stem, "int8"), pair_channels(stem, "fp16")) == (4, 4)
    assert pair_channels(replace(stem, c=6), "int8") == 8
    assert pair_channels(replace(stem, c=6), "fp16") is None  # 24-byte pairs
    assert pair_channels(stem, "int4") is None
    assert pixel_pairs(stem, 2) is None  # fewer than the layer's channels
    for other in (replace(stem, stride=(2, 1)), replace(stem, dilation=(1, 2)),
                  replace(stem, residual=True),
                  # an odd row whose last pixel only a pair past the output's would hold
                  ConvShape(2, 15, 21, 8, 16, 2, 6, stride=(3, 2), pad=(1, 2))):
        assert pixel_pairs(other, 8) is None


# ---- BatchNorm folding -------------------------------------------------------------------
@pytest.mark.parametrize("conv_bias,affine", [(False, True), (True, True), (True, False)])
def test_folded_conv_equals_conv_then_bn_in_eval(conv_bias: bool, affine: bool) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=conv_bias).double()
    bn = nn.BatchNorm2d(12, eps=1e-3, affine=affine).double()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(12, dtype=torch.float64))
        bn.running_var.copy_(torch.rand(12, dtype=torch.float64) * 3 + 0.01)
        if affine:
            bn.weight.copy_(torch.randn(12, dtype=torch.float64))  # negative gammas too
            bn.bias.copy_(torch.randn(12, dtype=torch.float64))
    bn.eval()
    x = torch.randn(3, 8, 9, 9, dtype=torch.float64)
    w, b = fold_conv_bn(conv.weight, conv.bias, bn)
    with torch.no_grad():
        want = bn(conv(x))
    got = F.conv2d(x, w, b, stride=2, padding=1)
    assert w.dtype == b.dtype == torch.float64
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert float((got - want).abs().max()) < 1e-10  # float64 throughout


def test_bn_affine_is_the_eval_formula() -> None:
    bn = nn.BatchNorm2d(2, eps=0.5).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([1.0, -2.0]))
        bn.running_var.copy_(torch.tensor([3.5, 0.5]))
        bn.weight.copy_(torch.tensor([2.0, -1.0]))
        bn.bias.copy_(torch.tensor([0.25, 3.0]))
    a, b = bn_affine(bn)
    assert a.tolist() == [1.0, -1.0]  # gamma / sqrt(var + eps) = 2/2, -1/1
    assert b.tolist() == [-0.75, 1.0]  # beta - mean * a
    w, bias = fold_conv_bn(torch.ones(2, 1, 1, 1), None, bn)
    assert w.flatten().tolist() == [1.0, -1.0] and bias.tolist() == [-0.75, 1.0]
    with pytest.raises(ValueError, match="features"):
        fold_conv_bn(torch.ones(3, 1, 1, 1), None, bn)


# ---- calibration -------------------------------------------------------------------------
def test_activation_scale_is_max_abs_over_127() -> None:
    x = torch.tensor([[0.5, -2.54], [1.0, 0.0]])
    assert calibrate.abs_percentile(x) == pytest.approx(2.54)
    assert calibrate.activation_scale(2.54) == pytest.approx(0.02)
    assert calibrate.activation_scale(0.0) == 1.0
    with pytest.raises(ValueError, match="finite"):
        calibrate.activation_scale(float("inf"))
    q = calibrate.quantize(x, 0.02)
    assert q.dtype == torch.int8 and q.tolist() == [[25, -127], [50, 0]]
    # Beyond the calibrated range: clamped, -128 reachable as the kernel clamps.
    assert calibrate.quantize(torch.tensor([3.0, -3.0]), 0.02).tolist() == [127, -128]
    # Half to even, as the kernel's rounding: 0.5 -> 0, 1.5 -> 2, -2.5 -> -2.
    assert calibrate.quantize(torch.tensor([0.5, 1.5, -2.5]), 1.0).tolist() == [0, 2, -2]
    assert torch.equal(calibrate.dequantize(q, 0.02), q.float() * 0.02)


def test_percentile_rule() -> None:
    x = torch.arange(1, 10001, dtype=torch.float32)  # |x| = 1..10000
    assert calibrate.abs_percentile(x, 100.0) == 10000.0
    assert calibrate.abs_percentile(-x, 99.0) == 9900.0
    assert calibrate.abs_percentile(x, 50.0) == 5000.0
    with pytest.raises(ValueError):
        calibrate.abs_percentile(x, 0.0)


def test_weight_scales_per_output_channel() -> None:
    w = torch.zeros(3, 2, 1, 1, dtype=torch.float64)
    w[0, :, 0, 0] = torch.tensor([1.27, -0.635])
    w[1, :, 0, 0] = torch.tensor([-12.7, 6.35])
    s = calibrate.weight_scales(w)
    assert s.tolist() == pytest.approx([0.01, 0.1, 1.0])  # an all-zero channel: 1
    q = calibrate.quantize_weight(w, s)
    assert q.dtype == torch.int8
    assert q[:, :, 0, 0].tolist() == [[127, -64], [-127, 64], [0, 0]]  # -63.5 -> -64
    # Symmetric: never -128.
    assert int(calibrate.quantize_weight(torch.full((1, 1, 1, 1), -5.0), torch.ones(1))) == -5


def test_observer_records_each_value_before_in_place_ops() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            return torch.relu_(y)

    from torch import fx

    gm = fx.symbolic_trace(M())
    calibrate.observe(gm, [(torch.tensor([[-3.0, 1.0]]),), (torch.tensor([[0.5, 2.0]]),)])
    amax = {n.name: n.meta.get("deploy_amax") for n in gm.graph.nodes}
    assert amax["mul"] == 6.0  # |-6| before relu_ zeroed it; the larger of the two runs
    assert amax["relu_"] == 4.0
    assert next(iter(gm.graph.nodes)).meta["deploy_shape"] == (1, 2)


# ---- the reference executor is the kernel's epilogue -------------------------------------
def _fused(precision: str, shape: ConvShape, relu: bool, residual: bool,
           seed: int = 0) -> FusedConv:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape.k, shape.c, shape.r, shape.s, generator=g, dtype=torch.float64)
    b = torch.randn(shape.k, generator=g, dtype=torch.float64)
    lp = LayerPlan("layer", shape.key())
    return FusedConv(lp, Precision(precision), w, b, shape, relu=relu, residual=residual,
                     backend="reference", target=H100, schedule={})


def _nhwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(0, 2, 3, 1).contiguous().numpy()


@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True),
                                           (False, True)])
def test_int8_reference_equals_kernels_reference_bit_for_bit(relu: bool, residual: bool
                                                              ) -> None:
    shape = ConvShape(2, 9, 7, 24, 16, 3, 3, stride=(2, 1), pad=(1, 1), dilation=(1, 1))
    mod = _fused("int8", shape, relu, residual)
    mod.set_scales(0.05, 0.08, 0.11 if residual else None)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-128, 128, (2, 24, 9, 7), generator=g, dtype=torch.int8)
    r = torch.randint(-128, 128, (2, 16, shape.p, shape.q), generator=g, dtype=torch.int8) \
        if residual else None
    y = mod(x.contiguous(memory_format=torch.channels_last), r)
    assert y.dtype == torch.int8 and y.is_contiguous(memory_format=torch.channels_last)
    w_krsc = mod.weight.permute(0, 2, 3, 1).numpy()
    acc = ref.conv_ref(_nhwc(x), w_krsc, shape, Precision.INT8)
    want = ref.requantize(acc, mod.scale.numpy(), mod.bias.numpy(), 8, relu,
                          None if r is None else _nhwc(r), mod.res_scale or 1.0)
    assert np.array_equal(_nhwc(y).astype(np.int64), want)
    # The epilogue's parameters are the activation scales' ratios.
    assert torch.allclose(mod.scale.double(), 0.05 * mod.weight_scale / 0.08, rtol=1e-6)
    assert torch.allclose(mod.bias.double(), mod.bias_real / 0.08, rtol=1e-6)
    if residual:
        assert mod.res_scale == pytest.approx(0.11 / 0.08, rel=1e-6)


@pytest.mark.parametrize("relu,residual", [(True, False), (False, True)])
def test_fp16_reference_matches_kernels_reference(relu: bool, residual: bool) -> None:
    shape = ConvShape(2, 8, 8, 16, 24, 3, 3, pad=(2, 2), dilation=(2, 2))
    mod = _fused("fp16", shape, relu, residual)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 8, 8, generator=g).half()
    r = torch.randn(2, 24, shape.p, shape.q, generator=g).half() if residual else None
    y = mod(x, r)
    assert y.dtype == torch.float16
    acc = ref.conv_ref(_nhwc(x), mod.weight.permute(0, 2, 3, 1).numpy(), shape,
                       Precision.FP16)
    want = ref.fp_epilogue(acc, mod.bias.numpy(), relu, None if r is None else _nhwc(r))
    ok, stats = ref.check_output(_nhwc(y).astype(np.float64), want, Precision.FP16, 16)
    assert ok, stats
    # One rounding to fp16 at the end, as the kernel's epilogue (float32 sums before it):
    # equal to the exact result rounded to fp16 but where float32 rounding straddles an fp16
    # rounding boundary (rare); rounding the accumulator to fp16 first would miss ~15%.
    got, exact = _nhwc(y), want.astype(np.float16)
    assert np.count_nonzero(got != exact) <= got.size // 1000
    ulp = np.spacing(np.abs(exact)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - exact.astype(np.float64)) <= ulp)


def test_int8_ties_round_to_even_like_the_kernel() -> None:
    """acc * 0.5 of odd accumulators is exactly n + 0.5: the kernel's cvt.rni (and
    kernels.reference.requantize) round it to the even neighbour."""
    shape = ConvShape(1, 4, 4, 16, 16, 1, 1)
    w = torch.zeros(16, 16, 1, 1, dtype=torch.float64)
    w[:, 0, 0, 0] = 127.0  # weight scale 1: the int8 weights are these values
    w[:, 1, 0, 0] = torch.arange(16, dtype=torch.float64) - 8
    mod = FusedConv(LayerPlan("ties", shape.key()), Precision.INT8, w,
                    torch.zeros(16, dtype=torch.float64), shape, relu=False, residual=False,
                    backend="reference", target=H100, schedule={})
    mod.set_scales(0.5, 1.0)  # scale[k] = 0.5 * 1 / 1
    assert mod.scale.tolist() == [0.5] * 16
    x = torch.zeros(1, 16, 4, 4, dtype=torch.int8)
    x[0, 1] = torch.arange(16, dtype=torch.int8).view(4, 4) - 8  # acc = x1 * w1: odd values
    y = mod(x)
    acc = ref.conv_ref(_nhwc(x), mod.weight.permute(0, 2, 3, 1).numpy(), shape, Precision.INT8)
    assert np.count_nonzero(acc % 2) > 50  # many ties
    want = ref.requantize(acc, mod.scale.numpy(), mod.bias.numpy(), 8, False)
    assert np.array_equal(_nhwc(y).astype(np.int64), want)


def test_fused_layer_refuses_wrong_inputs() -> None:
    shape = ConvShape(1, 4, 4, 16, 16, 1, 1)
    mod = _fused("int8", shape, relu=False, residual=False)
    x = torch.zeros(1, 16, 4, 4, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="scales"):
        mod(x)  # never calibrated
    mod.set_scales(1.0, 1.0)
    with pytest.raises(TypeError, match="int8"):
        mod(x.float())
    with pytest.raises(ValueError, match="residual"):
        mod(x, x)
    with pytest.raises(ValueError, match="positive"):
        mod.set_scales(0.0, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_activation_quantize_is_captured_by_a_cuda_graph() -> None:
    """A quantize that deploy leaves to PyTorch runs inside the CUDA graphs that time and
    serve the model (DenseNet-121's concatenations): nothing in it copies from the host."""
    x = torch.randn(2, 8, 5, 5, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calibrate.quantize(x, 0.02)  # warm-up off the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = calibrate.quantize(x, 0.02)
    x.copy_(torch.randn_like(x) * 3)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(q.cpu(), calibrate.quantize(x.cpu(), 0.02))
