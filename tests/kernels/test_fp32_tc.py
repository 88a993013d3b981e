"""fp32_tc on the CPU: the per-tensor scaling and hi/lo split reproduce FP32 accuracy (random
data and range extremes), the three SPLIT combinations recover FP32-level dot products, the
check's bound, and every SPLIT variant compiles for sm_75/80/90 to HMMA code without spills."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernels.build import BuildJob, build, build_many, cubin_path
from kernels.reference import (
    FP32_U,
    check_output,
    conv_ref,
    fp32_tc_amax,
    fp32_tc_elem_tol,
    fp32_tc_exponent,
    fp32_tc_reconstruct,
    fp32_tc_rel_tol,
    fp32_tc_split,
    from_device_output,
    make_problem,
    to_device_bytes,
)
from kernels.sass import summarize
from kernels.space import ScheduleSpace, channel_vector, geometry, padded_channels
from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target

P = Precision.FP32_TC
SPLITS = ("scaled3", "binomial4", "karatsuba")
SM_TARGET = {75: "t4", 80: "a100", 90: "h100"}
BASE = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=2, WARP_ROW_TILES=2, WARP_COL_TILES=2, CHUNK=2,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1)
SPLIT_RES = 2.0**-22  # the split keeps 22 significant bits: |hi + lo*2^-11 - x| <= 2^-22 |x|

# Fails (does not skip) without cuobjdump: .ci/run installs it with the dev extra.
needs_sass = pytest.mark.usefixtures("sass_tools")


def roundtrip(t: np.ndarray) -> np.ndarray:
    e = fp32_tc_exponent(float(np.abs(t).max(initial=0.0)))
    hi, lo = fp32_tc_split(t, e)
    assert np.all(np.isfinite(hi.astype(np.float64))) and np.all(np.isfinite(lo))
    return fp32_tc_reconstruct(hi, lo, e)


# ---- the split --------------------------------------------------------------------------
def test_exponent_puts_the_maximum_in_2_13_to_2_14() -> None:
    for amax in (1.0, 0.999, 1e6, 1e-6, 3.4e38, 1.2e-38, 1e-40, 1e-45, 65504.0, 7.0):
        e = fp32_tc_exponent(amax)
        assert 2.0**13 <= np.ldexp(amax, e) < 2.0**14, (amax, e)
    assert fp32_tc_exponent(0.0) == 0
    assert fp32_tc_exponent(float("inf")) == 0 and fp32_tc_exponent(float("nan")) == 0


@pytest.mark.parametrize("lo,hi", [(-1, 1), (0, 1), (-4, 4), (-1e6, 1e6), (1e-6, 2e-6),
                                   (-3e38, 3e38)])
def test_split_reproduces_fp32_accuracy_on_random_data(lo: float, hi: float) -> None:
    rng = np.random.default_rng(0)
    t = rng.uniform(lo, hi, 200_000).astype(np.float32)
    back = roundtrip(t)
    rel = np.abs(back - t.astype(np.float64)) / np.abs(t.astype(np.float64))
    # Every element within 2^-22 (22 bits; float32 rounding is 2^-24) ...
    assert rel.max() <= SPLIT_RES
    # ... and on average at float32's own level: the RMS error of the split is below one
    # float32 rounding of the same values (u/sqrt(3) for uniform rounding errors).
    assert np.sqrt(np.mean(rel**2)) <= FP32_U


def test_split_at_the_range_extremes() -> None:
    f32 = np.float32
    tiny = np.finfo(np.float32).tiny  # 2^-126, the smallest normal float32
    cases = {
        "1e6 and negatives": np.array([1e6, -1e6, 999_999.94, -3.5e5, 12345.678], f32),
        "1e-6 and negatives": np.array([1e-6, -1e-6, 1.2345678e-6, -9.99e-7, 3e-7], f32),
        "float32 max": np.array([3.4028235e38, -1e38, 2.5e37], f32),
        "around float32's smallest normal": np.array(
            [tiny, -tiny, np.nextafter(tiny, f32(1)), np.nextafter(tiny, f32(0)), 3 * tiny],
            f32),
        "float32 subnormals": np.array([1e-45, 3e-44, -7.1e-42, 1e-40], f32),
        "with zeros": np.array([0.0, -0.0, 1.5, 0.0, -2.25], f32),
        "all zeros": np.zeros(5, f32),
    }
    for name, t in cases.items():
        back = roundtrip(t)
        err = np.abs(back - t.astype(np.float64))
        assert np.all(err <= SPLIT_RES * np.abs(t.astype(np.float64))), (name, t, back)
    # Values 2^-28 of the tensor's maximum or more keep 22 bits; far below that the lo part
    # (then hi) leaves fp16's normal range and the absolute error stays below 2^-36 of the
    # scaled unit: negligible next to the maximum's products in any dot product.
    t = np.array([1e6, 1e-6, -3e-3, 1.0, 0.0], f32)
    e = fp32_tc_exponent(1e6)
    back = roundtrip(t)
    err = np.abs(back - t.astype(np.float64))
    assert np.all(err <= SPLIT_RES * np.abs(t) + np.ldexp(2.0**-36, -e))
    assert err[0] <= SPLIT_RES * 1e6 and err[3] <= SPLIT_RES


def test_split_matches_the_kernel_formula() -> None:
    # hi rounds to nearest; lo is exactly (x - hi) * 2^11 rounded once: nothing else rounds.
    t = np.array([1.0 + 2.0**-23, 1.0 / 3.0, -0.1, 8191.999], np.float32)
    e = fp32_tc_exponent(float(np.abs(t).max()))
    hi, lo = fp32_tc_split(t, e)
    ts = np.ldexp(t.astype(np.float64), e)
    assert np.array_equal(hi, ts.astype(np.float16))
    assert np.array_equal(lo, ((ts - hi.astype(np.float64)) * 2048).astype(np.float16))


# ---- the three products, emulated with exact products (what the Tensor Core computes) ----
def emulate_dot(a: np.ndarray, b: np.ndarray, split: str) -> np.ndarray:
    """Rows of a (M x K) dotted with rows of b (N x K) as the kernel combines the parts:
    hi*hi summed per k-step of 16 outside the accumulator (round to nearest), corrections
    chained in float32."""
    ea, eb = fp32_tc_exponent(float(np.abs(a).max())), fp32_tc_exponent(float(np.abs(b).max()))
    ah, al = (v.astype(np.float64) for v in fp32_tc_split(a, ea))
    bh, bl = (v.astype(np.float64) for v in fp32_tc_split(b, eb))
    f32 = np.float32
    h = np.zeros((a.shape[0], b.shape[0]), f32)
    c2 = np.zeros_like(h)
    c3 = np.zeros_like(h)
    if split == "karatsuba":
        as_ = (ah + al).astype(np.float16).astype(np.float64)
        bs = (bh + bl).astype(np.float16).astype(np.float64)
    if split == "binomial4":
        bq = (bl * 2.0**-11).astype(np.float16).astype(np.float64)
    for k0 in range(0, a.shape[1], 16):
        s = slice(k0, k0 + 16)
        h = (h + (ah[:, s] @ bh[:, s].T).astype(f32)).astype(f32)
        if split == "karatsuba":
            c2 = (c2 + as_[:, s] @ bs[:, s].T).astype(f32)
            c3 = (c3 + al[:, s] @ bl[:, s].T).astype(f32)
        else:
            c = ah[:, s] @ bl[:, s].T + al[:, s] @ bh[:, s].T
            if split == "binomial4":
                c = c + al[:, s] @ bq[:, s].T
            c2 = (c2 + c).astype(f32)
    h64 = h.astype(np.float64)
    if split == "karatsuba":
        d = (c2 - h) - c3
        y = h64 + d.astype(np.float64) * 2.0**-11 + c3.astype(np.float64) * 2.0**-22
    else:
        y = h64 + c2.astype(np.float64) * 2.0**-11
    return np.ldexp(y.astype(f32).astype(np.float64), -(ea + eb))


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("scale", [1.0, 1e6, 1e-6])
def test_split_products_reach_fp32_level_dot_products(split: str, scale: float) -> None:
    rng = np.random.default_rng(3)
    k = 1152
    a = (rng.uniform(-1, 1, (64, k)) * scale).astype(np.float32)
    b = (rng.uniform(-1, 1, (16, k)) * scale).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    y = emulate_dot(a, b, split)
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel <= fp32_tc_rel_tol(k), (split, scale, rel)
    if scale == 1.0:  # only the hi parts (plain fp16): orders of magnitude worse
        f16 = a.astype(np.float16).astype(np.float64) @ b.astype(np.float16).astype(np.float64).T
        assert np.linalg.norm(f16 - ref) / np.linalg.norm(ref) > 100 * rel


# ---- the check ------------------------------------------------------------------------
def sequential_fp32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """FFMA order: one product at a time, exact product, one rounding per step."""
    acc = np.zeros((a.shape[0], b.shape[0]), np.float32)
    for i in range(a.shape[1]):
        acc = (acc + np.outer(a[:, i].astype(np.float64), b[:, i].astype(np.float64))
               ).astype(np.float32)
    return acc.astype(np.float64)


def test_check_bound_is_twice_the_fp32_model() -> None:
    rng = np.random.default_rng(5)
    for k in (64, 256, 1024):
        a = rng.uniform(-1, 1, (300, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (16, k)).astype(np.float32)
        ref = a.astype(np.float64) @ b.astype(np.float64).T
        rel = np.linalg.norm(sequential_fp32(a, b) - ref) / np.linalg.norm(ref)
        model = 0.3 * FP32_U * np.sqrt(k)
        assert 0.75 * model <= rel <= 1.33 * model, (k, rel, model)
        assert rel <= fp32_tc_rel_tol(k) / 2 * 1.33  # FP32 itself passes with room to spare


def test_check_accepts_fp32_results_and_rejects_fp16_level_and_holes() -> None:
    shape = ConvShape(2, 6, 6, 16, 8, 3, 3, pad=1)
    prob = make_problem(shape, P)
    assert prob.scale.dtype == np.float32 and prob.scale.shape == (2,)
    assert prob.abs_acc is not None
    want = prob.expected("bias", False)
    kw = {"gemm_k": shape.gemm_k, "abs_ref": prob.abs_acc + np.abs(prob.bias)}
    good = want.astype(np.float32).astype(np.float64)
    assert check_output(good, want, P, 32, **kw)[0]
    xh = prob.x.astype(np.float16).astype(np.float32)
    wh = prob.w.astype(np.float16).astype(np.float32)
    fp16_level = conv_ref(xh, wh, shape, P) + prob.bias
    ok, stats = check_output(fp16_level, want, P, 32, **kw)
    assert not ok and stats["rel_err"] > 10 * stats["rel_tol"]
    hole = good.copy()
    hole[1, 2, 3, 4] = 0.0  # one unwritten output
    ok, stats = check_output(hole, want, P, 32, **kw)
    assert not ok and stats["bad_elements"] == 1
    assert not check_output(good * np.nan, want, P, 32, **kw)[0]
    assert fp32_tc_elem_tol(576) < 1e-4


def test_device_images_and_output_roundtrip() -> None:
    shape = ConvShape(8, 3, 3, 6, 8, 1, 1)
    assert channel_vector(P) == 4 and padded_channels(shape, P) == 8
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 3, 3, 8)).astype(np.float32)
    for layout in ("nhwc", "nhwcnc"):
        b = to_device_bytes(x, P, layout, 4)
        assert b.nbytes == x.nbytes
        y = from_device_output(b, ConvShape(8, 3, 3, 8, 8, 1, 1), 32, P, layout)
        assert np.array_equal(y, x.astype(np.float64))
    assert np.array_equal(fp32_tc_amax(x, -2 * x), np.abs(x).max() * np.array([1, 2], np.float32))


# ---- space and builds -------------------------------------------------------------------
def test_geometry_counts_two_planes_and_the_accumulator_sets() -> None:
    shape = RESNET50_3X3["stage3"]
    target = get_target("h100")
    cols = {k: np.array([v] * 3, dtype=object if isinstance(v, str) else np.int64)
            for k, v in BASE.items()}
    cols["SPLIT"] = np.array(SPLITS, dtype=object)
    g = geometry(shape, P, target, cols)
    f16 = geometry(shape, Precision.FP16, target, {k: v[:1] for k, v in cols.items()})
    # hi and lo planes: twice fp16's pipeline; PACK_OUT with fp32 out needs no staging.
    assert list(g.smem_bytes) == [2 * int(f16.smem_bytes[0])] * 3
    assert list(g.acc_regs) == [2 * int(f16.acc_regs[0])] * 2 + [3 * int(f16.acc_regs[0])]
    # fp32 in global memory: twice the 16-byte loads of fp16 per stage
    assert list(g.stage_vectors) == [2 * int(f16.stage_vectors[0])] * 3


def test_stages_rule_and_the_staging_ring() -> None:
    shape = RESNET50_3X3["stage3"]
    s3 = {**BASE, "STAGES": 3, "SPLIT": "scaled3"}
    # sm_75 has no cp.async: the register-staged split is double-buffered at most ...
    assert not ScheduleSpace(shape, P, get_target("t4")).is_valid(s3)
    # ... sm_80+ runs STAGES=3 as a cp.async ring of fp32 stages + two hi/lo plane buffers.
    assert ScheduleSpace(shape, P, get_target("h100")).is_valid(s3)
    target = get_target("h100")
    cols = {k: np.array([v, v], dtype=object if isinstance(v, str) else np.int64)
            for k, v in s3.items()}
    cols["STAGES"] = np.array([2, 3])
    g = geometry(shape, P, target, cols)
    assert int(g.smem_bytes[1]) == 5 * int(g.smem_bytes[0]) // 2


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp32tc_cubins")


HMMA = {75: "HMMA.1688.F32", 80: "HMMA.16816.F32", 90: "HMMA.16816.F32"}


@needs_sass
@pytest.mark.parametrize("sm", [75, 80, 90])
def test_every_split_compiles_to_hmma_without_spills(sm: int, cache: Path) -> None:
    shape = RESNET50_3X3["stage3"]
    jobs = [BuildJob(shape, P, sm, {**BASE, "SPLIT": s}) for s in SPLITS]
    # ... and with the other code paths: split-K + staged epilogue, duplicate-aware loads.
    jobs.append(BuildJob(shape, P, sm, {**BASE, "SPLIT": "scaled3", "SPLIT_K": 2,
                                        "PACK_OUT": 0}))
    jobs.append(BuildJob(shape, P, sm, {**BASE, "SPLIT": "karatsuba", "DUP_AWARE": 1,
                                        "REORDER_INNER": 1, "WARP_COL_TILES": 1}))
    if sm >= 80:  # the cp.async staging ring
        jobs.append(BuildJob(shape, P, sm, {**BASE, "SPLIT": "binomial4", "STAGES": 3}))
        jobs.append(BuildJob(shape, P, sm, {**BASE, "SPLIT": "scaled3", "STAGES": 3,
                                            "DUP_AWARE": 1, "WARP_COL_TILES": 1}))
    for job, res in zip(jobs, build_many(jobs, cache), strict=True):
        assert res.status == "ok", res.log[-2000:]
        s = summarize(cubin_path(cache, res.key))
        assert s.mma == [HMMA[sm]], (job.schedule, s.mma)
        assert not s.spills and s.stack == 0, (job.schedule, s.registers, s.stack)


@pytest.mark.parametrize("sm", [75, 80, 90])
def test_sampled_valid_schedules_compile(sm: int, cache: Path) -> None:
    """A few random valid schedules per SPLIT and sm, over shapes with tails and odd channel
    counts: is_valid and the compiler agree (the kernel static_asserts its shared memory)."""
    rng = np.random.default_rng(sm)
    shapes = [RESNET50_3X3["stage4"], ConvShape(2, 32, 32, 3, 64, 7, 7, stride=2, pad=3),
              ConvShape(3, 13, 11, 48, 40, 3, 3, stride=2, pad=1)]
    target = get_target(SM_TARGET[sm])
    jobs = []
    for i, split in enumerate(SPLITS * 2):
        shape = shapes[i % len(shapes)]
        space = ScheduleSpace(shape, P, target, restrict={"SPLIT": [split]})
        jobs.append(BuildJob(shape, P, sm, space.schedule_at(int(rng.choice(
            space.valid_indices)))))
    bad = [(j.shape.key(), j.schedule, r.log[-500:])
           for j, r in zip(jobs, build_many(jobs, cache), strict=True) if r.status != "ok"]
    assert not bad, bad


def test_stages_rule_is_what_the_kernel_asserts(cache: Path) -> None:
    res = build(BuildJob(RESNET50_3X3["stage3"], P, 75, {**BASE, "STAGES": 3,
                                                         "SPLIT": "binomial4"}), cache)
    assert res.status == "compile_error" and "double-buffered" in res.log
