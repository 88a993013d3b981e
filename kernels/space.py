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
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from kernels.spec import (
    ConvShape,
    Instruction,
    Precision,
    Target,
    canonical_json,
    instruction_shape,
)

Schedule = dict[str, Any]

# Knob -> allowed values, in the order strategies enumerate them. PAPER_KNOBS are the six of
# the paper (section 4.1), whose sections "paper 3.x" cites below: Choi, Kwon, Lee, Choi and
# Lim, "Learning from Distinctive Candidates to Optimize Reduced-Precision Convolution Program
# on Tensor Cores", 2022 (docs/design.md, "Sources").
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
    # 1: epilogue and packing in registers before the smem store (3.2), then 16-byte stores;
    # 2: the same tile swizzled and written by TMA bulk tensor stores (TMA builds).
    "PACK_OUT": (0, 1, 2),
    "LAYOUT": ("nhwc", "nhwcnc"),  # activations in the blocked layout (3.3)
    "STAGES": (1, 2, 3, 4, 6, 8),  # shared-memory pipeline depth (4-8: wgmma only)
    "SPLIT_K": (1, 2, 4),  # blocks that share one output tile's reduction
    # Tensor Core instruction: warp-wide mma.sync, or warpgroup-wide wgmma (sm_90a) reading
    # both operands from shared memory (see WGMMA_* below for what the other knobs mean then).
    "MMA": ("sync", "wgmma"),
    # wgmma stages loaded by the Tensor Memory Accelerator (im2col and tiled tensor maps,
    # mbarrier-paced, one issuing thread) instead of every thread's cp.async (0); 1: the
    # issuing thread is one of the math warps'; 2: a producer warp of its own (one more warp).
    "TMA": (0, 1, 2),
    # Few input channels (C below one 16-byte vector, fp16 and int8): 1 packs the reduction
    # densely as (r, s, c) with C padded to a 4-, 8- or 16-byte "tap vector" (the stem's C=3:
    # 4 channels) instead of one whole 16-byte vector per filter tap, and loads taps, not
    # vectors (see fold_tap_bytes).
    "FOLD_TAPS": (0, 1),
    # 0: one block per output tile. n >= 1: a persistent grid of n blocks per SM that walk
    # the tiles; each block issues the next tile's first stages (TMA or cp.async) before the
    # current tile's epilogue (which gets shared memory of its own), so loads overlap stores
    # on layers whose tiles are short (1x1, few channels) and no wave is a partial one.
    "PERSIST": (0, 1, 2),
    # 1x1 convolutions with stride 1 and no padding on the TMA path: 1 copies A as the plain
    # [N*H*W, C] matrix (tiled tensor map, one box of BM rows) instead of the im2col walk.
    # (The cp.async loader reads such rows as plain rows too: block_tile.cuh, PLAIN_M.)
    "PLAIN_A": (0, 1),
    # 1: two consumers (each BLK_ROW_WARPS x BLK_COL_WARPS warpgroups, a tile of its own)
    # take a persistent block's tiles in turn behind the producer warp (TMA=2), so that one
    # runs its main loop while the other runs its epilogue (CUTLASS's ping-pong schedule).
    "PINGPONG": (0, 1),
    # 1: a stage holds a channel block of all R*S filter taps, A as one patch of the input
    # (a tiled TMA box of padded rows) that each tap reads at its own offset, instead of R*S
    # im2col boxes: stride-1 layers (halo_tiling).
    "HALO": (0, 1),
    # wgmma: 1 issues a warpgroup's tile (WARP_ROW_TILES x 64 pixels by 32 x WARP_COL_TILES
    # channels) as instructions of 64 channels (the weights as wgmma's A) by all its pixels
    # (B) instead of 64 pixels by all its channels: for narrow channel tiles, fewer and wider
    # instructions that read less of shared memory per multiply-add (cuBLAS's layout for
    # such GEMMs); the epilogue transposes through the staging tile.
    "SWAP_AB": (0, 1),
    # sm_90, SPLIT_K > 1: 1 launches a tile's SPLIT_K blocks as one thread-block cluster, and
    # the first sums the others' partial tiles from their shared memory (distributed shared
    # memory) instead of through a global workspace and a per-tile counter.
    "SPLIT_CLUSTER": (0, 1),
}
# Knobs added after schedules were first stored, with the value that builds the kernel as it
# was: a schedule that does not name such a knob means that value, and hashes as if the knob
# were absent, so stored schedules, measurements and their hashes keep their meaning.
KNOB_DEFAULTS: dict[str, Any] = {"MMA": "sync", "TMA": 0, "FOLD_TAPS": 0, "PERSIST": 0,
                                 "PLAIN_A": 0, "PINGPONG": 0, "HALO": 0, "SWAP_AB": 0,
                                 "SPLIT_CLUSTER": 0}
# Each default is its knob's first value (tested): recorded datasets and stored prior
# schedules that predate a knob read it as its first value (search/datasets.py, features.py).
FP32_TC_KNOBS: dict[str, tuple[Any, ...]] = {
    "SPLIT": ("scaled3", "binomial4", "karatsuba"),
}

# NHWCnc blocks the batch by this many images (rows of an m8 instruction tile).
NHWCNC_BATCH_BLOCK = 8
# ptxas gives a thread at most this many registers, and a block at most 64K of them.
MAX_REGS_PER_THREAD = 255
REGS_PER_BLOCK = 65536
# Register model of the kernel, calibrated against ptxas on ~2,500 sm_90 builds (the
# accepted region had no spill there): accumulators + 2 x one k-step's fragments (ptxas
# keeps the next k-step's in flight) + REG_OVERHEAD (+ REG_DEEP_CHUNK when CHUNK >= 4, the
# unrolled k-steps' addresses) must fit the per-thread cap. It is conservative: about one
# in eight schedules it rejects would still compile without spilling.
REG_OVERHEAD = 64
REG_DEEP_CHUNK = 16
# fp32_tc (calibrated the same way on ~360 sm_90 builds near the limit): the fixed part
# grows with CHUNK (each unrolled k-step holds hi and lo fragments and the register-staged
# loader keeps up to 8 prefetched vectors live across the math), and duplicate-aware loads
# add their index state: REG_F32TC_BASE + REG_F32TC_PER_CHUNK * CHUNK (+ REG_F32TC_DUP).
REG_F32TC_BASE = 48
REG_F32TC_PER_CHUNK = 20
REG_F32TC_DUP = 48
# Bytes added to each row of the epilogue's staging tile against bank conflicts.
EPILOGUE_ROW_PAD = 16
# wgmma (MMA=wgmma, sm_90a): rows of one warpgroup instruction tile, and columns per
# WARP_COL_TILES step (the instruction is m64 x n(32 * WARP_COL_TILES) x 32 bytes of k).
WGMMA_M = 64
WGMMA_N_PER_TILE = 32
WGMMA_SMEM_ALIGN = 1024
# TMA=1: a full and an empty mbarrier (8 bytes each) per stage; a weight box spans at most
# this many rows. (The im2col walk's other limits, <= 1024 pixels, stride <= 8, bounding-box
# corners in [-128, 127], hold for every valid schedule and shape: the register rule keeps
# block_m <= 1024 and kernels/spec.py bounds strides, pads and dilated filters; tested.)
TMA_MBAR_BYTES = 16
TMA_MAX_BOX_ROWS = 256
# PACK_OUT=2: the staging tile's alignment (its swizzle pattern is taken from address bits),
# and the rows of one bulk store box.
TMA_STORE_ALIGN = 1024
TMA_STORE_BOX_ROWS = 64
SYNC_MAX_STAGES = 3
# Register model of the wgmma path, calibrated on ~480 sm_90a builds: no fragments; the
# loader keeps 4 registers of address state per unrolled 16-byte job (block_tile.cuh unrolls a
# job loop of <= 8 per thread and rolls longer ones), plus a fixed part.
REG_WGMMA_BASE = 16
REG_WGMMA_PER_JOB = 6
# 4 warpgroups (512 threads, 128 registers each): 64 accumulators spilled in 8 of 33 builds
# (the raw int32 epilogue writes them all from registers), so they need this much more.
REG_WGMMA_512 = 40
# 8 warpgroups (1024 threads, 64 registers each): one at the rule's limit (32 accumulators,
# split-K 4) spilled 4 bytes in the GPU check of 200 random wgmma schedules.
REG_WGMMA_1024 = 8
# TMA builds (calibrated on 150 sm_90a builds near the limit and 1,043 zoo builds, 4 and 8
# warpgroups): the math threads load nothing, so no per-job address state and no 512-thread
# term: 64 accumulators took 90-105 registers of a 4-warpgroup block's 120-128. Split-K's raw
# partial sums and the one-stage loop (it waits for each stage's MMAs) hold more: they took
# all 128 and spilled a few bytes in 7 builds, so they add enough to leave out 64
# accumulators at 4 warpgroups.
REG_TMA_BASE = 40
REG_TMA_HELD = 32
# HALO builds issue every tap's MMAs of a stage with descriptors of their own: calibrated on
# 1,227 sm_90a builds (1,077 zoo, 150 random), they keep REG_HALO more; a one-stage loop (it
# waits for each stage's MMAs) spilled in 18 of 475 builds, all past 36 MMAs a stage or within
# 16 registers of the cap, and none of 752 deeper ones did.
REG_HALO = 8
REG_HALO_ONE_STAGE = 16
HALO_ONE_STAGE_MAX_MMAS = 36
# 128 accumulators split over several 64-row tiles (WARP_ROW_TILES >= 2) spilled a few bytes
# in 2 of ~40 builds (an epilogue or split-K sum holding every tile at once): left out.
WGMMA_MAX_MULTI_TILE_ACC = 96


def knobs_for(precision: Precision) -> dict[str, tuple[Any, ...]]:
    knobs = {**PAPER_KNOBS, **EXTRA_KNOBS}
    if Precision(precision) is Precision.FP32_TC:
        knobs.update(FP32_TC_KNOBS)
    return knobs


def schedule_hash(schedule: Mapping[str, Any]) -> str:
    """Stable id of a schedule; a later knob at its default value does not enter it."""
    core = {k: v for k, v in schedule.items()
            if not (k in KNOB_DEFAULTS and v == KNOB_DEFAULTS[k])}
    return hashlib.sha256(canonical_json(core).encode()).hexdigest()[:16]


def with_defaults(precision: Precision, schedule: Mapping[str, Any]) -> Schedule:
    """The schedule with every later knob it does not name set to its default."""
    out = dict(schedule)
    for name, value in KNOB_DEFAULTS.items():
        if name in knobs_for(precision):
            out.setdefault(name, value)
    return out


def channel_vector(precision: Precision) -> int:
    """Channels in one 16-byte vector of the activation tensor (the 'c' of NHWCnc); fp32_tc
    keeps fp32 in global memory, so 4."""
    return 128 // Precision(precision).input_bits


def fold_tap_bytes(shape: ConvShape, precision: Precision) -> int:
    """FOLD_TAPS=1: bytes of one filter tap's channels, C rounded up to 4, 8 or 16 bytes (the
    widths of cp.async); 0 where the layer has too many channels (or a precision without
    the path) to fold."""
    p = Precision(precision)
    if p not in (Precision.FP16, Precision.INT8):
        return 0
    nbytes = shape.c * p.input_bits // 8
    for tv in (4, 8, 16):
        if nbytes <= tv:
            return tv
    return 0


def padded_channels(shape: ConvShape, precision: Precision, fold: bool = False) -> int:
    """C rounded up to whole 16-byte vectors, or with `fold` (FOLD_TAPS=1) to one tap vector:
    the harness zero-pads activations and weights to it."""
    if fold:
        return fold_tap_bytes(shape, precision) * 8 // Precision(precision).input_bits
    cv = channel_vector(precision)
    return -(-shape.c // cv) * cv


@dataclass(frozen=True)
class HaloTiling:
    """HALO=1's output tiles for one block_m (kernels/conv.cu: HALO). The output is cut into
    `bands` of `cols` columns; a band of one image is a run of `virtual` positions, row after
    row at a `pitch` of cols + S - 1 (position v is output (v // pitch, v % pitch) of the band,
    a pixel where v % pitch < cols), and a tile is block_m consecutive positions of it. Tap
    (r, s) of position v reads the band's input pixel v + r * pitch + s (input rows and
    columns from -pad), so a tile's A operand is one patch of `box_rows` input rows of
    `pitch` pixels (a TMA box, zero-filled past the image), each tap's view of it a constant
    offset from the tile's first position. `plane_rows`: the patch's pixel rows in shared
    memory (whole KB of every atom width)."""

    cols: int
    pitch: int
    bands: int
    virtual: int
    tiles_per_band: int
    box_rows: int
    plane_rows: int

    @property
    def tiles_per_image(self) -> int:
        return self.bands * self.tiles_per_band


def halo_tiling(shape: ConvShape, block_m: int) -> HaloTiling | None:
    """The fewest bands whose pitch fits a TMA box (<= 256 pixels); None where the patch's
    rows would not (> 256)."""
    q, s, r = shape.q, shape.s, shape.r
    bands = -(-(q + s - 1) // TMA_MAX_BOX_ROWS)
    cols = -(-q // bands)
    while cols + s - 1 > TMA_MAX_BOX_ROWS:
        bands += 1
        cols = -(-q // bands)
    pitch = cols + s - 1
    virtual = (shape.p - 1) * pitch + cols
    box_rows = r + -(-(block_m + s - 2) // pitch)
    if box_rows > TMA_MAX_BOX_ROWS:
        return None
    return HaloTiling(cols=cols, pitch=pitch, bands=-(-q // cols), virtual=virtual,
                      tiles_per_band=-(-virtual // block_m), box_rows=box_rows,
                      plane_rows=-(-(box_rows * pitch) // 32) * 32)


def halo_applies(shape: ConvShape) -> bool:
    """HALO=1's layers: stride 1, no dilation, a filter of more than one tap, one input."""
    return tuple(shape.stride) == (1, 1) and tuple(shape.dilation) == (1, 1) and \
        shape.r * shape.s > 1 and not shape.concat


CONCAT_KNOBS = {"TMA": 0, "FOLD_TAPS": 0, "DUP_AWARE": 0, "LAYOUT": "nhwc"}


def concat_problems(shape: ConvShape, precision: Precision, sm: int,
                    schedule: Mapping[str, Any]) -> str | None:
    """Why a layer over two inputs (shape.concat > 0: ConvShape) cannot run this schedule,
    or None (also for one-input layers). The path is the cp.async / register-staged loads of
    a 1x1 unpadded NHWC int8 or fp16 layer, each stage holding channels of one input
    (conv.cu: CAT); `validity` applies the same rules to whole spaces."""
    p = Precision(precision)
    concat = shape.concat
    if not concat:
        return None
    probs = shape.problems(p)
    if probs:
        return "; ".join(why for _, why in probs)
    sched = with_defaults(p, schedule)
    for knob, want in CONCAT_KNOBS.items():
        if sched.get(knob, want) != want:
            return f"two inputs need {knob}={want}"
    per_stage = int(sched["CHUNK"]) * instruction_shape(p, sm).k  # conv.cu: BKC
    if concat % per_stage:
        return (f"x1's {concat} channels must fill whole stages of {per_stage} channels "
                f"(CHUNK {sched['CHUNK']})")
    return None


def schedule_columns(schedule: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """One schedule as the one-row knob columns `geometry` and the rules read."""
    return {k: np.array([v], dtype=object if isinstance(v, str) else np.int64)
            for k, v in schedule.items()}


B2B_KNOBS = {"LAYOUT": "nhwc", "SPLIT_K": 1, "HALO": 0}


def b2b_on_wgmma(cols: Mapping[str, np.ndarray], n: tuple[int, ...], b2b: int) -> np.ndarray:
    """Where a back-to-back conv of `b2b` channels runs on wgmma (conv.cu: B2B_WG): in wgmma
    builds, n32 tiles or wider (narrower ones run on mma.sync)."""
    return mma_is_wgmma(cols, n) & (b2b > 0) & (b2b % 32 == 0)


def b2b_path_ok(cols: Mapping[str, np.ndarray], n: tuple[int, ...], b2b: int) -> np.ndarray:
    """Where a back-to-back conv finds the block's staged output tile: PACK_OUT=1, or on
    wgmma also 2 (its second GEMM reads the tile in TMA stores' swizzled boxes: conv.cu,
    B2B_WG); one tile a block, or on wgmma a persistent block of one consumer, which keeps
    the second conv's weights for all its tiles."""
    wgmma = b2b_on_wgmma(cols, n, b2b)
    pack_out = _knob(cols, "PACK_OUT", n)
    persist, pingpong = _knob(cols, "PERSIST", n), _knob(cols, "PINGPONG", n)
    return (((pack_out == 1) | ((pack_out == 2) & wgmma)) &
            ((persist == 0) | (wgmma & (pingpong == 0))))


def b2b_problems(shape: ConvShape, precision: Precision, sm: int,
                 schedule: Mapping[str, Any], b2b: int, g: Geometry) -> str | None:
    """Why a build with a back-to-back 1x1 conv of `b2b` output channels (Epilogue.b2b)
    cannot run this schedule, or None (also without one). The block stages its whole output
    rows (one column tile, PACK_OUT=1; wgmma: or 2) and reduces them in whole instruction k-steps
    (conv.cu: B2B); `g` is the build's geometry."""
    if not b2b:
        return None
    p = Precision(precision)
    if p not in (Precision.INT8, Precision.FP16):
        return f"a back-to-back conv is for int8 and fp16, not {p.value}"
    sched = with_defaults(p, schedule)
    for knob, want in B2B_KNOBS.items():
        if sched.get(knob, want) != want:
            return f"a back-to-back conv needs {knob}={want}"
    cols = schedule_columns(sched)
    if not b2b_path_ok(cols, (1,), b2b)[0]:
        wgmma = bool(b2b_on_wgmma(cols, (1,), b2b)[0])
        if sched.get("PACK_OUT", 1) not in ((1, 2) if wgmma else (1,)):
            return "a back-to-back conv needs PACK_OUT=1 (on wgmma, 32-channel multiples: 1 or 2)"
        return ("a back-to-back conv needs PERSIST=0 (on wgmma, 32-channel multiples: or one "
                "consumer, PINGPONG=0)")
    eb = p.input_bits // 8
    kb = instruction_shape(p, sm).k * eb  # bytes of k per instruction (conv.cu: KB)
    bn = int(g.block_n[0])
    if bn < shape.k or (bn * eb) % 16:
        return (f"a back-to-back conv reads whole output rows: the block's {bn} columns must "
                f"cover K = {shape.k} in 16-byte rows")
    if (shape.k * eb) % kb:
        return f"a back-to-back conv reduces K = {shape.k} in whole steps of {kb // eb} channels"
    if b2b % 8 or (b2b * eb) % 16:
        return f"the back-to-back conv's {b2b} channels must fill 16-byte vectors of 8 channels"
    return None


def b2b_mask(shape: ConvShape, precision: Precision, sm: int,
             cols: Mapping[str, np.ndarray], b2b: int, g: Geometry) -> np.ndarray:
    """`b2b_problems` over numpy columns of schedules (their geometry `g`): True where a
    build with a back-to-back conv of `b2b` channels can run the schedule."""
    p = Precision(precision)
    n = np.broadcast_shapes(np.shape(g.block_m), *(np.shape(v) for v in cols.values()))
    if not b2b or p not in (Precision.INT8, Precision.FP16):
        return np.full(n, not b2b, dtype=bool)
    eb = p.input_bits // 8
    kb = instruction_shape(p, sm).k * eb
    ok = (g.block_n >= shape.k) & ((g.block_n * eb) % 16 == 0)
    for knob, want in B2B_KNOBS.items():
        if knob in cols:  # (the columns broadcast together: `ok` takes their shape)
            ok = ok & (np.asarray(cols[knob]) == want)
    ok = ok & b2b_path_ok(cols, n, b2b)
    ok = ok & ((shape.k * eb) % kb == 0) & (b2b % 8 == 0) & ((b2b * eb) % 16 == 0)
    return np.broadcast_to(ok, n)


def int4_via_s8(precision: Precision, sm: int) -> bool:
    """int4 runs on the s8 m16n8k32 path (unpacked in shared memory) where instruction_shape
    says so (sm_90: no 4-bit Tensor Core unit)."""
    inst = instruction_shape(precision, sm)
    return Precision(precision) is Precision.INT4 and inst.m == 16 and inst.k == 32


def _knob(cols: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A later knob's column, or its default where the columns predate it."""
    if name in cols:
        return np.asarray(cols[name])
    return np.full(shape, KNOB_DEFAULTS[name])


def mma_is_wgmma(cols: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    """Boolean column: which schedules use wgmma (columns without MMA are mma.sync)."""
    if "MMA" not in cols:
        return np.zeros(shape, dtype=bool)
    return np.asarray(cols["MMA"], dtype=object) == "wgmma"


def schedule_problems(precision: Precision, schedule: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Structural errors of a schedule (unknown knob, missing knob, value not allowed)."""
    knobs = knobs_for(precision)
    out: list[tuple[str, str]] = []
    for name in schedule:
        if name not in knobs:
            out.append((name, f"unknown knob for {Precision(precision).value}"))
    for name, values in knobs.items():
        if name not in schedule:
            if name not in KNOB_DEFAULTS:
                out.append((name, "missing"))
        elif schedule[name] not in values or isinstance(schedule[name], bool):
            out.append((name, f"must be one of {list(values)}, got {schedule[name]!r}"))
    return out


def blocks_per_sm(target: Target, smem_bytes: np.ndarray, block_threads: np.ndarray
                  ) -> np.ndarray:
    """Blocks of this size an SM holds at once by its shared memory (1 KB of it reserved per
    block), threads and block slots; registers aside."""
    return np.minimum(np.minimum(target.smem_per_sm_kib * 1024 // (smem_bytes + 1024),
                                 target.max_threads_per_sm // block_threads),
                      target.max_blocks_per_sm)


@dataclass(frozen=True)
class Geometry:
    """Derived quantities of schedules (numpy columns, one entry per schedule)."""

    block_m: np.ndarray
    block_n: np.ndarray
    block_k: np.ndarray
    warps: np.ndarray
    threads: np.ndarray  # the math warps' threads (which share the loads and the epilogue)
    acc_regs: np.ndarray  # accumulator registers per thread
    smem_bytes: np.ndarray
    grid_blocks: np.ndarray  # blocks per launch (incl. split-K)
    k_iters: np.ndarray  # main-loop iterations per block
    footprint_pixels: np.ndarray  # input pixel rows a block loads per channel block
    frag_regs: np.ndarray | None = None  # A and B fragment registers of one k-step
    stage_vectors: np.ndarray | None = None  # global loads per thread per stage
    row_loads: np.ndarray | None = None  # global loads per shared row per stage
    # threads launched: x 2 with PINGPONG, + TMA=2's producer warp
    block_threads: np.ndarray | None = None
    taps: np.ndarray | None = None  # filter taps of a stage (DUP_AWARE, HALO: several)
    res_ahead: np.ndarray | None = None  # the residual tile is copied in during the main loop
    b2b_ahead: np.ndarray | None = None  # a back-to-back conv's weights too (else after it)


def dup_field_rows(shape: ConvShape, bm: np.ndarray, blocked: np.ndarray,
                   reorder: np.ndarray) -> np.ndarray:
    """Shared rows of the duplicate-aware receptive field of a block of `bm` output rows
    (block_tile.cuh): slot rows x input columns x images (NHWCnc: 8 images a row). With
    REORDER_INNER=1 the slots hold every filter row of the block's output rows, else one."""
    nb = np.where(blocked, NHWCNC_BATCH_BLOCK, 1)
    nbt = np.maximum(shape.n // nb, 1)
    bmp = bm // nb
    pp, q = shape.p, shape.q
    (sh, sw), (dh, dw) = shape.stride, shape.dilation
    r, s = shape.r, shape.s
    fullrow = bmp >= q
    rows_out = np.minimum(np.where(fullrow, -(-bmp // q) + 1, 2), nbt * pp)
    nimg = np.minimum(nbt, (rows_out + pp - 2) // pp + 1)
    gap = max(0, (r - 1) * dh - sh + 1)
    in_cols = (np.where(fullrow, q, bmp) - 1) * sw + (s - 1) * dw + 1
    slots = np.where(reorder,
                     np.where(fullrow, (rows_out - 1) * sh + (r - 1) * dh + 1 + (nimg - 1) * gap,
                              rows_out * r),
                     rows_out)
    return slots * in_cols * nb


def _dup_field_rows_by_value(shape: ConvShape, bm: np.ndarray, blocked: np.ndarray,
                             reorder: np.ndarray) -> np.ndarray:
    """dup_field_rows worked out once per distinct block rows and (layout, reorder) pair and
    looked up: its inputs take a few values each, and an enumeration's crossed columns
    would otherwise repeat its two dozen operations for every schedule."""
    bm = np.asarray(bm)
    rows, inverse = np.unique(bm, return_inverse=True)
    flags = np.array([False, True])
    table = dup_field_rows(shape, rows[:, None, None], flags[None, :, None],
                           flags[None, None, :])
    return table[inverse.reshape(bm.shape), np.asarray(blocked, np.int64),
                 np.asarray(reorder, np.int64)]  # type: ignore[no-any-return]


def field_pixels(shape: ConvShape, cols: Mapping[str, np.ndarray], g: Geometry) -> np.ndarray:
    """Input pixel rows per channel block that the duplicate-aware load with every filter row
    in a stage (REORDER_INNER=1) would read for each schedule's block, whatever its own
    DUP_AWARE says (HALO: its patch); `g` is the schedules' geometry. What DUP_AWARE could
    save is the block's im2col rows over this."""
    blocked = np.asarray(cols["LAYOUT"], dtype=object) == "nhwcnc"
    halo = _knob(cols, "HALO", np.shape(g.block_m)) == 1
    every_row = np.ones(np.shape(g.block_m), dtype=bool)
    return np.where(halo, g.footprint_pixels,
                    dup_field_rows(shape, g.block_m, blocked, every_row))


def geometry(shape: ConvShape, precision: Precision, target: Target,
             cols: Mapping[str, np.ndarray], out_bits: int | None = None,
             int4_s8: bool | None = None, residual: bool = False, b2b: int = 0
             ) -> Geometry:
    """Tile geometry of schedules given as numpy columns (knob -> array of values).

    Mirrors kernels/conv.cu exactly: the kernel static_asserts that its shared-memory size
    equals `smem_bytes`. `out_bits` is the epilogue's output width (None: the precision's
    requantized output, as tuned; 32: raw int32 accumulators). `int4_s8` overrides the int4
    path on sm_80+ (None: as instruction_shape says), for builds that compare the two.
    `residual`: the residual epilogue, which with PACK_OUT stages a residual tile too (also
    where the shape says so: ConvShape.residual). `b2b`: a back-to-back conv's output channels
    (Epilogue.b2b), whose weights and staged output take a region past the rest.
    """
    p = Precision(precision)
    residual = residual or shape.residual
    b2b = b2b or shape.b2b
    inst = instruction_shape(p, target.sm)
    s8 = int4_via_s8(p, target.sm) if int4_s8 is None else bool(int4_s8)
    if p is Precision.INT4 and target.sm >= 80:
        inst = Instruction(16, 8, 32) if s8 else Instruction(16, 8, 64, emulated=target.sm >= 90)
    i64 = np.int64
    brw, bcw = np.asarray(cols["BLK_ROW_WARPS"], i64), np.asarray(cols["BLK_COL_WARPS"], i64)
    wrt, wct = np.asarray(cols["WARP_ROW_TILES"], i64), np.asarray(cols["WARP_COL_TILES"], i64)
    chunk, stages = np.asarray(cols["CHUNK"], i64), np.asarray(cols["STAGES"], i64)
    dup = np.asarray(cols["DUP_AWARE"], i64) == 1
    pack_out = np.asarray(cols["PACK_OUT"], i64)
    pack, tma_store = pack_out >= 1, pack_out == 2
    reorder = np.asarray(cols["REORDER_INNER"], i64) == 1
    split_k = np.asarray(cols["SPLIT_K"], i64)
    blocked = np.asarray(cols["LAYOUT"], dtype=object) == "nhwcnc"

    f32tc = p is Precision.FP32_TC
    elem_bits = p.input_bits  # in global memory (fp32_tc: fp32)
    # in shared memory: s4 unpacked to s8; fp32_tc split into fp16 hi and lo planes
    smem_bits = 8 if s8 else 16 if f32tc else elem_bits
    planes = 2 if f32tc else 1
    kb = inst.k * smem_bits // 8  # bytes of k per instruction (16 or 32)
    wg = mma_is_wgmma(cols, np.shape(brw))
    # mma.sync: a warp holds WRT x WCT instruction tiles (inst.m x inst.n).
    # wgmma: a warpgroup (4 warps) holds WRT tiles of 64 rows x WGMMA_N_PER_TILE * WCT
    # columns; BLK_ROW_WARPS / BLK_COL_WARPS count warpgroups (conv.cu: WG).
    bm = np.where(wg, brw * wrt * WGMMA_M, brw * wrt * inst.m)
    bn = np.where(wg, bcw * wct * WGMMA_N_PER_TILE, bcw * wct * inst.n)
    bk = chunk * inst.k
    warps = np.where(wg, brw * bcw * 4, brw * bcw)
    acc = np.where(wg, wrt * wct * WGMMA_N_PER_TILE // 2, wrt * wct * (inst.m * inst.n // 32))
    # ldmatrix fragments of one k-step: A (m x kb bytes) and B (8 x kb bytes) per tile;
    # wgmma reads both operands from shared memory (no fragments in registers).
    frag_a = wrt * (inst.m // 8) * (kb // 16)
    frag_b = wct * (kb // 16)
    frag = np.where(wg, 0, frag_a + frag_b)
    if f32tc:
        split = np.asarray(cols["SPLIT"], dtype=object) if "SPLIT" in cols else \
            np.full(np.shape(brw), "scaled3", dtype=object)
        kara, bino = split == "karatsuba", split == "binomial4"
        # Accumulator sets (warp_tile.cuh): hi*hi (summed outside the Tensor Core) and the
        # corrections; karatsuba keeps lo*lo apart as a third set.
        acc = acc * np.where(kara, 3, 2)
        # Fragments: hi and lo of A and B; karatsuba adds the hi+lo sums of both, binomial4
        # the 2^-11-scaled lo of B.
        frag = 2 * frag + np.where(kara, frag, 0) + np.where(bino, frag_b, 0)
    sb = chunk * kb  # shared bytes of one row per tap (of one plane)

    cp = padded_channels(shape, p)
    n_cb = -(-cp // bk)
    # FOLD_TAPS=1: a stage row holds sb / tv consecutive taps of tv bytes; the main loop walks
    # the R*S taps, tps at a time.
    fold = _knob(cols, "FOLD_TAPS", np.shape(brw)) == 1
    tv = fold_tap_bytes(shape, p) or 16
    tps = np.maximum(sb // tv, 1)
    r, s = shape.r, shape.s
    taps = np.where(dup, np.where(reorder, r * s, s), 1)
    a_rows = np.where(dup, _dup_field_rows_by_value(shape, bm, blocked, reorder), bm)
    # HALO=1: a stage holds all R*S taps of a channel block and A is the tile's input patch.
    halo = _knob(cols, "HALO", np.shape(brw)) == 1
    hal = _halo_columns(shape, bm, halo)
    taps = np.where(halo, r * s, taps)
    a_rows = np.where(halo, hal["plane_rows"], a_rows)
    a_stage = planes * a_rows * sb
    b_stage = planes * bn * taps * sb
    # fp32_tc with STAGES=3 on sm_80+ (conv.cu: F32_ASYNC): two hi/lo plane buffers and a
    # 3-deep ring of fp32 staging slots, each as large as one stage's planes.
    f32_async = f32tc and target.sm >= 80
    pipeline = np.where(f32_async & (stages == 3), 2 + stages, stages) * (a_stage + b_stage)
    # wgmma's swizzled operand tiles must start on 1024-byte boundaries: the kernel rounds
    # the dynamic shared-memory base up at run time.
    pipeline = pipeline + np.where(wg, WGMMA_SMEM_ALIGN, 0)
    tma_knob = _knob(cols, "TMA", np.shape(brw))
    tma = tma_knob >= 1
    # PINGPONG: two consumers, each with a tile, a turn mbarrier and an epilogue region.
    consumers = np.where(_knob(cols, "PINGPONG", np.shape(brw)) == 1, 2, 1)
    pipeline = pipeline + np.where(tma, TMA_MBAR_BYTES * stages, 0) + \
        np.where(consumers == 2, TMA_MBAR_BYTES, 0)
    ob = p.output_bits if out_bits is None else out_bits
    stage_bits = np.where(pack, ob, 32)
    padded_tile = bm * (bn * stage_bits // 8 + EPILOGUE_ROW_PAD)
    # PACK_OUT=2, and a wgmma build's back-to-back conv (conv.cu: SWZ_STG), stage the tile
    # dense (swizzled) from a 1024-byte-aligned base.
    b2b_wg = b2b_on_wgmma(cols, np.shape(brw), b2b)
    swizzled = tma_store | b2b_wg
    staging = np.where(swizzled, bm * bn * ob // 8 + TMA_STORE_ALIGN, padded_tile)
    # The residual region: its tile, then the columns' scale and bias (fp16: bias) as floats.
    res_region = padded_tile + bn * 4 * (1 if p is Precision.FP16 else 2)
    epilogue = np.where(pack & (ob == 32), 0,
                        staging + np.where(pack & residual, res_region, 0))
    # A persistent block's epilogue runs while the next tile's stages land: its own region.
    persist = _knob(cols, "PERSIST", np.shape(brw)) > 0
    # SPLIT_CLUSTER: a split's partial tile, 4 bytes an output, at 0 (conv.cu: PART_SMEM).
    part = np.where(_knob(cols, "SPLIT_CLUSTER", np.shape(brw)) == 1, bm * bn * 4, 0)
    smem = np.where(persist, pipeline + consumers * epilogue,
                    np.maximum(np.maximum(pipeline, epilogue), part))
    block_threads = consumers * warps * 32 + np.where(tma_knob == 2, 32, 0)
    m_tiles = np.where(halo, shape.n * hal["tiles_per_image"], -(-shape.gemm_m // bm))
    tiles = m_tiles * (-(-shape.gemm_n // bn))
    # The residual tile copied in while the main loop runs (conv.cu: RES_AHEAD) needs a region
    # past the pipeline's: taken where it leaves as many blocks per SM (blocks_per_sm) as
    # copying it in after the loop does, or where by those measures the whole grid is resident
    # at once with it (then no block waits for another's place either way). Its copies are the
    # epilogue's store vectors (conv.cu: VW), cp.async's 4, 8 or 16 bytes.
    if residual and target.sm >= 80:
        res_off = -(-np.maximum(pipeline, staging) // 16) * 16
        row_gcd = np.gcd(shape.k * ob // 8, bn * ob // 8)
        res_vector = np.minimum(row_gcd & -row_gcd, 16)
        ahead_bps = blocks_per_sm(target, res_off + res_region, block_threads)
        res_ahead = (pack & (ob != 32) & ~persist & (split_k == 1) & (res_vector >= 4) &
                     ((ahead_bps >= blocks_per_sm(target, smem, block_threads)) |
                      (tiles <= target.sms * ahead_bps)))
        smem = np.where(res_ahead, res_off + res_region, smem)
    else:
        res_ahead = np.zeros(np.shape(smem), dtype=bool)
    b2b_ahead = np.zeros(np.shape(smem), dtype=bool)
    if b2b:  # conv.cu: W2_OFF, O2_OFF (rows padded by 16 bytes; wgmma: dense, aligned)
        eb = elem_bits // 8
        w2 = np.where(b2b_wg, b2b * shape.k * eb + TMA_STORE_ALIGN,
                      b2b * (shape.k * eb + EPILOGUE_ROW_PAD))
        o2 = bm * (b2b * eb + EPILOGUE_ROW_PAD)
        stg_end = -(-staging // 16) * 16  # the staged output tile, at 0
        base = -(-smem // 16) * 16
        # Ahead: the weights copied in while the main loop runs, into a region past the rest;
        # taken where it leaves as many blocks per SM as copying them after the loop into the
        # pipeline's dead region does (the second GEMM's output tile goes there either way).
        # (a persistent block's next stages land at 0 while a tile's second GEMM runs: its
        # weights stay resident, ahead, and its output tile goes past them)
        ahead = base + w2 + np.where(~persist & (stg_end + o2 <= base), 0, o2)
        late = np.maximum(smem, stg_end + w2 + o2)
        if target.sm >= 80:
            b2b_ahead = persist | (blocks_per_sm(target, ahead, block_threads) >=
                                   blocks_per_sm(target, late, block_threads))
        smem = np.where(b2b_ahead, ahead, late)

    n_it = np.where(fold, -(-(r * s) // tps),
                    np.where(dup | halo, np.where(reorder | halo, n_cb, r * n_cb), r * s * n_cb))
    # global loads per row per stage: 16-byte vectors, or taps (FOLD_TAPS)
    gvec = np.where(fold, tps, bk * elem_bits // 8 // 16)
    threads = warps * 32
    stage_vec = -(-np.where(dup, a_rows, np.where(halo, hal["box_pixels"], bm)) * gvec //
                  threads) + -(-(bn * taps * gvec) // threads)
    footprint = np.where(dup, a_rows * np.where(reorder, 1, r), bm * r * s)
    footprint = np.where(halo, hal["box_pixels"], footprint)
    return Geometry(
        block_m=bm, block_n=bn, block_k=bk, warps=warps, threads=threads, acc_regs=acc,
        smem_bytes=smem, grid_blocks=tiles * split_k, k_iters=-(-n_it // split_k),
        footprint_pixels=footprint, frag_regs=frag, stage_vectors=stage_vec,
        row_loads=gvec, block_threads=block_threads,
        taps=taps, res_ahead=res_ahead, b2b_ahead=b2b_ahead,
    )


def _halo_columns(shape: ConvShape, bm: np.ndarray, halo: np.ndarray) -> dict[str, np.ndarray]:
    """halo_tiling per schedule where HALO=1 (zeros where it has none or HALO=0); `bm` and
    `halo` may be broadcastable arrays of different shapes."""
    keys = ("plane_rows", "tiles_per_image", "box_pixels")
    bm = np.asarray(bm)
    if not np.any(halo):
        zeros = np.zeros(np.broadcast_shapes(bm.shape, np.shape(halo)), np.int64)
        return dict.fromkeys(keys, zeros)
    # halo_tiling depends on the block's rows alone: one lookup row per distinct block_m.
    values, inverse = np.unique(bm, return_inverse=True)
    table = np.zeros((len(keys), len(values)), np.int64)
    for j, b in enumerate(values):
        t = halo_tiling(shape, int(b))
        if t is not None:
            table[:, j] = (t.plane_rows, t.tiles_per_image, t.box_rows * t.pitch)
    inverse = inverse.reshape(bm.shape)
    return {k: np.where(halo, table[i][inverse], 0) for i, k in enumerate(keys)}


def register_slack(shape: ConvShape, precision: Precision, target: Target,
                   cols: Mapping[str, np.ndarray], g: Geometry | None = None) -> np.ndarray:
    """Registers per thread left under the cap by the kernel's register model (negative: the
    schedule would spill). __launch_bounds__ caps a thread at min(255, 64K / threads)
    registers; the model counts accumulators, fragments and a fixed part (see REG_OVERHEAD)."""
    p = Precision(precision)
    g = geometry(shape, p, target, cols) if g is None else g
    # PERSIST=n asks for n resident blocks per SM (__launch_bounds__' second argument).
    blocks = np.maximum(_knob(cols, "PERSIST", np.shape(g.block_m)), 1)
    cap = np.minimum(MAX_REGS_PER_THREAD,
                     (REGS_PER_BLOCK // (g.block_threads * blocks)) // 8 * 8)
    chunk = np.asarray(cols["CHUNK"])
    if p is Precision.FP32_TC:
        fixed = REG_F32TC_BASE + REG_F32TC_PER_CHUNK * chunk + \
            np.where(np.asarray(cols["DUP_AWARE"]) == 1, REG_F32TC_DUP, 0)
    else:
        fixed = REG_OVERHEAD + np.where(chunk >= 4, REG_DEEP_CHUNK, 0)
    wg = mma_is_wgmma(cols, np.shape(g.block_m))
    gvec = g.row_loads  # global loads per row of a stage
    a_jobs = -(-g.block_m * gvec // g.threads)
    b_jobs = -(-g.block_n * gvec // g.threads)
    unrolled = np.where(a_jobs <= 8, a_jobs, 1) + np.where(b_jobs <= 8, b_jobs, 1)
    fixed = np.where(wg, REG_WGMMA_BASE + REG_WGMMA_PER_JOB * unrolled +
                     np.where(g.threads == 512, REG_WGMMA_512, 0) +
                     np.where(g.threads == 1024, REG_WGMMA_1024, 0), fixed)
    tma = wg & (_knob(cols, "TMA", np.shape(g.block_m)) >= 1)
    held = (np.asarray(cols["SPLIT_K"]) > 1) | (np.asarray(cols["STAGES"]) == 1)
    # TMA builds: their own model, or the loader's where that is smaller (what it admits stays)
    fixed = np.where(tma, np.minimum(fixed, REG_TMA_BASE + np.where(held, REG_TMA_HELD, 0)), fixed)
    one_stage = np.asarray(cols["STAGES"]) == 1
    fixed = fixed + np.where(_knob(cols, "HALO", np.shape(g.block_m)) == 1,
                             REG_HALO + np.where(one_stage, REG_HALO_ONE_STAGE, 0), 0)
    return cap - (g.acc_regs + 2 * g.frag_regs + fixed)


# The knobs that shape the tiles (block, warp and instruction tile counts, stage depth in
# k-steps). Every other knob is structural: which pipeline, loader, layout and epilogue
# the kernel is built with. structural_validity reads no tile knob, so a space is enumerated
# by pruning the structural product first (ScheduleSpace.valid_indices).
TILE_KNOBS = ("BLK_ROW_WARPS", "BLK_COL_WARPS", "WARP_ROW_TILES", "WARP_COL_TILES", "CHUNK")


def is_plain_matrix(shape: ConvShape) -> bool:
    """A 1x1 conv with stride 1 and no padding: its im2col matrix is x as [N*H*W, C]."""
    return (shape.r, shape.s) == (1, 1) and tuple(shape.stride) == (1, 1) and \
        tuple(shape.pad) == (0, 0)


@dataclass(frozen=True)
class LayerTraits:
    """What the structural rules read of a layer: a handful of yes-or-no answers, which
    many layers share, so the structural product's survivors are enumerated once per
    traits (`ScheduleSpace.valid_indices`)."""

    tma_store_rows: bool  # K output elements fill whole 16-byte rows (a TMA store's stride)
    fold_taps: bool  # few enough channels that taps pack into the reduction (FOLD_TAPS)
    plain_matrix: bool  # 1x1, stride 1, unpadded: A is x itself (PLAIN_A)
    nhwcnc: bool  # batch and channels fill the blocked layout's 8 x vector blocks
    concat: bool  # two inputs
    halo: bool  # the halo patch applies (HALO)
    b2b: int = 0  # a back-to-back conv's output channels (ConvShape.b2b), or 0


def layer_traits(shape: ConvShape, precision: Precision) -> LayerTraits:
    p = Precision(precision)
    cv = channel_vector(p)
    return LayerTraits(
        tma_store_rows=shape.k * p.output_bits // 8 % 16 == 0,
        fold_taps=fold_tap_bytes(shape, p) > 0,
        plain_matrix=is_plain_matrix(shape),
        nhwcnc=shape.n % NHWCNC_BATCH_BLOCK == 0 and shape.c % cv == 0 and shape.k % cv == 0,
        concat=bool(shape.concat),
        halo=halo_applies(shape),
        b2b=shape.b2b)


def structural_validity(traits: LayerTraits, precision: Precision, target: Target,
                        cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Boolean column: the rules of `validity` that read no tile knob (TILE_KNOBS), of a
    layer with these traits (and nothing else of it)."""
    p = Precision(precision)
    n = np.shape(cols["STAGES"])
    ok = np.ones(n, dtype=bool)
    wg = mma_is_wgmma(cols, n)
    dup0 = np.asarray(cols["DUP_AWARE"]) == 0
    nhwc = np.asarray(cols["LAYOUT"], dtype=object) == "nhwc"
    split1 = np.asarray(cols["SPLIT_K"]) == 1
    stages = np.asarray(cols["STAGES"])
    tma_knob = _knob(cols, "TMA", n)
    # wgmma exists on sm_90a only; the path is built for fp16 and int8 (int4 on sm_90 goes
    # through the register-staged s4 -> s8 loader, which stays on mma.sync). Its operands are
    # whole swizzled tiles: no duplicate-aware row indexing.
    if not (target.sm == 90 and p in (Precision.FP16, Precision.INT8)):
        ok &= ~wg
    ok &= ~wg | dup0
    # Thread-block clusters exist on sm_90; a cluster's blocks are a tile's splits, each
    # with one 32-bit accumulator per output (not fp32_tc's sets).
    cluster = _knob(cols, "SPLIT_CLUSTER", n) == 1
    if target.sm < 90 or p is Precision.FP32_TC:
        ok &= ~cluster
    ok &= ~cluster | ~split1
    # Swapped operands are a wgmma tile's (not the halo patch's views of A).
    ok &= (_knob(cols, "SWAP_AB", n) == 0) | (wg & (_knob(cols, "HALO", n) == 0))
    # TMA feeds the wgmma path with whole NHWC tiles (no duplicate-aware rows, no NHWCnc;
    # the kernel static_asserts it).
    if "TMA" in cols:
        ok &= (tma_knob == 0) | (wg & dup0 & nhwc)
    # TMA stores (PACK_OUT=2) write through the TMA build's tensor maps (NHWC, no split-K)
    # whole 16-byte rows of the output (K * its bytes a multiple of 16: the map's stride).
    tma_store = np.asarray(cols["PACK_OUT"]) == 2
    ok &= ~tma_store | ((tma_knob >= 1) & split1)
    if not traits.tma_store_rows or p not in (Precision.FP16, Precision.INT8):
        ok &= ~tma_store
    # FOLD_TAPS packs (r, s, c) of a layer with few channels and reads plain NHWC im2col
    # rows (no duplicate-aware rows, no NHWCnc, no TMA; REORDER_INNER has no meaning: 0).
    fold = _knob(cols, "FOLD_TAPS", n) == 1
    if not traits.fold_taps:
        ok &= ~fold
    else:
        ok &= ~fold | (dup0 & (np.asarray(cols["REORDER_INNER"]) == 0) & nhwc &
                       (tma_knob == 0))
    # The plain-matrix copy of A exists for TMA builds of 1x1, stride-1, unpadded layers,
    # whose im2col rows are the rows of x itself.
    plain = _knob(cols, "PLAIN_A", n) == 1
    if traits.plain_matrix:
        ok &= ~plain | (tma_knob >= 1)
    else:
        ok &= ~plain
    # A persistent grid runs on the TMA or the cp.async multistage pipeline (not fp32_tc,
    # not the register-staged loads of sm_75 or int4 via s8), without split-K.
    persist = _knob(cols, "PERSIST", n)
    if target.sm < 80 or p is Precision.FP32_TC or int4_via_s8(p, target.sm):
        ok &= persist == 0
    ok &= (persist == 0) | split1
    # The ping-pong consumers take turns behind a producer warp on a persistent grid.
    ok &= (_knob(cols, "PINGPONG", n) == 0) | ((tma_knob == 2) & (persist > 0))
    # Pipelines deeper than 3 stages pay with wgmma (its loads and math overlap); on the
    # mma.sync path they gained 2-4% on int8 and lost beyond 4 (docs/decisions.md, H100 probe),
    # not worth a space twice the size.
    ok &= wg | (stages <= SYNC_MAX_STAGES)
    # The register-staged pipeline (no cp.async on sm_75; int4 unpacked to s8 on the way
    # into shared memory on sm_90) is double-buffered at most (the kernel static_asserts).
    # fp32_tc on sm_80+ splits on that path with STAGES 1-2 and runs STAGES=3 as a cp.async
    # staging ring (conv.cu: F32_ASYNC).
    if target.sm < 80 or int4_via_s8(p, target.sm):
        ok &= stages <= 2
    # NHWCnc blocks 8 images x one 16-byte channel vector: batch and channels must fill
    # them, or the layout does not exist (the kernel static_asserts).
    if not traits.nhwcnc:
        ok &= nhwc
    # A back-to-back conv (b2b_problems) reads the block's staged output rows: PACK_OUT=1
    # (wgmma: or 2), NHWC, one tile a block (wgmma: or persistent, one consumer), the halo's
    # tiling aside.
    if traits.b2b:
        for knob, want in B2B_KNOBS.items():
            ok &= _knob(cols, knob, n) == want
        ok &= b2b_path_ok(cols, n, traits.b2b)
    # Two inputs (concat_problems): the cp.async / register-staged loads of NHWC rows.
    if traits.concat:
        ok &= (tma_knob == 0) & ~fold & dup0 & nhwc
    # The halo patch is a TMA box of whole rows at stride 1 that each tap reads at an offset;
    # its tiles are rows of the output, not runs of M (no TMA stores of 64-row boxes), each
    # reduced by one block (no split-K); REORDER_INNER has no meaning (every tap is in the
    # stage): 0.
    halo = _knob(cols, "HALO", n) == 1
    if traits.halo:
        ok &= ~halo | ((tma_knob >= 1) & ~tma_store & split1 &
                       (np.asarray(cols["REORDER_INNER"]) == 0))
    else:
        ok &= ~halo
    return ok


def validity(shape: ConvShape, precision: Precision, target: Target,
             cols: Mapping[str, np.ndarray], g: Geometry | None = None) -> np.ndarray:
    """Boolean column: which schedules can compile and launch: the structural rules and the
    tile rules (`tile_validity`). Each rule says why it exists (tests/kernels/test_kernels_build.py
    shows, per rule, a schedule that breaks it and fails). `g`: the columns' geometry, where
    the caller has it already."""
    return structural_validity(layer_traits(shape, precision), precision, target, cols) & \
        tile_validity(shape, precision, target, cols, g)


def tile_validity(shape: ConvShape, precision: Precision, target: Target,
                  cols: Mapping[str, np.ndarray], g: Geometry | None = None) -> np.ndarray:
    """Boolean array: the rules of `validity` that read the tiles' geometry. The columns may
    be arrays of different shapes that broadcast together (the enumeration's tile knobs as a
    column, structural knobs as a row): what depends on one of them alone is worked out once
    per its values."""
    p = Precision(precision)
    g = geometry(shape, p, target, cols) if g is None else g
    ok = np.ones(np.broadcast_shapes(*(np.shape(v) for v in cols.values())), dtype=bool)
    # Two inputs: each stage holds channels of one input (x1's fill whole stages).
    if shape.concat:
        ok &= shape.concat % (np.asarray(cols["CHUNK"]) * instruction_shape(p, target.sm).k) == 0
    # A back-to-back conv: the block's columns cover all K output channels (b2b_mask).
    if shape.b2b:
        ok &= b2b_mask(shape, p, target.sm, cols, shape.b2b, g)
    # Registers: a schedule whose accumulators and fragments do not fit under the cap spills
    # them, and the build treats spills as errors (ptxas --warn-on-spills -Werror): local-
    # memory traffic in the inner loop is never a schedule worth measuring.
    ok &= register_slack(shape, p, target, cols, g) >= 0
    # wgmma: a stage row of CHUNK 8 (256 bytes) is two 128-byte swizzle atoms, and a block
    # holds at most 1024 threads (8 warpgroups).
    wg = mma_is_wgmma(cols, np.shape(g.block_m))
    ok &= ~wg | (g.block_threads <= 1024)
    # (A warpgroup's accumulators belong to several instructions: WARP_ROW_TILES row tiles,
    # or with SWAP_AB WARP_COL_TILES / 2 channel blocks.)
    swap = _knob(cols, "SWAP_AB", np.shape(g.block_m)) == 1
    multi = np.where(swap, np.asarray(cols["WARP_COL_TILES"]) > 2,
                     np.asarray(cols["WARP_ROW_TILES"]) > 1)
    few_acc = g.acc_regs <= WGMMA_MAX_MULTI_TILE_ACC
    ok &= ~wg | ~multi | few_acc
    # SWAP_AB: whole 64-channel instructions (WARP_COL_TILES 2, 4, 8) whose N, the
    # warpgroup's 64 x WARP_ROW_TILES pixels, is a wgmma width (64, 128 or 256).
    # With split-K, 128 swapped accumulators spilled a few bytes in the raw int32 epilogue
    # (2 of 200 builds of a GPU check, bench/data/kernels_check_swap_h200.json.gz): left out.
    ok &= ~swap | (wg & (np.asarray(cols["WARP_COL_TILES"]) >= 2) &
                   (np.asarray(cols["WARP_ROW_TILES"]) <= 4) &
                   ((np.asarray(cols["SPLIT_K"]) == 1) | few_acc))
    tma_knob = _knob(cols, "TMA", np.shape(g.block_m))
    # A TMA weight box (and PLAIN_A's box of x rows) has at most 256 rows; a TMA store box 64
    # (the kernel static_asserts).
    ok &= (tma_knob == 0) | (g.block_n <= TMA_MAX_BOX_ROWS)
    ok &= (_knob(cols, "PLAIN_A", np.shape(g.block_m)) == 0) | (g.block_m <= TMA_MAX_BOX_ROWS)
    ok &= (np.asarray(cols["PACK_OUT"]) != 2) | (g.block_m % TMA_STORE_BOX_ROWS == 0)
    # HALO: the tile's patch is one TMA box of at most 256 rows (halo_tiling); a one-stage
    # loop issues at most HALO_ONE_STAGE_MAX_MMAS MMAs a stage (more spilled: REG_HALO).
    halo = _knob(cols, "HALO", np.shape(g.block_m)) == 1
    if np.any(halo):
        mmas = shape.r * shape.s * np.asarray(cols["CHUNK"]) * np.asarray(cols["WARP_ROW_TILES"])
        ok &= ~halo | ((_halo_columns(shape, g.block_m, halo)["plane_rows"] > 0) &
                       ((np.asarray(cols["STAGES"]) >= 2) | (mmas <= HALO_ONE_STAGE_MAX_MMAS)))
    # FOLD_TAPS' loader keeps one tap slot per thread: threads a multiple of the taps per
    # stage row.
    fold = _knob(cols, "FOLD_TAPS", np.shape(g.block_m)) == 1
    ok &= ~fold | (g.threads % g.row_loads == 0)
    # A persistent grid's blocks per SM must fit the SM's shared memory and threads.
    persist = _knob(cols, "PERSIST", np.shape(g.block_m))
    ok &= (persist == 0) | (blocks_per_sm(target, g.smem_bytes, g.block_threads) >= persist)
    # Shared memory: a block cannot launch with more than the opt-in maximum.
    ok &= g.smem_bytes <= target.smem_per_block_kib * 1024
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
        self._values = [np.asarray(v, dtype=object if isinstance(v[0], str) else np.int64)
                        for v in self.knobs.values()]

    # --- index <-> schedule -------------------------------------------------------------
    def digits(self, indices: np.ndarray) -> np.ndarray:
        """(len(indices), n_knobs) array of value positions."""
        # Knob by knob over contiguous rows, a transposed view out: one (rows, knobs)
        # broadcast division took twice as long.
        idx = np.asarray(indices, dtype=np.int64).ravel()
        out = np.empty((len(self.radices), len(idx)), dtype=np.int64)
        for i, (place, radix) in enumerate(zip(self._place, self.radices, strict=True)):
            np.floor_divide(idx, place, out=out[i])
            np.remainder(out[i], radix, out=out[i])
        return out.T

    def index_of(self, schedule: Mapping[str, Any]) -> int:
        pos = [self.knobs[n].index(schedule[n] if n in schedule else KNOB_DEFAULTS[n])
               for n in self.names]
        return int(np.dot(pos, self._place))

    def schedule_at(self, index: int) -> Schedule:
        # In Python integers: a round's candidates are decoded one at a time, where the
        # array path's per-knob calls cost more than the arithmetic.
        i = int(index)
        return {n: values[i // place % radix]
                for n, values, place, radix in zip(self.names, self.knobs.values(),
                                                   self._place.tolist(), self.radices.tolist(),
                                                   strict=True)}

    def columns(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Knob -> values column for the given indices (string knobs stay strings)."""
        # Knob by knob, as `digits` decodes, without its table: one (rows, knobs) division
        # and gathers from its strided columns were half of an enumeration's time.
        idx = np.asarray(indices, dtype=np.int64).ravel()
        return {n: self._values[i][idx // self._place[i] % self.radices[i]]
                for i, n in enumerate(self.names)}

    # --- validity ------------------------------------------------------------------------
    def valid_mask(self, indices: np.ndarray) -> np.ndarray:
        return validity(self.shape, self.precision, self.target, self.columns(indices))

    @cached_property
    def valid_indices(self) -> np.ndarray:
        """Every valid schedule's index, ascending. Most of the product breaks a structural
        rule, so the structural product (tile knobs at their first value) is filtered
        first and only its survivors are crossed with the tile knobs: a few percent of the
        product is evaluated in full, with the very rules `valid_mask` applies."""
        key = (self.shape, self.precision, self.target, self._knob_key)
        hit = _VALID_CACHE.get(key)
        if hit is None:
            hit = _cache_put(_VALID_CACHE, key, self._enumerate_valid())
        return hit

    @cached_property
    def _knob_key(self) -> tuple[tuple[str, tuple[Any, ...]], ...]:
        return tuple((n, v) for n, v in self.knobs.items())

    def _structural_survivors(self, tile: np.ndarray) -> np.ndarray:
        """Indices of the structural product (tile knobs at their first value) that pass
        the structural rules: the same for every layer of the same traits."""
        key = (layer_traits(self.shape, self.precision), self.precision, self.target,
               self._knob_key)
        hit = _STRUCTURAL_CACHE.get(key)
        if hit is None:
            structural = _product_offsets(np.where(tile, 1, self.radices), self._place)
            keep = structural_validity(key[0], self.precision, self.target,
                                       self.columns(structural))
            hit = _cache_put(_STRUCTURAL_CACHE, key, structural[keep])
        return hit

    def _enumerate_valid(self) -> np.ndarray:
        tile = np.array([n in TILE_KNOBS for n in self.names])
        structural = self._structural_survivors(tile)
        scols = self.columns(structural)
        tiles = _product_offsets(np.where(tile, self.radices, 1), self._place)
        tcols = self.columns(tiles)
        # The tile rules over the crossed product by broadcasting, tile knobs as a column and
        # the structural survivors as a row: a quantity of one factor alone (a block's
        # tile sizes, a pipeline's stage count) is worked out once per its values, and no
        # crossed column is built.
        # Once per Tensor Core path, MMA a (1, 1) column: most of the geometry branches on it,
        # and a row holding both paths would make nearly every quantity a crossed one.
        path = scols.get("MMA", np.zeros(len(structural)))
        out = []
        for value in np.unique(path):
            sel = path == value
            cols = {n: tcols[n][:, None] if t else
                    (scols[n][sel][:1, None] if n == "MMA" else scols[n][sel][None, :])
                    for n, t in zip(self.names, tile, strict=True)}
            ok = tile_validity(self.shape, self.precision, self.target, cols)
            out.append((tiles[:, None] + structural[sel][None, :])[ok])
        return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)

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


# Enumerated spaces by (shape, precision, target, knob values): a process builds the space
# of a task many times (explorer rounds, the simulated backend, features), and it is fixed.
_VALID_CACHE: dict[tuple[Any, ...], np.ndarray] = {}
# The structural product's survivors by (traits, precision, target, knob values): a quarter
# of a new layer's enumeration, shared by most layers of a fleet's target.
_STRUCTURAL_CACHE: dict[tuple[Any, ...], np.ndarray] = {}
_CACHE_SIZE = 64
_CACHE_LOCK = threading.Lock()  # evictions (threads of one explorer share the caches)


def _cache_put(cache: dict[tuple[Any, ...], np.ndarray], key: tuple[Any, ...],
               value: np.ndarray) -> np.ndarray:
    """Store a read-only `value` under `key` in a bounded cache (the oldest entries go);
    the entry a racing thread stored first wins."""
    value.flags.writeable = False
    with _CACHE_LOCK:
        while len(cache) >= _CACHE_SIZE:
            cache.pop(next(iter(cache)))
        return cache.setdefault(key, value)


def _product_offsets(radices: np.ndarray, place: np.ndarray) -> np.ndarray:
    """Indices of every digit combination with digit i < radices[i] (place values `place`)."""
    out = np.zeros(1, dtype=np.int64)
    for r, pl in zip(radices, place, strict=True):
        out = (out[:, None] + np.arange(r, dtype=np.int64) * pl).ravel()
    return out


def is_valid(shape: ConvShape, precision: Precision, schedule: Mapping[str, Any],
             target: Target) -> bool:
    return ScheduleSpace(shape, precision, target).is_valid(schedule)
