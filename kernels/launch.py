"""How a built conv kernel is loaded and launched: one place for the runner and the runtime.

The build's launch metadata (`kernels.build.launch_meta`) says everything: kernel name,
grid, block, dynamic shared memory, split-K workspace and counters, and for TMA builds the
tensor maps' parameters. The kernel's arguments are `(x, w, scale, bias, y, workspace,
counters, ready)` (`ready`: the inputs that a launch with programmatic dependent launch may
read before its wait for the kernel before: READY_* below), then for builds over two inputs
`x1`, for residual builds `(res, res_scale)`, for builds with a back-to-back conv `(w2,
scale2, bias2, y2)` (kernels/b2b.cuh), and for TMA builds the tensor maps by value after
them (x and w; y's too for TMA stores, PACK_OUT=2) (kernels/conv.cu).
CuPy and the driver bindings are imported only inside functions, so `kernels` imports
without a GPU.
"""

from __future__ import annotations

import ctypes
import os
from collections import OrderedDict
from typing import Any

import numpy as np

# conv.cu's `ready` bits: the weights, x of a build over two inputs, the residual.
READY_W, READY_X, READY_RES = 1, 2, 4

# Above this much dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
DEFAULT_SMEM_LIMIT = 48 * 1024


def load_function(cubin: str | os.PathLike[str], meta: dict[str, Any]) -> tuple[Any, Any]:
    """(module, function) of a cubin, with the dynamic shared-memory limit raised when the
    build needs more than the default 48 KB. Keep the module alive as long as the function."""
    import cupy

    mod = cupy.RawModule(path=str(cubin))
    fn = mod.get_function(meta["kernel"])
    if int(meta["smem_bytes"]) > DEFAULT_SMEM_LIMIT:
        fn.max_dynamic_shared_size_bytes = int(meta["smem_bytes"])
    return mod, fn


_SM_COUNT: dict[int, int] = {}


def sm_count() -> int:
    """Streaming multiprocessors of CuPy's current device."""
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _SM_COUNT:
        _SM_COUNT[dev] = int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"])
    return _SM_COUNT[dev]


def launch_dims(meta: dict[str, Any], sms: int | None = None
                ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(grid, block, dynamic shared bytes) of a build. A persistent build's grid is PERSIST
    blocks per SM (`sms`: the current device's count), at most one per tile."""
    grid = tuple(meta["grid"])
    if meta.get("persist"):
        per_sm = int(meta["persist"]) * (sm_count() if sms is None else sms)
        grid = (min(int(meta["tiles"]), per_sm), 1, 1)
    return grid, tuple(meta["block"]), int(meta["smem_bytes"])


def scratch_words(meta: dict[str, Any]) -> tuple[int, int]:
    """32-bit words of the split-K workspace and of the tile counters (at least one each,
    so that the kernel always gets valid pointers)."""
    return max(1, int(meta["workspace_bytes"]) // 4), max(1, int(meta["counters"]))


def alloc_scratch(meta: dict[str, Any]) -> tuple[Any, Any]:
    """Zeroed workspace and counters on CuPy's current device and stream. The kernel resets
    each counter after use, so one pair serves any number of launches that run one after
    another (never two launches at once: they would share the counters)."""
    import cupy

    ws_words, counter_words = scratch_words(meta)
    return cupy.zeros(ws_words, dtype=cupy.uint32), cupy.zeros(counter_words, dtype=cupy.uint32)


def encode_tensor_maps(tma: dict[str, Any], x_ptr: int, w_ptr: int, y_ptr: int = 0) -> bytes:
    """The bytes a TMA build reads: x's im2col map (tiled with PLAIN_A and HALO), then
    w's tiled map, then for TMA stores (PACK_OUT=2, "y" in the parameters) y's tiled map
    (kernels/tma.cuh), 128 bytes each,
    encoded by the driver from `launch_meta`'s "tma" parameters and the device pointers."""
    from cuda.bindings import driver as drv

    dtype = (drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16 if tma["dtype"] == "float16"
             else drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8)
    swizzles = {32: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
                64: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
                128: drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}
    common = (drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
              swizzles[int(tma["swizzle_bytes"])],
              drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
              drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)  # zeros
    xs, ws = tma["x"], tma["w"]

    def u64(v: list[int]) -> list[Any]:
        return [drv.cuuint64_t(int(i)) for i in v]

    def u32(v: list[int]) -> list[Any]:
        return [drv.cuuint32_t(int(i)) for i in v]

    if xs.get("tiled"):  # PLAIN_A: x as the [N*H*W, C] matrix; HALO: x as (C, W, H, N)
        err, xmap = drv.cuTensorMapEncodeTiled(
            dtype, len(xs["dims"]), x_ptr, u64(xs["dims"]), u64(xs["strides"]), u32(xs["box"]),
            u32(xs["element_strides"]), *common)
    else:
        err, xmap = drv.cuTensorMapEncodeIm2col(
            dtype, 4, x_ptr, u64(xs["dims"]), u64(xs["strides"]), xs["lower"], xs["upper"],
            *u32([xs["channels"], xs["pixels"]]), u32(xs["element_strides"]), *common)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncode (x): {err} ({tma})")
    err, wmap = drv.cuTensorMapEncodeTiled(
        dtype, 3, w_ptr, u64(ws["dims"]), u64(ws["strides"]), u32(ws["box"]),
        u32(ws["element_strides"]), *common)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled: {err} ({tma})")
    maps = [xmap, wmap]
    if "y" in tma:  # bytes, so one map serves int8 and fp16 outputs
        ys = tma["y"]
        err, ymap = drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, y_ptr, u64(ys["dims"]),
            u64(ys["strides"]), u32(ys["box"]), u32(ys["element_strides"]),
            common[0], swizzles[int(ys["swizzle_bytes"])], *common[2:])
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled (y): {err} ({tma})")
        maps.append(ymap)
    return b"".join(np.array(m.opaque, dtype=np.uint64).tobytes() for m in maps)


# Encoded maps per (build, x pointer, w pointer): a map holds its tensor's address, so each
# input buffer pair has its own; encoding is a host call, and the launch copies the maps into
# the kernel's parameters (graph capture records them as they were).
_MAPS: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
MAX_CACHED_MAPS = 4096


def tensor_maps(meta: dict[str, Any], x_ptr: int, w_ptr: int, y_ptr: int = 0) -> Any:
    """The by-value kernel argument of a TMA build (ctypes, 128 bytes a map) for these
    pointers (y's only where the build stores through a map)."""
    stores = "y" in meta["tma"]
    key = (repr(meta["tma"]), x_ptr, w_ptr, y_ptr if stores else 0)
    arg = _MAPS.get(key)
    if arg is None:
        raw = encode_tensor_maps(meta["tma"], x_ptr, w_ptr, y_ptr)
        arg = (ctypes.c_uint64 * (len(raw) // 8)).from_buffer_copy(raw)
        _MAPS[key] = arg
        while len(_MAPS) > MAX_CACHED_MAPS:
            _MAPS.popitem(last=False)
    else:
        _MAPS.move_to_end(key)
    return arg


def has_residual(meta: dict[str, Any]) -> bool:
    return bool(meta["epilogue"].get("residual"))


def _launch_driver(fn: Any, meta: dict[str, Any], args: list[Any], pdl: bool) -> None:
    """A conv build's launch on CuPy's current stream (`driver_launch`)."""
    import cupy

    grid, block, smem = launch_dims(meta)
    driver_launch(fn, grid, block, smem, args, cupy.cuda.get_current_stream().ptr, pdl)


def driver_launch(fn: Any, grid: tuple[int, ...], block: tuple[int, ...], smem: int,
                  args: list[Any], stream_ptr: int, pdl: bool) -> None:
    """One launch through the driver with ctypes arguments: CuPy passes no 64-byte-aligned
    structs (the tensor maps) and sets no launch attributes (programmatic dependent launch).
    `fn`: a CuPy RawModule's function (`load_function`)."""
    from cuda.bindings import driver as drv

    params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
    stream = drv.CUstream(stream_ptr)
    func = drv.CUfunction(fn.kernel.ptr)  # CuPy's RawKernel -> cupy.cuda.Function -> CUfunction
    if pdl:
        cfg = launch_config(grid, block, smem, stream)
        (err,) = drv.cuLaunchKernelEx(cfg, func, ctypes.addressof(params), 0)
    else:
        (err,) = drv.cuLaunchKernel(func, *grid, *block, smem, stream,
                                    ctypes.addressof(params), 0)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuLaunchKernel{'Ex' if pdl else ''}: {err}")


def launch_config(grid: tuple[int, ...], block: tuple[int, ...], smem: int, stream: Any) -> Any:
    """A driver launch configuration that allows programmatic dependent launch: the kernel
    may start while the previous kernel on the stream finishes (it waits in its prologue,
    kernels/conv.cu, until that kernel's writes are visible). Stream capture keeps it as a
    programmatic edge of the graph."""
    from cuda.bindings import driver as drv

    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in grid)
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in block)
    cfg.sharedMemBytes = int(smem)
    cfg.hStream = stream
    cfg.attrs = [attr]
    cfg.numAttrs = 1
    return cfg


def supports_pdl(sm: int) -> bool:
    """Whether builds for this sm wait for their predecessor in their prologue (sm_90,
    conv.cu): only those may be launched with programmatic dependent launch."""
    return int(sm) >= 90


def launch(fn: Any, meta: dict[str, Any], x: Any, w: Any, scale: Any, bias: Any, y: Any,
           ws: Any, counters: Any, res: Any = None, res_scale: float = 1.0,
           pdl: bool = False, x1: Any = None, b2b: tuple[Any, Any, Any, Any] | None = None,
           w_ready: bool = False, res_ready: bool = False, x_ready: bool = False) -> None:
    """Enqueue one launch on CuPy's current stream. `res` (y's shape and type) and
    `res_scale` are the residual build's extra arguments, and only theirs; `x1` the second
    input of a build over two (meta "concat"), and only its; `b2b` the back-to-back conv's
    (w2, scale2, bias2, y2) of a build with one (its epilogue's "b2b"), and only its.
    `pdl`: allow programmatic dependent launch (sm_90 builds; `supports_pdl`).
    `w_ready` (with `pdl`): `w` was complete before the kernel just before this one on the
    stream started, so the kernel copies its first stages' weights while it waits for that
    kernel (conv.cu: W_EARLY); `res_ready` the same of `res` (a residual tile copied ahead is
    copied then: RES_EARLY), `x_ready` of a build over two inputs' `x` (its part of the
    reduction runs then: CAT_EARLY)."""
    if has_residual(meta) != (res is not None):
        raise ValueError("a residual build takes a residual tensor, and only a residual build"
                         if res is None else "this build has no residual epilogue")
    if w_ready and not pdl:
        raise ValueError("w_ready says when the weights may be read under programmatic "
                         "dependent launch: it needs pdl")
    if res_ready and not (pdl and res is not None):
        raise ValueError("res_ready says when a residual build's residual may be read under "
                         "programmatic dependent launch: it needs both")
    if x_ready and not (pdl and x1 is not None):
        raise ValueError("x_ready says when a build over two inputs may read x under "
                         "programmatic dependent launch: it needs both")
    ready = READY_W * bool(w_ready) | READY_X * bool(x_ready) | READY_RES * bool(res_ready)
    if bool(meta.get("concat")) != (x1 is not None):
        raise ValueError("a build over two inputs takes x1, and only such a build"
                         if x1 is None else "this build has one input")
    if bool(meta["epilogue"].get("b2b")) != (b2b is not None):
        raise ValueError("a build with a back-to-back conv takes its (w2, scale2, bias2, y2), "
                         "and only such a build" if b2b is None
                         else "this build runs no back-to-back conv")
    if pdl and not supports_pdl(meta["sm"]):
        raise ValueError(f"programmatic dependent launch needs an sm_90 build, not sm_{meta['sm']}")
    if meta.get("tma") or pdl:
        ptrs = [a.data.ptr for a in (x, w, scale, bias, y, ws, counters)]
        args: list[Any] = [ctypes.c_void_p(p) for p in ptrs] + [ctypes.c_int(ready)]
        if x1 is not None:
            args.append(ctypes.c_void_p(x1.data.ptr))
        if res is not None:
            args += [ctypes.c_void_p(res.data.ptr), ctypes.c_float(float(res_scale))]
        if b2b is not None:
            args += [ctypes.c_void_p(a.data.ptr) for a in b2b]
        if meta.get("tma"):
            args.append(tensor_maps(meta, ptrs[0], ptrs[1], ptrs[4]))
        _launch_driver(fn, meta, args, pdl)
        return
    grid, block, smem = launch_dims(meta)
    kargs: tuple[Any, ...] = (x, w, scale, bias, y, ws, counters, np.int32(ready))
    if x1 is not None:
        kargs += (x1,)
    if res is not None:
        kargs += (res, np.float32(res_scale))
    if b2b is not None:
        kargs += tuple(b2b)
    fn(grid, block, kargs, shared_mem=smem)
