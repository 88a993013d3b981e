"""tctune's input quantize kernel (kernels/quantize.py, quantize.cu): the shapes it refuses,
builds for every sm (CPU, NVRTC), and on a GPU its output against deploy's own quantize
(int8) or cast (fp16) with the zero channels appended, exactly, from either layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels.quantize import QuantizeInput, QuantizeShape, compile_quantize
from kernels.sass import loads_before_first_use, summarize
from tests.kernels.builds import small_kernel_builds


def test_shapes_the_kernel_cannot_run_are_refused_with_the_reason() -> None:
    assert QuantizeShape(8, 3, 224, 224, 4, False, False).problems() is None
    assert QuantizeShape(8, 3, 224, 224, 4, True, True).problems() is None
    assert "word" in QuantizeShape(8, 3, 8, 8, 3, False, False).problems()
    assert "word" in QuantizeShape(8, 5, 8, 8, 4, False, False).problems()
    assert "negative" in QuantizeShape(8, 3, 8, 8, 4, False, False, -1, 0).problems()
    assert QuantizeShape(8, 3, 8, 8, 4, False, False, 1, 1).out_w == 10
    with pytest.raises(ValueError, match="word"):
        QuantizeInput(QuantizeShape(1, 3, 8, 8, 6, False, False), 90)


@pytest.mark.parametrize("in_fp16", [False, True])
@pytest.mark.parametrize("out_fp16,channels", [(False, 4), (False, 16), (True, 4), (True, 8)])
def test_the_kernel_builds_for_every_sm(in_fp16: bool, out_fp16: bool, channels: int) -> None:
    for pads in ((0, 0), (1, 1)):  # plain, and the rows of a stem over pixel pairs
        shape = QuantizeShape(8, 3, 224, 224, channels, in_fp16, out_fp16, *pads)
        for sm in (75, 80, 90):
            image, log = compile_quantize(shape, sm)
            assert image is not None, log
        for sm in (75, 80):
            assert compile_quantize(shape, sm, ptx=True)[0] is not None


@pytest.mark.parametrize("in_fp16,out_fp16", [(False, False), (True, False), (False, True)])
def test_a_pixel_s_channel_loads_share_one_memory_round_trip(in_fp16: bool, out_fp16: bool,
                                                             sass_tools: None) -> None:
    """Every channel of a pixel is loaded before the first is converted, on every sm (an int8
    channel's division does not hold back the next channel's load)."""
    shape = QuantizeShape(8, 3, 224, 224, 4, in_fp16, out_fp16)
    for sm in (75, 80, 90):
        image, log = compile_quantize(shape, sm)
        assert image is not None, log
        assert loads_before_first_use(summarize(image).text) == 3, sm


def _gpu() -> bool:
    from tests.conftest import has_gpu

    return has_gpu()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
def test_the_kernel_is_deploys_quantize_with_the_channels_padded(tmp_path: Path) -> None:
    from deploy import calibrate

    builds = small_kernel_builds()
    sm = builds[0][0]  # this GPU's
    g = torch.Generator(device="cuda").manual_seed(6)
    scale = 0.0173
    for dtype in (torch.float32, torch.float16):
        x = torch.randn(3, 3, 19, 23, device="cuda", generator=g) * 1.5
        x[0, 0, 0, :8] = (torch.arange(-4, 4, device="cuda") + 0.5) * scale  # ties: to even
        x[1, 2, 3, :2] = torch.tensor([1e4, -1e4])  # clamped
        x = x.to(dtype)
        for layout in (torch.contiguous_format, torch.channels_last):
            xl = x.contiguous(memory_format=layout)
            for out_fp16, channels, pads in ((False, 4, (0, 0)), (False, 8, (0, 0)),
                                             (True, 4, (0, 0)), (True, 8, (0, 0)),
                                             (False, 4, (1, 0)), (True, 4, (1, 2))):
                shape = QuantizeShape(3, 3, 19, 23, channels, dtype == torch.float16, out_fp16,
                                      *pads)
                want = x.to(torch.float16) if out_fp16 else calibrate.quantize(x, scale)
                # zero channels after a pixel's, zero pixels before and after a row's
                want = F.pad(want.permute(0, 2, 3, 1), (0, channels - 3, *pads))
                want = want.permute(0, 3, 1, 2)
                for b_sm, pdl, ptx in builds:
                    y = QuantizeInput(shape, b_sm, pdl, tmp_path, ptx)(
                        xl, None if out_fp16 else scale)
                    assert y.is_contiguous(memory_format=torch.channels_last)
                    assert torch.equal(y, want), (dtype, layout, out_fp16, channels, pads, b_sm,
                                                  ptx)
    # A model's input: a million quotients, some within an ulp of a rounding tie, where a
    # division computed otherwise than as IEEE's (a reciprocal's product) rounds differently.
    x = torch.randn(8, 3, 224, 224, device="cuda", generator=g) * (40 * scale)
    shape = QuantizeShape(8, 3, 224, 224, 4, False, False)
    want = F.pad(calibrate.quantize(x, scale).permute(0, 2, 3, 1), (0, 1)).permute(0, 3, 1, 2)
    assert torch.equal(QuantizeInput(shape, sm, False, tmp_path)(x, scale), want)
    assert torch.equal(calibrate.quantize(x, scale).cpu(), calibrate.quantize(x.cpu(), scale))
