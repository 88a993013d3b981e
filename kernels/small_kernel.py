"""The deploy path's kernels other than the conv (kernels/pool.cu, kernels/quantize.cu): one
source file each, specialized by its defines, built with NVRTC (no GPU needed), cached beside
the conv builds under a key of the source and the options, and launched on the caller's torch
stream; on sm_90 with programmatic dependent launch, so that each starts while the kernel
before it finishes, as the conv layers do (each waits at `griddepcontrol.wait` before it
touches global memory).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
from pathlib import Path
from typing import Any

from kernels.build import BUILD_FORMAT, COMMON_OPTIONS, KERNEL_DIR, atomic_write, nvrtc_compile
from kernels.launch import driver_launch, load_function, supports_pdl


def small_options(defines: dict[str, int], sm: int, ptx: bool = False) -> list[str]:
    arch = f"{'compute' if ptx else 'sm'}_{sm}"
    return [f"--gpu-architecture={arch}", *COMMON_OPTIONS, f"-DTK_SM={sm}",
            *(f"-D{k}={v}" for k, v in sorted(defines.items()))]


def compile_small(source: str, defines: dict[str, int], sm: int, ptx: bool = False
                  ) -> tuple[bytes | None, str]:
    """NVRTC compile of kernels/`source`. Returns (image or None, log)."""
    return nvrtc_compile(source, (KERNEL_DIR / source).read_text(), {},
                         small_options(defines, sm, ptx), ptx)


def small_key(source: str, defines: dict[str, int], sm: int, ptx: bool = False) -> str:
    h = hashlib.sha256(f"format={BUILD_FORMAT};{source}\n".encode())
    h.update((KERNEL_DIR / source).read_bytes())
    h.update("\0".join(small_options(defines, sm, ptx)).encode())
    return h.hexdigest()[:32]


def build_small(source: str, defines: dict[str, int], sm: int,
                cache_dir: str | os.PathLike[str], ptx: bool = False) -> Path:
    """The cached cubin, or PTX text (compiled on first use)."""
    name = f"{Path(source).stem}_{small_key(source, defines, sm, ptx)}"
    path = Path(cache_dir) / f"{name}.{'ptx' if ptx else 'cubin'}"
    if not path.exists():
        cubin, log = compile_small(source, defines, sm, ptx)
        if cubin is None:
            raise RuntimeError(f"{source} failed to compile with {defines}: {log}")
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, cubin)
    return path


class SmallKernel:
    """One build of a small kernel, launched on torch's current stream of a tensor's GPU.
    `ptx`: built as PTX of compute_<sm>, which the driver compiles for the GPU at hand when
    it loads it (another target's code path run on this GPU, for its checks)."""

    def __init__(self, source: str, name: str, defines: dict[str, int], sm: int,
                 pdl: bool = False, cache_dir: str | os.PathLike[str] | None = None,
                 ptx: bool = False) -> None:
        if pdl and not supports_pdl(sm):
            raise ValueError(f"pdl (programmatic dependent launch) needs sm_90, not sm_{sm}")
        if cache_dir is None:
            from kernels.runtime import default_cache_dir

            cache_dir = default_cache_dir()
        self.name, self.sm, self.pdl = name, int(sm), pdl
        self.cubin = build_small(source, defines, self.sm, cache_dir, ptx)
        self._fns: dict[int, tuple[Any, Any]] = {}

    def launch(self, device: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
               smem: int, args: list[Any]) -> None:
        """Enqueue one launch on `device` (a torch.device): `args` the kernel's arguments,
        ints as pointers, ctypes values as they are."""
        import cupy
        import torch

        dev = device.index if device.index is not None else torch.cuda.current_device()
        with cupy.cuda.Device(dev):
            if dev not in self._fns:
                self._fns[dev] = load_function(self.cubin, {"kernel": self.name,
                                                            "smem_bytes": smem})
            driver_launch(self._fns[dev][1], grid, block, smem,
                          [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_void_p(a)
                           for a in args],
                          int(torch.cuda.current_stream(dev).cuda_stream), self.pdl)


class ShapedKernel:
    """A small kernel's op for one shape (kernels/pool.py's MaxPool2d, kernels/quantize.py's
    QuantizeInput): a shape the kernel cannot run is refused with the shape's reason
    (`problems()`), the kernel is built at construction, and a launch runs `work(shape)`
    threads in blocks of THREADS (the kernels' __launch_bounds__). Subclasses name the
    source, the kernel, what to call it in messages, and the shape's defines."""

    THREADS = 256
    source = ""
    kernel_name = ""
    what = ""

    def __init__(self, shape: Any, sm: int, pdl: bool = False,
                 cache_dir: str | os.PathLike[str] | None = None, ptx: bool = False) -> None:
        why = shape.problems()
        if why:
            raise ValueError(f"{self.what}: {why}")
        self.shape = shape
        self.kernel = SmallKernel(self.source, self.kernel_name, self.defines(shape), sm, pdl,
                                  cache_dir, ptx)
        self.grid = (math.ceil(self.work(shape) / self.THREADS), 1, 1)

    @staticmethod
    def defines(shape: Any) -> dict[str, int]:
        raise NotImplementedError

    @staticmethod
    def work(shape: Any) -> int:
        """Threads a launch runs."""
        raise NotImplementedError

    def launch(self, device: Any, args: list[Any]) -> None:
        self.kernel.launch(device, self.grid, (self.THREADS, 1, 1), 0, args)

    def __repr__(self) -> str:
        k = self.kernel
        return f"{type(self).__name__}({self.shape}, sm_{k.sm}{', pdl' if k.pdl else ''})"
