"""NVRTC builds of the conv kernel: (shape, precision, sm, schedule, epilogue) -> cubin.

Runs on a CPU (no GPU, no CuPy). Each build is keyed by a hash of the kernel sources, the
NVRTC options (which carry every define) and the sm, and cached on disk as
`<cache>/<key>.cubin` + `<key>.json` (the launch metadata the runner needs). A compile
failure is data: a `BuildResult` with status "compile_error" and the log, never an
exception. `build_many` runs builds in a process pool.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kernels.space import (
    NHWCNC_BATCH_BLOCK,
    TMA_STORE_BOX_ROWS,
    WGMMA_N_PER_TILE,
    Geometry,
    HaloTiling,
    b2b_problems,
    channel_vector,
    concat_problems,
    geometry,
    halo_tiling,
    int4_via_s8,
    knobs_for,
    padded_channels,
    schedule_columns,
    schedule_problems,
    with_defaults,
)
from kernels.spec import ConvShape, Precision, Target

KERNEL_DIR = Path(__file__).resolve().parent
SOURCES = ("conv.cu", "instruction_tile.cuh", "block_tile.cuh", "warp_tile.cuh",
           "warpgroup_tile.cuh", "wgmma.cuh", "tma.cuh", "epilogue.cuh", "pipeline.cuh",
           "pipeline_tma.cuh", "pipeline_split_async.cuh", "pipeline_multistage.cuh",
           "pipeline_regstaged.cuh", "b2b.cuh")
KERNEL_NAME = "tc_conv"
PRECISION_CODE = {"fp16": 0, "int8": 1, "int4": 2, "fp32_tc": 3}
LAYOUT_CODE = {"nhwc": 0, "nhwcnc": 1}
SPLIT_CODE = {"scaled3": 0, "binomial4": 1, "karatsuba": 2}  # fp32_tc products (conv.cu)
MMA_CODE = {"sync": 0, "wgmma": 1}
# Bumped when the meaning of a cached artifact changes without its sources changing.
BUILD_FORMAT = 1


@dataclass(frozen=True)
class Epilogue:
    """Compile-time output options of a build (not schedule knobs).

    mode: "acc"  raw int32 accumulators (int) / plain fp16 out (fp16) / fp32 out (fp32_tc);
          "requant"  int: y = clamp(round(acc*scale[k] + bias[k])) stored as int8 / int4;
          "bias"  fp16 / fp32_tc: + bias[k] before the output conversion.
    residual: int8 requant and fp16 bias only: a tensor of the output's shape, layout and type
          is added before the ReLU and the rounding (int8: times its own scale, `res_scale`),
          so that a ResNet block's add needs no pass of its own.
    b2b: int8 requant and fp16 bias only: > 0 runs a 1x1 conv of `b2b` output channels
          over the output in the same kernel (kernels/b2b.cuh), with weights [b2b][K] of
          the layer's type, its own per-channel scale (int8) and bias, and ReLU where
          `b2b_relu`; its output [N][P][Q][b2b] is the kernel's second (a ResNet
          bottleneck's last conv and the next block's first as one kernel).
    """

    mode: str = "default"
    relu: bool = False
    residual: bool = False
    b2b: int = 0
    b2b_relu: bool = False

    def resolved(self, precision: Precision) -> Epilogue:
        p = Precision(precision)
        mode = self.mode
        if mode == "default":
            mode = "requant" if p.is_integer else "bias"
        allowed = ("acc", "requant") if p.is_integer else ("acc", "bias")
        if mode not in allowed:
            raise ValueError(f"epilogue {mode!r} is not one of {allowed} for {p.value}")
        if self.residual and not ((p is Precision.INT8 and mode == "requant") or
                                  (p is Precision.FP16 and mode == "bias")):
            raise ValueError("a residual is added by the int8 'requant' and the fp16 'bias' "
                             f"epilogues only, not by {p.value} {mode!r}")
        if self.b2b and not ((p is Precision.INT8 and mode == "requant") or
                             (p is Precision.FP16 and mode == "bias")):
            raise ValueError("a back-to-back conv follows the int8 'requant' and the fp16 'bias' "
                             f"epilogues only, not {p.value} {mode!r}")
        return Epilogue(mode, bool(self.relu), bool(self.residual), int(self.b2b),
                        bool(self.b2b_relu) and bool(self.b2b))

    def out_bits(self, precision: Precision) -> int:
        p = Precision(precision)
        e = self.resolved(p)
        if p.is_integer:
            return 32 if e.mode == "acc" else p.input_bits
        return 16 if p is Precision.FP16 else 32

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mode": self.mode, "relu": self.relu}
        if self.residual:  # absent when off: earlier builds' metadata reads the same
            d["residual"] = True
        if self.b2b:
            d.update(b2b=self.b2b, b2b_relu=self.b2b_relu)
        return d


DEFAULT_EPILOGUE = Epilogue()


@dataclass
class BuildResult:
    status: str  # "ok" or "compile_error"
    key: str
    log: str = ""
    seconds: float = 0.0
    cached: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BuildJob:
    shape: ConvShape
    precision: Precision
    sm: int
    schedule: Mapping[str, Any]
    epilogue: Epilogue = DEFAULT_EPILOGUE
    int4_s8: bool | None = None  # None: follow instruction_shape for (int4, sm)
    # PTX for compute_<sm> instead of a cubin: the driver compiles it when it loads the module,
    # so an sm_75 / sm_80 code path runs (for correctness only) on a newer GPU.
    ptx: bool = False

    def __post_init__(self) -> None:
        # A layer tuned with its residual (ConvShape.residual) builds the residual epilogue.
        if self.shape.residual and not self.epilogue.residual:
            object.__setattr__(self, "epilogue", replace(self.epilogue, residual=True))
        # A layer tuned with a back-to-back conv (ConvShape.b2b) builds it.
        if self.shape.b2b and self.epilogue.b2b != self.shape.b2b:
            object.__setattr__(self, "epilogue", replace(self.epilogue, b2b=self.shape.b2b))


def _sources() -> dict[str, str]:
    return {name: (KERNEL_DIR / name).read_text() for name in SOURCES}


_SOURCE_CACHE: dict[str, str] | None = None


def sources() -> dict[str, str]:
    global _SOURCE_CACHE
    if _SOURCE_CACHE is None:
        _SOURCE_CACHE = _sources()
    return _SOURCE_CACHE


def _target_for_sm(sm: int) -> Target:
    """Any target of this sm (shared-memory limits only matter for validity, not the build)."""
    from kernels.spec import TARGETS

    for t in TARGETS.values():
        if t.sm == sm:
            return t
    base = min(TARGETS.values(), key=lambda t: abs(t.sm - sm))
    return Target(f"sm{sm}", f"sm_{sm}", sm, base.sms, base.boost_mhz, base.mem_gib,
                  base.bandwidth_gbs, base.l2_mib, base.smem_per_sm_kib,
                  base.smem_per_block_kib, base.max_threads_per_sm, base.max_blocks_per_sm,
                  base.peak_tops)


def _job_geometry(job: BuildJob, int4_s8: bool) -> tuple[dict[str, Any], Geometry]:
    """The job's schedule (later knobs at their defaults) and its tile geometry."""
    p = Precision(job.precision)
    sched = with_defaults(p, job.schedule)
    epi = job.epilogue.resolved(p)
    return sched, geometry(job.shape, p, _target_for_sm(job.sm), schedule_columns(sched),
                           out_bits=epi.out_bits(p),
                           int4_s8=int4_s8, residual=epi.residual, b2b=epi.b2b)


def defines(job: BuildJob) -> dict[str, int]:
    """Every -D of a build. Values are integers taken from the enumerated space only."""
    p = Precision(job.precision)
    problems = schedule_problems(p, job.schedule)
    if problems:
        raise ValueError("; ".join(f"{k}: {v}" for k, v in problems))
    sh = job.shape
    epi = job.epilogue.resolved(p)
    s8 = int4_via_s8(p, job.sm) if job.int4_s8 is None else bool(job.int4_s8)
    if s8 and not (p is Precision.INT4 and job.sm >= 80):
        raise ValueError("int4_s8 applies to int4 on sm_80+ only")
    sched, g = _job_geometry(job, s8)
    why = concat_problems(sh, p, job.sm, sched) or \
        b2b_problems(sh, p, job.sm, sched, epi.b2b, g)  # two inputs; a back-to-back conv
    if why:
        raise ValueError(why)
    d: dict[str, int] = {
        "TC_PREC": PRECISION_CODE[p.value], "TC_SM": int(job.sm), "TC_INT4_S8": int(s8),
        "TC_N": sh.n, "TC_H": sh.h, "TC_W": sh.w,
        "TC_C": padded_channels(sh, p, fold=sched["FOLD_TAPS"] == 1),
        "TC_C_REAL": sh.c, "TC_K": sh.k, "TC_R": sh.r, "TC_S": sh.s,
        "TC_STR_H": sh.stride[0], "TC_STR_W": sh.stride[1], "TC_PAD_H": sh.pad[0],
        "TC_PAD_W": sh.pad[1], "TC_DIL_H": sh.dilation[0], "TC_DIL_W": sh.dilation[1],
        "TC_EPI": 0 if epi.mode == "acc" else 1, "TC_RELU": int(epi.relu),
        **({"TC_RES": 1, "TC_RES_AHEAD": int(g.res_ahead[0])} if epi.residual else {}),
        **({"TC_CAT": sh.concat} if sh.concat else {}),
        **({"TC_B2B": epi.b2b, "TC_B2B_RELU": int(epi.b2b_relu),
            "TC_B2B_AHEAD": int(g.b2b_ahead[0])} if epi.b2b else {}),
        "TC_SMEM_BYTES": int(g.smem_bytes[0]), "TC_K_ITERS": int(g.k_iters[0]),
    }
    for name in knobs_for(p):
        if name == "LAYOUT":
            d["TC_LAYOUT"] = LAYOUT_CODE[sched[name]]
        elif name == "SPLIT":
            d["TC_SPLIT"] = SPLIT_CODE[sched[name]]  # fp32_tc only
        elif name == "MMA":
            d["TC_MMA"] = MMA_CODE[sched[name]]
        else:
            d[f"TC_{name}"] = int(sched[name])
    if sched.get("HALO") == 1:  # the tiling space.halo_tiling chose (conv.cu derives the rest)
        t = halo_tiling(sh, int(g.block_m[0]))
        if t is None:
            raise ValueError(f"HALO: no tiling of {int(g.block_m[0])} rows for this shape")
        d["TC_HALO_COLS"] = t.cols
    return d


# Every NVRTC build's options after the architecture (the conv's and kernels/small_kernel.py's).
COMMON_OPTIONS = ("-std=c++17", "-default-device",
                  # no texture/surface or device-runtime declarations to parse: builds 24%
                  # faster (0.27 -> 0.21 s), identical SASS (36 builds over every precision
                  # and sm compared)
                  "-minimal",
                  # spills are build errors: a build whose registers spill is never worth timing
                  "--ptxas-options=--warn-on-spills", "--ptxas-options=--warning-as-error")


def nvrtc_options(d: Mapping[str, int], sm: int, ptx: bool = False) -> list[str]:
    # wgmma exists on the architecture-specific sm_90a target only (it runs on every sm_90).
    arch = f"sm_{sm}a" if d.get("TC_MMA") and sm == 90 else f"sm_{sm}"
    if ptx:
        arch = "compute" + arch[2:]
    return [f"--gpu-architecture={arch}", *COMMON_OPTIONS,
            *(f"-D{k}={int(v)}" for k, v in sorted(d.items()))]


def cache_key(d: Mapping[str, int], sm: int, ptx: bool = False) -> str:
    h = hashlib.sha256()
    h.update(f"format={BUILD_FORMAT};sm={sm}\n".encode())
    for name, text in sorted(sources().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    h.update("\0".join(nvrtc_options(d, sm, ptx)).encode())
    return h.hexdigest()[:32]


def _check(err: Any, what: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what}: {err}")


def nvrtc_compile(name: str, text: str, headers: Mapping[str, str], options: list[str],
                  ptx: bool = False) -> tuple[bytes | None, str]:
    """NVRTC: the source `text` (file `name`) with `headers` (name -> text) to a cubin, or
    PTX. Returns (image or None, log)."""
    from cuda.bindings import nvrtc

    names = list(headers)
    err, prog = nvrtc.nvrtcCreateProgram(
        text.encode(), name.encode(), len(names), [headers[h].encode() for h in names],
        [h.encode() for h in names])
    _check(err, "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "nvrtcGetProgramLogSize")
        log_buf = b" " * size
        (err,) = nvrtc.nvrtcGetProgramLog(prog, log_buf)
        log = log_buf.decode(errors="replace").rstrip("\0").strip()
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return None, log or str(res)
        if ptx:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(err, "nvrtcGetPTXSize")
            image = b" " * size
            (err,) = nvrtc.nvrtcGetPTX(prog, image)
            _check(err, "nvrtcGetPTX")
            return image.rstrip(b"\0") + b"\0", log
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(err, "nvrtcGetCUBIN")
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_cubin(d: Mapping[str, int], sm: int, ptx: bool = False
                  ) -> tuple[bytes | None, str]:
    """NVRTC compile of the conv kernel to a cubin (or PTX). Returns (image or None, log)."""
    src = sources()
    return nvrtc_compile("conv.cu", src["conv.cu"],
                         {h: src[h] for h in SOURCES if h != "conv.cu"},
                         nvrtc_options(d, sm, ptx), ptx)


def launch_meta(job: BuildJob, d: Mapping[str, int]) -> dict[str, Any]:
    """What the runner needs to allocate, lay out and launch this build."""
    p = Precision(job.precision)
    sh = job.shape
    epi = job.epilogue.resolved(p)
    s, g = _job_geometry(job, bool(d["TC_INT4_S8"]))
    threads = int(g.threads[0])  # split-K partials: one set per math thread
    tiles = int(g.grid_blocks[0]) // int(s["SPLIT_K"])
    # Split-K partials: one accumulator set per thread (fp32_tc's sets are combined first).
    inst_m = 16 if (p in (Precision.FP16, Precision.FP32_TC) or job.sm >= 80) else 8
    per_tile = WGMMA_N_PER_TILE // 2 if s["MMA"] == "wgmma" else inst_m * 8 // 32
    acc_n = s["WARP_ROW_TILES"] * s["WARP_COL_TILES"] * per_tile
    global_split = s["SPLIT_K"] > 1 and s.get("SPLIT_CLUSTER", 0) == 0
    return {
        "kernel": KERNEL_NAME, "grid": [tiles, 1, int(s["SPLIT_K"])],
        "block": [int(g.block_threads[0]), 1, 1],
        "smem_bytes": int(d["TC_SMEM_BYTES"]),
        # (a cluster's splits sum in shared memory: SPLIT_CLUSTER)
        "workspace_bytes": (tiles * int(s["SPLIT_K"]) * acc_n * threads * 4
                            if global_split else 0),
        "counters": tiles if global_split else 0,
        # PERSIST: the grid is this many blocks per SM of the GPU at hand, at most `tiles`
        # (kernels/launch.py: launch_dims).
        "persist": int(s.get("PERSIST", 0)), "tiles": tiles,
        "shape": sh.to_dict(), "precision": p.value, "sm": job.sm,
        "schedule": dict(s), "epilogue": epi.to_dict(), "out_bits": epi.out_bits(p),
        "c_padded": int(d["TC_C"]), "layout": s["LAYOUT"], "concat": sh.concat,
        "channel_vector": channel_vector(p), "batch_block": NHWCNC_BATCH_BLOCK,
        "int4_s8": bool(d["TC_INT4_S8"]), "defines": dict(d),
        "tma": tma_maps(sh, p, int(d["TC_C"]), int(g.block_m[0]), int(g.block_n[0]),
                        int(g.block_k[0]),
                        epi.out_bits(p) if s["PACK_OUT"] == 2 else None,
                        plain_a=s.get("PLAIN_A") == 1,
                        halo=halo_tiling(sh, int(g.block_m[0])) if s.get("HALO") == 1 else None)
        if s.get("TMA")
        else None,
    }


# Widest swizzle atom of a TMA box row (conv.cu: ATOM); a wider stage row takes two boxes.
TMA_ATOM_BYTES = 128


def tma_maps(sh: ConvShape, p: Precision, c_padded: int, bm: int, bn: int,
             bk: int, store_bits: int | None = None, plain_a: bool = False,
             halo: HaloTiling | None = None) -> dict[str, Any]:
    """What kernels/launch.py needs to encode a TMA build's two tensor maps (cuTensorMapEncode*)
    for any x and w of this shape: dimensions innermost first, byte strides, boxes, swizzle.
    x: NHWC as (C, W, H, N) walked im2col-wise, BM pixels per box from the block's first output
    pixel, corners such that the walk covers exactly the P x Q output positions (as CUTLASS
    does: lower = -pad, upper = pad - (filter - 1) * dilation). w: KRSC as (C, R*S, K).
    `store_bits` (PACK_OUT=2): y as bytes (K * store_bits / 8, N*P*Q), boxes of the widest
    swizzle dividing the tile's row bytes x 64 rows (conv.cu: SWB, BOX_ROWS). `plain_a`
    (PLAIN_A=1, 1x1 stride-1 unpadded layers): x as the tiled matrix (C, N*H*W), boxes of
    BM rows ("tiled": true) instead of the im2col walk. `halo` (HALO=1): x as the tiled
    tensor (C, W, H, N), one box per tile of the patch's `pitch` columns x `box_rows` rows
    (space.halo_tiling), which the kernel places at the tile's first input row and column
    (from -pad): zeros past the image."""
    es = p.input_bits // 8
    atom = min(bk * es, TMA_ATOM_BYTES)
    (sh_, sw_), (ph, pw), (dh, dw) = sh.stride, sh.pad, sh.dilation
    out: dict[str, Any] = {}
    if store_bits is not None:
        row, tile_row = sh.k * store_bits // 8, bn * store_bits // 8
        swb = next(b for b in (128, 64, 32) if tile_row % b == 0)
        out["y"] = {"dims": [row, sh.gemm_m], "strides": [row], "box": [swb, TMA_STORE_BOX_ROWS],
                    "element_strides": [1, 1], "swizzle_bytes": swb}
    nhwc_strides = [c_padded * es, sh.w * c_padded * es, sh.h * sh.w * c_padded * es]
    x: dict[str, Any] = (
        {"tiled": True, "dims": [c_padded, sh.n * sh.h * sh.w], "strides": [c_padded * es],
         "box": [atom // es, bm], "element_strides": [1, 1]} if plain_a else
        {"tiled": True, "dims": [c_padded, sh.w, sh.h, sh.n], "strides": nhwc_strides,
         "box": [atom // es, halo.pitch, halo.box_rows, 1], "element_strides": [1, 1, 1, 1]}
        if halo is not None else
        {"dims": [c_padded, sh.w, sh.h, sh.n], "strides": nhwc_strides,
         "lower": [-pw, -ph], "upper": [pw - (sh.s - 1) * dw, ph - (sh.r - 1) * dh],
         "channels": atom // es, "pixels": bm, "element_strides": [1, sw_, sh_, 1]})
    return {
        "dtype": "float16" if p is Precision.FP16 else "uint8",
        "swizzle_bytes": atom,
        "x": x,
        "w": {"dims": [c_padded, sh.r * sh.s, sh.k],
              "strides": [c_padded * es, sh.r * sh.s * c_padded * es],
              "box": [atom // es, 1, bn], "element_strides": [1, 1, 1]},
        **out,
    }


def build(job: BuildJob, cache_dir: str | os.PathLike[str]) -> BuildResult:
    """Build one kernel (or find it in the cache). Never raises for a bad schedule."""
    t0 = time.perf_counter()
    try:
        d = defines(job)
    except Exception as e:  # a schedule the space cannot express: data, not a crash
        return BuildResult("compile_error", "", log=f"bad build request: {e}",
                           seconds=time.perf_counter() - t0)
    key = cache_key(d, job.sm, job.ptx)
    cache = Path(cache_dir)
    cubin_path, meta_path, err_path = (cache / f"{key}.cubin", cache / f"{key}.json",
                                       cache / f"{key}.err")
    if meta_path.exists() and cubin_path.exists():
        meta = json.loads(meta_path.read_text())
        return BuildResult("ok", key, log=meta.get("log", ""), cached=True, meta=meta,
                           seconds=time.perf_counter() - t0)
    if err_path.exists():
        return BuildResult("compile_error", key, log=err_path.read_text(), cached=True,
                           seconds=time.perf_counter() - t0)
    try:
        cubin, log = compile_cubin(d, job.sm, job.ptx)
    except Exception as e:  # NVRTC itself missing or broken
        return BuildResult("compile_error", key, log=f"nvrtc failed: {e!r}",
                           seconds=time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    cache.mkdir(parents=True, exist_ok=True)
    if cubin is None:
        atomic_write(err_path, log.encode())
        return BuildResult("compile_error", key, log=log, seconds=seconds)
    meta = launch_meta(job, d)
    meta["image"] = "ptx" if job.ptx else "cubin"
    meta["log"] = log
    meta["compile_seconds"] = round(seconds, 3)
    atomic_write(cubin_path, cubin)
    atomic_write(meta_path, json.dumps(meta, sort_keys=True).encode())
    return BuildResult("ok", key, log=log, seconds=seconds, meta=meta)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def cubin_path(cache_dir: str | os.PathLike[str], key: str) -> Path:
    """The build's module image: a cubin, or for a PTX build (meta "image": "ptx") the PTX
    text, which the driver's module loader tells apart by its content and compiles."""
    return Path(cache_dir) / f"{key}.cubin"


def load_meta(cache_dir: str | os.PathLike[str], key: str) -> dict[str, Any]:
    return json.loads((Path(cache_dir) / f"{key}.json").read_text())


def _build_star(args: tuple[BuildJob, str]) -> BuildResult:
    return build(*args)


def build_many(jobs: Iterable[BuildJob], cache_dir: str | os.PathLike[str],
               workers: int | None = None) -> list[BuildResult]:
    """Build in parallel (a process pool; NVRTC holds the GIL poorly and can crash alone)."""
    jobs = list(jobs)
    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(jobs) <= 1:
        return [build(j, cache_dir) for j in jobs]
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as ex:
        return list(ex.map(_build_star, [(j, str(cache_dir)) for j in jobs], chunksize=1))
