"""How a built conv kernel is loaded and launched: one place for the runner and the runtime.

The build's launch metadata (`kernels.build.launch_meta`) says everything: kernel name,
grid, block, dynamic shared memory, split-K workspace and counters. The kernel's arguments
are always `(x, w, scale, bias, y, workspace, counters)` (kernels/conv.cu). CuPy is imported
only inside functions, so `kernels` imports without a GPU.
"""

from __future__ import annotations

import os
from typing import Any

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


def launch_dims(meta: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(grid, block, dynamic shared bytes) of a build."""
    return tuple(meta["grid"]), tuple(meta["block"]), int(meta["smem_bytes"])


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


def launch(fn: Any, meta: dict[str, Any], x: Any, w: Any, scale: Any, bias: Any, y: Any,
           ws: Any, counters: Any) -> None:
    """Enqueue one launch on CuPy's current stream."""
    grid, block, smem = launch_dims(meta)
    fn(grid, block, (x, w, scale, bias, y, ws, counters), shared_mem=smem)
