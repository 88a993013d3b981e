"""bench/kernels_check.py's plan without a GPU: the T4's code paths (PTX, as the A100's) and the
H100's draw layers over two inputs too, each with a schedule that layer can run."""

from __future__ import annotations

import pytest

from bench import kernels_check
from kernels.space import concat_problems
from kernels.spec import ConvShape, Precision


@pytest.mark.parametrize("target,ptx", [("t4", True), ("h100", False)])
def test_the_plan_draws_layers_over_two_inputs(target: str, ptx: bool) -> None:
    items = kernels_check.plan(60, seed=41, target_name=target, ptx=ptx)
    two = [it for it in items if it["shape"].get("concat")]
    assert {it["precision"] for it in two} == {"int8", "fp16"}
    assert {ConvShape.from_dict(it["shape"]).stride for it in two} == {(1, 1), (2, 2)}
    for it in two:
        shape, p = ConvShape.from_dict(it["shape"]), Precision(it["precision"])
        assert concat_problems(shape, p, it["sm"], it["schedule"]) is None
    assert all(it["ptx"] is ptx for it in items)
