"""Deploy-time runtime: a conv op built from a tuned schedule, run on CuPy or PyTorch tensors.

    from kernels.runtime import Conv2d
    conv = Conv2d(shape, "int8", schedule, target="h100", epilogue="requant", relu=True)
    y = conv(x, w, scale=s, bias=b)          # CuPy arrays or torch CUDA tensors, NHWC

The best tuned schedule of a service: `api.client.from_service` (this package does not
depend on the API).

Construction validates the schedule (`kernels.space`), compiles it through NVRTC with the
disk cache (`kernels.build`; no GPU needed) and computes the tensor contract. A call
validates every argument (shape, dtype, device, contiguity, alignment; a clear
ValueError/TypeError names the argument and what was expected), takes torch tensors
through DLPack (zero copy) and launches on the caller's current stream
(`torch.cuda.current_stream()` for torch tensors, `cupy.cuda.get_current_stream()` for CuPy
arrays). The launch itself is `kernels.launch`, shared with the measurement runner.

Tensor contract (storage shapes; `conv.input_shape` etc. say it for a given op):
  x  NHWC [N][H][W][Cp]  or, when the schedule's LAYOUT is "nhwcnc",
     NHWCnc [N/8][H][W][Cp/c][8][c] (`conv.to_input_layout(x_nhwc)` converts);
     Cp = C rounded up to a 16-byte channel vector (8 fp16 / 16 int8 / 32 int4 channels).
     Pass Cp channels with the extra ones zero (zero copy), or C channels and the op pads
     into its own buffer (one device copy per call; the ResNet-50 stem's C=3 is this case).
  w  KRSC [K][R][S][Cp] (or C, padded the same way; `conv.prepare_weight` pads once and
     also takes PyTorch's KCRS layout).
  scale, bias  float32 [K]: int8/int4 "requant" y = clamp(round(acc*scale[k] + bias[k]));
     fp16 "bias" adds bias[k] (None: zero). "acc" (no epilogue) writes raw int32 accumulators.
  y  NHWC [N][P][Q][K] (or NHWCnc like x) of `conv.output_dtype`: int8 / int4 packed two per
     byte (uint8) / int32 / float16; allocated in the caller's framework unless `out=` is given.
  int4 activations and weights are packed two per byte (uint8), element 2i in the low nibble.

Graph capture: call the op once on a stream before capturing it; that first call allocates the
op's per-stream scratch (split-K workspace and counters). Launches of one op on two streams
at once each get their own scratch; calls on one stream run one after another.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kernels.build import DEFAULT_EPILOGUE, BuildJob, BuildResult, Epilogue, build, cubin_path
from kernels.launch import supports_pdl
from kernels.space import (
    NHWCNC_BATCH_BLOCK,
    WGMMA_M,
    Schedule,
    ScheduleSpace,
    b2b_mask,
    b2b_problems,
    channel_vector,
    concat_problems,
    fold_tap_bytes,
    geometry,
    int4_via_s8,
    knobs_for,
    schedule_columns,
    schedule_problems,
    with_defaults,
)
from kernels.spec import (
    RESNET50_3X3,
    ConvShape,
    Precision,
    Target,
    gemm_distance,
    get_target,
    target_for_gpu_model,
)

CACHE_ENV = "TCTUNE_KERNEL_CACHE"
ALIGN = 16  # the kernel moves 16-byte vectors of x, w and y


class DefaultScheduleWarning(UserWarning):
    """An op runs a default schedule because no tuned one was given or found."""


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "tctune" / "kernels"


# ---- default schedules -------------------------------------------------------------------
# The recorded bests of ResNet-50's 3x3 layers at batch 8 are data (package data, next to
# this file): per instruction path, per precision, layer name -> schedule, in order.
DEFAULTS_FILE = Path(__file__).resolve().with_name("runtime_defaults.json")
_DEFAULTS: dict[str, Any] = json.loads(DEFAULTS_FILE.read_text())

RecordedBests = dict[str, list[tuple[str, ConvShape, Schedule]]]


def _load_recorded(path: str) -> RecordedBests:
    return {p: [(name, RESNET50_3X3[name], dict(sched)) for name, sched in layers.items()]
            for p, layers in _DEFAULTS[path]["bests"].items()}


# The exhaustively tuned mma.sync bests, measured on an NVIDIA H200 (sm_90). They are the
# starting points of every default (mma.sync runs on every target): the one of the nearest
# GEMM shape is taken, adapted to the target's rules.
RECORDED_BESTS: RecordedBests = _load_recorded("mma.sync")

# The same layers' bests on the warpgroup path (MMA=wgmma, sm_90a: H100/H200, int8 and fp16),
# measured on an NVIDIA H100. On sm_90 they come before the mma.sync bests. A later search
# replaces an entry only where it is faster by more than the run-to-run spread (~1%): fp16
# stage2/3 keep the schedules first recorded (the later picks tied them), which had been
# validated as defaults for other shapes.
WGMMA_BESTS: RecordedBests = _load_recorded("wgmma")


def recorded_bests(precision: Precision, target: Target, wgmma: bool = True
                   ) -> list[tuple[str, str, ConvShape, Schedule]]:
    """(instruction path, layer, shape, schedule) of the recorded bests a default may start
    from on this target: the wgmma ones first where the target runs wgmma (and `wgmma`)."""
    key = "int8" if precision.is_integer else "fp16"
    rows = [("mma.sync", *row) for row in RECORDED_BESTS[key]]
    if wgmma and target.sm == 90 and precision in (Precision.INT8, Precision.FP16):
        rows = [("wgmma", *row) for row in WGMMA_BESTS[key]] + rows
    return rows


def _load_few_channels() -> dict[str, Schedule]:
    return {p: dict(sched) for p, sched in _DEFAULTS["few_channels"]["bests"].items()}


def _load_one_by_one() -> dict[str, list[tuple[ConvShape, Schedule]]]:
    bests = _DEFAULTS["one_by_one"]["bests"]
    return {p: [(ConvShape.from_dict(b["shape"]), dict(b[p])) for b in bests]
            for p in ("int8", "fp16")}


# ResNet-50's 1x1 layers' searched bests (the H100's wgmma path): a 1x1 layer's default on
# that path is the best of the nearest of them (GEMM shape) with its stride, where it fits and
# lies within ONE_BY_ONE_REACH octaves (summed over M, N and K), before the 3x3 bests. Over
# the zoo's 1x1 layers (bench/RESULTS.md "Runtime defaults") the layers within reach took
# 0.88x the time of stage3's best (geomean; 5 of 82 slower by more than 5%, worst 1.16x);
# at any distance it was 0.93x with 42 of 246 slower, up to 1.57x (the narrow expansions of
# MobileNet and EfficientNet).
ONE_BY_ONE_BESTS = _load_one_by_one()
ONE_BY_ONE_REACH = 1.5


# A stem's searched best (ResNet-50's conv1 on the H100's wgmma path): the default of a layer
# with few input channels on that path before any 3x3 best with folded taps, where the
# layer has at least one of its 256-row tiles of output pixels. On the zoo's stems it took
# 0.47-0.81x the time of stage3's best folded, on squeeze-excitation layers (8 pixels)
# 0.99-1.35x: those keep stage3's (bench/RESULTS.md "Runtime defaults").
FEW_CHANNELS_BESTS: dict[str, Schedule] = _load_few_channels()


# The default for a layer that is none of the four: stage3's best. Over the other 19 conv
# shapes of ResNet-50 (batch 8, H200, bench/data/resnet50_e2e.json) it ran at a geometric
# mean of 1.09x (int8) / 1.20x (fp16) of each layer's searched best; the recorded best of
# the nearest GEMM shape, the first rule, gave 1.23x / 1.24x. On the wgmma path (H100,
# bench/data/runtime_defaults_h100.json) stage3's best is again the best default for the 23
# shapes together (network time; 1.10x / 1.09x of the best of the four per shape).
PREFERRED_DEFAULT = "stage3"


def _adapt(schedule: Mapping[str, Any], precision: Precision, target: Target) -> Schedule:
    """A recorded schedule made structurally right for another precision / arch."""
    s = dict(schedule)
    if "SPLIT" in knobs_for(precision):
        s.setdefault("SPLIT", "scaled3")
    if target.sm < 80 or int4_via_s8(precision, target.sm):
        s["STAGES"] = min(int(s["STAGES"]), 2)  # register-staged pipelines: 2 stages at most
    return s


def _epilogue_smem_ok(shape: ConvShape, precision: Precision, target: Target,
                      cols: Mapping[str, np.ndarray], epilogue: Epilogue) -> np.ndarray:
    """`is_valid` sizes shared memory for the tuned (requantized) output; raw int32 output
    stages wider tiles, a residual with PACK_OUT a second tile, and a back-to-back conv its
    weights and output tile, which must fit too (and the b2b its rule: b2b_mask)."""
    b2b = epilogue.b2b or shape.b2b
    g = geometry(shape, precision, target, cols, out_bits=epilogue.out_bits(precision),
                 residual=epilogue.residual, b2b=b2b)
    return np.asarray(g.smem_bytes <= target.smem_per_block_kib * 1024) & \
        b2b_mask(shape, precision, target.sm, cols, b2b, g)


def schedule_fits(shape: ConvShape, precision: Precision, target: Target,
                  schedule: Mapping[str, Any], epilogue: Epilogue = DEFAULT_EPILOGUE
                  ) -> str | None:
    """None if the schedule can build and launch for this layer and epilogue, else why not."""
    p = Precision(precision)
    probs = schedule_problems(p, schedule)
    if probs:
        return "; ".join(f"{k}: {v}" for k, v in probs)
    why = concat_problems(shape, p, target.sm, schedule)  # two inputs: the clearer reason
    if why:
        return why
    epi = epilogue.resolved(p)
    b2b = epi.b2b or shape.b2b
    if b2b:  # a back-to-back conv: the clearer reason too
        s = with_defaults(p, schedule)
        why = b2b_problems(shape, p, target.sm, s, b2b, geometry(
            shape, p, target, schedule_columns(s), residual=epi.residual, b2b=b2b))
        if why:
            return why
    space = ScheduleSpace(shape, p, target)
    if not space.is_valid(schedule):
        cols = space.columns(np.array([space.index_of(schedule)]))
        smem = int(geometry(shape, p, target, cols).smem_bytes[0])
        if smem > target.smem_per_block_kib * 1024:
            return (f"needs {smem} bytes of shared memory; {target.name} allows "
                    f"{target.smem_per_block_kib * 1024}")
        return ("breaks a rule of kernels.space.validity (registers per thread, pipeline "
                "stages on this arch, or NHWCnc needs N % 8 == 0 and whole channel vectors)")
    cols = space.columns(np.array([space.index_of(schedule)]))
    if not _stores_ok(cols, epilogue.resolved(p), p)[0]:
        return (f"PACK_OUT=2 (TMA stores) writes int8 or fp16 outputs, not the "
                f"{epilogue.resolved(p).mode!r} epilogue's 32-bit values")
    if not _epilogue_smem_ok(shape, p, target, cols, epilogue.resolved(p))[0]:
        return f"its {epilogue.resolved(p).mode!r} epilogue tile does not fit in shared memory"
    return None


def _stores_ok(cols: Mapping[str, np.ndarray], epilogue: Epilogue,
               precision: Precision) -> np.ndarray:
    """`is_valid` admits TMA stores for the tuned 8- or 16-bit output; raw 32-bit outputs
    leave the kernel from registers (conv.cu static_asserts)."""
    return (np.asarray(cols["PACK_OUT"]) != 2) | (epilogue.out_bits(precision) != 32)


def default_schedule(shape: ConvShape, precision: Precision | str, target: Target | str,
                     epilogue: Epilogue = DEFAULT_EPILOGUE, wgmma: bool = True
                     ) -> tuple[Schedule, str]:
    """A sound schedule for a layer nobody tuned, and where it came from.

    On the wgmma path, a layer with few input channels and at least 256 output pixels: the
    recorded best of ResNet-50's stem where it fits; another 1x1 layer: the recorded best
    of the nearest of ResNet-50's 1x1 layers with its stride that fits, within
    ONE_BY_ONE_REACH. Otherwise on each
    instruction path in turn (wgmma first on sm_90 unless `wgmma` is False, then mma.sync):
    the recorded best (ResNet-50 3x3, batch 8) of the same layer, else stage3's (see
    PREFERRED_DEFAULT), else that of the nearest GEMM shape, the first of them valid here;
    if none is, the valid schedule that differs from the first in the fewest knobs.
    """
    p = Precision(precision)
    t = get_target(target) if isinstance(target, str) else target
    epi = epilogue.resolved(p)
    rows = recorded_bests(p, t, wgmma)
    paths = list(dict.fromkeys(path for path, *_ in rows))
    ranked = sorted(rows, key=lambda row: (paths.index(row[0]), row[2] != shape,
                                           row[1] != PREFERRED_DEFAULT,
                                           gemm_distance(row[2], shape)))
    if fold_tap_bytes(shape, p) and paths[0] == "wgmma":
        stem = _adapt(FEW_CHANNELS_BESTS["int8" if p.is_integer else "fp16"], p, t)
        tile_rows = stem["BLK_ROW_WARPS"] * stem["WARP_ROW_TILES"] * WGMMA_M
        if shape.gemm_m >= tile_rows and schedule_fits(shape, p, t, stem, epi) is None:
            return stem, "recorded best of ResNet-50 conv1 (wgmma, H100, batch 8), taps folded"
    if (shape.r, shape.s) == (1, 1) and not fold_tap_bytes(shape, p) and paths[0] == "wgmma":
        near = sorted((row for row in ONE_BY_ONE_BESTS["int8" if p.is_integer else "fp16"]
                       if row[0].stride == shape.stride
                       and gemm_distance(row[0], shape) <= ONE_BY_ONE_REACH),
                      key=lambda row: (gemm_distance(row[0], shape), row[0].key()))
        for other, sched in near:
            cand = _adapt(sched, p, t)
            if schedule_fits(shape, p, t, cand, epi) is None:
                return cand, (f"recorded best of ResNet-50's 1x1 {other.key()} (wgmma, H100, "
                              "batch 8)")
    for path, name, _, sched in ranked:
        s = _adapt(sched, p, t)
        # A layer with few channels (the stem) folds its taps where the schedule allows: the
        # same tiles do 4-11x fewer multiply-adds than with each tap padded to a vector.
        tries = [({**s, "FOLD_TAPS": 1, "REORDER_INNER": 0}, ", taps folded")] \
            if fold_tap_bytes(shape, p) else []
        for cand, how in [*tries, (s, "")]:
            if schedule_fits(shape, p, t, cand, epi) is None:
                gpu = "H100" if path == "wgmma" else "H200"
                return cand, f"recorded best of ResNet-50 {name} ({path}, {gpu}, batch 8){how}"
    ranked = [row for row in ranked if row[0] == "mma.sync"]  # runs on every target
    _, name, _, sched = ranked[0]
    pref = _adapt(sched, p, t)
    space = ScheduleSpace(shape, p, t)
    idx = space.valid_indices
    if len(idx):
        cols = space.columns(idx)
        idx = idx[_epilogue_smem_ok(shape, p, t, cols, epi) & _stores_ok(cols, epi, p)]
    if not len(idx):
        raise ValueError(f"no schedule of the space is valid for {shape.key()} {p.value} "
                         f"on {t.name}")
    want = space.digits(np.array([space.index_of(pref)]))[0]
    changed = (space.digits(idx) != want).sum(axis=1)
    best = int(idx[int(np.argmin(changed))])
    return (space.schedule_at(best),
            f"nearest valid schedule to the recorded best of ResNet-50 {name} "
            f"({int(changed.min())} knobs changed)")


# ---- tensor contract ---------------------------------------------------------------------
def _storage(channels: int, bits: int) -> int:
    """Elements of storage for `channels` values (int4: two per byte)."""
    return channels // 2 if bits == 4 else channels


def _dtype_for(bits: int, precision: Precision) -> str:
    if bits == 4:
        return "uint8"
    if bits == 8:
        return "int8"
    if bits == 16:
        return "float16"
    return "int32" if precision.is_integer else "float32"


@dataclass(frozen=True)
class TensorSpec:
    """What one argument must be: storage shape(s) accepted and dtype(s)."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    what: str  # the layout in words, for error messages

    def describe_shapes(self) -> str:
        return " or ".join(str(s) for s in self.shapes)


def _framework(t: Any) -> str:
    mod = type(t).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    return mod.split(".")[0] or "unknown"


def _dtype_name(t: Any) -> str:
    d = t.dtype
    name = getattr(d, "name", None)  # numpy / CuPy dtypes
    if isinstance(name, str):
        return name
    return str(d).removeprefix("torch.")  # torch.int8 -> int8


def _is_contiguous(t: Any, fw: str) -> bool:
    if fw == "torch":
        return bool(t.is_contiguous())
    flags = getattr(t, "flags", None)
    return bool(flags["C_CONTIGUOUS"]) if flags is not None else True


def _device_of(t: Any, fw: str) -> int | None:
    """CUDA device index, or None when the tensor is not on a GPU."""
    if fw == "torch":
        return int(t.device.index) if t.device.type == "cuda" else None
    if fw == "cupy":
        return int(t.device.id)
    return None


def _data_ptr(t: Any, fw: str) -> int:
    return int(t.data_ptr()) if fw == "torch" else int(t.data.ptr)


def check_tensor(t: Any, spec: TensorSpec, framework: str | None = None,
                 device: int | None = None, align: int = ALIGN) -> tuple[str, int]:
    """Validate one argument against its spec; returns (framework, device).

    Raises TypeError (not an array of a supported framework, mixed frameworks, wrong dtype)
    or ValueError (shape, device, contiguity, alignment), naming the argument."""
    fw = _framework(t)
    if fw not in ("torch", "cupy"):
        raise TypeError(f"{spec.name} must be a CuPy array or a PyTorch CUDA tensor, got "
                        f"{type(t).__module__}.{type(t).__name__}")
    if framework is not None and fw != framework:
        raise TypeError(f"{spec.name} is a {fw} array but x is a {framework} one: pass every "
                        f"tensor of a call from one framework")
    dt = _dtype_name(t)
    if dt not in spec.dtypes:
        raise TypeError(f"{spec.name} must have dtype {' or '.join(spec.dtypes)}, got {dt}")
    shape = tuple(int(v) for v in t.shape)
    if shape not in spec.shapes:
        raise ValueError(f"{spec.name} must have shape {spec.describe_shapes()} ({spec.what}), "
                         f"got {shape}")
    dev = _device_of(t, fw)
    if dev is None:
        raise ValueError(f"{spec.name} must be on a CUDA device, got {t.device}")
    if device is not None and dev != device:
        raise ValueError(f"{spec.name} is on cuda:{dev} but x is on cuda:{device}")
    if not _is_contiguous(t, fw):
        raise ValueError(f"{spec.name} must be C-contiguous ({spec.what}); a permuted or "
                         f"strided view is not (call .contiguous() / cupy.ascontiguousarray)")
    if _data_ptr(t, fw) % align:
        raise ValueError(f"{spec.name} must start on a {align}-byte boundary (is it a view at "
                         f"an offset?); pass a freshly allocated tensor")
    return fw, dev


def _to_blocked(t: Any, vector: int) -> Any:
    """[N][H][W][C] -> [N/8][H][W][C/v][8][v], for torch, CuPy or numpy arrays."""
    n, h, w, c = (int(v) for v in t.shape)
    nb = NHWCNC_BATCH_BLOCK
    if n % nb or c % vector:
        raise ValueError(f"NHWCnc needs N % {nb} == 0 and C % {vector} == 0, got {tuple(t.shape)}")
    v = t.reshape(n // nb, nb, h, w, c // vector, vector)
    perm = (0, 2, 3, 4, 1, 5)
    if hasattr(v, "permute"):
        return v.permute(*perm).contiguous()
    return v.transpose(perm).copy()


def _from_blocked(t: Any) -> Any:
    """[N/8][H][W][C/v][8][v] -> [N][H][W][C]."""
    nb8, h, w, cb, nb, cv = (int(v) for v in t.shape)
    perm = (0, 4, 1, 2, 3, 5)
    v = t.permute(*perm).contiguous() if hasattr(t, "permute") else t.transpose(perm).copy()
    return v.reshape(nb8 * nb, h, w, cb * cv)


# ---- the op ------------------------------------------------------------------------------
def _resolve_target(target: Target | str | None) -> Target:
    if isinstance(target, Target):
        return target
    if target is not None:
        return get_target(target)
    try:
        import cupy

        dev = cupy.cuda.Device().id
        name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
    except Exception as e:  # no CuPy, no driver, no GPU
        raise ValueError(f"target=None means 'this GPU', but none could be queried ({e!r}); "
                         f"name one: {', '.join(_target_names())}") from None
    name = name.decode() if isinstance(name, bytes) else str(name)
    t = target_for_gpu_model(name)
    if t is None:
        raise ValueError(f"GPU {name!r} is not a known target; name one: "
                         f"{', '.join(_target_names())}")
    return t


def _target_names() -> list[str]:
    from kernels.spec import TARGETS

    return list(TARGETS)


class Conv2d:
    """A tuned conv layer: `y = conv(x, weight, scale=None, bias=None, out=None)`.

    shape      the layer (ConvShape: NHWC activations, KRSC weights, groups=1); with
               shape.concat = n > 0 two inputs, `conv(x, w, ..., x1=x1)`: x1 [N][P][Q][n] at
               the output's resolution holds the first n of shape.c channels (weights
               [K][1][1][C] as for one input) and x the other shape.c - n, read at the
               layer's stride (a ResNet bottleneck's last conv with its projection shortcut;
               kernels.space.concat_problems says which schedules)
    precision  "int8", "fp16", "int4" (or "fp32_tc" where the kernel supports it)
    schedule   a tuned schedule (knob -> value); None: a default with a DefaultScheduleWarning
    target     "h100", a Target, or None for the current GPU (needs CuPy and a GPU)
    epilogue   "requant" (int: int8/int4 out) / "bias" (fp16) / "acc" (int32 accumulators,
               or plain fp16) / "default" (requant or bias), or an `Epilogue`
    relu       clamp at zero in the epilogue
    residual   add a tensor of the output's shape in the epilogue (int8 requant: times
               `res_scale`; fp16 bias): `conv(x, w, scale, bias, residual=r, res_scale=s)`
               An `Epilogue` with `b2b` = n > 0 also runs a 1x1 conv of n output channels
               over the output in the same kernel (kernels/b2b.cuh; int8 requant, fp16
               bias; kernels.space.b2b_problems says which schedules):
               `y, y2 = conv(x, w, scale, bias, b2b=(w2, scale2, bias2))`, w2 [n][K] of
               x's type, scale2 (int8; None for fp16) and bias2 float32 [n], y2 [N][P][Q][n]
    pdl        launch with programmatic dependent launch (sm_90 targets): the kernel may be
               scheduled while the kernel before it on the stream finishes, and waits in its
               prologue for that kernel's writes; saves the launch gap between consecutive
               kernels (a whole model's convs), changes nothing else
    residual_ready  (with pdl and a residual) every call's residual was complete before the
               kernel just before this one on the stream started (a ResNet block's input, two
               convs back): a kernel that copies its residual tile ahead of its main loop
               copies it while it waits for that kernel
    x_ready    (with pdl and two inputs) the same of every call's x (a bottleneck's input,
               three convs back, beside the conv before's output as x1): the kernel reduces
               over x's channels while it waits for the kernel before
    cache_dir  where cubins are built and kept (default $TCTUNE_KERNEL_CACHE or
               ~/.cache/tctune/kernels)
    """

    def __init__(self, shape: ConvShape, precision: Precision | str,
                 schedule: Mapping[str, Any] | None = None, target: Target | str | None = None,
                 *, epilogue: Epilogue | str = "default", relu: bool = False,
                 residual: bool = False, pdl: bool = False, residual_ready: bool = False,
                 x_ready: bool = False, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.shape = shape
        self.concat = shape.concat
        self.precision = Precision(precision)
        self.target = _resolve_target(target)
        p, t = self.precision, self.target
        epi = epilogue if isinstance(epilogue, Epilogue) else \
            Epilogue("acc" if epilogue == "none" else epilogue, relu, residual)
        if shape.residual:  # a layer tuned with its residual adds it (ConvShape.residual)
            epi = replace(epi, residual=True)
        self.epilogue = epi.resolved(p)
        if pdl and not supports_pdl(t.sm):
            raise ValueError(f"pdl (programmatic dependent launch) needs an sm_90 target, not "
                             f"sm_{t.sm}")
        if residual_ready and not (pdl and self.epilogue.residual):
            raise ValueError("residual_ready says when the residual may be read under "
                             "programmatic dependent launch: it needs pdl=True and a residual "
                             "epilogue")
        if x_ready and not (pdl and shape.concat):
            raise ValueError("x_ready says when x may be read under programmatic dependent "
                             "launch: it needs pdl=True and a layer over two inputs")
        problems = shape.problems(p, t)
        if problems:
            raise ValueError(f"layer {shape.key()} cannot run as {p.value}: "
                             + "; ".join(f"{k}: {v}" for k, v in problems))
        if schedule is None:
            sched, src = default_schedule(shape, p, t, self.epilogue)
            warnings.warn(f"no tuned schedule for {shape.key()} {p.value} on {t.name}: using "
                          f"the default ({src}); tune the layer (tctune tune / POST /tune) "
                          f"for its best", DefaultScheduleWarning, stacklevel=2)
            self.schedule: Schedule = sched
            self.schedule_source = f"default: {src}"
        else:
            why = schedule_fits(shape, p, t, schedule, self.epilogue)
            if why:
                raise ValueError(f"schedule is not valid for {shape.key()} {p.value} on "
                                 f"{t.name}: {why}")
            self.schedule = dict(schedule)
            self.schedule_source = "given"
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        res: BuildResult = build(BuildJob(shape, p, t.sm, self.schedule, self.epilogue),
                                 self.cache_dir)
        if res.status != "ok":
            raise RuntimeError(f"building {shape.key()} {p.value} for sm_{t.sm} failed: "
                               f"{res.log[-3000:]}")
        self.build_result = res
        self.key = res.key
        self.meta = res.meta
        self.pdl, self.residual_ready, self.x_ready = pdl, residual_ready, x_ready
        self.layout: str = self.schedule["LAYOUT"]
        self._init_contract()
        self._fns: dict[int, tuple[Any, Any]] = {}
        self._scratch: dict[tuple[int, int], dict[str, Any]] = {}
        self._streams: dict[int, Any] = {}

    # ---- contract ------------------------------------------------------------------------
    def _init_contract(self) -> None:
        sh, p = self.shape, self.precision
        in_bits, out_bits = p.input_bits, int(self.meta["out_bits"])
        self.padded_channels = cp = int(self.meta["c_padded"])
        self.input_dtype = _dtype_for(in_bits, p)
        self.output_dtype = _dtype_for(out_bits, p)
        in_dtypes = (self.input_dtype, "int8") if in_bits == 4 else (self.input_dtype,)
        cv = channel_vector(p)
        nb = NHWCNC_BATCH_BLOCK
        if self.layout == "nhwcnc":
            self.input_shape = (sh.n // nb, sh.h, sh.w, cp // cv, nb, _storage(cv, in_bits))
            co = 128 // out_bits
            self.output_shape = (sh.n // nb, sh.p, sh.q, sh.k // co, nb, _storage(co, out_bits))
            x_shapes = (self.input_shape,)
            what_x, what_y = "NHWCnc [N/8][H][W][C/c][8][c]", "NHWCnc [N/8][P][Q][K/c][8][c]"
        else:
            cx = self.concat  # x1's channels come first; x holds the rest
            self.input_shape = (sh.n, sh.h, sh.w, _storage(cp - cx, in_bits))
            self.output_shape = (sh.n, sh.p, sh.q, _storage(sh.k, out_bits))
            x_shapes = (self.input_shape,)
            if cp != sh.c:
                x_shapes += ((sh.n, sh.h, sh.w, _storage(sh.c - cx, in_bits)),)
            what_x = (f"NHWC, channels zero-padded to {cp - cx}" if cp != sh.c else "NHWC")
            what_y = "NHWC"
        self.weight_shape = (sh.k, sh.r, sh.s, _storage(cp, in_bits))
        w_shapes = (self.weight_shape,)
        if cp != sh.c:
            w_shapes += ((sh.k, sh.r, sh.s, _storage(sh.c, in_bits)),)
        unit = " (int4 packed two per byte)" if in_bits == 4 else ""
        self.specs = {
            "x": TensorSpec("x", x_shapes, in_dtypes, what_x + unit),
            "weight": TensorSpec("weight", w_shapes, in_dtypes,
                                 f"KRSC, channels zero-padded to {cp}{unit}" if cp != sh.c
                                 else f"KRSC{unit}"),
            "scale": (TensorSpec("scale", ((2,),), ("float32",),
                                 "{max|x|, max|w|} (or upper bounds): the power-of-two scaling "
                                 "of the fp16 split")
                      if self.precision is Precision.FP32_TC else
                      TensorSpec("scale", ((sh.k,),), ("float32",), "one per output channel")),
            "bias": TensorSpec("bias", ((sh.k,),), ("float32",), "one per output channel"),
            "out": TensorSpec("out", (self.output_shape,), (self.output_dtype,), what_y),
            "residual": TensorSpec("residual", (self.output_shape,), (self.output_dtype,),
                                   what_y + " (the output's shape and type)"),
            "x1": TensorSpec("x1", ((sh.n, sh.p, sh.q, _storage(self.concat, in_bits)),),
                             in_dtypes, "NHWC at the output's resolution: the first "
                             f"{self.concat} channels"),
        }
        n2 = self.epilogue.b2b
        if n2:
            self.b2b_output_shape = (sh.n, sh.p, sh.q, n2)
            self.specs.update({
                "b2b_weight": TensorSpec("b2b_weight", ((n2, sh.k),), (self.input_dtype,),
                                         "the back-to-back 1x1 conv's [n][K]"),
                "b2b_scale": TensorSpec("b2b_scale", ((n2,),), ("float32",),
                                        "one per back-to-back output channel"),
                "b2b_bias": TensorSpec("b2b_bias", ((n2,),), ("float32",),
                                       "one per back-to-back output channel"),
                "b2b_out": TensorSpec("b2b_out", (self.b2b_output_shape,),
                                      (self.output_dtype,), "NHWC"),
            })

    @property
    def needs_scale(self) -> bool:
        return self.precision.is_integer and self.epilogue.mode == "requant"

    @property
    def uses_bias(self) -> bool:
        return self.epilogue.mode in ("requant", "bias")

    def validate(self, x: Any, weight: Any, scale: Any = None, bias: Any = None,
                 out: Any = None, residual: Any = None, res_scale: float | None = None,
                 x1: Any = None, b2b: tuple[Any, Any, Any] | None = None,
                 b2b_out: Any = None) -> tuple[str, int]:
        """Check every argument of a call (no GPU work); returns (framework, device)."""
        fw, dev = check_tensor(x, self.specs["x"])
        self._validate_b2b(b2b, b2b_out, fw, dev)
        if self.concat:
            if x1 is None:
                raise ValueError("x1 is required: this op reads two inputs "
                                 f"({self.specs['x1'].describe_shapes()})")
            check_tensor(x1, self.specs["x1"], fw, dev)
        elif x1 is not None:
            raise ValueError("this op reads one input (x1 is for layers with shape.concat)")
        if self.epilogue.residual:
            if residual is None:
                raise ValueError("residual is required: this op's epilogue adds it "
                                 f"({self.specs['residual'].describe_shapes()})")
            check_tensor(residual, self.specs["residual"], fw, dev)
            if self.precision.is_integer:
                if res_scale is None or not math.isfinite(float(res_scale)):
                    raise ValueError("res_scale is required: a finite float, the int8 "
                                     "residual's scale (y = acc*scale + bias + res*res_scale)")
            elif res_scale is not None:
                raise ValueError("res_scale is for int8 residuals; an fp16 residual is added "
                                 "as it is: pass None")
        elif residual is not None or res_scale is not None:
            raise ValueError("this op has no residual epilogue: build it with residual=True")
        check_tensor(weight, self.specs["weight"], fw, dev)
        if scale is None and self.needs_scale:
            raise ValueError("scale is required: the requant epilogue computes "
                             "clamp(round(acc*scale[k] + bias[k])) (float32 [K])")
        if scale is not None and self.precision is Precision.FP32_TC:
            check_tensor(scale, self.specs["scale"], fw, dev, align=4)
        elif scale is not None:
            if not self.needs_scale:
                raise ValueError(f"scale is not used by the {self.epilogue.mode!r} epilogue of "
                                 f"{self.precision.value}; pass None")
            check_tensor(scale, self.specs["scale"], fw, dev, align=4)
        if bias is not None:
            if not self.uses_bias:
                raise ValueError(f"bias is not used by the {self.epilogue.mode!r} epilogue; "
                                 f"build the op with epilogue='bias'/'requant' or pass None")
            check_tensor(bias, self.specs["bias"], fw, dev, align=4)
        if out is not None:
            check_tensor(out, self.specs["out"], fw, dev)
        return fw, dev

    def _validate_b2b(self, b2b: tuple[Any, Any, Any] | None, b2b_out: Any, fw: str,
                      dev: int) -> None:
        if not self.epilogue.b2b:
            if b2b is not None or b2b_out is not None:
                raise ValueError("this op runs no back-to-back conv: build it with an Epilogue "
                                 "whose b2b is the back-to-back conv's output channels")
            return
        if b2b is None or len(b2b) != 3:
            raise ValueError("b2b is required: (weight [n][K], scale [n] or None for fp16, "
                             "bias [n]) of the back-to-back 1x1 conv")
        w2, s2, b2 = b2b
        check_tensor(w2, self.specs["b2b_weight"], fw, dev)
        if self.precision.is_integer:
            if s2 is None:
                raise ValueError("the back-to-back int8 conv requantizes: its scale is required")
            check_tensor(s2, self.specs["b2b_scale"], fw, dev, align=4)
        elif s2 is not None:
            raise ValueError("the back-to-back fp16 conv has no scale: pass None")
        check_tensor(b2, self.specs["b2b_bias"], fw, dev, align=4)
        if b2b_out is not None:
            check_tensor(b2b_out, self.specs["b2b_out"], fw, dev)

    # ---- helpers for callers -------------------------------------------------------------
    def to_input_layout(self, x_nhwc: Any) -> Any:
        """NHWC storage [N][H][W][Cp] -> what this op reads (NHWCnc when the schedule says so)."""
        if self.layout != "nhwcnc":
            return x_nhwc
        return _to_blocked(x_nhwc, self.input_shape[-1])

    def from_output_layout(self, y: Any) -> Any:
        """This op's output -> NHWC storage [N][P][Q][K]."""
        return _from_blocked(y) if self.layout == "nhwcnc" else y

    def prepare_weight(self, w: Any, layout: str = "krsc") -> Any:
        """Weights as the kernel reads them (KRSC, channels zero-padded), once: a new
        contiguous tensor of the same framework. layout "kcrs" is PyTorch's conv weight."""
        fw = _framework(w)
        if layout == "kcrs":
            if self.precision.input_bits == 4:
                raise ValueError("int4 weights come packed in KRSC; kcrs is not supported")
            w = w.permute(0, 2, 3, 1) if fw == "torch" else w.transpose(0, 2, 3, 1)
        elif layout != "krsc":
            raise ValueError(f"layout must be 'krsc' or 'kcrs', got {layout!r}")
        want = self.weight_shape
        shape = tuple(int(v) for v in w.shape)
        if shape[:3] != want[:3] or shape[3] > want[3]:
            raise ValueError(f"weight must have shape {want[:3]} + (channels <= {want[3]},) "
                             f"after the layout change, got {shape}")
        if fw == "torch":
            import torch

            w = w.detach()
            buf = torch.zeros(want, dtype=w.dtype, device=w.device)
        else:
            import cupy

            buf = cupy.zeros(want, dtype=w.dtype)
        buf[..., : shape[3]] = w
        return buf

    # ---- launch --------------------------------------------------------------------------
    def _function(self, dev: int) -> Any:
        if dev not in self._fns:
            from kernels.launch import load_function

            self._fns[dev] = load_function(cubin_path(self.cache_dir, self.key), self.meta)
        return self._fns[dev][1]

    def _scratch_for(self, dev: int, stream_ptr: int) -> dict[str, Any]:
        k = (dev, stream_ptr)
        if k not in self._scratch:
            import cupy

            from kernels.launch import alloc_scratch

            ws, counters = alloc_scratch(self.meta)
            self._scratch[k] = {"ws": ws, "counters": counters,
                                "zeros_k": cupy.zeros(self.shape.k, dtype=cupy.float32)}
        return self._scratch[k]

    def _padded(self, scratch: dict[str, Any], name: str, a: Any, full: tuple[int, ...]) -> Any:
        """A narrow-channel tensor copied into the op's zero-padded buffer (per stream)."""
        if tuple(a.shape) == full:
            return a
        import cupy

        buf = scratch.get(name)
        if buf is None:
            buf = scratch[name] = cupy.zeros(full, dtype=a.dtype)
        buf[..., : a.shape[-1]] = a
        return buf

    def _enqueue(self, dev: int, stream_ptr: int, x: Any, w: Any, scale: Any, bias: Any,
                 y: Any, res: Any = None, res_scale: float | None = None,
                 x1: Any = None, b2b: tuple[Any, Any, Any, Any] | None = None,
                 weight_ready: bool = False) -> None:
        """Launch on CuPy's current stream (the caller's), all arguments CuPy arrays."""
        from kernels.launch import launch

        fn = self._function(dev)
        sc = self._scratch_for(dev, stream_ptr)
        xp = self._padded(sc, "x_pad", x, self.input_shape)
        wp = self._padded(sc, "w_pad", w, self.weight_shape)
        # A padded copy is written just before the launch: not ready then.
        x_ready = self.x_ready and xp is x
        w_ready = self.pdl and weight_ready and wp is w
        x, w = xp, wp
        zeros = sc["zeros_k"]
        if scale is None and self.precision is Precision.FP32_TC:
            # The kernel scales both operands by powers of two from {max|x|, max|w|}: without
            # them values beyond fp16's range would overflow. One reduction each, on the
            # caller's stream; pass `scale` (bounds) to skip it.
            import cupy

            scale = cupy.stack([cupy.abs(x).max(), cupy.abs(w).max()]).astype(cupy.float32)
        if b2b is not None and b2b[1] is None:  # fp16: no scale is read
            b2b = (b2b[0], b2b[2], b2b[2], b2b[3])
        launch(fn, self.meta, x, w, zeros if scale is None else scale,
               zeros if bias is None else bias, y, sc["ws"], sc["counters"], res,
               1.0 if res_scale is None else float(res_scale), pdl=self.pdl, x1=x1,
               w_ready=w_ready, res_ready=self.residual_ready, x_ready=x_ready, b2b=b2b)

    def _stream(self, ptr: int) -> Any:
        import cupy

        if ptr == 0:
            return cupy.cuda.Stream.null
        if ptr not in self._streams:
            with warnings.catch_warnings():
                # CuPy 14 deprecates ExternalStream for Stream.from_external(obj with
                # __cuda_stream__); a raw pointer is what torch gives us, and what we tested.
                warnings.simplefilter("ignore", DeprecationWarning)
                self._streams[ptr] = cupy.cuda.ExternalStream(ptr)
        return self._streams[ptr]

    def __call__(self, x: Any, weight: Any, scale: Any = None, bias: Any = None, *,
                 residual: Any = None, res_scale: float | None = None, out: Any = None,
                 x1: Any = None, b2b: tuple[Any, Any, Any] | None = None,
                 b2b_out: Any = None, weight_ready: bool = False) -> Any:
        """The output; with a back-to-back conv (`b2b`: its weight, scale, bias), the output and
        the back-to-back conv's output. `weight_ready` (with pdl; else it changes nothing):
        `weight`, as the kernel reads it (`prepare_weight`'s), was complete before the kernel
        just before this one on the stream started (not written just before this call): the
        kernel copies its first stages' weights while it waits for that kernel."""
        fw, dev = self.validate(x, weight, scale, bias, out, residual, res_scale, x1, b2b,
                                b2b_out)
        import cupy

        if fw == "cupy":
            with cupy.cuda.Device(dev):
                stream = cupy.cuda.get_current_stream()
                y = out if out is not None else cupy.empty(self.output_shape,
                                                           dtype=self.output_dtype)
                y2 = None
                if b2b is not None:
                    y2 = b2b_out if b2b_out is not None else cupy.empty(
                        self.b2b_output_shape, dtype=self.output_dtype)
                self._enqueue(dev, int(stream.ptr), x, weight, scale, bias, y, residual,
                              res_scale, x1, None if y2 is None else (*b2b, y2), weight_ready)
            return y if y2 is None else (y, y2)
        import torch

        with torch.cuda.device(dev):
            ptr = int(torch.cuda.current_stream(dev).cuda_stream)
            dtype = getattr(torch, self.output_dtype)
            y = out if out is not None else torch.empty(self.output_shape, dtype=dtype,
                                                        device=x.device)
            y2 = None
            if b2b is not None:
                y2 = b2b_out if b2b_out is not None else torch.empty(
                    self.b2b_output_shape, dtype=dtype, device=x.device)
            # CuPy's current stream = torch's: the DLPack exchange then inserts no
            # cross-stream wait, and the launch is ordered with the caller's torch work.
            with cupy.cuda.Device(dev), self._stream(ptr):
                def dl(a: Any) -> Any:
                    return None if a is None else cupy.from_dlpack(a.detach())

                arrs = [dl(a) for a in (x, weight, scale, bias, y, residual)]
                ch = None if y2 is None else tuple(dl(a) for a in (*b2b, y2))
                self._enqueue(dev, ptr, *arrs, res_scale, dl(x1), ch, weight_ready)
        return y if y2 is None else (y, y2)

    def __repr__(self) -> str:
        return (f"Conv2d({self.shape.key()}, {self.precision.value}, {self.target.name}, "
                f"epilogue={self.epilogue.mode}{'+residual' if self.epilogue.residual else ''}"
                f"{'+relu' if self.epilogue.relu else ''}"
                f"{f'+b2b{self.epilogue.b2b}' if self.epilogue.b2b else ''}, "
                f"layout={self.layout}{f', concat={self.concat}' if self.concat else ''}, "
                f"schedule={self.schedule_source})")

