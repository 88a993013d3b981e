"""Features of schedules for the cost model, vectorized over many schedules at once.

A row holds the knob values (log2 ordinals for the power-of-two knobs, one-hot for the
categorical ones), quantities derived from the tile geometry (block tile M/N/K, warps,
occupancy, waves over the SMs, shared memory, duplicate ratio of the im2col rows,
arithmetic intensity, tile waste) and the layer's shape. The shape columns and the derived
ones are what let one model trained on several layers rank schedules of a new layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kernels.space import ScheduleSpace, field_pixels, geometry, knobs_for
from kernels.spec import ConvShape, Precision, Target

SHAPE_FEATURES = ("n", "h", "w", "c", "k", "r", "s", "stride", "p", "q",
                  "gemm_m", "gemm_n", "gemm_k", "flops")
DERIVED_FEATURES = (
    "block_m", "block_n", "block_k", "warps", "acc_regs", "smem_kib", "grid_blocks",
    "k_iters", "blocks_per_sm", "waves", "wave_eff", "dup_ratio", "intensity",
    "waste_m", "waste_n", "waste_k", "a_tile_bytes_log",
)


def _categorical(values: tuple[Any, ...]) -> bool:
    return any(isinstance(v, str) for v in values)


def feature_names(precision: Precision) -> list[str]:
    """Column names of `schedule_features` for this precision, in order."""
    names: list[str] = []
    for knob, values in knobs_for(precision).items():
        if _categorical(values):
            names += [f"{knob}={v}" for v in values]
        else:
            names.append(knob)
    return names + [f"d:{n}" for n in DERIVED_FEATURES] + [f"s:{n}" for n in SHAPE_FEATURES]


def _log2(x: np.ndarray | float) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1e-9))


def schedule_features(shape: ConvShape, precision: Precision, target: Target,
                      cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """(n_schedules, n_features) float32 matrix for schedules given as knob columns."""
    p = Precision(precision)
    knobs = knobs_for(p)
    n = len(next(iter(cols.values())))
    # Filled column by column in place (column-major, then one row-major copy): stacking
    # float64 columns and converting them was most of the features' time on a whole space.
    out = np.empty((len(feature_names(p)), n), dtype=np.float32)
    j = 0

    def put(*values: np.ndarray | float) -> None:
        nonlocal j
        for v in values:
            out[j] = v
            j += 1

    for knob, values in knobs.items():
        col = np.asarray(cols[knob])
        if _categorical(values):
            put(*(col == v for v in values))
        else:
            # Power-of-two knobs are ordinal on a log scale; 0/1 switches stay 0/1.
            put(_log2(col) if max(values) > 1 and min(values) >= 1 else col)

    g = geometry(shape, p, target, cols)
    f64 = np.float64
    bm, bn, bk = g.block_m.astype(f64), g.block_n.astype(f64), g.block_k.astype(f64)
    threads = g.threads.astype(f64)
    smem = g.smem_bytes.astype(f64)
    # Occupancy from threads and shared memory only (registers are the kernel's business).
    by_threads = target.max_threads_per_sm // threads
    by_smem = target.smem_per_sm_kib * 1024 // np.maximum(smem, 1.0)
    blocks_per_sm = np.maximum(1.0, np.minimum(float(target.max_blocks_per_sm),
                                               np.minimum(by_threads, by_smem)))
    waves = g.grid_blocks / (target.sms * blocks_per_sm)
    wave_eff = waves / np.ceil(waves)
    # Duplicate ratio: im2col rows of the block tile over the distinct input pixels they
    # read (its receptive field), whatever DUP_AWARE says: it is what that knob could save.
    dup_ratio = bm * shape.r * shape.s / np.maximum(field_pixels(shape, cols, g), 1)
    # Global bytes a block loads over the whole reduction (footprint: rows per channel block).
    in_bytes = p.input_bits / 8
    a_bytes = g.footprint_pixels * shape.c * in_bytes
    b_bytes = bn * shape.gemm_k * in_bytes
    intensity = 2.0 * bm * bn * shape.gemm_k / (a_bytes + b_bytes)
    pad_m = np.ceil(shape.gemm_m / bm) * bm
    pad_n = np.ceil(shape.gemm_n / bn) * bn
    split_k = np.asarray(cols["SPLIT_K"]).astype(f64)
    pad_k = np.ceil(shape.gemm_k / (bk * split_k)) * bk * split_k
    put(_log2(bm), _log2(bn), _log2(bk), _log2(g.warps), _log2(g.acc_regs), smem / 1024,
        _log2(g.grid_blocks), _log2(g.k_iters), blocks_per_sm, _log2(waves), wave_eff,
        dup_ratio, _log2(intensity),
        shape.gemm_m / pad_m, shape.gemm_n / pad_n, shape.gemm_k / pad_k, _log2(a_bytes))
    shape_vals = [shape.n, shape.h, shape.w, shape.c, shape.k, shape.r, shape.s,
                  shape.stride[0], shape.p, shape.q, shape.gemm_m, shape.gemm_n,
                  shape.gemm_k, shape.flops]
    put(*(float(np.log2(v)) for v in shape_vals))
    assert j == len(out)
    return np.ascontiguousarray(out.T)


def space_features(space: ScheduleSpace, indices: np.ndarray) -> np.ndarray:
    """Features of schedules of one space given by index."""
    idx = np.asarray(indices, dtype=np.int64)
    if len(idx) == 0:
        return np.zeros((0, len(feature_names(space.precision))), dtype=np.float32)
    return schedule_features(space.shape, space.precision, space.target, space.columns(idx))


def columns_from_schedules(precision: Precision,
                           schedules: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Knob columns from schedule dicts (measurements stored as dicts, e.g. of other layers).

    A knob a stored schedule does not name was added to the kernel after it was measured:
    it ran as the knob's first value (by convention the kernel before the knob existed)."""
    cols: dict[str, np.ndarray] = {}
    for knob, values in knobs_for(precision).items():
        raw = [s.get(knob, values[0]) for s in schedules]
        cols[knob] = np.asarray(raw, dtype=object if _categorical(values) else np.int64)
    return cols
