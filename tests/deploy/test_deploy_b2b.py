"""deploy's back-to-back 1x1 convs (CPU, reference executor): a bottleneck's last conv runs
the next block's first in its kernel (kernels.spec.ConvShape's `b2b`) where the record of the
two as one layer beats their two records, and the model computes the same as with the two
apart."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import nn

from deploy import FusedConv, OptimizedModel, optimize
from kernels.runtime import DefaultScheduleWarning
from kernels.spec import ConvShape, Precision, get_target, task_key
from tests.deploy_nets import Bottleneck, randomize_bn

SCHEDULE = dict(BLK_ROW_WARPS=1, BLK_COL_WARPS=1, WARP_ROW_TILES=1, WARP_COL_TILES=2, CHUNK=1,
                REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=4, SPLIT_K=1,
                MMA="wgmma")  # 64 x 64 tiles: one column tile of the last conv's 64 channels
LAST = ConvShape(2, 8, 8, 16, 64, 1, 1, residual=True)  # block 0's conv3, with the add
FIRST = ConvShape(2, 8, 8, 64, 16, 1, 1)  # block 1's conv1 over block 0's output


def blocks() -> nn.Module:
    torch.manual_seed(21)
    return randomize_bn(nn.Sequential(Bottleneck(64, 16), Bottleneck(64, 16))).eval()


def records(precision: str, b2b_us: float | None, schedule: dict[str, Any] = SCHEDULE
            ) -> dict[str, Any]:
    """Records of the two layers (5 and 4 µs) and, unless None, of the two as one."""
    h100, p = get_target("h100"), Precision(precision)
    out = {task_key(LAST, p, h100): {"schedule": SCHEDULE, "latency_us": 5.0},
           task_key(FIRST, p, h100): {"schedule": SCHEDULE, "latency_us": 4.0}}
    if b2b_us is not None:
        both = ConvShape.from_dict({**LAST.to_dict(), "b2b": 16})
        out[task_key(both, p, h100)] = {"schedule": schedule, "latency_us": b2b_us}
    return out


def opt(m: nn.Module, x: torch.Tensor, precision: str, recs: dict[str, Any],
        pdl: bool = False) -> OptimizedModel:
    """The blocks optimized for an H100, plain launches unless `pdl`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return optimize(m, x, precision, "h100", schedules=recs, backend="reference", pdl=pdl)


def fused(o: OptimizedModel) -> dict[str, FusedConv]:
    return {m.layer.name: m for m in o.modules_of(FusedConv)}  # type: ignore[attr-defined]


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_the_next_blocks_first_conv_runs_in_the_last_convs_kernel(precision: str) -> None:
    m, x = blocks(), torch.randn(2, 64, 8, 8)
    apart = opt(m, x, precision, records(precision, None))
    both = opt(m, x, precision, records(precision, 8.0))
    plan = {lp.name: lp for lp in both.plan}
    last, first = plan["0.conv3"], plan["1.conv1"]
    assert last.back_to_back == "1.conv1" and first.back_to_back == "0.conv3"
    assert first.replaced and "then 1.conv1" in last.fused and last.latency_us == 8.0
    layer = fused(both)["0.conv3"]
    assert "1.conv1" not in fused(both) and layer.b2b == 16 and layer.b2b_relu
    assert layer.epilogue.b2b == 16 and layer.record_key().split("|")[0].endswith("_res_b2b16")
    assert layer.schedule == SCHEDULE and layer.calibrated
    # block 1's add takes block 0's output, its conv2 the back-to-back conv's
    targets = [str(n.target) for n in both.graph_module.graph.nodes]
    assert "tctune_1_conv1" not in targets
    with torch.no_grad():
        got, want = both(x), apart(x)
    # the same math as the two layers apart: int8 bit for bit, fp16 as its own rounding
    if precision == "int8":
        assert torch.equal(got, want)
        assert layer.b2b_scale.abs().min() > 0 and layer.b2b_out_scale
    else:
        assert float((got - want).abs().max()) <= 1e-3 * float(want.abs().max())


def test_the_two_stay_apart_where_the_pair_is_no_faster_or_cannot_run() -> None:
    m, x = blocks(), torch.randn(2, 64, 8, 8)
    for recs in (records("int8", 9.0), records("int8", 8.0, {**SCHEDULE, "WARP_COL_TILES": 1})):
        o = opt(m, x, "int8", recs)
        assert {"0.conv3", "1.conv1"} <= set(fused(o)) and fused(o)["0.conv3"].b2b == 0
    notes = {lp.name: lp for lp in o.plan}["0.conv3"].notes
    assert any("not back to back with 1.conv1" in n and "whole output rows" in n
               for n in notes), notes


def test_with_pdl_the_two_stay_apart() -> None:
    """The pair's record is timed alone with plain launches; with PDL (sm_90's default) the
    second layer's kernel overlaps the first's end, so the pair stays apart, with a note."""
    m, x = blocks(), torch.randn(2, 64, 8, 8)
    o = opt(m, x, "int8", records("int8", 8.0), pdl=True)
    assert {"0.conv3", "1.conv1"} <= set(fused(o)) and fused(o)["0.conv3"].b2b == 0
    notes = {lp.name: lp for lp in o.plan}["0.conv3"].notes
    assert any("not back to back with 1.conv1" in n and "PDL" in n for n in notes), notes
    assert opt(m, x, "int8", records("int8", 8.0))  # (plain launches: the pair, above)


def test_a_layer_that_runs_a_back_to_back_conv_refuses_what_it_cannot() -> None:
    m, x = blocks(), torch.randn(2, 64, 8, 8)
    o = opt(m, x, "int8", records("int8", None))
    f = fused(o)
    with pytest.raises(ValueError, match="no 1x1 layer over"):
        f["0.conv3"].take_b2b(f["1.conv2"], SCHEDULE, "test")  # a 3x3 layer
    with pytest.raises(ValueError, match="set_scales first|back-to-back scale"):
        f["0.conv1"].set_b2b_scale(0.1)


def test_a_plan_tunes_the_pairs_deploy_runs_back_to_back() -> None:
    """`tctune plan --b2b` (api.plan.fused_layers) and the rewrite agree on the pairs: given
    a record of every planned layer (the runtime's default schedule; each pair faster than
    its two layers), deploy runs exactly the planned pairs back to back."""
    from api.plan import load_module_model
    from kernels.build import Epilogue
    from kernels.runtime import default_schedule

    h100 = get_target("h100")
    spec, shape = "tests.deploy_nets:small_resnet", (2, 3, 32, 32)
    layers = load_module_model(spec, shape, "int8", "h100", b2b=True)
    pairs = {la.name: la.shape for la in layers if la.shape.b2b}
    assert set(pairs) == {"layer1.1.conv2+layer2.0.conv1",
                          "layer2.0.conv3+layer2.1.conv1"}, set(pairs)
    assert pairs["layer2.0.conv3+layer2.1.conv1"].concat  # the layer over two inputs, + b2b
    assert pairs["layer1.1.conv2+layer2.0.conv1"].residual
    assert not any(la.shape.b2b for la in load_module_model(spec, shape, "int8", "h100"))
    recs = {}
    for la in layers:
        sched, _ = default_schedule(la.shape, Precision.INT8, h100,
                                    Epilogue(residual=la.shape.residual, b2b=la.shape.b2b))
        recs[task_key(la.shape, Precision.INT8, h100)] = {
            "schedule": sched, "latency_us": 1.0 if la.shape.b2b else 5.0}
    from tests.deploy_nets import small_resnet

    torch.manual_seed(22)
    m = small_resnet()
    o = opt(m, torch.randn(*shape), "int8", recs)
    ran = {f"{lp.name}+{lp.back_to_back}" for lp in o.plan
           if lp.back_to_back and fused(o).get(lp.name) is not None}
    assert ran == set(pairs)
