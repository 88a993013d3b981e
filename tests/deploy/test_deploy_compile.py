"""An optimized model under `torch.compile`: each fused layer is one opaque custom op
(`torch.ops.tctune.fused_conv`, deploy/torch_op.py) with a fake implementation, so Dynamo
captures the whole model in one graph, AOTAutograd propagates shapes, dtypes and
channels_last strides through the layers, and the compiled model computes what the eager one
does. On a CPU with the reference executor; the GPU run is bench/model_e2e.py's."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import fx

from deploy import FusedConv, KernelMaxPool2d, OptimizedModel, optimize, torch_op
from kernels.runtime import DefaultScheduleWarning
from tests.deploy_nets import small_resnet

X = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(10))
HELD = torch.randn(8, 3, 64, 64, generator=torch.Generator().manual_seed(11))
OP = torch.ops.tctune.fused_conv.default


def optimized(precision: str) -> OptimizedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return optimize(small_resnet(), X, precision, "h100", backend="reference")


class Recorder:
    """A Dynamo backend that keeps every graph it is given and runs it as it is."""

    def __init__(self) -> None:
        self.graphs: list[fx.GraphModule] = []

    def __call__(self, gm: fx.GraphModule, _inputs: Any) -> Any:
        self.graphs.append(gm)
        return gm.forward


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_the_model_is_one_graph_with_one_custom_op_per_fused_layer(precision: str) -> None:
    opt = optimized(precision)
    torch._dynamo.reset()
    rec = Recorder()
    with torch.no_grad():  # compiled first: nothing the eager run learns may steer the trace
        got = torch.compile(opt, backend=rec, fullgraph=True)(HELD)
        want = opt(HELD)
    assert torch.equal(got, want)
    assert len(rec.graphs) == 1
    calls = [n for n in rec.graphs[0].graph.nodes if n.op == "call_function" and
             getattr(n.target, "_overloadpacket", None) is torch.ops.tctune.fused_conv]
    assert len(calls) == len(opt.modules_of(FusedConv)) > 0
    # the stem's max-pool is its windows' maximum on the layer's own dtype (no casts around)
    targets = [n.target for n in rec.graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count(torch.maximum) == 8  # a 3x3 window's nine views
    assert not any(t in (torch.nn.functional.max_pool2d, torch.max_pool2d) for t in targets)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_aot_tracing_through_the_fake_op_gives_the_eager_result(precision: str) -> None:
    opt = optimized(precision)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(opt, backend="aot_eager", fullgraph=True)(HELD)
        want = opt(HELD)
    assert torch.equal(got, want)


def test_the_fake_op_has_the_layers_output_shape_dtype_and_strides() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    opt = optimized("int8")
    layer = opt.modules_of(FusedConv)[0]
    assert isinstance(layer, FusedConv)
    x = torch.zeros(8, 3, 64, 64, dtype=torch.int8).contiguous(memory_format=torch.channels_last)
    real = torch.ops.tctune.fused_conv(x, None, None, layer.uid)
    with FakeTensorMode() as mode:
        fake = torch.ops.tctune.fused_conv(mode.from_tensor(x), None, None, layer.uid)
    assert (fake.shape, fake.dtype, fake.stride()) == (real.shape, real.dtype, real.stride())
    assert real.is_contiguous(memory_format=torch.channels_last)


def test_a_copy_of_a_layer_runs_its_own_weights() -> None:
    opt = optimized("fp16")
    twin = copy.deepcopy(opt)
    a, b = opt.modules_of(FusedConv)[0], twin.modules_of(FusedConv)[0]
    assert isinstance(a, FusedConv) and isinstance(b, FusedConv) and a.uid != b.uid
    pools = [o.modules_of(KernelMaxPool2d)[0] for o in (opt, twin)]
    assert pools[0].uid != pools[1].uid
    assert torch_op._layer(pools[1].uid) is pools[1]  # the twin's op runs the twin's pool
    with torch.no_grad():
        b.weight.zero_()
        assert not torch.equal(twin(HELD), opt(HELD))


def test_the_fake_max_pool_op_has_the_pools_output_shape_dtype_and_strides() -> None:
    """The GPU pooling op (torch.ops.tctune.max_pool) as AOTAutograd traces it: the output
    PyTorch's max-pool would give, channels_last, in the input's dtype (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from deploy import KernelMaxPool2d
    from kernels.spec import get_target

    pool = KernelMaxPool2d(3, 2, 1, backend="cuda", target=get_target("h100"))
    cl = torch.channels_last
    for dtype in (torch.int8, torch.float16):
        x = torch.zeros(8, 64, 15, 15, dtype=dtype).contiguous(memory_format=cl)
        want = torch.nn.functional.max_pool2d(x.float(), 3, 2, 1).contiguous(memory_format=cl)
        with FakeTensorMode() as mode:
            fake = torch.ops.tctune.max_pool(mode.from_tensor(x), pool.uid)
        assert (fake.shape, fake.stride(), fake.dtype) == (want.shape, want.stride(), dtype)
    assert not pool.runs_kernel(x)  # a CPU tensor: the views' maximum instead
    assert torch.equal(pool(x).float(), want)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_the_input_quantize_writes_the_stems_padded_channels_on_the_gpu(
        precision: str, tmp_path: Any) -> None:
    """With the cuda backend (built here with NVRTC, no GPU), the model's input Quantize
    feeds only the stem, which reads 3 channels padded to 4 (one word a pixel): it takes that
    count and its kernel is built for the planned input; its fake op gives the padded
    channels_last output the stem reads."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from deploy import Quantize

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        opt = optimize(small_resnet(), X, precision, "h100", backend="cuda", cache_dir=tmp_path)
    (q,) = opt.modules_of(Quantize)
    stem = opt.modules_of(FusedConv)[0]
    assert q.channels == stem.input_channels == 4 and len(q._ops) == 1
    with FakeTensorMode() as mode:
        fake = torch.ops.tctune.quantize(mode.from_tensor(X), q.uid)
    assert fake.shape == (8, 4, 64, 64) and fake.dtype == q.out_dtype
    assert fake.is_contiguous(memory_format=torch.channels_last)
    assert not q.runs_kernel(X)  # a CPU tensor: torch ops, and the stem pads


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_the_head_runs_on_kernels_built_for_its_planned_input(precision: str,
                                                              tmp_path: Any) -> None:
    """With kernel_head and the cuda backend (built here with NVRTC, no GPU), the average
    pool reads the last layer's output as it is (int8 with its scale, or fp16) and the
    classifier the pooled fp16 rows, writing the float32 logits: each kernel is built for
    its planned input, and the fake ops give what the reference path gives (shape, dtype)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from deploy import KernelGlobalAvgPool, KernelLinear

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        opt = optimize(small_resnet(), X, precision, "h100", backend="cuda", cache_dir=tmp_path,
                       kernel_head=True)
    (pool,), (fc,) = opt.modules_of(KernelGlobalAvgPool), opt.modules_of(KernelLinear)
    last = opt.modules_of(FusedConv)[-1]
    assert isinstance(pool, KernelGlobalAvgPool) and isinstance(fc, KernelLinear)
    assert len(pool._ops) == 1 and len(fc._ops) == 1
    assert (pool.scale is None) == (precision == "fp16")
    assert fc.out_dtype == torch.float32 and fc.pdl == last.pdl
    x = torch.zeros(8, 128, 4, 4, dtype=last.out_dtype).contiguous(
        memory_format=torch.channels_last)
    with FakeTensorMode() as mode:
        fake = torch.ops.tctune.global_avg_pool(mode.from_tensor(x), pool.uid)
        rows = torch.ops.tctune.linear(mode.from_tensor(torch.zeros(8, 128).half()), fc.uid)
    assert not pool.runs_kernel(x)  # CPU tensors: the float32 mean and F.linear instead
    want = pool(x)
    assert (fake.shape, fake.dtype) == ((8, 128), torch.float16) and fake.is_contiguous()
    assert want.shape == (8, 128, 1, 1) and want.dtype == torch.float16
    assert want.is_contiguous() and want.is_contiguous(memory_format=torch.channels_last)
    assert (rows.shape, rows.dtype) == ((8, 10), torch.float32)


def test_module_ids_differ_between_processes() -> None:
    """A compiled graph names its modules by id, and Inductor's on-disk cache serves a graph
    compiled in one process to another: the same id must not name two processes' modules
    (one process's stem over pixel pairs, the other's not, failed so on the GPU)."""
    import subprocess
    import sys

    code = "from deploy import torch_op; print(torch_op.register(torch_op))"
    ids = {int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                              text=True).stdout) for _ in range(2)}
    assert len(ids) == 2 and all(0 < i < 2 ** 62 for i in ids)


def test_inductor_has_every_ops_fallback_once_a_model_is_made() -> None:
    """Made before any compile (deploy.torch_op.register_inductor_fallbacks), so Inductor
    never makes one while lowering a deep graph; with the layout constraint it would give
    the op itself."""
    from torch._inductor import lowering
    from torch._library.utils import get_layout_constraint_tag

    ops = [getattr(torch.ops.tctune, name).default for name in torch_op.OPS]
    for op in ops:  # whatever an earlier compile in this process registered
        lowering.lowerings.pop(op, None)
    optimized("int8")
    for name, op in zip(torch_op.OPS, ops, strict=True):
        assert op in lowering.lowerings, name
        want = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        assert lowering.maybe_layout_constraints(op) is want, name


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_a_stem_over_pixel_pairs_has_its_pairs_written_by_the_input_quantize(
        precision: str, tmp_path: Any) -> None:
    """With the cuda backend (built here, no GPU) and a faster record of the stem's pair
    layer, the model's input quantize writes 4 channels a pixel with a zero pixel before and
    after each row, its op's output seen as the pair layer's input (8 channels, 33 pairs a
    row, channels_last), which the stem's kernel is built for."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from deploy import Quantize
    from tests.deploy.test_deploy_graph import _pair_records

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        opt = optimize(small_resnet(), X, precision, "h100", _pair_records(X, 1.0),
                       backend="cuda", cache_dir=tmp_path)
    (q,) = opt.modules_of(Quantize)
    stem = opt.modules_of(FusedConv)[0]
    assert stem.pairs == (4, 1, 1) and (q.channels, q.pairs) == (4, (1, 1)) and len(q._ops) == 1
    assert [op.shape.key() for op in stem._ops.values()] == [stem.shape.key()]
    with FakeTensorMode() as mode:
        fake = torch.ops.tctune.quantize(mode.from_tensor(X), q.uid)
    assert fake.shape == (8, 8, 64, 33) and fake.dtype == q.out_dtype
    assert fake.is_contiguous(memory_format=torch.channels_last)
    assert stem.shape_for(fake.shape) == stem.shape_for(X.shape) == stem.shape
