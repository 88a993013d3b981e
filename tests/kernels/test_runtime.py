"""The deploy-time runtime (kernels/runtime.py).

On a CPU (CI): ops build through NVRTC, the fallback default schedule is valid and warns,
every mismatched argument is refused with a clear error (validation is separate from the
launch, so torch CPU tensors and stand-in arrays exercise it), the NHWCnc helpers match the
reference layouts, `api.client.from_service` takes the service's schedule.

On a GPU (`test_on_gpu_*`, skipped without CuPy and a device): results equal the reference
on random inputs, for CuPy arrays and torch tensors, on non-default streams. The device
cases are built by `test_device_cases_build` first, so a CPU run with
TCTUNE_KERNEL_CACHE=<dir> prebuilds every cubin the GPU run needs:
    TCTUNE_KERNEL_CACHE=.rtcache python -m pytest tests/kernels/test_runtime.py            # CPU
    TCTUNE_KERNEL_CACHE=.rtcache python -m pytest --noconftest -k on_gpu \
        tests/kernels/test_runtime.py
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from api.client import from_service
from kernels import reference as ref
from kernels.build import Epilogue
from kernels.runtime import (
    FEW_CHANNELS_BESTS,
    ONE_BY_ONE_BESTS,
    ONE_BY_ONE_REACH,
    RECORDED_BESTS,
    WGMMA_BESTS,
    Conv2d,
    DefaultScheduleWarning,
    default_cache_dir,
    default_schedule,
)
from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, ConvShape, Precision, gemm_distance, get_target

_KNOB_ORDER = ("BLK_ROW_WARPS", "BLK_COL_WARPS", "WARP_ROW_TILES", "WARP_COL_TILES", "CHUNK",
               "REORDER_INNER", "DUP_AWARE", "PACK_OUT", "LAYOUT", "STAGES", "SPLIT_K")


def _sched(*values: Any) -> dict[str, Any]:
    return dict(zip(_KNOB_ORDER, values, strict=True))


STAGE3 = RESNET50_3X3["stage3"]
INT8_BEST = RECORDED_BESTS["int8"][1][2]  # stage3's recorded best
SMALL = ConvShape(2, 10, 12, 32, 48, 3, 3, pad=(1, 1))
STEM = ConvShape(2, 30, 30, 3, 64, 7, 7, stride=2, pad=3)
CHAIN = ConvShape(8, 14, 14, 64, 64, 3, 3, pad=(1, 1))  # its output is its next input


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rtcache")


# ---- building ----------------------------------------------------------------------------
def test_kernels_import_without_cupy() -> None:
    # CuPy and torch are imported inside the functions that launch, never at import.
    mod = importlib.import_module("kernels.runtime")
    assert hasattr(mod, "Conv2d")


def test_builds_through_nvrtc_on_cpu(cache: Path) -> None:
    op = Conv2d(STAGE3, "int8", INT8_BEST, target="h100", epilogue="requant", relu=True,
                cache_dir=cache)
    assert op.schedule_source == "given"
    assert (cache / f"{op.key}.cubin").stat().st_size > 1000
    assert op.meta["grid"][0] > 0 and op.meta["epilogue"] == {"mode": "requant", "relu": True}
    assert op.input_shape == (8, 28, 28, 128) and op.weight_shape == (128, 3, 3, 128)
    assert op.output_shape == (8, 28, 28, 128) and op.output_dtype == "int8"
    again = Conv2d(STAGE3, "int8", INT8_BEST, target="h100", epilogue="requant", relu=True,
                   cache_dir=cache)
    assert again.key == op.key and again.build_result.cached
    acc = Conv2d(STAGE3, "int8", INT8_BEST, target="h100", epilogue="acc", cache_dir=cache)
    assert acc.output_dtype == "int32" and acc.key != op.key


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TCTUNE_KERNEL_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path


@pytest.mark.parametrize("shape,precision,target", [
    (ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3), "int8", "h100"),  # stem, C=3
    (ConvShape(8, 56, 56, 64, 256, 1, 1), "fp16", "h100"),
    (ConvShape(8, 28, 28, 512, 1024, 1, 1, stride=2), "int8", "h200"),
    (ConvShape(3, 9, 11, 20, 13, 3, 3, pad=1), "fp16", "t4"),  # tails, sm_75
    (ConvShape(4, 14, 14, 64, 64, 3, 3, pad=1), "int4", "h100"),  # s8 path: STAGES <= 2
])
def test_fallback_warns_and_picks_a_valid_default(shape: ConvShape, precision: str,
                                                  target: str, cache: Path) -> None:
    with pytest.warns(DefaultScheduleWarning, match="no tuned schedule"):
        op = Conv2d(shape, precision, None, target=target, cache_dir=cache)
    assert op.schedule_source.startswith("default: recorded best of ResNet-50")
    assert ScheduleSpace(shape, Precision(precision), get_target(target)).is_valid(op.schedule)
    assert op.build_result.status == "ok"


def test_fallback_takes_the_nearest_valid_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # 8x8 instruction tiles per warp need 256 accumulator registers: invalid everywhere.
    bad = _sched(4, 1, 8, 8, 2, 0, 0, 0, "nhwc", 3, 1)
    monkeypatch.setitem(RECORDED_BESTS, "int8", [("stage3", STAGE3, bad)])
    monkeypatch.setitem(WGMMA_BESTS, "int8", [("stage3", STAGE3, {**bad, "MMA": "wgmma"})])
    target = get_target("h100")
    space = ScheduleSpace(STAGE3, Precision.INT8, target)
    assert not space.is_valid(bad)
    sched, src = default_schedule(STAGE3, "int8", target)
    assert space.is_valid(sched) and src.startswith("nearest valid")
    assert sum(sched[k] != bad[k] for k in bad) == int(src.split("(")[1].split()[0])


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_sm90_defaults_start_from_the_wgmma_bests(precision: str) -> None:
    h100, a100 = get_target("h100"), get_target("a100")
    for name, shape in RESNET50_3X3.items():
        sched, src = default_schedule(shape, precision, h100)
        assert sched["MMA"] == "wgmma" and f"{name} (wgmma, H100" in src
        assert sched == dict(next(s for n, _, s in WGMMA_BESTS[precision] if n == name))
        sync, src = default_schedule(shape, precision, h100, wgmma=False)
        assert sync.get("MMA", "sync") == "sync" and "mma.sync" in src
        assert default_schedule(shape, precision, a100)[0].get("MMA", "sync") == "sync"
    # A layer none of the four (nor near a recorded 1x1 layer): stage3's wgmma best.
    far = ConvShape(8, 14, 14, 80, 480, 1, 1)
    sched, src = default_schedule(far, precision, h100)
    assert sched["MMA"] == "wgmma" and "stage3 (wgmma" in src
    # int4 has no wgmma path: its default stays on mma.sync.
    assert default_schedule(STAGE3, "int4", h100)[0].get("MMA", "sync") == "sync"


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_stems_start_from_the_recorded_stem_best(precision: str) -> None:
    """Few input channels and at least one 256-row tile of pixels: the stem's searched best
    (folded taps) on the wgmma path; squeeze-excitation layers (8 pixels) and other targets
    keep the rule of the other layers."""
    h100, a100 = get_target("h100"), get_target("a100")
    for stem in (ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3),
                 ConvShape(8, 224, 224, 3, 32, 3, 3, stride=2, pad=1),
                 ConvShape(1, 256, 256, 3, 64, 3, 3, pad=1)):
        sched, src = default_schedule(stem, precision, h100)
        assert sched == {**FEW_CHANNELS_BESTS[precision], **sched} and "conv1" in src
        assert sched["FOLD_TAPS"] == 1 and sched["MMA"] == "wgmma"
        assert "conv1" not in default_schedule(stem, precision, a100)[1]
        assert "conv1" not in default_schedule(stem, precision, h100, wgmma=False)[1]
    squeeze = ConvShape(8, 1, 1, 8, 32, 1, 1)
    sched, src = default_schedule(squeeze, precision, h100)
    assert "stage3" in src and sched["FOLD_TAPS"] == 1


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_1x1_layers_start_from_the_nearest_recorded_1x1_best(precision: str) -> None:
    h100, a100 = get_target("h100"), get_target("a100")
    recorded = ONE_BY_ONE_BESTS[precision]
    for shape, best in recorded:  # ResNet-50's own 1x1 layers: their own searched best
        sched, src = default_schedule(shape, precision, h100)
        assert sched == {**best, **sched} and shape.key() in src
        assert "1x1" not in default_schedule(shape, precision, a100)[1]
    # near one (K halved: one octave) -> that one's best; its stride must match
    shape, best = next((s, b) for s, b in recorded if s.key().startswith("n8_h28_w28_c512_k128"))
    near = ConvShape(8, 28, 28, 512, 64, 1, 1)
    sched, src = default_schedule(near, precision, h100)
    assert sched == {**best, **sched} and shape.key() in src
    strided = ConvShape(8, 28, 28, 512, 64, 1, 1, stride=2)
    assert shape.key() not in default_schedule(strided, precision, h100)[1]
    # beyond ONE_BY_ONE_REACH octaves: the 3x3 rule
    far = ConvShape(8, 1, 1, 1152, 48, 1, 1)
    assert min(gemm_distance(s, far) for s, _ in recorded) > ONE_BY_ONE_REACH
    assert "stage3" in default_schedule(far, precision, h100)[1]


def test_default_respects_the_raw_accumulator_epilogue() -> None:
    # int32 output stages 4 bytes per element: the default must fit that too.
    target = get_target("t4")
    shape = ConvShape(8, 56, 56, 64, 256, 1, 1)
    sched, _ = default_schedule(shape, "int8", target, Epilogue("acc"))
    from kernels.runtime import schedule_fits

    assert schedule_fits(shape, Precision.INT8, target, sched, Epilogue("acc")) is None


def test_invalid_schedules_are_refused(cache: Path) -> None:
    with pytest.raises(ValueError, match="FOO: unknown knob"):
        Conv2d(STAGE3, "int8", {**INT8_BEST, "FOO": 1}, target="h100", cache_dir=cache)
    with pytest.raises(ValueError, match="CHUNK: must be one of"):
        Conv2d(STAGE3, "int8", {**INT8_BEST, "CHUNK": 3}, target="h100", cache_dir=cache)
    big = _sched(4, 4, 4, 4, 8, 0, 0, 0, "nhwc", 3, 1)  # ~200 KB of pipeline: not on a T4
    with pytest.raises(ValueError, match="shared memory"):
        Conv2d(STAGE3, "int8", big, target="t4", cache_dir=cache)
    nhwcnc = {**INT8_BEST, "LAYOUT": "nhwcnc"}
    with pytest.raises(ValueError, match="NHWCnc"):
        Conv2d(ConvShape(3, 28, 28, 128, 128, 3, 3, pad=1), "int8", nhwcnc, target="h100",
               cache_dir=cache)
    with pytest.raises(ValueError, match="unknown target"):
        Conv2d(STAGE3, "int8", INT8_BEST, target="v100", cache_dir=cache)
    with pytest.raises(ValueError, match="int4 packs two channels"):
        Conv2d(ConvShape(1, 8, 8, 3, 8, 1, 1), "int4", None, target="h100", cache_dir=cache)


def test_target_none_without_a_gpu_says_so(cache: Path) -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed: target=None may find a GPU")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="target=None"):
        Conv2d(STAGE3, "int8", INT8_BEST, cache_dir=cache)


# ---- argument validation (no GPU needed) ------------------------------------------------
class FakeCupy:
    """Stands in for a cupy.ndarray (framework by module name, like the runtime checks)."""

    __module__ = "cupy._fake"

    def __init__(self, shape: tuple[int, ...], dtype: str, device: int = 0,
                 contiguous: bool = True, ptr: int = 1 << 20) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.device = type("Dev", (), {"id": device})()
        self.flags = {"C_CONTIGUOUS": contiguous}
        self.data = type("Mem", (), {"ptr": ptr})()


@pytest.fixture(scope="module")
def op(cache: Path) -> Conv2d:
    return Conv2d(STAGE3, "int8", INT8_BEST, target="h100", epilogue="requant",
                  cache_dir=cache)


def _ok_args(op: Conv2d) -> dict[str, Any]:
    return {"x": FakeCupy(op.input_shape, "int8"), "weight": FakeCupy(op.weight_shape, "int8"),
            "scale": FakeCupy((op.shape.k,), "float32"), "bias": FakeCupy((op.shape.k,), "float32")}


def test_validation_accepts_the_contract(op: Conv2d) -> None:
    assert op.validate(**_ok_args(op)) == ("cupy", 0)
    a = _ok_args(op)
    assert op.validate(**a, out=FakeCupy(op.output_shape, "int8")) == ("cupy", 0)


def test_validation_names_the_argument_and_what_was_expected(op: Conv2d) -> None:
    a = _ok_args(op)
    with pytest.raises(TypeError, match=r"x must be a CuPy array or a PyTorch CUDA tensor, "
                                        r"got numpy.ndarray"):
        op.validate(np.zeros(op.input_shape, np.int8), a["weight"], a["scale"])
    with pytest.raises(TypeError, match="x must have dtype int8, got float16"):
        op.validate(FakeCupy(op.input_shape, "float16"), a["weight"], a["scale"])
    with pytest.raises(ValueError, match=r"x must have shape \(8, 28, 28, 128\) \(NHWC\), "
                                         r"got \(8, 128, 28, 28\)"):
        op.validate(FakeCupy((8, 128, 28, 28), "int8"), a["weight"], a["scale"])
    with pytest.raises(ValueError, match=r"weight must have shape \(128, 3, 3, 128\)"):
        op.validate(a["x"], FakeCupy((128, 128, 3, 3), "int8"), a["scale"])
    with pytest.raises(ValueError, match="weight is on cuda:1 but x is on cuda:0"):
        op.validate(a["x"], FakeCupy(op.weight_shape, "int8", device=1), a["scale"])
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        op.validate(FakeCupy(op.input_shape, "int8", contiguous=False), a["weight"], a["scale"])
    with pytest.raises(ValueError, match="16-byte boundary"):
        op.validate(FakeCupy(op.input_shape, "int8", ptr=(1 << 20) + 4), a["weight"],
                    a["scale"])
    with pytest.raises(ValueError, match="scale is required"):
        op.validate(a["x"], a["weight"])
    with pytest.raises(TypeError, match="scale must have dtype float32, got float16"):
        op.validate(a["x"], a["weight"], FakeCupy((128,), "float16"))
    with pytest.raises(ValueError, match=r"bias must have shape \(128,\)"):
        op.validate(a["x"], a["weight"], a["scale"], FakeCupy((64,), "float32"))
    with pytest.raises(TypeError, match="out must have dtype int8, got int32"):
        op.validate(**a, out=FakeCupy(op.output_shape, "int32"))


def test_validation_with_torch_tensors(op: Conv2d) -> None:
    import torch  # installed by the dev extra: missing is a failure, not a skip
    x = torch.zeros(op.input_shape, dtype=torch.int8)
    w = torch.zeros(op.weight_shape, dtype=torch.int8)
    s = torch.ones(op.shape.k, dtype=torch.float32)
    with pytest.raises(ValueError, match="x must be on a CUDA device, got cpu"):
        op.validate(x, w, s)
    with pytest.raises(TypeError, match="x must have dtype int8, got float32"):
        op.validate(x.float(), w, s)
    with pytest.raises(ValueError, match="x must have shape"):
        op.validate(x.permute(0, 3, 1, 2), w, s)
    with pytest.raises(TypeError, match="weight is a torch array but x is a cupy one"):
        op.validate(FakeCupy(op.input_shape, "int8"), w, s)


def test_epilogue_arguments_follow_the_epilogue(cache: Path) -> None:
    fp16 = Conv2d(STAGE3, "fp16", RECORDED_BESTS["fp16"][1][2], target="h100",
                  cache_dir=cache)
    assert fp16.epilogue.mode == "bias" and fp16.output_dtype == "float16"
    x, w = FakeCupy(fp16.input_shape, "float16"), FakeCupy(fp16.weight_shape, "float16")
    assert fp16.validate(x, w) == ("cupy", 0)  # bias is optional (zero)
    with pytest.raises(ValueError, match="scale is not used"):
        fp16.validate(x, w, FakeCupy((128,), "float32"))
    acc = Conv2d(STAGE3, "int8", INT8_BEST, target="h100", epilogue="none", cache_dir=cache)
    xi, wi = FakeCupy(acc.input_shape, "int8"), FakeCupy(acc.weight_shape, "int8")
    assert acc.epilogue.mode == "acc" and acc.validate(xi, wi) == ("cupy", 0)
    with pytest.raises(ValueError, match="bias is not used"):
        acc.validate(xi, wi, None, FakeCupy((128,), "float32"))


def test_narrow_channels_accept_real_or_padded(cache: Path) -> None:
    # The default folds the stem's taps: channels padded to one 4-byte tap vector.
    with pytest.warns(DefaultScheduleWarning):
        op = Conv2d(STEM, "int8", None, target="h100", epilogue="acc", cache_dir=cache)
    assert op.schedule["FOLD_TAPS"] == 1 and "taps folded" in op.schedule_source
    assert op.padded_channels == 4 and op.input_shape == (2, 30, 30, 4)
    assert op.weight_shape == (64, 7, 7, 4)
    # Unfolded, each tap is padded to a whole 16-byte vector.
    unfolded = Conv2d(STEM, "int8", {**op.schedule, "FOLD_TAPS": 0}, target="h100",
                      epilogue="acc", cache_dir=cache)
    assert unfolded.padded_channels == 16 and unfolded.input_shape == (2, 30, 30, 16)
    for c in (3, 16):
        x, w = FakeCupy((2, 30, 30, c), "int8"), FakeCupy((64, 7, 7, c), "int8")
        assert unfolded.validate(x, w) == ("cupy", 0)
    with pytest.raises(ValueError, match=r"\(2, 30, 30, 16\) or \(2, 30, 30, 3\) \(NHWC, "
                                         r"channels zero-padded to 16\)"):
        unfolded.validate(FakeCupy((2, 30, 30, 8), "int8"), FakeCupy((64, 7, 7, 3), "int8"))
    with pytest.raises(ValueError, match=r"\(2, 30, 30, 4\) or \(2, 30, 30, 3\)"):
        op.validate(FakeCupy((2, 30, 30, 16), "int8"), FakeCupy((64, 7, 7, 3), "int8"))


def test_prepare_weight_pads_and_reorders(cache: Path) -> None:
    import torch  # installed by the dev extra: missing is a failure, not a skip
    with pytest.warns(DefaultScheduleWarning):
        op = Conv2d(STEM, "fp16", None, target="h100", cache_dir=cache)
    w_kcrs = torch.randn(64, 3, 7, 7).half()
    w = op.prepare_weight(w_kcrs, layout="kcrs")
    # fp16, taps folded: 3 channels padded to one 8-byte tap vector of 4
    assert tuple(w.shape) == op.weight_shape == (64, 7, 7, 4) and w.is_contiguous()
    assert torch.equal(w[..., :3], w_kcrs.permute(0, 2, 3, 1)) and not w[..., 3:].any()
    with pytest.raises(ValueError, match="weight must have shape"):
        op.prepare_weight(torch.zeros(64, 7, 7, 5).half())


def test_nhwcnc_contract_and_helpers(cache: Path) -> None:
    shape = ConvShape(8, 14, 14, 64, 32, 3, 3, pad=1)
    sched = {**INT8_BEST, "LAYOUT": "nhwcnc", "SPLIT_K": 1}
    op = Conv2d(shape, "int8", sched, target="h100", cache_dir=cache)
    assert op.input_shape == (1, 14, 14, 4, 8, 16)
    assert op.output_shape == (1, 14, 14, 2, 8, 16)  # int8 out: 16 channels per vector
    x = np.random.default_rng(0).integers(-128, 128, (8, 14, 14, 64), dtype=np.int8)
    blocked = op.to_input_layout(x)
    assert np.array_equal(blocked, ref.nhwc_to_nhwcnc(x, 16))
    y = ref.nhwc_to_nhwcnc(x[..., :32], 16)
    assert np.array_equal(op.from_output_layout(y), x[..., :32])
    with pytest.raises(ValueError, match="NHWCnc"):
        op.validate(FakeCupy((8, 14, 14, 64), "int8"), FakeCupy(op.weight_shape, "int8"),
                    FakeCupy((32,), "float32"))


# ---- from_service ------------------------------------------------------------------------
class StubClient:
    def __init__(self, found: dict[str, Any] | None) -> None:
        self.found = found
        self.asked: list[tuple[Any, ...]] = []

    def schedule(self, shape: ConvShape, precision: str, target: str) -> dict[str, Any] | None:
        self.asked.append((shape, precision, target))
        return self.found


def test_from_service_builds_the_served_schedule(cache: Path) -> None:
    client = StubClient({"schedule": INT8_BEST, "latency_us": 7.95, "iqr_us": 0.1,
                         "simulated": False, "backend": "cuda", "job_id": 3,
                         "measured_at": "2026-11-22T00:00:00Z", "task_key": "k"})
    op = from_service(client, STAGE3, "int8", "h200", cache_dir=cache)
    assert client.asked == [(STAGE3, "int8", "h200")]
    assert op.schedule == INT8_BEST and op.schedule_source.startswith("service: job 3")
    with pytest.warns(DefaultScheduleWarning):
        op2 = from_service(StubClient(None), STAGE3, "int8", "h200", cache_dir=cache)
    assert op2.schedule_source.startswith("default:")


# ---- the cases the GPU run checks (built here, on the CPU) --------------------------------
def device_cases() -> dict[str, Conv2d]:
    """Every op the GPU tests launch, in the default cache (TCTUNE_KERNEL_CACHE)."""
    split_k = {**INT8_BEST, "SPLIT_K": 4}
    nhwcnc = {**INT8_BEST, "LAYOUT": "nhwcnc", "SPLIT_K": 1}
    fp16_best = RECORDED_BESTS["fp16"][1][2]
    blocked = ConvShape(8, 14, 14, 64, 32, 3, 3, pad=1)
    # TMA builds launch through the driver with their tensor maps by value (kernels/launch.py)
    tma = {"BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 1, "WARP_ROW_TILES": 1, "WARP_COL_TILES": 2,
           "CHUNK": 4, "REORDER_INNER": 1, "DUP_AWARE": 0, "PACK_OUT": 1, "LAYOUT": "nhwc",
           "STAGES": 4, "SPLIT_K": 1, "MMA": "wgmma", "TMA": 1}
    wg = {**INT8_BEST, "MMA": "wgmma", "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 1,
          "WARP_ROW_TILES": 1, "WARP_COL_TILES": 2, "CHUNK": 2, "STAGES": 4, "SPLIT_K": 1}
    # FOLD_TAPS: the stem's (r, s, c) packed densely (explicit schedules of both paths)
    fold_sync = {**INT8_BEST, "FOLD_TAPS": 1, "REORDER_INNER": 0, "DUP_AWARE": 0,
                 "LAYOUT": "nhwc", "SPLIT_K": 2}
    fold_wg = {**wg, "FOLD_TAPS": 1, "REORDER_INNER": 0, "DUP_AWARE": 0}
    # PERSIST: blocks walk more tiles than the grid has blocks (1568 tiles; the stem's more)
    expand = ConvShape(8, 56, 56, 64, 256, 1, 1)
    tails = ConvShape(2, 17, 17, 64, 96, 3, 3, pad=1)
    persist = {**INT8_BEST, "BLK_ROW_WARPS": 1, "BLK_COL_WARPS": 4, "WARP_ROW_TILES": 2,
               "WARP_COL_TILES": 4, "CHUNK": 2, "REORDER_INNER": 0, "DUP_AWARE": 0,
               "PACK_OUT": 1, "LAYOUT": "nhwc", "STAGES": 3, "SPLIT_K": 1, "PERSIST": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return {
            "int8_acc": Conv2d(SMALL, "int8", INT8_BEST, "h100", epilogue="acc"),
            "int8_residual_relu": Conv2d(SMALL, "int8", INT8_BEST, "h100", relu=True,
                                         residual=True),
            "int8_residual_split_k_nhwcnc": Conv2d(blocked, "int8", {**nhwcnc, "SPLIT_K": 2},
                                                   "h100", residual=True),
            "int8_residual_wgmma_unpacked": Conv2d(SMALL, "int8", {**wg, "PACK_OUT": 0},
                                                   "h100", residual=True),
            "fp16_residual_relu": Conv2d(SMALL, "fp16", fp16_best, "h100", relu=True,
                                         residual=True),
            "fp16_residual_wgmma_unpacked": Conv2d(SMALL, "fp16", {**wg, "PACK_OUT": 0},
                                                   "h100", residual=True),
            "int8_stem_fold_sync": Conv2d(STEM, "int8", fold_sync, "h100", relu=True),
            "fp16_stem_fold_wgmma": Conv2d(STEM, "fp16", fold_wg, "h100"),
            "int8_persist_residual": Conv2d(expand, "int8", persist, "h100", relu=True,
                                            residual=True),
            "fp16_persist_wgmma": Conv2d(expand, "fp16", {**wg, "PERSIST": 1}, "h100"),
            "int8_persist_unpacked_acc": Conv2d(expand, "int8", {**persist, "PACK_OUT": 0},
                                                "h100", epilogue="acc"),
            "int8_persist_tma_residual": Conv2d(expand, "int8", {**tma, "PERSIST": 2},
                                                "h100", relu=True, residual=True),
            "fp16_persist_tma_one_stage": Conv2d(expand, "fp16", {**tma, "STAGES": 1,
                                                                  "PERSIST": 1}, "h100"),
            # PACK_OUT=2: the tile leaves through TMA stores (128-, 64- and 32-byte swizzles;
            # row and column tails clipped by the map: 578 rows, 96 channels)
            "int8_tma_store_persist_residual": Conv2d(
                expand, "int8", {**tma, "PACK_OUT": 2, "PERSIST": 2}, "h100", relu=True,
                residual=True),
            "fp16_tma_store": Conv2d(expand, "fp16", {**tma, "PACK_OUT": 2}, "h100"),
            "int8_tma_store_tails": Conv2d(tails, "int8", {**tma, "PACK_OUT": 2, "PERSIST": 1},
                                           "h100"),
            "int8_tma_store_narrow": Conv2d(tails, "int8", {**tma, "PACK_OUT": 2,
                                                            "WARP_COL_TILES": 1}, "h100"),
            "fp16_tma_store_tails_residual": Conv2d(tails, "fp16", {**tma, "PACK_OUT": 2},
                                                    "h100", residual=True),
            "int8_stem_fold_persist": Conv2d(STEM, "int8", {**fold_sync, "SPLIT_K": 1,
                                                            "PERSIST": 2}, "h100"),
            "int8_requant_relu": Conv2d(SMALL, "int8", INT8_BEST, "h100", epilogue="requant",
                                        relu=True),
            "int8_split_k": Conv2d(SMALL, "int8", split_k, "h100", epilogue="acc"),
            "fp16_bias_relu": Conv2d(SMALL, "fp16", fp16_best, "h100", relu=True),
            "int8_stem_acc": Conv2d(STEM, "int8", None, "h100", epilogue="acc"),
            "fp16_stem": Conv2d(STEM, "fp16", None, "h100"),
            "int8_nhwcnc": Conv2d(blocked, "int8", nhwcnc, "h100", epilogue="acc"),
            "int4_requant": Conv2d(SMALL, "int4", None, "h100"),
            "int8_tma_requant": Conv2d(SMALL, "int8", tma, "h100", epilogue="requant"),
            "fp16_tma_stem": Conv2d(STEM, "fp16", {**tma, "CHUNK": 2, "SPLIT_K": 2}, "h100"),
            # TMA=2: a producer warp issues the copies; the math warps' barriers leave it out
            # (split-K's flag, the persistent epilogue, TMA stores, the residual tile)
            "int8_producer_warp_split_k": Conv2d(SMALL, "int8", {**tma, "TMA": 2, "SPLIT_K": 2},
                                                 "h100", epilogue="requant"),
            "fp16_producer_warp_persist_residual": Conv2d(
                expand, "fp16", {**tma, "TMA": 2, "BLK_ROW_WARPS": 2, "PERSIST": 1}, "h100",
                residual=True),
            "int8_producer_warp_tma_store_persist": Conv2d(
                tails, "int8", {**tma, "TMA": 2, "PACK_OUT": 2, "PERSIST": 2}, "h100",
                relu=True),
            "fp16_producer_warp_stem": Conv2d(STEM, "fp16", {**tma, "TMA": 2, "CHUNK": 2},
                                              "h100"),
            # PLAIN_A: x copied as the [N*H*W, C] matrix (row tails past 578, split-K, TMA
            # stores, a producer warp, the persistent grid)
            "int8_plain_a_tma_store_persist_residual": Conv2d(
                expand, "int8", {**tma, "PACK_OUT": 2, "PERSIST": 2, "PLAIN_A": 1}, "h100",
                relu=True, residual=True),
            "fp16_plain_a_tails": Conv2d(ConvShape(2, 17, 17, 64, 96, 1, 1), "fp16",
                                         {**tma, "PLAIN_A": 1}, "h100"),
            "int8_plain_a_producer_warp_split_k": Conv2d(
                ConvShape(2, 14, 14, 256, 64, 1, 1), "int8",
                {**tma, "TMA": 2, "SPLIT_K": 2, "PLAIN_A": 1}, "h100", epilogue="requant"),
            # PINGPONG: two consumers take the tiles in turn (an odd number of tiles per
            # block and the last tile's tails; TMA stores; one stage; the residual tile)
            "int8_pingpong_tma_store_residual": Conv2d(
                expand, "int8", {**tma, "TMA": 2, "PACK_OUT": 2, "PERSIST": 1, "PLAIN_A": 1,
                                 "PINGPONG": 1}, "h100", relu=True, residual=True),
            "fp16_pingpong_tails": Conv2d(tails, "fp16", {**tma, "TMA": 2, "PERSIST": 2,
                                                          "PINGPONG": 1}, "h100"),
            "int8_pingpong_one_stage_two_warpgroups": Conv2d(
                tails, "int8", {**tma, "TMA": 2, "PERSIST": 1, "PINGPONG": 1, "STAGES": 1,
                                "BLK_ROW_WARPS": 2}, "h100", epilogue="requant"),
            # HALO: one input patch read by every tap (tails; two bands of a wide layer; the
            # persistent grid, ping-pong consumers and the residual tile)
            "int8_halo_persist_residual": Conv2d(
                tails, "int8", {**tma, "TMA": 2, "REORDER_INNER": 0, "CHUNK": 2, "STAGES": 2,
                                "PERSIST": 1, "HALO": 1}, "h100", relu=True, residual=True),
            "fp16_halo_two_bands": Conv2d(
                ConvShape(1, 5, 300, 16, 24, 3, 3, pad=1), "fp16",
                {**tma, "REORDER_INNER": 0, "CHUNK": 1, "STAGES": 2, "HALO": 1}, "h100"),
            "fp16_halo_pingpong_unpacked": Conv2d(
                tails, "fp16", {**tma, "TMA": 2, "REORDER_INNER": 0, "CHUNK": 2, "STAGES": 2,
                                "PERSIST": 1, "PINGPONG": 1, "PACK_OUT": 0, "HALO": 1}, "h100"),
            # SWAP_AB: 64-channel instructions over the tile's pixels (TMA stores of a
            # persistent grid with the residual tile; tails of M and K through the threads'
            # stores; raw int32 from registers with split-K)
            "int8_swap_tma_store_persist_residual": Conv2d(
                expand, "int8", {**tma, "PACK_OUT": 2, "PERSIST": 1, "WARP_ROW_TILES": 2,
                                 "SWAP_AB": 1}, "h100", relu=True, residual=True),
            "fp16_swap_tails": Conv2d(
                tails, "fp16", {**wg, "WARP_ROW_TILES": 4, "SWAP_AB": 1}, "h100"),
            "int8_swap_acc_split_k": Conv2d(
                ConvShape(2, 9, 11, 160, 40, 1, 1), "int8",
                {**wg, "SPLIT_K": 2, "SWAP_AB": 1}, "h100", epilogue="acc"),
            # a tile's splits as one cluster, summed over distributed shared memory: the
            # producer warp (exited before the cluster's barriers), the residual, tails of M
            # and K; mma.sync with four splits; swapped raw accumulators
            "int8_cluster_split_producer_warp_residual": Conv2d(
                tails, "int8", {**tma, "TMA": 2, "SPLIT_K": 2, "SPLIT_CLUSTER": 1}, "h100",
                relu=True, residual=True),
            "fp16_cluster_split_sync_four": Conv2d(
                ConvShape(2, 9, 11, 160, 40, 1, 1), "fp16",
                {**wg, "MMA": "sync", "BLK_COL_WARPS": 2, "STAGES": 3, "SPLIT_K": 4,
                 "SPLIT_CLUSTER": 1}, "h100", relu=True),
            "int8_cluster_split_swap_acc": Conv2d(
                ConvShape(2, 9, 11, 160, 40, 1, 1), "int8",
                {**wg, "SPLIT_K": 2, "SWAP_AB": 1, "SPLIT_CLUSTER": 1}, "h100", epilogue="acc"),
            # two inputs (concat): x1's channels, then x's at the layer's stride (wgmma and
            # mma.sync; tails of M and K; split-K; the persistent grid; padded channels)
            "concat_int8_wgmma_stride2": Conv2d(
                ConvShape(2, 9, 11, 160, 40, 1, 1, stride=2, concat=64), "int8", wg, "h100",
                relu=True),
            "concat_fp16_wgmma_persist": Conv2d(
                ConvShape(8, 14, 14, 96, 64, 1, 1, concat=32), "fp16", {**wg, "PERSIST": 2},
                "h100", relu=True),
            "concat_int8_sync_split_k_padded": Conv2d(
                ConvShape(3, 9, 11, 72, 24, 1, 1, stride=2, concat=32), "int8",
                {**wg, "MMA": "sync", "CHUNK": 1, "SPLIT_K": 2, "STAGES": 2}, "h100"),
            "concat_fp16_sync_stride2": Conv2d(
                ConvShape(8, 28, 28, 192, 128, 1, 1, stride=2, concat=64), "fp16",
                {**wg, "MMA": "sync", "BLK_COL_WARPS": 2, "STAGES": 3}, "h100"),
            # programmatic dependent launch: each op feeds the next (C = K), plain and PDL
            **{f"chain_{name}{'_pdl' if pdl else ''}": Conv2d(
                CHAIN, "int8", sched, "h100", relu=True, pdl=pdl)
               for name, sched in (("default", None), ("tma", tma),
                                   ("split_k", {**tma, "SPLIT_K": 2}),
                                   ("cluster_split", {**tma, "SPLIT_K": 2, "SPLIT_CLUSTER": 1}),
                                   ("sync", {**wg, "MMA": "sync", "BLK_COL_WARPS": 2, "STAGES": 3}),
                                   ("persist", {**wg, "PERSIST": 1}),
                                   ("persist_tma", {**tma, "TMA": 2, "PERSIST": 1}),
                                   ("pingpong", {**tma, "TMA": 2, "PERSIST": 1, "PINGPONG": 1}))
               for pdl in (False, True)},
        }


def test_device_cases_build() -> None:
    cases = device_cases()
    assert all(op.build_result.status == "ok" for op in cases.values())


# ---- on the GPU --------------------------------------------------------------------------
def _gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # noqa: BLE001 - no CuPy / driver / device
        return False


def chain_outputs(chain: Callable[[], None], outs: list[Any], graph: bool) -> list[np.ndarray]:
    """The outputs of a chain of launches on a stream of its own, every output poisoned
    first: run once (which allocates the ops' scratch on that stream before any capture),
    then with `graph` captured in a CUDA graph and replayed three times, poisoned before each."""
    import torch

    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for y in outs:
            y.fill_(-91)
        chain()
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                chain()
            for _ in range(3):
                for y in outs:
                    y.fill_(-91)
                g.replay()
    s.synchronize()
    return [y.cpu().numpy() for y in outs]


def assert_chain_equal(chain: Callable[[], None], outs: list[Any],
                       want: list[np.ndarray]) -> None:
    """The chain gives `want` (a plain launch's outputs, which carry information to the end)
    eagerly and replayed from a CUDA graph."""
    assert len(np.unique(want[-1])) > 32, "the chain carries information to its end"
    for graph in (False, True):
        got = chain_outputs(chain, outs, graph)
        for i, (g, wv) in enumerate(zip(got, want, strict=True)):
            assert np.array_equal(g, wv), f"conv {i} of the chain differs (graph={graph})"


def on_gpu(test: Any) -> Any:
    """Marked `gpu`; skipped here too, because the GPU run may go without the conftest."""
    return pytest.mark.gpu(pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")(test))


@pytest.fixture(scope="module")
def cases() -> dict[str, Conv2d]:
    return device_cases()


def _problem(op: Conv2d, seed: int) -> ref.Problem:
    return ref.make_problem(op.shape, op.precision, seed)


def _storage_inputs(op: Conv2d, prob: ref.Problem, padded: bool = True
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Host arrays in the op's storage contract (padded channels, layout, int4 packing)."""
    cp = op.padded_channels if padded else op.shape.c
    x, w = ref.pad_channels(prob.x, cp), ref.pad_channels(prob.w, cp)
    if op.precision is Precision.INT4:
        x, w = ref.pack_int4(x), ref.pack_int4(w)
    return op.to_input_layout(x), w


def _want(op: Conv2d, prob: ref.Problem) -> np.ndarray:
    return prob.expected(op.epilogue.mode, op.epilogue.relu, op.epilogue.residual)


def _residual(op: Conv2d, prob: ref.Problem) -> tuple[np.ndarray | None, float | None]:
    """The problem's residual in the op's output storage (layout), and its scale argument."""
    if not op.epilogue.residual:
        return None, None
    res, scale = prob.residual()
    vec = 128 // (8 * res.itemsize)
    r = ref.nhwc_to_nhwcnc(res, vec) if op.layout == "nhwcnc" else res
    return np.ascontiguousarray(r), (scale if op.precision.is_integer else None)


def _got(op: Conv2d, y: np.ndarray) -> np.ndarray:
    """The op's output on the host -> NHWC values (int64 / float64)."""
    y = op.from_output_layout(y)
    if op.output_dtype == "uint8":  # int4 packed
        y = ref.unpack_int4(y)
    return y.astype(np.float64 if op.output_dtype == "float16" else np.int64)


def _assert_matches(op: Conv2d, got: np.ndarray, want: np.ndarray) -> None:
    bits = {"int32": 32, "int8": 8, "uint8": 4, "float16": 16}[op.output_dtype]
    ok, stats = ref.check_output(got, want, op.precision, bits)
    assert ok, stats


def _run_cupy(op: Conv2d, prob: ref.Problem, padded: bool = True, repeat: int = 1
              ) -> np.ndarray:
    import cupy

    x, w = _storage_inputs(op, prob, padded)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        args = [cupy.asarray(x), cupy.asarray(w),
                cupy.asarray(prob.scale) if op.needs_scale else None,
                cupy.asarray(prob.bias) if op.uses_bias else None]
        out = cupy.full(op.output_shape, 0xA5 if op.output_dtype == "uint8" else -91,
                        dtype=op.output_dtype)  # poisoned
        res, res_scale = _residual(op, prob)
        res_dev = None if res is None else cupy.asarray(res)
        for _ in range(repeat):
            y = op(*args, out=out, residual=res_dev, res_scale=res_scale)
        stream.synchronize()
        assert y is out and cupy.cuda.get_current_stream().ptr == stream.ptr
        return cupy.asnumpy(y)


def _run_torch(op: Conv2d, prob: ref.Problem, padded: bool = True) -> np.ndarray:
    import torch

    x, w = _storage_inputs(op, prob, padded)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        args = [torch.from_numpy(np.ascontiguousarray(x)).cuda(),
                torch.from_numpy(np.ascontiguousarray(w)).cuda(),
                torch.from_numpy(prob.scale).cuda() if op.needs_scale else None,
                torch.from_numpy(prob.bias).cuda() if op.uses_bias else None]
        res, res_scale = _residual(op, prob)
        y = op(*args, residual=None if res is None else torch.from_numpy(res).cuda(),
               res_scale=res_scale)
        assert isinstance(y, torch.Tensor) and tuple(y.shape) == op.output_shape
        # Work queued after the op on the caller's stream sees its result.
        y2 = y.clone()
    s.synchronize()
    return y2.cpu().numpy()


@on_gpu
@pytest.mark.parametrize("name", ["int8_acc", "int8_requant_relu", "fp16_bias_relu",
                                  "int8_nhwcnc", "int4_requant", "int8_tma_requant",
                                  "fp16_tma_stem", "int8_residual_relu",
                                  "int8_residual_split_k_nhwcnc", "int8_residual_wgmma_unpacked",
                                  "fp16_residual_relu", "fp16_residual_wgmma_unpacked",
                                  "int8_persist_residual", "fp16_persist_wgmma",
                                  "int8_persist_unpacked_acc", "int8_persist_tma_residual",
                                  "fp16_persist_tma_one_stage",
                                  "int8_plain_a_tma_store_persist_residual",
                                  "fp16_plain_a_tails", "int8_plain_a_producer_warp_split_k",
                                  "int8_halo_persist_residual", "fp16_halo_two_bands",
                                  "fp16_halo_pingpong_unpacked",
                                  "int8_swap_tma_store_persist_residual", "fp16_swap_tails",
                                  "int8_swap_acc_split_k",
                                  "int8_cluster_split_producer_warp_residual",
                                  "fp16_cluster_split_sync_four", "int8_cluster_split_swap_acc"])
def test_on_gpu_cupy_and_torch_equal_the_reference(cases: dict[str, Conv2d], name: str) -> None:
    op = cases[name]
    for seed in (1, 2):  # fresh random inputs each time
        prob = _problem(op, seed)
        want = _want(op, prob)
        _assert_matches(op, _got(op, _run_cupy(op, prob)), want)
        _assert_matches(op, _got(op, _run_torch(op, prob)), want)


@on_gpu
@pytest.mark.parametrize("name", ["concat_int8_wgmma_stride2", "concat_fp16_wgmma_persist",
                                  "concat_int8_sync_split_k_padded", "concat_fp16_sync_stride2"])
def test_on_gpu_two_inputs_equal_the_reference_of_their_concatenation(
        cases: dict[str, Conv2d], name: str) -> None:
    """x1 and x (whose pixels between the strided ones hold other values) give the one-input
    layer over their concatenation, from CuPy and torch."""
    import cupy
    import torch

    op = cases[name]
    for seed in (1, 2):
        prob = ref.make_problem(op.shape, op.precision, seed)
        x1 = prob.x1
        assert x1 is not None
        x, w = ref.pad_channels(prob.x, op.input_shape[-1]), ref.pad_channels(prob.w,
                                                                              op.padded_channels)
        want = prob.expected(op.epilogue.mode, op.epilogue.relu)
        host = (x, w, prob.scale if op.needs_scale else None, prob.bias)
        y = op(*(None if a is None else cupy.asarray(a) for a in host), x1=cupy.asarray(x1))
        _assert_matches(op, _got(op, cupy.asnumpy(y)), want)
        yt = op(*(None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda()
                  for a in host), x1=torch.from_numpy(x1).cuda())
        _assert_matches(op, _got(op, yt.cpu().numpy()), want)


@on_gpu
def test_on_gpu_split_k_repeats_and_matches(cases: dict[str, Conv2d]) -> None:
    op = cases["int8_split_k"]
    prob = _problem(op, 3)
    _assert_matches(op, _got(op, _run_cupy(op, prob, repeat=3)), _want(op, prob))


@on_gpu
@pytest.mark.parametrize("name", ["int8_stem_acc", "fp16_stem", "int8_stem_fold_sync",
                                  "fp16_stem_fold_wgmma", "int8_stem_fold_persist"])
def test_on_gpu_narrow_channels_real_and_padded(cases: dict[str, Conv2d], name: str) -> None:
    op = cases[name]
    prob = _problem(op, 4)
    want = _want(op, prob)
    for padded in (True, False):
        _assert_matches(op, _got(op, _run_cupy(op, prob, padded)), want)
        _assert_matches(op, _got(op, _run_torch(op, prob, padded)), want)


@on_gpu
def test_on_gpu_refuses_host_tensors_and_wrong_device_order(cases: dict[str, Conv2d]) -> None:
    import torch

    op = cases["int8_acc"]
    x = torch.zeros(op.input_shape, dtype=torch.int8, device="cuda")
    w = torch.zeros(op.weight_shape, dtype=torch.int8)
    with pytest.raises(ValueError, match="weight must be on a CUDA device"):
        op(x, w)
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        op(torch.zeros((2, 10, 12, 64), dtype=torch.int8, device="cuda")[..., ::2],
           w.cuda())


@on_gpu
@pytest.mark.parametrize("name", ["default", "tma", "split_k", "cluster_split", "sync",
                                  "persist", "persist_tma", "pingpong"])
def test_on_gpu_pdl_chains_equal_plain_launches_eager_and_in_a_graph(
        cases: dict[str, Conv2d], name: str) -> None:
    """Six convs, each reading the one before's output: launched with programmatic dependent
    launch they must wait for it (poisoned outputs would leak through a missing wait), eagerly
    and replayed from a CUDA graph, and give the plain launches' bytes; so too with the
    weights ready (copied before the wait where the build does: W_EARLY)."""
    import torch

    plain, pdl = cases[f"chain_{name}"], cases[f"chain_{name}_pdl"]
    assert pdl.pdl and not plain.pdl
    prob = _problem(plain, 5)
    x, w = _storage_inputs(plain, prob)
    dev = [torch.from_numpy(np.ascontiguousarray(a)).cuda()
           for a in (x, w, prob.scale, prob.bias)]
    outs = [torch.empty(plain.output_shape, dtype=torch.int8, device="cuda") for _ in range(6)]

    def chain(op: Conv2d, weight_ready: bool = False) -> None:
        h = dev[0]
        for y in outs:
            op(h, dev[1], dev[2], dev[3], out=y, weight_ready=weight_ready)
            h = y

    want = chain_outputs(lambda: chain(plain), outs, graph=False)
    _assert_matches(plain, _got(plain, want[0]), _want(plain, prob))
    assert_chain_equal(lambda: chain(pdl), outs, want)
    assert_chain_equal(lambda: chain(pdl, weight_ready=True), outs, want)
