"""The schedule space of the shared conv kernel: knobs, enumeration and validity.

A schedule is a dict knob -> value drawn from the enumerated values below; nothing else
reaches the CUDA source. The space of one (shape, precision, target) is the cartesian
product of the knobs, indexed in mixed radix so that strategies can work with integers.

Validity (`is_valid`) and the derived tile geometry (`geometry`) are computed with numpy
over whole columns of schedules, so one implementation serves a single check, the
enumeration of a space and the search's features, and they cannot disagree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from kernels.spec import ConvShape, Precision, Target, canonical_json, instruction_shape

Schedule = dict[str, Any]

# Knob -> allowed values, in the order strategies enumerate them.
PAPER_KNOBS: dict[str, tuple[Any, ...]] = {
    "BLK_ROW_WARPS": (1, 2, 4),  # warps along GEMM M (output pixels) in a block
    "BLK_COL_WARPS": (1, 2, 4),  # warps along GEMM N (output channels) in a block
    "WARP_ROW_TILES": (1, 2, 4, 8),  # instruction tiles along M in a warp
    "WARP_COL_TILES": (1, 2, 4, 8),  # instruction tiles along N in a warp
    "CHUNK": (1, 2, 4, 8),  # instruction k-steps per shared-memory stage
    "REORDER_INNER": (0, 1),  # 0: filter (r, s) outer, channels inner; 1: channels outer
}
EXTRA_KNOBS: dict[str, tuple[Any, ...]] = {
    "DUP_AWARE": (0, 1),  # load the block's receptive field once (paper 3.1)
    "PACK_OUT": (0, 1),  # epilogue and packing in registers before the smem store (3.2)
    "LAYOUT": ("nhwc", "nhwcnc"),  # activations in the blocked layout (3.3)
    "STAGES": (1, 2, 3),  # shared-memory pipeline depth
    "SPLIT_K": (1, 2, 4),  # blocks that share one output tile's reduction
}
FP32_TC_KNOBS: dict[str, tuple[Any, ...]] = {
    "SPLIT": ("scaled3", "binomial4", "karatsuba"),
}

# NHWCnc blocks the batch by this many images (rows of an m8 instruction tile).
NHWCNC_BATCH_BLOCK = 8
# Accumulator registers a thread may hold; more spills or fails to allocate.
MAX_ACC_REGS = 128


def knobs_for(precision: Precision) -> dict[str, tuple[Any, ...]]:
    knobs = {**PAPER_KNOBS, **EXTRA_KNOBS}
    if Precision(precision) is Precision.FP32_TC:
        knobs.update(FP32_TC_KNOBS)
    return knobs


def schedule_hash(schedule: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(schedule)).encode()).hexdigest()[:16]


def channel_vector(precision: Precision) -> int:
    """Channels in one 16-byte vector of the activation tensor (the 'c' of NHWCnc)."""
    return 128 // Precision(precision).input_bits if Precision(precision) is not \
        Precision.FP32_TC else 8


def schedule_problems(precision: Precision, schedule: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Structural errors of a schedule (unknown knob, missing knob, value not allowed)."""
    knobs = knobs_for(precision)
    out: list[tuple[str, str]] = []
    for name in schedule:
        if name not in knobs:
            out.append((name, f"unknown knob for {Precision(precision).value}"))
    for name, values in knobs.items():
        if name not in schedule:
            out.append((name, "missing"))
        elif schedule[name] not in values or isinstance(schedule[name], bool):
            out.append((name, f"must be one of {list(values)}, got {schedule[name]!r}"))
    return out


@dataclass(frozen=True)
class Geometry:
    """Derived quantities of schedules (numpy columns, one entry per schedule)."""

    block_m: np.ndarray
    block_n: np.ndarray
    block_k: np.ndarray
    warps: np.ndarray
    threads: np.ndarray
    acc_regs: np.ndarray  # accumulator registers per thread
    smem_bytes: np.ndarray
    grid_blocks: np.ndarray  # blocks per launch (incl. split-K)
    k_iters: np.ndarray  # main-loop iterations per block
    footprint_pixels: np.ndarray  # input pixels a block loads per channel slice


def geometry(shape: ConvShape, precision: Precision, target: Target,
             cols: Mapping[str, np.ndarray]) -> Geometry:
    """Tile geometry of schedules given as numpy columns (knob -> array of values)."""
    p = Precision(precision)
    inst = instruction_shape(p, target.sm)
    brw, bcw = cols["BLK_ROW_WARPS"], cols["BLK_COL_WARPS"]
    wrt, wct = cols["WARP_ROW_TILES"], cols["WARP_COL_TILES"]
    chunk, stages = cols["CHUNK"], cols["STAGES"]
    dup, pack, split_k = cols["DUP_AWARE"], cols["PACK_OUT"], cols["SPLIT_K"]
    bm = brw * wrt * inst.m
    bn = bcw * wct * inst.n
    bk = chunk * inst.k
    warps = brw * bcw
    acc = wrt * wct * (inst.m * inst.n // 32)
    if p is Precision.FP32_TC:
        acc = acc * 2  # correction terms accumulate beside the Tensor Core accumulator
    smem_bits = 32 if p is Precision.FP32_TC else p.operand_bits  # fp32_tc keeps hi and lo

    # Receptive field of BM consecutive output pixels (rows of the output image).
    q = shape.q
    rows_out = np.minimum(-(-bm // q) + 1, shape.n * shape.p)
    in_rows = (rows_out - 1) * shape.stride[0] + (shape.r - 1) * shape.dilation[0] + 1
    in_cols = np.where(bm >= q, shape.w + 2 * shape.pad[1],
                       (np.minimum(bm, q) - 1) * shape.stride[1]
                       + (shape.s - 1) * shape.dilation[1] + 1)
    footprint = in_rows * in_cols
    # A stage holds BK channels of the footprint (dup-aware) or BK im2col columns of BM rows.
    a_stage = np.where(dup == 1, footprint * bk, bm * bk) * smem_bits // 8
    b_stage = bn * bk * smem_bits // 8
    pipeline = stages * (a_stage + b_stage)
    out_bits = np.where(pack == 1, p.output_bits, 32)
    epilogue = bm * bn * out_bits // 8
    smem = np.maximum(pipeline, epilogue)

    tiles = (-(-shape.gemm_m // bm)) * (-(-shape.gemm_n // bn))
    k_steps = -(-shape.gemm_k // bk)
    return Geometry(
        block_m=bm, block_n=bn, block_k=bk, warps=warps, threads=warps * 32, acc_regs=acc,
        smem_bytes=smem, grid_blocks=tiles * split_k, k_iters=-(-k_steps // split_k),
        footprint_pixels=footprint,
    )


def validity(shape: ConvShape, precision: Precision, target: Target,
             cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Boolean column: which schedules can compile and launch. Each rule says why it exists."""
    p = Precision(precision)
    g = geometry(shape, p, target, cols)
    ok = np.ones_like(g.block_m, dtype=bool)
    # Registers: beyond this many accumulators per thread ptxas spills or cannot allocate.
    ok &= g.acc_regs <= MAX_ACC_REGS
    # Shared memory: a block cannot launch with more than the opt-in maximum.
    ok &= g.smem_bytes <= target.smem_per_block_kib * 1024
    # Split-K needs at least one main-loop step per split.
    k_steps = -(-shape.gemm_k // g.block_k)
    ok &= k_steps >= cols["SPLIT_K"]
    # Without cp.async (sm_75) the pipeline is double-buffered through registers at most.
    if target.sm < 80:
        ok &= cols["STAGES"] <= 2
    # NHWCnc blocks batch and channels: both must divide.
    cv = channel_vector(p)
    nhwcnc_fits = (shape.n % NHWCNC_BATCH_BLOCK == 0) and shape.c % cv == 0 and shape.k % cv == 0
    if not nhwcnc_fits:
        ok &= cols["LAYOUT"] != "nhwcnc"
    return ok


class ScheduleSpace:
    """The space of one (shape, precision, target); schedules are indexed in mixed radix."""

    def __init__(self, shape: ConvShape, precision: Precision, target: Target,
                 restrict: Mapping[str, Iterable[Any]] | None = None) -> None:
        """`restrict` narrows knobs to a subset of their values (a replay dataset's subspace)."""
        self.shape = shape
        self.precision = Precision(precision)
        self.target = target
        self.knobs = knobs_for(self.precision)
        for name, values in (restrict or {}).items():
            allowed = tuple(v for v in self.knobs[name] if v in set(values))
            if not allowed:
                raise ValueError(f"restriction leaves knob {name} without values")
            self.knobs[name] = allowed
        self.names = list(self.knobs)
        self.radices = np.array([len(v) for v in self.knobs.values()], dtype=np.int64)
        # Place values: the first knob varies slowest.
        self._place = np.ones(len(self.radices), dtype=np.int64)
        for i in range(len(self.radices) - 2, -1, -1):
            self._place[i] = self._place[i + 1] * self.radices[i + 1]
        self.size = int(np.prod(self.radices))

    # --- index <-> schedule -------------------------------------------------------------
    def digits(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), n_knobs) array of value positions."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1, 1)
        return (idx // self._place) % self.radices

    def index_of(self, schedule: Mapping[str, Any]) -> int:
        pos = [self.knobs[n].index(schedule[n]) for n in self.names]
        return int(np.dot(pos, self._place))

    def schedule_at(self, index: int) -> Schedule:
        d = self.digits(np.array([index]))[0]
        return {n: _plain(self.knobs[n][int(d[i])]) for i, n in enumerate(self.names)}

    def columns(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Knob -> values column for the given indices (string knobs stay strings)."""
        d = self.digits(indices)
        return {n: np.asarray(self.knobs[n], dtype=object if isinstance(self.knobs[n][0], str)
                              else np.int64)[d[:, i]] for i, n in enumerate(self.names)}

    # --- validity ------------------------------------------------------------------------
    def valid_mask(self, indices: np.ndarray) -> np.ndarray:
        return validity(self.shape, self.precision, self.target, self.columns(indices))

    @cached_property
    def valid_indices(self) -> np.ndarray:
        """Every valid schedule's index, ascending."""
        all_idx = np.arange(self.size, dtype=np.int64)
        return all_idx[self.valid_mask(all_idx)]

    def is_valid(self, schedule: Mapping[str, Any]) -> bool:
        if schedule_problems(self.precision, schedule):
            return False
        return bool(self.valid_mask(np.array([self.index_of(schedule)]))[0])

    def geometry(self, indices: np.ndarray) -> Geometry:
        return geometry(self.shape, self.precision, self.target, self.columns(indices))

    # --- moves used by strategies --------------------------------------------------------
    def mutate_index(self, index: int, rng: np.random.Generator) -> int:
        """Change one random knob to another of its values."""
        d = self.digits(np.array([index]))[0]
        movable = np.flatnonzero(self.radices > 1)
        i = int(rng.choice(movable))
        step = int(rng.integers(1, self.radices[i]))
        d[i] = (d[i] + step) % self.radices[i]
        return int(np.dot(d, self._place))

    def schedules(self, indices: Iterable[int]) -> list[Schedule]:
        return [self.schedule_at(int(i)) for i in indices]


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def is_valid(shape: ConvShape, precision: Precision, schedule: Mapping[str, Any],
             target: Target) -> bool:
    return ScheduleSpace(shape, precision, target).is_valid(schedule)
