"""deploy's rewrite (CPU, reference executor): which modules are replaced, what each fused
layer takes in, and what stays in PyTorch."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from deploy import FusedConv, KernelMaxPool2d, OptimizedModel, optimize
from kernels.runtime import DefaultScheduleWarning
from kernels.spec import Precision
from tests.deploy_nets import Bottleneck, randomize_bn


def opt(model: nn.Module, x: torch.Tensor, precision: str = "fp16", **kw: Any
        ) -> OptimizedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return optimize(model, x, precision, "h100", backend="reference", **kw)


def plan_of(o: OptimizedModel) -> dict[str, Any]:
    return {lp.name: lp for lp in o.plan}


def fused(o: OptimizedModel) -> dict[str, FusedConv]:
    return {m.layer.name: m for m in o.modules_of(FusedConv)}  # type: ignore[attr-defined]


def call_targets(o: OptimizedModel) -> list[str]:
    return [str(n.target) for n in o.graph_module.graph.nodes if n.op == "call_module"]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


class ConvBnRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(32, 32, 1)  # conv -> bn (none) -> nothing: bias only
        self.bn2 = nn.BatchNorm2d(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn2(self.conv2(self.relu(self.bn(self.conv(x)))))


def test_conv_bn_relu_and_conv_bn_are_each_one_fused_layer() -> None:
    torch.manual_seed(0)
    m = randomize_bn(ConvBnRelu()).eval()
    x = torch.randn(2, 16, 12, 12)
    o = opt(m, x)
    p = plan_of(o)
    assert p["conv"].replaced and p["conv"].bn == "bn" and p["conv"].relu
    assert p["conv"].residual is None
    assert p["conv2"].replaced and p["conv2"].bn == "bn2" and not p["conv2"].relu
    # Nothing of the original convs, BNs or ReLU runs: two fused layers and the casts.
    targets = call_targets(o)
    assert [t for t in targets if not t.startswith("tctune_")] == []
    assert [t for t in targets if t.startswith("tctune_") and "quantize" not in t] == \
        ["tctune_conv", "tctune_conv2"]
    f = fused(o)
    assert f["conv"].relu and f["conv"].epilogue.mode == "bias"
    assert rel_err(o(x), m(x)) < 2e-3


def test_bottleneck_fuses_residual_add_and_relu_into_one_conv() -> None:
    torch.manual_seed(1)
    m = randomize_bn(Bottleneck(32, 16, stride=2)).eval()  # with a downsample branch
    x = torch.randn(2, 32, 10, 10)
    o = opt(m, x, "int8")
    p = plan_of(o)
    assert all(lp.replaced for lp in o.plan), o.report()
    # The first conv in graph order at the add takes it; the downsample's conv+bn is its
    # residual, the block's final ReLU its clamp.
    assert p["conv3"].bn == "bn3" and p["conv3"].relu
    assert p["conv3"].residual == "downsample.0"
    assert p["downsample.0"].bn == "downsample.1" and not p["downsample.0"].relu
    assert p["downsample.0"].residual is None
    assert p["conv1"].relu and p["conv2"].relu and p["conv1"].residual is None
    f = fused(o)
    assert f["conv3"].epilogue.residual and f["conv3"].epilogue.relu
    assert f["conv3"].epilogue.mode == "requant"
    # No add, no ReLU left in the graph: the epilogue did both.
    left = [n for n in o.graph_module.graph.nodes if n.op in ("call_function", "call_method")]
    assert left == []
    with torch.no_grad():
        want = m(x)
    assert float(F.cosine_similarity(o(x).flatten(), want.flatten(), dim=0)) > 0.99


def test_identity_residual_block() -> None:
    """A block without downsample adds its input: the residual is the block's input, quantized
    once and shared by conv1 (its input) and conv3 (its residual)."""
    torch.manual_seed(2)
    m = randomize_bn(Bottleneck(64, 16)).eval()
    x = torch.randn(2, 64, 8, 8).relu()
    o = opt(m, x, "int8")
    p = plan_of(o)
    assert p["conv3"].residual == "x" and p["conv3"].relu
    assert o.conversions() == {"quantize": 1, "dequantize": 1}


class AddOwnInput(nn.Module):
    """b adds its own input, which a's kernel has just written."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        return torch.relu(self.b(y) + y)


def test_a_residual_is_read_early_only_where_its_writer_ran_before_the_input_s() -> None:
    """With PDL a kernel may read its residual before it waits for the kernel before it
    where that residual's writer ran before the kernel of its input: a block's last conv
    adding the block's input (two convs back), not a downsample conv that runs beside the
    main path (its kernel may be the one just before), nor its own input."""
    torch.manual_seed(5)
    x = torch.randn(2, 64, 8, 8).relu()
    identity = fused(opt(randomize_bn(Bottleneck(64, 16)).eval(), x, "int8"))
    assert identity["conv3"].residual_ready and not identity["conv3"].x_ready
    assert not identity["conv1"].residual_ready and not identity["conv2"].residual_ready
    down = fused(opt(randomize_bn(Bottleneck(32, 16, stride=2)).eval(),
                     torch.randn(2, 32, 10, 10), "int8"))
    assert down["conv3"].residual and not down["conv3"].residual_ready
    own = fused(opt(AddOwnInput().eval(), torch.randn(2, 16, 8, 8)))
    assert own["b"].residual and not own["b"].residual_ready
    identity["conv1"].set_ready(residual=True, x=True)  # no residual, one input: nothing
    assert not identity["conv1"].residual_ready and not identity["conv1"].x_ready


def test_the_runtime_op_reads_the_residual_early_only_with_pdl(tmp_path: Any) -> None:
    torch.manual_seed(6)
    x = torch.randn(2, 64, 8, 8).relu()
    m = randomize_bn(Bottleneck(64, 16)).eval()
    for pdl in (False, True):
        conv3 = fused(opt(m, x, "int8", pdl=pdl, cache_dir=tmp_path))["conv3"]
        assert conv3.residual_ready and conv3.pdl == pdl
        op = conv3.build((2, 16, 8, 8))
        assert op.residual_ready == pdl
        conv3.set_ready(residual=False, x=False)
        assert conv3.build((2, 16, 8, 8)).residual_ready is False  # rebuilt without it
    # the weight as the kernel reads it is prepared at the layer's first call (a copy just
    # before the launch): ready from the second call on
    calls = [conv3.kernel_call(torch.zeros(2, 16, 8, 8, dtype=torch.int8),
                               torch.zeros(2, 64, 8, 8, dtype=torch.int8)) for _ in range(2)]
    assert [kw["weight_ready"] for _, _, kw in calls] == [False, True]
    assert calls[0][1][1] is calls[1][1][1]  # the same prepared weight


class Odd(nn.Module):
    """Layers the kernel cannot run next to ones it can, and non-conv ops."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, padding=1)
        self.grouped = nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.dilated = nn.Conv2d(32, 32, 3, padding=2, dilation=2)  # the kernel has it
        self.wide_dilation = nn.Conv2d(32, 32, 3, padding=10, dilation=10)  # > MAX_DILATION
        self.reflect = nn.Conv2d(32, 32, 3, padding=1, padding_mode="reflect")
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(32 * 8 * 8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = self.depthwise(self.grouped(x))
        x = self.reflect(self.wide_dilation(self.dilated(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def test_layers_the_kernel_cannot_run_stay_in_pytorch() -> None:
    torch.manual_seed(3)
    m = Odd().eval()
    x = torch.randn(2, 3, 16, 16)
    o = opt(m, x, kernel_head=False)  # the classifier in PyTorch too (the kernel head: below)
    p = plan_of(o)
    assert p["stem"].replaced and p["stem"].relu  # F.relu fuses like nn.ReLU
    assert p["dilated"].replaced and "d2x2" in (p["dilated"].shape_key or "")
    for name, why in (("grouped", "groups"), ("depthwise", "groups"),
                      ("wide_dilation", "dilation"), ("reflect", "padding_mode")):
        assert not p[name].replaced and why in p[name].reason, (name, p[name].reason)
    targets = call_targets(o)
    for kept in ("grouped", "depthwise", "wide_dilation", "reflect", "pool", "fc"):
        assert kept in targets
        assert type(o.graph_module.get_submodule(kept)) is type(m.get_submodule(kept))
    # fp16 from end to end: kept layers run in fp16 too (cuDNN's fp16 conv on a GPU), so
    # the only casts are the input's and the output's.
    assert o.conversions() == {"quantize": 1, "dequantize": 1}
    for kept in ("grouped", "depthwise", "wide_dilation", "reflect", "fc"):
        assert o.graph_module.get_submodule(kept).weight.dtype == torch.float16
    assert o(x).dtype == torch.float32
    assert rel_err(o(x), m(x)) < 2e-3


class AddAfterRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(16, 16, 3, padding=1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        z = self.bn(y) + y  # y has two users: its BN cannot fold into `a`
        return torch.relu(self.b(z)) + z  # ReLU before the add: the add stays in PyTorch


def test_fusion_stops_where_a_value_has_other_users_or_the_order_differs() -> None:
    torch.manual_seed(4)
    m = randomize_bn(AddAfterRelu()).eval()
    x = torch.randn(2, 16, 8, 8)
    o = opt(m, x)
    p = plan_of(o)
    assert p["a"].replaced and p["a"].bn is None and not p["a"].relu
    assert p["b"].replaced and p["b"].relu and p["b"].residual is None
    ops = [n.target for n in o.graph_module.graph.nodes if n.op == "call_function"]
    assert len(ops) == 2  # both adds stay
    assert "bn" in call_targets(o)
    assert rel_err(o(x), m(x)) < 2e-3


class Sub(nn.Conv2d):
    """Traced through (not a torch.nn leaf): its conv is a functional call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_functional_convs_are_listed_and_kept() -> None:
    m = nn.Sequential(Sub(16, 16, 3, padding=1)).eval()
    x = torch.randn(1, 16, 8, 8)
    o = opt(m, x)
    assert len(o.plan) == 1 and not o.plan[0].replaced
    assert "functional" in o.plan[0].reason
    with torch.no_grad():  # the module as it was, in fp16 like the rest of an fp16 model
        cl = torch.channels_last
        want = copy.deepcopy(m).half().to(memory_format=cl)(
            x.half().contiguous(memory_format=cl)).float()
        assert torch.equal(o(x), want)


def test_max_pool_between_convs_stays_in_the_kernel_domain() -> None:
    torch.manual_seed(5)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                      nn.Conv2d(16, 16, 3, padding=1)).eval()
    x = torch.randn(2, 3, 16, 16)
    for precision in ("fp16", "int8"):
        o = opt(m, x, precision)
        assert len(o.modules_of(KernelMaxPool2d)) == 1
        assert o.conversions() == {"quantize": 1, "dequantize": 1}
        # it runs as the fused layers do (on the GPU: tctune's pooling kernel)
        pool, conv = o.modules_of(KernelMaxPool2d)[0], o.modules_of(FusedConv)[0]
        assert (pool.backend, pool.target, pool.pdl, pool.cache_dir) == \
            (conv.backend, conv.target, conv.pdl, conv.cache_dir)
        o.set_backend("cuda")  # the pool switches with the fused layers
        assert pool.backend == conv.backend == "cuda"


def _pair_records(x: torch.Tensor, pair_us: float) -> dict[str, Any]:
    """small_resnet's stem with a record of its own (2 us) and one of its pair layer."""
    from kernels.spec import ConvShape, pixel_pairs

    stem = ConvShape(int(x.shape[0]), 64, 64, 3, 32, 7, 7, stride=(2, 2), pad=(3, 3))
    paired = pixel_pairs(stem, 4)
    assert paired is not None
    return {stem.key(): {"schedule": {}, "latency_us": 2.0},
            paired[0].key(): {"schedule": {}, "latency_us": pair_us}}


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_the_stem_runs_over_pixel_pairs_where_their_record_is_faster(precision: str) -> None:
    """With a faster record of its pair layer (kernels.spec.pixel_pairs) the stem runs as
    that layer: its weights paired, its input padded and paired in forward (the reference
    executor; on the GPU the input quantize writes the pairs); the model's output is the
    same as without it (int8: bit for bit). A slower pair record leaves it as it is."""
    from tests.deploy_nets import small_resnet

    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(8))
    m = small_resnet()
    base = opt(m, x, precision)
    fast = opt(m, x, precision, schedules=_pair_records(x, 1.0))
    slow = opt(m, x, precision, schedules=_pair_records(x, 3.0))
    stem = fused(fast)["conv1"]
    assert stem.pairs == (4, 1, 1) and fused(slow)["conv1"].pairs is None
    assert stem.weight.shape[1:] == (8, 7, 4) and stem.shape.key().startswith("n2_h64_w33_c8")
    lp = plan_of(fast)["conv1"]
    assert lp.shape_key == stem.shape.key() and any("pixel pairs" in n for n in lp.notes)
    assert all(m.pairs is None for name, m in fused(fast).items() if name != "conv1")
    assert torch.equal(fast(x), base(x))
    assert torch.equal(slow(x), base(x))


class FunctionalHead(nn.Module):
    """A head after an op that stays in PyTorch (sigmoid): F.adaptive_avg_pool2d to (1, 1)
    (as DenseNet calls it), flatten, classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 32, 3, padding=1)
        self.fc = nn.Linear(32, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.adaptive_avg_pool2d(torch.sigmoid(self.conv(x)), (1, 1))
        return self.fc(torch.flatten(y, 1))


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_kernel_head_runs_the_pool_and_classifier_on_kernels(precision: str) -> None:
    """kernel_head: the global average pool reads the last layer's int8 (with its output
    scale) or fp16 as it is, so nothing is dequantized; the classifier writes the float32
    logits itself, so nothing is cast at the end; the logits are those of PyTorch's head
    on the same layers within its fp16 roundings. Off, PyTorch runs both."""
    from deploy import KernelGlobalAvgPool, KernelLinear
    from tests.deploy_nets import small_resnet

    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    m = small_resnet()
    base, head = opt(m, x, precision, kernel_head=False), opt(m, x, precision)
    assert not base.modules_of(KernelGlobalAvgPool) and not base.modules_of(KernelLinear)
    assert base.conversions() == {"quantize": 1, "dequantize": 1}
    assert head.conversions() == {"quantize": 1, "dequantize": 0}
    order = [type(head.graph_module.get_submodule(t)).__name__ for t in call_targets(head)]
    assert order[-3:] == ["FusedConv", "KernelGlobalAvgPool", "KernelLinear"]
    (pool,), (fc,) = head.modules_of(KernelGlobalAvgPool), head.modules_of(KernelLinear)
    assert pool.scale == (head.plan[-1].out_scale if precision == "int8" else None)
    assert (fc.weight.dtype, fc.bias.dtype, fc.out_dtype) == \
        (torch.float16, torch.float32, torch.float32)
    conv = head.modules_of(FusedConv)[0]
    assert (pool.backend, pool.pdl, fc.backend, fc.pdl) == (conv.backend, conv.pdl) * 2
    got, want = head(x), base(x)
    assert got.dtype == torch.float32 and rel_err(got, want) < 2e-3
    # the functional form, over a float value (fp16 in, also in an int8 model)
    torch.manual_seed(4)
    fh = FunctionalHead().eval()
    f = opt(fh, x, precision)
    assert len(f.modules_of(KernelGlobalAvgPool)) == 1 and len(f.modules_of(KernelLinear)) == 1
    assert f.modules_of(KernelGlobalAvgPool)[0].scale is None
    assert rel_err(f(x), opt(fh, x, precision, kernel_head=False)(x)) < 2e-3


def test_the_average_pool_of_int8_is_the_kernels_exact_sum_rounded_once() -> None:
    """KernelGlobalAvgPool's reference math for int8 is the kernel's: the exact sum times
    the scale over the pixels in float32, rounded once to fp16; fp16 is the float32 mean."""
    from deploy import KernelGlobalAvgPool

    g = torch.Generator().manual_seed(6)
    x = torch.randint(-128, 128, (3, 48, 7, 5), generator=g, dtype=torch.int8)
    x = x.contiguous(memory_format=torch.channels_last)
    y = KernelGlobalAvgPool(0.0371)(x)
    exact = x.double().sum((2, 3)) * 0.0371 / 35
    assert y.shape == (3, 48, 1, 1) and y.dtype == torch.float16
    # one fp16 rounding of a float32 product within float32's error of the exact value
    assert torch.allclose(y.flatten(1).double(), exact, rtol=2 ** -11 + 2 ** -22, atol=0)
    s32 = float(torch.tensor(0.0371 / 35, dtype=torch.float32))
    assert torch.equal(y.flatten(1), (x.int().sum((2, 3)).float() * s32).half())
    h = torch.randn(3, 48, 7, 5, generator=g).half()
    assert torch.equal(KernelGlobalAvgPool()(h).flatten(1), h.float().mean((2, 3)).half())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
def test_max_pool_as_the_maximum_of_its_windows_is_pytorchs_max_pool(dtype: torch.dtype) -> None:
    """KernelMaxPool2d's views' maximum against F.max_pool2d (in float32, which holds every
    value exactly): square and rectangular windows, strides, padding, dilation, a padded
    border whose window holds the dtype's lowest value; channels_last out."""
    torch.manual_seed(11)
    x = torch.randint(-128, 128, (2, 5, 13, 11)).to(dtype)
    x[0, 0, 0, :] = -128  # a window of the lowest value beside the padding
    x = x.contiguous(memory_format=torch.channels_last)
    for k, s, p, d in [(3, 2, 1, 1), (2, 2, 0, 1), (3, 1, 1, 1), ((3, 2), (2, 1), (1, 0), 1),
                       (3, 2, 1, 2), (5, 3, 2, 1), (3, None, 1, 1), (1, 1, 0, 1)]:
        got = KernelMaxPool2d(k, s, p, d)(x)
        want = F.max_pool2d(x.float(), k, s if s is not None else k, p, d)
        assert got.dtype is dtype and got.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(got.float(), want), (k, s, p, d)
    # ceil_mode: PyTorch's own pooling (through fp16 for int8)
    got = KernelMaxPool2d(3, 2, 1, 1, ceil_mode=True)(x)
    assert torch.equal(got.float(), F.max_pool2d(x.float(), 3, 2, 1, ceil_mode=True))


def test_the_original_model_is_not_changed_and_errors_are_clear() -> None:
    m = ConvBnRelu().eval()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt(m, torch.randn(1, 16, 8, 8), "int8")
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert type(m.conv) is nn.Conv2d
    with pytest.raises(ValueError, match="precision"):
        opt(m, torch.randn(1, 16, 8, 8), "int4")
    with pytest.raises(ValueError, match="backend"):
        optimize(m, torch.randn(1, 16, 8, 8), "fp16", "h100", backend="tpu")
    with pytest.raises(ValueError, match="unknown target"):
        optimize(m, torch.randn(1, 16, 8, 8), "fp16", "v100", backend="reference")


class Shared(nn.Module):
    """One conv module called twice, at two input sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.pool = nn.AvgPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        return self.conv(self.pool(y))


def test_a_module_called_twice_is_two_fused_layers() -> None:
    torch.manual_seed(6)
    m = Shared().eval()
    x = torch.randn(2, 16, 8, 8)
    o = opt(m, x)
    assert [(lp.name, lp.replaced, lp.relu) for lp in o.plan] == \
        [("conv", True, True), ("conv", True, False)]
    assert o.plan[0].shape_key != o.plan[1].shape_key
    assert len(o.modules_of(FusedConv)) == 2
    assert rel_err(o(x), m(x)) < 2e-3


class OwnParameter(nn.Module):
    """A parameter of a module with children, read by the graph directly (get_attr)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)
        self.gain = nn.Parameter(torch.rand(1, 16, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * self.gain


def test_fp16_runs_what_stays_in_pytorch_in_fp16_too() -> None:
    torch.manual_seed(6)
    m = OwnParameter().eval()
    x = torch.randn(2, 16, 8, 8)
    o = opt(m, x)
    assert plan_of(o)["conv"].replaced
    assert o.graph_module.gain.dtype == torch.float16
    assert fused(o)["conv"].bias.dtype == torch.float32  # the kernel's epilogue takes fp32
    y = o(x)
    assert y.dtype == torch.float32 and rel_err(y, m(x)) < 2e-3


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_a_narrow_input_is_padded_before_the_kernel_call(precision: str) -> None:
    """A fused layer set to take the kernel's padded channel count pads narrower inputs with
    zero channels itself (torch ops a compiled model fuses into the input's cast or quantize);
    the layer's shape, and so its output, stay the same."""
    torch.manual_seed(8)
    m = Odd().eval()
    x = torch.randn(2, 3, 16, 16)
    o = opt(m, x, precision)
    stem = fused(o)["stem"]
    assert stem.in_channels == stem.input_channels == 3
    before = o(x)
    seen: list[tuple[int, ...]] = []
    orig = stem.execute
    stem.execute = lambda xin, *rest: (seen.append(tuple(xin.shape)), orig(xin, *rest))[1]
    stem.set_input_channels(4)
    after = o(x)
    assert seen == [(2, 4, 16, 16)]
    assert torch.equal(before, after)
    assert stem.shape_for((2, 4, 16, 16)) == stem.shape_for((2, 3, 16, 16))
    assert stem.shape_for((2, 4, 16, 16)).c == 3
    with pytest.raises(ValueError, match="fewer than the layer's 3"):
        stem.set_input_channels(2)


def test_int8_runs_what_stays_in_pytorch_in_fp16() -> None:
    """int8 models dequantize to fp16 for PyTorch ops, whose weights are fp16; the model's
    input reaches the int8 quantize as float32, and the output is cast back to float32."""
    torch.manual_seed(9)
    m = Odd().eval()
    x = torch.randn(2, 3, 16, 16)
    o = opt(m, x, "int8", kernel_head=False)
    for kept in ("grouped", "depthwise", "fc"):
        assert o.graph_module.get_submodule(kept).weight.dtype == torch.float16
    # int8 in and out of stem and dilated; the fp16 cast of the output is not counted
    assert o.conversions() == {"quantize": 2, "dequantize": 2}
    assert not any(t.startswith("tctune_quantize_input") for t in call_targets(o))
    assert call_targets(o)[-1] == "tctune_dequantize_output"
    y = o(x)
    assert y.dtype == torch.float32
    cos = F.cosine_similarity(y.flatten().double(), m(x).flatten().double(), dim=0)
    assert cos > 0.99


# ---- a bottleneck's last conv and its projection as one GEMM ------------------------------
CONCAT_SCHEDULE = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2,
                       CHUNK=1, REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc",
                       STAGES=4, SPLIT_K=1, MMA="wgmma")


def _concat_records(x: torch.Tensor, precision: str, schedule: dict[str, Any],
                    latency_us: float = 5.0) -> dict[str, Any]:
    """A record of the bottleneck's two-input layer (Bottleneck(64, 32, stride=2) at x):
    conv3's 32 channels at 5x5 and the projection's 64 at 10x10, stride 2."""
    from kernels.spec import ConvShape, get_target, task_key, two_input_shape

    n, c, h, w = x.shape
    shape = two_input_shape(ConvShape(n, h // 2, w // 2, 32, 128, 1, 1),
                            ConvShape(n, h, w, c, 128, 1, 1, stride=2))
    assert shape is not None
    key = task_key(shape, Precision(precision), get_target("h100"))
    return {key: {"schedule": schedule, "latency_us": latency_us}}


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_last_conv_and_projection_run_as_one_layer_over_both_inputs(precision: str) -> None:
    torch.manual_seed(11)
    m = randomize_bn(Bottleneck(64, 32, stride=2)).eval()
    x = torch.randn(2, 64, 10, 10)
    one = opt(m, x, precision)
    two = opt(m, x, precision, schedules=_concat_records(x, precision, CONCAT_SCHEDULE))
    p = plan_of(two)
    assert p["conv3"].merged == "downsample.0" and p["downsample.0"].merged == "conv3"
    assert p["conv3"].replaced and p["downsample.0"].replaced and p["conv3"].relu
    assert p["conv3"].residual is None and "+downsample.0" in p["conv3"].fused
    f = fused(two)
    assert set(f) == {"conv1", "conv2", "conv3"}
    layer = f["conv3"]
    assert layer.concat == 32 and layer.in_channels == 32 + 64 and layer.stride == (2, 2)
    assert not layer.epilogue.residual and layer.epilogue.relu
    # its inputs: x the block's input (the projection's), x1 conv2's output
    node = next(n for n in two.graph_module.graph.nodes
                if n.op == "call_module" and n.target == "tctune_conv3")
    assert node.args[1] is None and len(node.args) == 3
    # x, written before conv1's kernel (which conv2's depends on), is read before the wait
    # for conv2's (with PDL); x1, conv2's output, after it; the convs before read nothing early
    assert layer.x_ready and not layer.residual_ready
    assert not any(f[n].x_ready or f[n].residual_ready for n in ("conv1", "conv2"))
    with torch.no_grad():
        want = m(x)
    got, got_one = two(x), one(x)
    if precision == "fp16":
        assert rel_err(got, want) < 2e-3 and rel_err(got, got_one) < 2e-3
    else:
        # one weight scale per output channel over both parts, neither clipped
        w = layer.weight.to(torch.float64) * layer.weight_scale.view(-1, 1, 1, 1)
        w[:, :32] *= layer.layer.in_scale / layer.layer.x1_scale
        real = layer.weight_real
        assert float((w - real).abs().max()) <= float(
            layer.weight_scale.max()) * max(1.0, layer.layer.in_scale / layer.layer.x1_scale)
        assert int(layer.weight.abs().max()) <= 127
        cos = F.cosine_similarity(got.flatten().double(), want.flatten().double(), dim=0)
        assert cos > 0.99


def test_the_two_layers_stay_apart_without_a_fitting_faster_record() -> None:
    torch.manual_seed(12)
    m = randomize_bn(Bottleneck(64, 32, stride=2)).eval()
    x = torch.randn(2, 64, 10, 10)
    for recs in ({}, _concat_records(x, "fp16", {**CONCAT_SCHEDULE, "TMA": 1})):
        o = opt(m, x, "fp16", schedules=recs)
        p = plan_of(o)
        assert p["conv3"].merged is None and p["conv3"].residual == "downsample.0"
        assert set(fused(o)) == {"conv1", "conv2", "conv3", "downsample.0"}
    assert any("TMA=0" in n for n in p["conv3"].notes), p["conv3"].notes


def test_a_pair_merges_where_its_gemm_beats_what_the_two_would_run_as() -> None:
    """fp16: conv3 alone loses to cuDNN with the pass after it (kept in PyTorch), the
    projection wins. The pair's one GEMM is merged where it beats cuDNN's conv3 with that
    pass plus the projection's kernel (5 + 1.8 + 4 us), and otherwise conv3 stays on cuDNN
    and the projection takes the residual add."""
    from kernels.spec import ConvShape, get_target, task_key

    torch.manual_seed(13)
    m = randomize_bn(Bottleneck(64, 32, stride=2)).eval()
    x = torch.randn(2, 64, 10, 10)
    h100 = get_target("h100")
    conv3 = task_key(ConvShape(2, 5, 5, 32, 128, 1, 1), Precision.FP16, h100)
    proj = task_key(ConvShape(2, 10, 10, 64, 128, 1, 1, stride=2), Precision.FP16, h100)
    parts = {conv3: {"schedule": CONCAT_SCHEDULE, "latency_us": 7.5, "baseline_us": 5.0},
             proj: {"schedule": CONCAT_SCHEDULE, "latency_us": 4.0, "baseline_us": 5.0}}
    merged = plan_of(opt(m, x, "fp16", schedules={
        **parts, **_concat_records(x, "fp16", CONCAT_SCHEDULE, latency_us=8.5)}))
    assert merged["conv3"].replaced and merged["conv3"].merged == "downsample.0"
    assert merged["conv3"].reason == ""
    o = opt(m, x, "fp16", schedules={
        **parts, **_concat_records(x, "fp16", CONCAT_SCHEDULE, latency_us=11.0)})
    apart = plan_of(o)
    assert not apart["conv3"].replaced and "slower than its baseline" in apart["conv3"].reason
    assert apart["downsample.0"].merged is None and apart["downsample.0"].residual is not None
    assert set(fused(o)) == {"conv1", "conv2", "downsample.0"}
    with torch.no_grad():
        assert rel_err(o(x), m(x)) < 2e-3


def test_a_plan_tunes_with_its_residual_every_conv_deploy_runs_with_one() -> None:
    """`tctune plan` (api.plan.fused_layers) and the rewrite agree on which convs' epilogues
    add a residual: the layers tuned as ConvShape.residual are those deploy runs so."""
    from api.plan import conv_layers, fused_layers
    from tests.models import small_resnet

    torch.manual_seed(14)
    nets = [(small_resnet().eval(), torch.randn(2, 3, 32, 32)),
            (randomize_bn(nn.Sequential(Bottleneck(64, 32, stride=2), Bottleneck(128, 32))).eval(),
             torch.randn(2, 64, 10, 10))]
    for m, x in nets:
        residual = fused_layers(m, x, conv_layers(m, x)).residual
        want = {lp.name for lp in opt(m, x, "int8").plan if lp.residual}
        assert residual == want and len(want) >= 2
    # A BatchNorm deploy does not fold (no running statistics) ends conv3's chain before the
    # add: neither the plan nor deploy gives conv3 the residual, or merges it with the
    # projection; the projection takes the add in both.
    m = randomize_bn(nn.Sequential(Bottleneck(64, 32, stride=2), Bottleneck(128, 32)))
    m[0].bn3 = nn.BatchNorm2d(128, track_running_stats=False)
    m.eval()
    x = torch.randn(2, 64, 10, 10)
    pairs, residual, _ = fused_layers(m, x, conv_layers(m, x))
    want = {lp.name for lp in opt(m, x, "int8").plan if lp.residual}
    assert residual == want and "0.conv3" not in want and "0.downsample.0" in want
    assert pairs == []
