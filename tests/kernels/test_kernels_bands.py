"""Row-band signals (kernels.build.Epilogue's `bands`, kernels/epilogue.cuh: signal_bands): a
conv whose blocks add what they wrote to a counter per band of output rows, so that the
max-pool after it (kernels/pool.cu's band mode) pools each of its rows as soon as the rows
under its window are written. On a CPU: the rule (kernels.space and the kernel's
static_assert agree), the epilogue's checks, the builds for sm_75 / sm_80 / sm_90 with their
one release reduction. On a GPU: conv and band-mode pool give the plain conv's output pooled
by PyTorch, eagerly and replayed from a CUDA graph, with and without PDL, and leave the
counters at zero."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kernels import reference as ref
from kernels.build import BuildJob, Epilogue, defines
from kernels.runtime import Conv2d, schedule_fits
from kernels.space import bands_problems
from kernels.spec import ConvShape, Precision, get_target
from tests.kernels.builds import sass_of
from tests.kernels.test_runtime import chain_outputs, on_gpu

STEM = ConvShape(2, 64, 62, 3, 64, 7, 7, stride=2, pad=3)  # 32 x 31 out: rows split by tiles
WIDE = ConvShape(3, 18, 20, 16, 64, 3, 3, pad=1)  # column tiles of 16 and 32 channels
POOL = (3, 2, 1, 1)  # a ResNet stem's max-pool: window, stride, padding, dilation
SYNC = dict(BLK_ROW_WARPS=2, BLK_COL_WARPS=1, WARP_ROW_TILES=2, WARP_COL_TILES=4, CHUNK=1,
            REORDER_INNER=0, DUP_AWARE=0, PACK_OUT=1, LAYOUT="nhwc", STAGES=2, SPLIT_K=1)
WG = {**SYNC, "BLK_ROW_WARPS": 1, "WARP_ROW_TILES": 1, "WARP_COL_TILES": 1, "STAGES": 4,
      "MMA": "wgmma"}
CASES = [(STEM, {**SYNC, "FOLD_TAPS": 1}), (STEM, {**WG, "FOLD_TAPS": 1}),
         (WIDE, {**SYNC, "WARP_COL_TILES": 2}), (WIDE, {**WG, "CHUNK": 2})]


def _bands(shape: ConvShape) -> tuple[int, int, int, int, int]:
    k, s, p, d = POOL
    return (k, s, p, d, (shape.p + 2 * p - d * (k - 1) - 1) // s + 1)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bands")


def test_the_rule_names_what_a_band_signal_cannot_follow() -> None:
    p = Precision.INT8
    assert bands_problems(p, {**WG, "FOLD_TAPS": 1}) is None
    for bad, word in (({"PERSIST": 1}, "PERSIST"), ({"SPLIT_K": 2}, "SPLIT_K"),
                      ({"HALO": 1}, "HALO"), ({"LAYOUT": "nhwcnc"}, "LAYOUT"),
                      ({"PACK_OUT": 2, "TMA": 1}, "PACK_OUT")):
        assert word in bands_problems(p, {**WG, **bad})
    assert "back-to-back" in bands_problems(p, WG, b2b=64)
    epi = Epilogue(relu=True, bands=_bands(STEM))
    h100 = get_target("h100")
    assert schedule_fits(STEM, p, h100, {**WG, "FOLD_TAPS": 1}, epi) is None
    assert "SPLIT_K" in schedule_fits(WIDE, p, h100, {**WG, "SPLIT_K": 2}, epi)
    # the build refuses what the kernel's static_assert would
    with pytest.raises(ValueError, match="SPLIT_K"):
        defines(BuildJob(WIDE, p, 90, {**WG, "SPLIT_K": 2}, epi))


def test_the_epilogue_checks_its_bands() -> None:
    assert Epilogue(bands=(3, 2, 1, 1, 16)).resolved(Precision.FP16).bands == (3, 2, 1, 1, 16)
    for bad in ((3, 2, 1, 1), (0, 2, 1, 1, 16), (3, 2, -1, 1, 16), (3, 0, 1, 1, 16)):
        with pytest.raises(ValueError, match="bands"):
            Epilogue(bands=bad).resolved(Precision.INT8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="accumulators"):
        Epilogue("acc", bands=(3, 2, 1, 1, 16)).resolved(Precision.INT8)
    d = defines(BuildJob(STEM, Precision.INT8, 90, {**WG, "FOLD_TAPS": 1},
                         Epilogue(bands=(3, 2, 1, 1, 16))))
    assert (d["TC_BANDS"], d["TC_BAND_ROWS"], d["TC_BAND_STRIDE"], d["TC_BAND_PAD"],
            d["TC_BAND_DIL"], d["TC_BAND_OUT"]) == (1, 3, 2, 1, 1, 16)
    assert "TC_BANDS" not in defines(BuildJob(STEM, Precision.INT8, 90, {**WG, "FOLD_TAPS": 1}))


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_band_builds_compile_for_every_sm_with_one_release_reduction(precision: str,
                                                                     sass_tools: None,
                                                                     cache: Path) -> None:
    """The signal is one `red.release.gpu` (SASS RED) per (row, band) pair of the block's
    tile, by one thread; the build without bands has none."""
    for shape, sched in CASES:
        for sm in (75, 80, 90) if sched.get("MMA") != "wgmma" else (90,):
            for bands in (_bands(shape), None):
                job = BuildJob(shape, Precision(precision), sm, sched,
                               Epilogue(relu=True, bands=bands))
                summary = sass_of(job, cache)
                assert not summary.spills
                reds = [ln for ln in summary.text.splitlines() if re.search(r"\bREDG?\.", ln)]
                assert bool(reds) == (bands is not None), (shape.key(), sm, sched)


def _problem_tensors(op: Conv2d, seed: int) -> tuple[object, ...]:
    import torch

    prob = ref.make_problem(op.shape, op.precision, seed)
    x = ref.pad_channels(prob.x, op.padded_channels)
    w = ref.pad_channels(prob.w, op.padded_channels)
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in
                 (op.to_input_layout(x), w.reshape(op.weight_shape), prob.scale, prob.bias))


def _check_case(shape: ConvShape, sched: dict, precision: str, seed: int, cache: Path) -> None:
    import torch
    import torch.nn.functional as F

    from kernels.pool import MaxPool2d, PoolShape

    fp16 = precision == "fp16"
    plain = Conv2d(shape, precision, sched, "h100", relu=True, cache_dir=cache)
    x, w, sc, b = _problem_tensors(plain, seed)
    scale = None if fp16 else sc
    y0 = plain(x, w, scale, b)
    k, s, p, d = POOL
    want = F.max_pool2d(y0.permute(0, 3, 1, 2).float(), k, s, p, d)
    assert len(torch.unique(want)) > 32
    ps = PoolShape.of((shape.n, shape.k, shape.p, shape.q), k, s, p, d, fp16, bands=True)
    counters = torch.zeros(shape.n * ps.out_hw[0], dtype=torch.int32, device="cuda")
    y = torch.empty(plain.output_shape, dtype=y0.dtype, device="cuda")
    pooled = torch.empty(want.shape, dtype=y0.dtype, device="cuda").contiguous(
        memory_format=torch.channels_last)
    for pdl in (False, True):
        op = Conv2d(shape, precision, sched, "h100", pdl=pdl, cache_dir=cache,
                    epilogue=Epilogue(relu=True, bands=ps.band_signal))
        assert op.band_rows == counters.numel()
        pool = MaxPool2d(ps, 90, pdl, cache)

        def chain(op: Conv2d = op, pool: MaxPool2d = pool) -> None:
            op(x, w, scale, b, out=y, bands=counters)
            pooled.copy_(pool(y.permute(0, 3, 1, 2), counters))

        for graph in (False, True):
            got = chain_outputs(chain, [pooled], graph)[0]
            assert np.array_equal(got.astype(np.float32), want.cpu().numpy()), \
                (shape.key(), sched, pdl, graph)
            assert not counters.any()
    with pytest.raises(ValueError, match="bands"):
        op(x, w, scale, b)
    with pytest.raises(ValueError, match="bands"):
        plain(x, w, scale, b, bands=counters)


@on_gpu
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_on_gpu_conv_then_band_pool_is_the_conv_pooled(precision: str, cache: Path) -> None:
    """Each case's conv with bands and the band-mode pool after it, launched plainly and with
    PDL (the pool then starts while the conv runs), give exactly the plain conv's output
    max-pooled by PyTorch, eagerly and replayed from a CUDA graph three times, every output
    poisoned before each run; the counters end at zero."""
    for i, (shape, sched) in enumerate(CASES):
        _check_case(shape, sched, precision, 11 + i, cache)
