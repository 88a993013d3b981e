"""kernels.reference: the reference conv against the definition, layouts, int4, epilogue."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.reference import (
    conv_naive,
    conv_ref,
    from_device_output,
    make_problem,
    nhwc_to_nhwcnc,
    nhwcnc_to_nhwc,
    pack_int4,
    requantize,
    to_device_bytes,
    unpack_int4,
)
from kernels.spec import ConvShape, Precision

SHAPES = [
    ConvShape(2, 7, 9, 5, 6, 3, 3, stride=(2, 1), pad=(1, 2), dilation=(1, 2)),
    ConvShape(1, 5, 5, 3, 4, 1, 1),
    ConvShape(3, 8, 6, 4, 2, 5, 3, stride=(1, 2), pad=(2, 0), dilation=(2, 1)),
    ConvShape(2, 11, 10, 6, 8, 7, 7, stride=2, pad=3),
    ConvShape(1, 6, 6, 2, 3, 3, 3, stride=3, pad=0, dilation=1),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.key())
@pytest.mark.parametrize("precision", ["int8", "int4", "fp16"])
def test_conv_ref_matches_naive_loop(shape: ConvShape, precision: str) -> None:
    rng = np.random.default_rng(7)
    xs, ws = (shape.n, shape.h, shape.w, shape.c), (shape.k, shape.r, shape.s, shape.c)
    if precision == "fp16":
        x = rng.uniform(-1, 1, xs).astype(np.float16)
        w = rng.uniform(-1, 1, ws).astype(np.float16)
        np.testing.assert_allclose(conv_ref(x, w, shape, precision), conv_naive(x, w, shape),
                                   rtol=1e-12, atol=1e-12)
    else:
        lo, hi = (-128, 127) if precision == "int8" else (-8, 7)
        x = rng.integers(lo, hi + 1, xs, dtype=np.int8)
        w = rng.integers(lo, hi + 1, ws, dtype=np.int8)
        got = conv_ref(x, w, shape, precision)
        assert got.dtype == np.int64
        assert np.array_equal(got, conv_naive(x, w, shape))


def test_conv_ref_int_exact_beyond_float32() -> None:
    # Accumulators past 2**24 are where a float32 reference would round; ours must not.
    shape = ConvShape(1, 3, 3, 1024, 2, 3, 3, pad=1)
    x = np.full((1, 3, 3, 1024), 127, dtype=np.int8)
    w = np.full((2, 3, 3, 1024), -128, dtype=np.int8)
    w[0, 0, 0, 0] = -127
    acc = conv_ref(x, w, shape, "int8")
    assert acc[0, 1, 1, 1] == 9 * 1024 * 127 * -128
    assert acc[0, 1, 1, 0] == 9 * 1024 * 127 * -128 + 127


def test_int4_pack_roundtrip_and_nibble_order() -> None:
    v = np.array([[1, -2, 7, -8]], dtype=np.int8)
    b = pack_int4(v)
    assert b.tolist() == [[0xE1, 0x87]]  # element 2i in the low nibble
    rng = np.random.default_rng(0)
    w = rng.integers(-8, 8, (5, 64))
    assert np.array_equal(unpack_int4(pack_int4(w)), w)


def test_nhwcnc_roundtrip_and_blocking() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(-100, 100, (16, 3, 4, 32))
    b = nhwc_to_nhwcnc(x, 16)
    assert b.shape == (2, 3, 4, 2, 8, 16)
    assert b[1, 2, 3, 1, 5, 7] == x[8 + 5, 2, 3, 16 + 7]
    assert np.array_equal(nhwcnc_to_nhwc(b), x)
    with pytest.raises(ValueError):
        nhwc_to_nhwcnc(x[:3], 16)


def test_requantize_is_float32_mul_then_add_round_half_even() -> None:
    acc = np.array([[3, 5, -3, 1000, -1000, 7]])
    scale = np.full(6, 0.5, dtype=np.float32)
    bias = np.zeros(6, dtype=np.float32)
    assert requantize(acc, scale, bias, 8, relu=False).tolist() == [[2, 2, -2, 127, -128, 4]]
    assert requantize(acc, scale, bias, 4, relu=True).tolist() == [[2, 2, 0, 7, 0, 4]]


@pytest.mark.parametrize("precision,out_bits,layout", [
    ("int8", 8, "nhwc"), ("int8", 32, "nhwcnc"), ("int4", 4, "nhwcnc"), ("int4", 4, "nhwc"),
    ("fp16", 16, "nhwc"), ("fp16", 16, "nhwcnc")])
def test_device_output_roundtrip(precision: str, out_bits: int, layout: str) -> None:
    shape = ConvShape(8, 3, 3, 32, 64, 1, 1)
    rng = np.random.default_rng(2)
    vals = rng.integers(-8, 8, (8, 3, 3, 64))
    if out_bits == 32:
        arr = vals.astype(np.int32)
        if layout == "nhwcnc":
            arr = nhwc_to_nhwcnc(arr, 4)
        buf = arr.view(np.uint8).reshape(-1)
    elif out_bits == 16:
        buf = to_device_bytes(vals.astype(np.float16), Precision.FP16, layout, 8)
    else:
        buf = to_device_bytes(vals, Precision(precision), layout, 128 // out_bits)
    got = from_device_output(buf, shape, out_bits, Precision(precision), layout)
    assert np.array_equal(got, vals)


def test_make_problem_is_seeded_and_not_zero() -> None:
    shape = ConvShape(2, 5, 5, 16, 8, 3, 3, pad=1)
    a, b = make_problem(shape, "int8"), make_problem(shape, "int8")
    assert np.array_equal(a.x, b.x) and np.array_equal(a.acc, b.acc)
    assert np.count_nonzero(a.x) > 0.9 * a.x.size
    q = a.expected("requant", False)
    assert q.min() >= -128 and q.max() <= 127 and len(np.unique(q)) > 50


@pytest.mark.parametrize(("precision", "mode"), [("int8", "requant"), ("fp16", "bias")])
def test_a_problems_derived_arrays_are_made_once_and_read_only(precision: str, mode: str) -> None:
    """Every candidate of a task is checked against the same expected output and inputs: the
    problem keeps them (read-only, so that no caller can change a later check)."""
    shape = ConvShape(2, 6, 6, 16, 8, 3, 3, pad=1)
    prob, fresh = make_problem(shape, precision), make_problem(shape, precision)
    held = prob.nbytes
    want = prob.expected(mode, True)
    assert prob.expected(mode, True) is want and not want.flags.writeable
    assert np.array_equal(want, fresh._expected(mode, True, False))
    assert not np.array_equal(prob.expected(mode, False), want)  # keyed by the epilogue
    xb, wb = prob.device_inputs("nhwc")
    assert prob.device_inputs("nhwc")[0] is xb and not xb.flags.writeable
    assert np.array_equal(xb, fresh.device_inputs("nhwc")[0])
    with pytest.raises(ValueError, match="read-only"):
        want[0] = 0
    assert prob.nbytes == held + 2 * want.nbytes + xb.nbytes + wb.nbytes
