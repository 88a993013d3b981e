"""The CUTLASS sm90 conv baseline (bench/cutlass_conv.py, bench/cutlass/conv_sm90.cu) without a
GPU: the ctypes signatures are the source's, the library builds for sm_90a with wgmma and no
spills, and time_us refuses what CUTLASS cannot run with a reason.

The build compiles two configs (one fp16, one int8: 2-5 minutes on two cores) where
nvcc and CUTLASS's headers are found (an installed nvidia-cutlass, TCTUNE_CUTLASS_DIR, or the
copy `python -m bench.cutlass_conv build` fetches); TCTUNE_CUTLASS_LIB names a library built
already instead."""

from __future__ import annotations

import ctypes
import os
import re
import tomllib
from pathlib import Path

import pytest

from bench import cutlass_conv as cc
from kernels.spec import ConvShape, Precision
from tests.conftest import REPO

C_TYPES = {"int": ctypes.c_int, "size_t": ctypes.c_size_t, "float": ctypes.c_float,
           "const char*": ctypes.c_char_p, "void*": ctypes.c_void_p,
           "const void*": ctypes.c_void_p, "int*": ctypes.POINTER(ctypes.c_int)}


def _source_signatures() -> dict[str, tuple[object, list[object]]]:
    src = cc.SOURCE.read_text()
    shape = re.search(r"#define TCTUNE_SHAPE_PARAMS\s*\\\n(.*?)\n\n", src, re.S)
    assert shape is not None
    n_shape = len(re.findall(r"\bint \w+", shape.group(1)))
    out = {}
    for ret, name, params in re.findall(r"TCTUNE_API ([\w ]+?\*?) (tctune_\w+)\((.*?)\)\s*\{",
                                        src, re.S):
        args: list[object] = []
        for p in (x.strip() for x in params.split(",")):
            if p in ("void", ""):
                continue
            if p == "TCTUNE_SHAPE_PARAMS":
                args += [ctypes.c_int] * n_shape
                continue
            ctype = re.sub(r"\s*\w+$", "", p).replace(" *", "*")
            args.append(C_TYPES[ctype])
        out[name] = (C_TYPES[ret.replace(" *", "*")], args)
    return out


def test_ctypes_signatures_are_the_sources() -> None:
    src = _source_signatures()
    assert set(src) == set(cc.SIGNATURES)
    for name, (res, args) in cc.SIGNATURES.items():
        assert src[name][0] is res, name
        assert len(src[name][1]) == len(args), name
        for a, b in zip(src[name][1], args, strict=True):
            assert a == b, name  # POINTER(c_int) is cached: equal types compare equal
    abi = re.search(r"#define TCTUNE_CUTLASS_ABI (\d+)", cc.SOURCE.read_text())
    assert abi is not None and int(abi.group(1)) == cc.ABI_VERSION
    assert len(cc.shape_args(ConvShape(1, 8, 8, 8, 8, 3, 3))) == 13


def test_source_configs_cover_both_precisions() -> None:
    cfgs = cc.source_configs()
    assert [i for i, _, _ in cfgs] == list(range(len(cfgs)))
    assert len({name for _, name, _ in cfgs}) == len(cfgs)
    assert {prec for _, _, prec in cfgs} == {"fp16", "int8"}
    assert all(name.startswith(prec) for _, name, prec in cfgs)


def test_the_bench_extra_pins_the_cutlass_the_source_is_written_for() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f"nvidia-cutlass=={cc.CUTLASS_VERSION}" in project["optional-dependencies"]["bench"]
    assert not any("cutlass" in r for r in project["optional-dependencies"]["dev"])


# ---- with a built library ----------------------------------------------------------------
# Whichever test runs first pays for the build (pytest-timeout counts fixture setup).
BUILD_TIMEOUT = pytest.mark.timeout(1800)
# The two configs that compile fastest (64-row tiles), one per precision.
BUILD_CONFIGS = ("fp16_64x128x64_c1x1x1", "int8_64x128x128_c1x1x1")


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> cc.CutlassLib:
    given = os.environ.get("TCTUNE_CUTLASS_LIB")
    if given:
        return cc.CutlassLib(given)
    if cc.nvcc_path() is None:
        pytest.skip("needs nvcc to build the CUTLASS library")
    if cc.find_cutlass() is None:
        pytest.skip("needs CUTLASS's headers (pip install nvidia-cutlass=="
                    f"{cc.CUTLASS_VERSION}, or run `python -m bench.cutlass_conv build` once)")
    index = {name: i for i, name, _ in cc.source_configs()}
    out = tmp_path_factory.mktemp("cutlass")
    path = cc.build(out, configs=[index[n] for n in BUILD_CONFIGS], log=lambda *a: None)
    return cc.CutlassLib(path)


RESNET = ConvShape(8, 14, 14, 256, 256, 3, 3, pad=1)
STEM = ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3)


@pytest.mark.slow
@BUILD_TIMEOUT
def test_library_loads_and_lists_its_configs(lib: cc.CutlassLib) -> None:
    names = [c.name for c in lib.configs]
    assert set(BUILD_CONFIGS) <= set(names)
    for c in lib.configs:
        assert c.precision in cc.PRECISIONS and c.name.startswith(c.precision.value)
        assert c.threads == 256  # one TMA producer warpgroup + one wgmma consumer warpgroup
        assert c.stages >= 2 and 0 < c.smem_bytes <= 227 * 1024
        assert c.tile[2] * c.precision.input_bits == 1024  # 128-byte K slices
    assert lib.lib.tctune_cutlass_config_name(len(names)) is None


@pytest.mark.slow
@BUILD_TIMEOUT
def test_library_has_wgmma_and_no_spills(lib: cc.CutlassLib) -> None:
    from kernels.sass import cuobjdump_path

    if cuobjdump_path() is None:
        pytest.skip("needs cuobjdump (dev extra)")
    lines = cc.sass_report(lib.path)
    assert len(lines) == len(lib.configs), lines
    precisions = {c.precision for c in lib.configs}
    if Precision.FP16 in precisions:
        assert any("HGMMA.64x" in line and ".F32" in line for line in lines), lines
    if Precision.INT8 in precisions:
        assert any("IGMMA.64x" in line and ".S8.S8" in line for line in lines), lines
    for line in lines:
        assert "UTMALDG.4D.IM2COL" in line, line  # activations through TMA im2col
        assert "LOCAL 0" in line and line.endswith("LDL/STL 0"), line


@pytest.mark.slow
@BUILD_TIMEOUT
def test_can_implement_status_codes(lib: cc.CutlassLib) -> None:
    fp16 = lib.configs_for(Precision.FP16)[0].index
    int8 = lib.configs_for(Precision.INT8)[0].index
    for cfg in (fp16, int8):
        assert lib.can_implement(cfg, RESNET) == cc.OK
        assert lib.workspace_size(cfg, RESNET) == 0
        assert lib.can_implement(cfg, STEM) == cc.CHANNELS_ALIGN
        assert lib.can_implement(cfg, ConvShape(1, 2, 2, 16, 16, 3, 3)) == cc.BAD_SHAPE
    odd_k = ConvShape(2, 15, 15, 32, 40, 3, 3, pad=1)
    assert lib.can_implement(fp16, odd_k) == cc.OK
    assert lib.can_implement(int8, odd_k) == cc.OUTPUT_ALIGN
    assert lib.can_implement(int8, ConvShape(2, 15, 15, 24, 32, 3, 3)) == cc.CHANNELS_ALIGN
    assert lib.can_implement(fp16, ConvShape(1, 64, 64, 16, 16, 1, 1, stride=9)) \
        == cc.CUTLASS_REFUSED
    assert lib.can_implement(fp16, ConvShape(1, 300, 300, 16, 16, 3, 3, dilation=130)) \
        == cc.CUTLASS_REFUSED
    assert lib.can_implement(len(lib.configs), RESNET) == cc.BAD_CONFIG
    assert "TMA" in lib.status_string(cc.CHANNELS_ALIGN)


@pytest.mark.slow
@BUILD_TIMEOUT
def test_run_refuses_before_launching(lib: cc.CutlassLib) -> None:
    cfg = lib.configs_for(Precision.FP16)[0].index
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        lib.run(cfg, RESNET, 1, 0, 0, 1.0, 0, 0, 0)  # x misaligned
    with pytest.raises(RuntimeError, match="multiple of a 16-byte vector"):
        lib.run(cfg, STEM, 0, 0, 0, 1.0, 0, 0, 0)


@pytest.mark.slow
@BUILD_TIMEOUT
def test_time_us_refusals_give_reasons(lib: cc.CutlassLib) -> None:
    for p in (Precision.FP32_TC, Precision.INT4):
        us, why = lib.time_us(RESNET, p, 50 << 20)
        assert us is None and why is not None and "fp16 and int8" in why
    us, why = lib.time_us(STEM, Precision.FP16, 50 << 20)
    assert us is None and why is not None and "C=3 is not a multiple of 8" in why
    us, why = lib.time_us(STEM, Precision.INT8, 50 << 20)
    assert us is None and why is not None and "C=3 is not a multiple of 16" in why
    us, why = lib.time_us(ConvShape(2, 15, 15, 32, 40, 3, 3, pad=1), Precision.INT8, 50 << 20)
    assert us is None and why is not None and "K=40 is not a multiple of 16" in why
    grouped = ConvShape(8, 14, 14, 256, 256, 3, 3, pad=1, groups=2)
    us, why = lib.time_us(grouped, Precision.FP16, 50 << 20)
    assert us is None and why is not None and "groups=2" in why
    assert lib.last == []


@pytest.mark.slow
@BUILD_TIMEOUT
def test_time_us_without_a_gpu_says_so(lib: cc.CutlassLib) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: bench.cutlass_conv check covers it")
    assert lib.time_us(RESNET, Precision.FP16, 50 << 20) == (None, "no CUDA device")


def test_find_cutlass_takes_an_explicit_folder(tmp_path: Path) -> None:
    src = tmp_path / "cutlass_library" / "source"
    (src / "include" / "cutlass" / "conv" / "collective").mkdir(parents=True)
    (src / "include" / "cutlass" / "conv" / "collective" / "collective_builder.hpp").touch()
    (src / "tools" / "util" / "include" / "cutlass" / "util").mkdir(parents=True)
    assert cc.find_cutlass(tmp_path) == src


# ---- the reference and the check, with a stand-in for the library (CPU) ------------------
class _Emulated:
    """Writes what CUTLASS's kernels compute, in PyTorch on the CPU (or a wrong variant)."""

    def __init__(self, prob: object, shape: ConvShape, p: Precision, wrong: str = "") -> None:
        self.prob, self.shape, self.p, self.wrong = prob, shape, p, wrong

    def run(self, *_: object) -> None:
        import torch
        import torch.nn.functional as F

        s, prob = self.shape, self.prob
        conv = {"stride": s.stride, "padding": s.pad, "dilation": s.dilation}
        acc = F.conv2d(prob.x.double(), prob.w.double(), **conv)  # type: ignore[attr-defined]
        if self.p is Precision.FP16:
            y = acc.float().half()
            if self.wrong == "tile":
                y[..., :4, :4] = 0  # an output tile left at zero
        else:
            # The epilogue: int32 -> float (nearest), * alpha in float, rint, saturate.
            v = acc.to(torch.int32).float() * torch.tensor(prob.alpha, dtype=torch.float32)
            y = torch.round(v).clamp(-128, 127).to(torch.int8).contiguous()  # half to even
            if self.wrong == "one":
                y.view(-1)[7] += 1 if y.view(-1)[7] < 127 else -1
        prob.y.copy_(y)  # type: ignore[attr-defined]


@pytest.mark.parametrize("p", [Precision.FP16, Precision.INT8])
def test_reference_accepts_the_epilogue_and_rejects_wrong_outputs(p: Precision) -> None:
    pytest.importorskip("torch")
    shape = ConvShape(2, 9, 11, 32, 48, 3, 3, stride=2, pad=1)
    prob = cc._make_problem(shape, p, device="cpu")
    cfg = cc.Config(0, "emulated", p, (128, 128, 64), (1, 1, 1), 0, 256, 4)
    ok, stats = cc._check(_Emulated(prob, shape, p), cfg, shape, p, prob, 0, 0)
    assert ok, stats
    if p is Precision.INT8:
        got = prob.y.permute(0, 2, 3, 1).numpy()
        assert (got == 127).any() and (got == -128).any() and len(set(got.ravel())) > 200
    wrong = "tile" if p is Precision.FP16 else "one"
    ok, stats = cc._check(_Emulated(prob, shape, p, wrong), cfg, shape, p, prob, 0, 0)
    assert not ok, stats
