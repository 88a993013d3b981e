"""tctune's pooling kernels (kernels/pool.py): the max-pool (pool.cu), its shapes against
PyTorch's, the shapes it refuses, builds for every sm (CPU, NVRTC), and on a GPU its results
against PyTorch's max-pool, exactly; the global average pool (avg_pool.cu), the same, and on
a GPU its results against the float32 mean rounded to fp16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels.pool import (
    GlobalAvgPool,
    GlobalPoolShape,
    MaxPool2d,
    PoolShape,
    avg_pool_defines,
    compile_pool,
    pool_defines,
)
from kernels.sass import loads_before_first_use, summarize
from kernels.small_kernel import build_small, compile_small
from tests.kernels.builds import small_kernel_builds

CASES = [(3, 2, 1, 1), (2, 2, 0, 1), (3, 1, 1, 1), ((3, 2), (2, 1), (1, 0), 1), (3, 2, 1, 2),
         (5, 3, 2, 1), (3, None, 1, 1)]


@pytest.mark.parametrize("k,s,p,d", CASES)
def test_output_size_is_pytorchs(k: object, s: object, p: object, d: object) -> None:
    x = torch.zeros(2, 16, 13, 11)
    ps = PoolShape.of(tuple(x.shape), k, s, p, d, fp16=False)
    want = F.max_pool2d(x, k, s if s is not None else k, p, d).shape
    assert (ps.n, ps.c, *ps.out_hw) == tuple(want)
    assert ps.problems() is None


def test_shapes_the_kernel_cannot_run_are_refused_with_the_reason() -> None:
    assert "16-byte" in PoolShape.of((1, 8, 8, 8), 3, 2, 1, 1, fp16=False).problems()
    assert PoolShape.of((1, 8, 8, 8), 3, 2, 1, 1, fp16=True).problems() is None
    assert "half" in PoolShape.of((1, 16, 8, 8), 3, 2, 2, 1, fp16=False).problems()
    assert "larger" in PoolShape.of((1, 16, 2, 2), 5, 1, 0, 1, fp16=False).problems()
    with pytest.raises(ValueError, match="16-byte"):
        MaxPool2d(PoolShape.of((1, 24, 8, 8), 3, 2, 1, 1, fp16=False), 90)
    with pytest.raises(ValueError, match="sm_90"):
        MaxPool2d(PoolShape.of((1, 16, 8, 8), 3, 2, 1, 1, fp16=False), 80, pdl=True)


@pytest.mark.parametrize("fp16", [False, True])
def test_the_kernel_builds_for_every_sm_and_is_cached(fp16: bool, tmp_path: Path) -> None:
    shape = PoolShape.of((8, 64, 112, 112), 3, 2, 1, 1, fp16)
    for sm in (75, 80, 90):
        image, log = compile_pool(shape, sm)
        assert image is not None, log
    for sm in (75, 80):  # the T4's and A100's paths as PTX (run on the GPU test below)
        assert compile_pool(shape, sm, ptx=True)[0] is not None
        ptx = build_small("pool.cu", pool_defines(shape), sm, tmp_path, ptx=True)
        assert ptx.suffix == ".ptx" and f".target sm_{sm}" in ptx.read_text()
    path = build_small("pool.cu", pool_defines(shape), 90, tmp_path)
    mtime = path.stat().st_mtime_ns
    assert build_small("pool.cu", pool_defines(shape), 90, tmp_path) == path
    assert path.stat().st_mtime_ns == mtime
    other = PoolShape.of((8, 64, 112, 112), 3, 1, 1, 1, fp16)
    assert build_small("pool.cu", pool_defines(other), 90, tmp_path) != path


@pytest.mark.parametrize("fp16", [False, True])
def test_a_window_s_loads_share_one_memory_round_trip(fp16: bool, sass_tools: None) -> None:
    """ResNet's 3x3 max-pool issues 7-9 of its window's 9 loads before it first uses one, on
    every sm: a thread waits one memory round trip, not one a window row (3 loads)."""
    shape = PoolShape.of((8, 64, 112, 112), 3, 2, 1, 1, fp16)
    for sm in (75, 80, 90):
        image, log = compile_pool(shape, sm)
        assert image is not None, log
        assert loads_before_first_use(summarize(image).text) >= 7, sm


def _gpu() -> bool:
    from tests.conftest import has_gpu

    return has_gpu()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.int8, torch.float16])
def test_the_kernel_is_pytorchs_max_pool_on_the_gpu(dtype: torch.dtype, tmp_path: Path) -> None:
    builds = small_kernel_builds()
    g = torch.Generator(device="cuda").manual_seed(3)
    for c in (16, 64):
        x = torch.randint(-128, 128, (3, c, 17, 15), device="cuda", generator=g).to(dtype)
        if dtype is torch.float16:
            x[0, 1, 4, 4] = float("nan")  # propagates, as PyTorch's does
        x = x.contiguous(memory_format=torch.channels_last)
        for k, s, p, d in CASES:
            ps = PoolShape.of(tuple(x.shape), k, s, p, d, dtype is torch.float16)
            if ps.problems():
                continue
            for b_sm, pdl, ptx in builds:
                y = MaxPool2d(ps, b_sm, pdl, tmp_path, ptx)(x)
                want = F.max_pool2d(x.float(), k, s if s is not None else k, p, d)
                assert y.dtype is dtype and y.is_contiguous(memory_format=torch.channels_last)
                assert torch.equal(y.float().nan_to_num(7.5), want.nan_to_num(7.5)), \
                    (c, k, s, p, b_sm, ptx)


def test_average_pools_the_kernel_cannot_run_are_refused_with_the_reason() -> None:
    assert GlobalPoolShape(8, 7, 7, 2048, fp16=False).problems() is None
    assert "16-byte" in GlobalPoolShape(8, 7, 7, 24, fp16=False).problems()
    assert GlobalPoolShape(8, 7, 7, 24, fp16=True).problems() is None
    assert "pixels" in GlobalPoolShape(1, 512, 256, 16, fp16=False).problems()
    with pytest.raises(ValueError, match="16-byte"):
        GlobalAvgPool(GlobalPoolShape(1, 8, 8, 8, fp16=False), 90)


@pytest.mark.parametrize("fp16", [False, True])
def test_the_average_pool_builds_for_every_sm(fp16: bool) -> None:
    shape = GlobalPoolShape(8, 7, 7, 2048, fp16)
    for sm in (75, 80, 90):
        assert compile_small("avg_pool.cu", avg_pool_defines(shape), sm)[0] is not None
    for sm in (75, 80):  # the T4's and A100's paths as PTX (run on the GPU test below)
        assert compile_small("avg_pool.cu", avg_pool_defines(shape), sm, ptx=True)[0] is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.int8, torch.float16])
def test_the_average_pool_is_the_float32_mean_on_the_gpu(dtype: torch.dtype,
                                                         tmp_path: Path) -> None:
    """int8 sums are exact, so int8 is the float32 mean times the scale rounded once to fp16
    (within an fp16 ulp: float32's own sum order differs); fp16 sums in float32 too."""
    builds = small_kernel_builds()
    sm = builds[0][0]  # this GPU's
    g = torch.Generator(device="cuda").manual_seed(5)
    int8 = dtype is torch.int8
    # ResNet-50's head; channels over one block's 8 vectors and not a multiple of them; a
    # pixel count below the block's 32 thread groups; one image
    for n, c, h, w in ((8, 2048, 7, 7), (3, 784, 5, 3), (1, 16, 2, 1), (2, 512, 13, 11)):
        if int8:
            x = torch.randint(-128, 128, (n, c, h, w), device="cuda", generator=g).to(dtype)
        else:
            x = torch.randn(n, c, h, w, device="cuda", generator=g).to(dtype) * 4
        x = x.contiguous(memory_format=torch.channels_last)
        scale = 0.0371 if int8 else None
        want = x.double().mean((2, 3)) * (scale or 1.0)
        shape = GlobalPoolShape(n, h, w, c, not int8)
        for b_sm, pdl, ptx in builds:
            y = GlobalAvgPool(shape, b_sm, pdl, tmp_path, ptx)(x, scale)
            assert y.dtype == torch.float16 and y.shape == (n, c)
            assert torch.allclose(y.double(), want, rtol=2 ** -10, atol=2 ** -24), \
                (n, c, h, w, b_sm, ptx)
    with pytest.raises(ValueError, match="int8 takes a positive scale"):  # and fp16 none
        GlobalAvgPool(GlobalPoolShape(1, 2, 2, 16, not int8), sm, False, tmp_path)(
            x[:1, :16, :2, :2].contiguous(memory_format=torch.channels_last),
            None if int8 else 0.5)
