"""tctune's max-pool kernel (kernels/pool.py, pool.cu): its shapes against PyTorch's, the
shapes it refuses, builds for every sm (CPU, NVRTC), and on a GPU its results against
PyTorch's max-pool, exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels.pool import MaxPool2d, PoolShape, compile_pool, pool_defines
from kernels.small_kernel import build_small

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


def _gpu() -> bool:
    from tests.conftest import has_gpu

    return has_gpu()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.int8, torch.float16])
def test_the_kernel_is_pytorchs_max_pool_on_the_gpu(dtype: torch.dtype, tmp_path: Path) -> None:
    from kernels.launch import supports_pdl

    sm = torch.cuda.get_device_capability()[0] * 10 + torch.cuda.get_device_capability()[1]
    sm = 90 if sm >= 90 else 80 if sm >= 80 else 75
    # this GPU's build, with and without PDL, and the older targets' paths as PTX (the T4's
    # and A100's code, which the driver compiles for this GPU)
    builds = [(sm, False, False)] + [(sm, True, False)] * supports_pdl(sm) + \
        [(t, False, True) for t in (75, 80) if t < sm]
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
