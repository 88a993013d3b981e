"""tctune's fully connected kernel for a few rows (kernels/linear.py, linear.cu): the shapes
it refuses, builds for every sm (CPU, NVRTC), and on a GPU its results against float32
sums, rounded to fp16 or kept in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels.linear import Linear, LinearShape, compile_linear
from tests.kernels.builds import small_kernel_builds


def test_shapes_the_kernel_cannot_run_are_refused_with_the_reason() -> None:
    assert LinearShape(8, 2048, 1000).problems() is None
    assert "rows" in LinearShape(32, 2048, 1000).problems()
    assert "multiple of 8" in LinearShape(8, 2046, 1000).problems()
    assert LinearShape(16, 4096, 1000).problems() is None
    assert "in_features over" in LinearShape(1, 4104, 10).problems()
    with pytest.raises(ValueError, match="rows"):
        Linear(LinearShape(17, 64, 10), 90)
    with pytest.raises(ValueError, match="sm_90"):
        Linear(LinearShape(8, 64, 10), 80, pdl=True)


@pytest.mark.parametrize("shape", [LinearShape(8, 2048, 1000), LinearShape(1, 24, 3, True),
                                   LinearShape(16, 1280, 1000, True)])
def test_the_kernel_builds_for_every_sm(shape: LinearShape) -> None:
    for sm in (75, 80, 90):
        image, log = compile_linear(shape, sm)
        assert image is not None, log
    for sm in (75, 80):  # the T4's and A100's paths as PTX (run on the GPU test below)
        assert compile_linear(shape, sm, ptx=True)[0] is not None


def _gpu() -> bool:
    from tests.conftest import has_gpu

    return has_gpu()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
def test_the_kernel_is_the_float32_sum_on_the_gpu(tmp_path: Path) -> None:
    builds = small_kernel_builds()
    g = torch.Generator(device="cuda").manual_seed(4)
    for rows, c, j in ((8, 2048, 1000), (1, 24, 3), (16, 1280, 1000), (3, 512, 37)):
        x = torch.randn(rows, c, device="cuda", generator=g).half()
        w = (torch.randn(j, c, device="cuda", generator=g) / c ** 0.5).half()
        b = torch.randn(j, device="cuda", generator=g)
        want = (x.double() @ w.double().T + b.double()).float()
        for b_sm, pdl, ptx in builds:
            for fp32 in (False, True):
                y = Linear(LinearShape(rows, c, j, fp32), b_sm, pdl, tmp_path, ptx)(x, w, b)
                assert y.dtype == (torch.float32 if fp32 else torch.float16)
                assert y.shape == (rows, j)
                # fp32 sums (and one fp16 rounding): within an fp16 ulp of the exact value
                assert torch.allclose(y.float(), want, rtol=2 ** -10, atol=2 ** -14), \
                    (rows, c, j, b_sm, ptx, fp32)
