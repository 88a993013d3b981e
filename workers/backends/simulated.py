"""The `simulated` backend: an analytical model of a named GPU, for machines without one.

It turns (shape, schedule) into a latency from the quantities that decide a Tensor Core
conv's speed. Per SM and main-loop iteration, the blocks resident on it (occupancy from
threads, registers and shared memory) share the Tensor Cores (wgmma, or mma.sync through the
four sub-partitions), the load path (bytes per iteration; cp.async address work per thread,
none with TMA), its 128-byte lines (L2 requests of cp.async, or the SM's TMA unit's copies)
and, with wgmma, each block's per-stage bookkeeping, with mma.sync each sub-partition's warp
instructions, and pay a latency floor (barrier, warps, pipeline depth, TMA=1's wait per
stage, longer with more resident blocks; a halo stage's taps); these overlap as a smooth
max. The main loop runs once per round of resident blocks (the last round with the blocks
left, which share the SM less), plus each block's prologue (with TMA, its set-up) and
epilogue (a persistent block sets up once and hides most of a tile's fixed cost behind the
next); DRAM bounds the whole; split-K adds its reduction. The result is deterministic per
(shape, schedule) plus small seeded noise, and every result it makes is stored and shown as
simulated.

The constants are fitted (bench/simulator_fit.py) to GPU-recorded data and live in
simulated_fit.json beside this module: "kernel" to the ResNet-50 3x3 replay spaces recorded
on H100 (wgmma: the shared constants) and H200 (mma.sync: that path's own), then the
constants of PERSIST, HALO and DUP_AWARE (which those spaces lack) to the zoo's, the halo
patch's and the duplicate-aware probe's timed rounds; "cudnn_fp16" and "cudnn_fp32" to
cuDNN times recorded on H100 and H200.
Held-out figures are in bench/RESULTS.md, "Simulator calibration". Other targets use the
same constants with their own datasheet figures (SMs, clock, peaks, bandwidth): an
extrapolation.

The baseline (`SimulatedBackend.baseline_us`) is a model of cuDNN, not of this kernel: a
roofline of the layer (arithmetic, DRAM bytes, the reduction walked in order) with its own
fitted constants.

The model is written over numpy columns so that a whole space can be simulated at once
(`model_inputs` once per space, `latency_from_inputs` per set of constants: the fit's loop).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from kernels.space import (
    WGMMA_N_PER_TILE,
    Geometry,
    ScheduleSpace,
    _knob,
    fold_tap_bytes,
    geometry,
    mma_is_wgmma,
    schedule_hash,
    schedule_problems,
    validity,
)
from kernels.spec import ConvShape, Precision, Target, instruction_shape
from workers.backends.base import BuildOutcome, MeasureOutcome, TaskSpec

FIT_FILE = Path(__file__).with_name("simulated_fit.json")
NOISE_SIGMA = 0.015  # relative spread of repeated timings on a real GPU
FP32_TC_PRODUCTS = {"scaled3": 3.0, "binomial4": 4.0, "karatsuba": 3.3}
# FP32 lanes (FFMA per clock) of one SM, by compute capability.
FP32_LANES = {75: 64, 80: 64, 86: 128, 89: 128, 90: 128}


def _load_fit(path: Path = FIT_FILE) -> tuple[dict[str, dict[str, float]], frozenset[str]]:
    """The fitted constants (bench/simulator_fit.py writes them): "kernel" for the tuned
    kernel's model, "cudnn_fp16" and "cudnn_fp32" for the modelled baselines; and the GPUs
    whose measurements they were fitted to and checked against."""
    data = json.loads(path.read_text())
    return ({part: {k: float(v) for k, v in data[part].items()}
             for part in ("kernel", "cudnn_fp16", "cudnn_fp32")},
            frozenset(data["checked_targets"]))


FIT, CHECKED_TARGETS = _load_fit()


def prediction_note(target: str) -> str | None:
    """What a simulated result on `target` is, where the model was never checked against
    that GPU (None where it was): its datasheet figures in a model fitted to other GPUs."""
    if target in CHECKED_TARGETS:
        return None
    return (f"a prediction of the analytical model for {target}, from its datasheet "
            f"figures: never checked against measurements on that GPU (the model is "
            f"fitted to {', '.join(sorted(CHECKED_TARGETS))})")


def _smooth_max(p: float, *xs: np.ndarray) -> np.ndarray:
    """(sum x^p)^(1/p): the max of terms that overlap imperfectly (p=1: no overlap, a sum;
    large p: full overlap, the max)."""
    arrs = np.broadcast_arrays(*[np.asarray(x, dtype=np.float64) for x in xs])
    top = np.maximum(np.maximum.reduce(arrs), 1e-30)
    return top * sum((a / top) ** p for a in arrs) ** (1.0 / p)


def model_inputs(shape: ConvShape, precision: Precision, target: Target,
                 cols: Mapping[str, np.ndarray], g: Geometry | None = None) -> dict[str, Any]:
    """The parameter-free quantities of the model, per schedule (numpy columns) and per layer
    (scalars): what `latency_from_inputs` combines with the fitted constants. Split so that
    a fit evaluates the constants many times over the same columns. `g`: the columns'
    geometry, where the caller has it already."""
    p = Precision(precision)
    inst = instruction_shape(p, target.sm)
    g = geometry(shape, p, target, cols) if g is None else g
    f64 = np.float64
    n = np.shape(g.block_m)
    wrt, wct = cols["WARP_ROW_TILES"].astype(f64), cols["WARP_COL_TILES"].astype(f64)
    wg = mma_is_wgmma(cols, n)
    tma = _knob(cols, "TMA", n).astype(f64)
    persist = _knob(cols, "PERSIST", n).astype(f64)
    stages, split_k = cols["STAGES"].astype(f64), cols["SPLIT_K"].astype(f64)
    dup, pack = cols["DUP_AWARE"] == 1, cols["PACK_OUT"] >= 1
    nhwcnc = cols["LAYOUT"] == "nhwcnc"
    bits, in_bytes = p.operand_bits, p.input_bits / 8

    # Occupancy from threads, registers and shared memory.
    frag = np.where(wg, 0.0, (wrt * inst.m * inst.k + wct * inst.n * inst.k) * bits / 32 / 32)
    regs = np.minimum(target.max_regs_per_thread, g.acc_regs + frag + 40)
    threads = g.block_threads.astype(f64)
    by_threads = target.max_threads_per_sm // threads
    by_regs = target.regs_per_sm // (threads * np.ceil(regs / 8) * 8)
    by_smem = np.where(g.smem_bytes > 0,
                       target.smem_per_sm_kib * 1024 // np.maximum(g.smem_bytes, 1), 64)
    bps = np.maximum(1, np.minimum.reduce(
        [np.full_like(threads, target.max_blocks_per_sm), by_threads, by_regs, by_smem]))
    bps = np.where(persist > 0, np.minimum(bps, persist), bps)
    grid = g.grid_blocks.astype(f64)
    # Blocks an SM runs at once, and how many times over it does so.
    conc = np.minimum(bps, np.ceil(grid / target.sms))
    rounds = np.ceil(grid / (target.sms * bps))
    # The last round holds what is left: fewer blocks per SM, which share it less.
    full = np.floor(grid / (target.sms * bps))
    tail_conc = np.ceil((grid - full * target.sms * bps) / target.sms)

    peak = target.peak(p) * 1e12 / (target.sms * target.boost_mhz * 1e6)  # per SM and clock
    if p is Precision.FP32_TC:
        peak = peak / np.vectorize(FP32_TC_PRODUCTS.get)(cols["SPLIT"]).astype(f64)
    # A stage's MMAs: one filter tap of its channels, or several (DUP_AWARE: a filter row or
    # all R*S taps; HALO: all R*S, each tap also a cost of its own in the floor).
    taps = g.taps.astype(f64)
    halo_taps = np.where(_knob(cols, "HALO", n) == 1, shape.r * shape.s, 0)
    flops_it = 2.0 * g.block_m * g.block_n * g.block_k * taps
    # Width of one instruction's N (wgmma: one instruction spans the warp's WCT tiles) and
    # the independent instruction chains a warp keeps in flight (mma.sync). SWAP_AB is not
    # modelled (a swapped tile costs what its twin does): measured, the same tile swapped
    # took 0.90-1.55x of its twin's time, by layer (docs/kernels/levels-and-pipelines.md).
    wg_n = WGMMA_N_PER_TILE * wct
    chains = wrt * wct
    # Global bytes one block loads per main-loop iteration (16-byte vectors, or taps).
    fold = _knob(cols, "FOLD_TAPS", n) == 1
    vec_bytes = np.where(fold, fold_tap_bytes(shape, p) or 16, 16)
    ld_it = g.stage_vectors * g.threads * vec_bytes
    # Narrow rows of plain NHWC waste 32-byte sectors; NHWCnc keeps them whole, and so do
    # folded taps (a stage row packs the taps of neighbouring pixels, which share sectors).
    row_bytes = np.minimum(shape.c, g.block_k) * in_bytes
    ld_it = ld_it / np.where(nhwcnc | fold, 1.0, np.minimum(1.0, row_bytes / 32.0))
    # Channels inner (REORDER_INNER=0, one filter tap per stage run): a stage reads a
    # row_bytes piece of each input pixel's 128-byte line and the next stages the rest, so
    # lines shorter than that travel from L2 in parts: A's traffic grows with the parts.
    a_share = g.block_m / (g.block_m + g.block_n)
    parts = np.maximum(128.0 / np.maximum(np.minimum(shape.c * in_bytes, g.block_k * in_bytes),
                                          1.0), 1.0) - 1.0
    split_lines = np.where((cols["REORDER_INNER"] == 0) & ~dup & ~fold, a_share * parts, 0.0)
    # ...and the wgmma path's cp.async loads run that order slower per stage even where a
    # stage takes whole lines (every channel in one stage: the same stages in either
    # order; recorded spaces: 2% at the median), an effect of the generated code.
    order0 = wg & (tma == 0) & (cols["REORDER_INNER"] == 0) & ~dup & ~fold
    # PINGPONG: each consumer's main loop waits its turn (an mbarrier the other hands over)
    # on every stage of its tile.
    pingpong = _knob(cols, "PINGPONG", n) == 1
    # mma.sync reads its fragments from shared memory with ldmatrix (wgmma reads in place).
    smem_it = np.where(wg, 0.0, g.warps * (wrt * inst.m + wct * inst.n) * g.block_k * bits / 8
                       * taps)
    # A residual tile is read in the epilogue as the output tile is written.
    epi_bytes = g.block_m * g.block_n * (np.where(pack, p.output_bits, 32) +
                                         p.output_bits * shape.residual) / 8
    unique = shape.tensor_elements()
    dram = (unique["input"] + unique["weight"]) * in_bytes + \
        (unique["output"] + unique["residual"]) * p.output_bits / 8
    return {
        "wg": wg, "tma": tma, "stages": stages, "split_k": split_k, "dup": dup,
        "pack": pack, "warps": g.warps.astype(f64), "k_iters": g.k_iters.astype(f64),
        "vectors": g.stage_vectors.astype(f64),
        "epi_values": g.block_m * g.block_n / threads,  # output values per thread
        # 128-byte lines (pieces of a row of pixels or filters) a stage loads: L2 serves an
        # SM's requests a line at a time, and the SM's one TMA unit copies them one by one.
        "lines": g.stage_vectors * g.threads / np.maximum(g.row_loads, 1) *
        np.ceil(g.block_k * in_bytes / 128.0),
        "conc": conc, "rounds": rounds, "grid": grid, "full_rounds": full,
        "persist_rounds": np.where(persist > 0, rounds - 1, 0.0),
        "tma_store": cols["PACK_OUT"] == 2,
        "tail_conc": tail_conc, "flops_it": flops_it, "halo_taps": halo_taps,
        "peak": peak, "wg_n": wg_n, "chains": chains,
        # mma.sync: a warp's instructions per iteration, MMAs and their fragments' ldmatrix
        "warp_instrs": np.where(wg, 0.0, g.block_k / inst.k * (wrt * wct + wrt + wct) * taps),
        "ld_it": ld_it, "smem_it": smem_it,
        "epi_bytes": epi_bytes, "split_lines": split_lines, "order0": order0,
        "pingpong": pingpong, "dram": dram,
        "clock_hz": target.boost_mhz * 1e6,
        "bw": target.bandwidth_gbs * 1e9, "sms": target.sms,
        # (SPLIT_CLUSTER, the sum over distributed shared memory, is not modelled: a split
        # layer took 0.94-0.96x the global sum's time with it, bench/RESULTS.md)
        "reduce_bytes": np.where(split_k > 1,
                                 split_k * shape.gemm_m * shape.gemm_n * 4 * 2, 0.0),
    }


def _burst_cycles(x: Mapping[str, Any], c: Mapping[str, float], conc: np.ndarray
                  ) -> np.ndarray:
    """The prologue's burst: a block loads its first min(STAGES - 1, iterations) stages
    before its first MMA, and the `conc` blocks resident on its SM do so at once, so the
    first MMA waits on all their bytes at `burst_bytes_per_clk`. Scaled by the share of the
    main loop beyond the prologue ((iterations - (STAGES - 1)) / iterations, at least 0):
    a block whose whole loop fits in the prologue loads nothing more after it, and its
    main-loop terms (k_iters x an iteration's time) already charge those very loads; a
    long loop's burst is a start-up delay its steady state does not hide."""
    # Where the share is above 0 the loop is longer than the prologue: it loads STAGES - 1.
    n_pro = x["stages"] - 1
    beyond = np.maximum(x["k_iters"] - n_pro, 0) / x["k_iters"]
    return conc * n_pro * x["ld_it"] / c["burst_bytes_per_clk"] * beyond


def _block_cycles(x: Mapping[str, Any], c: Mapping[str, float], conc: np.ndarray,
                  burst_share: float | np.ndarray = 1.0) -> np.ndarray:
    """Cycles of one block, from its first load to its last store, with `conc` blocks
    resident on its SM (sharing its Tensor Cores and load path); `burst_share`: the share of
    the prologue's burst it pays (a persistent block's tiles share one)."""
    wg = x["wg"]
    # Tensor Core rate: wgmma loses to narrow N (per-instruction overhead); mma.sync to
    # too few independent chains per warp.
    eff = np.where(wg, c["eff_wgmma"] * x["wg_n"] / (x["wg_n"] + c["wgmma_n0"]),
                   c["eff_sync"] * x["chains"] / (x["chains"] + c["sync_chains0"]))
    # A warp issues to one of the SM's four sub-partitions, each with a quarter of its
    # Tensor Cores: the busiest one sets the pace (a warpgroup spans all four).
    resident = conc * x["warps"]
    imbalance = np.where(wg, 1.0, np.ceil(resident / 4.0) * 4.0 / resident)
    t_mma = conc * x["flops_it"] * imbalance / (x["peak"] * eff)
    ld_bw = c["load_bytes_per_clk"] * np.where(x["tma"] > 0, c["tma_load_gain"], 1.0)
    t_ld = conc * (x["ld_it"] * (1.0 + c["line_part_cost"] * x["split_lines"]) / ld_bw +
                   x["smem_it"] / c["smem_bytes_per_clk"])
    # TMA=1: a math thread refills each stage once every warp has released it, before its
    # own next MMAs: a wait per stage the MMAs do not hide (TMA=2: a producer warp's), and
    # its copies queue behind the other resident blocks' at the SM's one TMA unit.
    floor = np.where(wg, c["iter_cycles_wgmma"], c["iter_cycles_sync"]) + \
        c["iter_cycles_per_warp"] * x["warps"] * conc + \
        c["load_latency_cycles"] / x["stages"] + np.where(x["dup"], c["dup_iter_cycles"], 0.0) + \
        np.where(x["order0"], c["order0_iter_cycles"], 0.0) + \
        np.where(x["pingpong"], c["pingpong_iter_cycles"], 0.0) + \
        np.where(x["tma"] == 1, c["tma_issue_cycles"] * conc, 0.0) + \
        x["halo_taps"] * c["halo_tap_cycles"]
    # cp.async loads: every thread computes the addresses of its vectors each iteration
    # (TMA: one thread issues a few tensor copies); warps on one sub-partition take turns.
    t_issue = np.where(x["tma"] > 0, 0.0, c["issue_cycles_per_vector"] * x["vectors"] *
                       np.maximum(1.0, conc * x["warps"] / 4.0))
    # Lines: the L2 requests of cp.async, or the TMA unit's copies, shared by the SM's blocks.
    t_lines = conc * x["lines"] * np.where(x["tma"] > 0, c["tma_line_cycles"], c["line_cycles"])
    # wgmma: each resident block's per-stage bookkeeping (fence, commit and wait of its
    # warpgroups' MMAs, the stage's barriers) takes the SM's issue slots in turn.
    t_blocks = np.where(wg, conc * c["block_iter_cycles"], 0.0)
    # mma.sync: a sub-partition issues its warps' instructions one a cycle at best, and a
    # warp with few others beside it waits on its own dependencies (ldmatrix -> MMA) instead.
    t_warps = x["warp_instrs"] * np.maximum(resident / 4.0, c["sync_lone_cpi"])
    t_it = _smooth_max(c["overlap_p"], floor, t_mma, t_ld, t_issue, t_lines, t_blocks, t_warps)
    # Each thread transforms its output values one after another (a block's own latency,
    # which other resident blocks overlap: not shared by `conc`).
    t_epi = c["epilogue_cycles"] + _store_cycles(x, c, conc) + \
        c["epi_value_cycles"] * x["epi_values"]
    # TMA: a block first fetches its tensor maps and sets up its stages' mbarriers.
    t_pro = _prologue_cycles(x, c)
    return x["k_iters"] * t_it + t_pro + t_epi + burst_share * _burst_cycles(x, c, conc)


def _store_cycles(x: Mapping[str, Any], c: Mapping[str, float], conc: np.ndarray
                  ) -> np.ndarray:
    """The output tile's stores, with `conc` blocks resident on the SM."""
    return conc * x["epi_bytes"] / c["store_bytes_per_clk"]


def _prologue_cycles(x: Mapping[str, Any], c: Mapping[str, float]) -> np.ndarray:
    """A block's set-up before its first load (with TMA: its tensor maps and mbarriers)."""
    return c["prologue_cycles"] + np.where(x["tma"] > 0, c["tma_prologue_cycles"], 0.0)


def latency_from_inputs(x: Mapping[str, Any], c: Mapping[str, float]) -> np.ndarray:
    """Modelled latency (us) of the schedules whose `model_inputs` are `x`, with constants `c`.

    Per SM and main-loop iteration, the blocks resident on it share the Tensor Cores and the
    load path, and each iteration has a latency floor (barrier, issue, load latency not hidden
    by the stages); those overlap imperfectly (a smooth max). The main loop is paid per round
    of resident blocks, plus each block's prologue and epilogue; DRAM bounds the whole."""
    # Full rounds run `conc` blocks per SM; a partial last round, `tail_conc`.
    # (Both in one evaluation: rows of a (2, n) array broadcast against the inputs.)
    # A persistent block loads the prologue's burst once: it issues each next tile's first
    # stages before the last one's epilogue (its full rounds share one burst, its tail none).
    once = (x["persist_rounds"] > 0) & (x["full_rounds"] > 0)
    share = np.stack([np.where(once, 1.0 / np.maximum(x["full_rounds"], 1), 1.0),
                      np.where(once, 0.0, 1.0)])
    t_full, t_tail = _block_cycles(x, c, np.stack([x["conc"], np.maximum(x["tail_conc"], 1)]),
                                   share)
    t_tail = np.where(x["tail_conc"] > 0, t_tail, 0.0)
    # A persistent block (PERSIST) loops over its tiles: it sets up once, a share of its
    # fixed costs around a tile's main loop (epilogue_cycles: the first loads' and the last
    # stores' latency, mostly) overlaps the next tile's (whose first stages it issues before
    # this tile's epilogue), and so do its TMA stores (PACK_OUT=2), which drain while it
    # goes on.
    overlapped = _prologue_cycles(x, c) + c["persist_hidden"] * c["epilogue_cycles"] + \
        np.where(x["tma_store"], _store_cycles(x, c, x["conc"]), 0.0)
    t_sm = (x["full_rounds"] * t_full + t_tail - x["persist_rounds"] * overlapped
            ) / x["clock_hz"]
    t_dram = x["dram"] / (x["bw"] * c["dram_eff"])
    t_split = x["reduce_bytes"] / (x["bw"] * c["dram_eff"]) + \
        np.where(x["split_k"] > 1, c["split_launch_us"] * 1e-6, 0.0)
    return (_smooth_max(c["overlap_p"], t_sm, t_dram) + t_split) * 1e6 + c["launch_us"]


def simulate_latency_us(shape: ConvShape, precision: Precision, target: Target,
                        cols: Mapping[str, np.ndarray],
                        constants: Mapping[str, float] | None = None,
                        g: Geometry | None = None) -> np.ndarray:
    """Noise-free modelled latency in microseconds for each schedule in `cols` (constants:
    the fitted ones unless given; `g`: the columns' geometry, where the caller has it)."""
    return latency_from_inputs(model_inputs(shape, precision, target, cols, g),
                               FIT["kernel"] if constants is None else constants)


def _cudnn_us(shape: ConvShape, peak_flops: float, operand_bytes: float, target: Target,
              c: Mapping[str, float]) -> float:
    """A library conv, modelled from its layer alone: arithmetic at a share of `peak_flops`
    (less where the output has too few `tile` x `tile` tiles to fill the SMs, and for few
    input channels), the tensors' bytes at a share of DRAM bandwidth (of the output's, the
    share `out_dram_share` that reaches DRAM before the kernel ends: the rest waits in L2 as
    lines written back later), and the reduction walked in order (`k_ns` per element of GEMM
    K), overlapping as a smooth max, plus a launch (constants `c`, fitted to cuDNN)."""
    tiles = shape.gemm_m * shape.gemm_n / c["tile"] ** 2  # smooth: the library picks its tile
    # Few input channels per filter tap leave the inner product short: less efficient.
    eff = c["compute_eff"] * shape.c / (shape.c + c["channels_half"])
    t_compute = shape.flops / (peak_flops * eff * min(1.0, tiles / target.sms))
    el = shape.tensor_elements()
    t_memory = (el["input"] + el["weight"] + c["out_dram_share"] * el["output"]) * operand_bytes / \
        (target.bandwidth_gbs * 1e9 * c["dram_eff"])
    t_serial = shape.gemm_k * c["k_ns"] * 1e-9
    t = float(_smooth_max(c["overlap_p"], np.array(t_compute), np.array(t_memory),
                          np.array(t_serial)))
    # A residual layer's baseline adds the residual after the conv (kernels.cudnn): a pass
    # that reads two outputs' worth and writes one, and its launch.
    t_add = 3 * el["residual"] * operand_bytes / (target.bandwidth_gbs * 1e9 * c["dram_eff"])
    return (t + t_add) * 1e6 + c["launch_us"] * (2 if shape.residual else 1)


def cudnn_fp16_us(shape: ConvShape, target: Target) -> float:
    """Modelled cuDNN fp16 (channels_last, Tensor Cores)."""
    return round(_cudnn_us(shape, target.peak(Precision.FP16) * 1e12, 2.0, target,
                           FIT["cudnn_fp16"]), 3)


def ffma_peak(target: Target) -> float:
    """FP32 FLOP/s of the CUDA cores (FFMA, two operations)."""
    return target.sms * FP32_LANES.get(target.sm, 128) * 2 * target.boost_mhz * 1e6


def cudnn_fp32_us(shape: ConvShape, target: Target) -> float:
    """Modelled cuDNN fp32 (TF32 off): FFMA on the CUDA cores."""
    peak = ffma_peak(target)
    return round(_cudnn_us(shape, peak, 4.0, target, FIT["cudnn_fp32"]), 3)


def _noise(key: str) -> float:
    """A log-normal factor of spread NOISE_SIGMA, fixed per key: a standard normal from two
    uniforms of the key's hash (Box-Muller; a numpy generator per call cost 10x more)."""
    digest = hashlib.sha256(key.encode()).digest()
    u1 = (int.from_bytes(digest[:8], "little") + 1) / 2**64  # in (0, 1]: log(u1) is finite
    u2 = int.from_bytes(digest[8:16], "little") / 2**64
    return math.exp(NOISE_SIGMA * math.sqrt(-2.0 * math.log(u1)) * math.cos(2 * math.pi * u2))


@lru_cache(maxsize=256)
def _space_of(task: TaskSpec) -> ScheduleSpace:
    return ScheduleSpace(task.shape, task.precision, task.target)


Row = tuple[tuple[str, Any], ...]  # a schedule as sorted (knob, value) pairs
_ROWS: OrderedDict[tuple[TaskSpec, Row], float | None] = OrderedDict()  # LRU of modelled rows
MAX_ROWS = 8192


def _model_rows(task: TaskSpec, rows: list[Row]) -> None:
    """Model these schedules of one task in one evaluation (None: invalid for the layer) into
    the row cache. A call costs about 0.5 ms of numpy overhead for one row or a chunk's; a
    table of the task's whole space would cost a second of enumeration and 70 MB per task
    and process, and a worker measures few schedules of each task. The model is
    elementwise: a row gets the very number it gets alone or in a whole-space call."""
    space = _space_of(task)
    cols = space.columns(np.array([space.index_of(dict(r)) for r in rows]))
    g = geometry(task.shape, task.precision, task.target, cols)
    ok = validity(task.shape, task.precision, task.target, cols, g)
    us = simulate_latency_us(task.shape, task.precision, task.target, cols, g=g)
    for r, valid, u in zip(rows, ok, us, strict=True):
        _ROWS[(task, r)] = float(u) if valid else None
    while len(_ROWS) > MAX_ROWS:
        _ROWS.popitem(last=False)


def _model_us(task: TaskSpec, schedule: Mapping[str, Any]) -> float | None:
    """The modelled latency of a schedule, or None where it is not valid for the layer."""
    key = (task, tuple(sorted(schedule.items())))
    if key in _ROWS:  # modelled rows passed schedule_problems
        _ROWS.move_to_end(key)
        return _ROWS[key]
    if schedule_problems(task.precision, schedule):
        return None
    _model_rows(task, [key[1]])
    return _ROWS[key]


def simulated_result(task: TaskSpec, schedule: Mapping[str, Any]) -> MeasureOutcome:
    base = _model_us(task, schedule)
    if base is None:
        return MeasureOutcome("compile_error", error="schedule is not valid for this layer")
    key = f"{task.shape.key()}|{task.precision.value}|{task.target.name}|{schedule_hash(schedule)}"
    median = base * _noise(key)
    return MeasureOutcome("ok", median_us=round(median, 3),
                          iqr_us=round(median * NOISE_SIGMA * 1.35, 3),
                          detail={"simulated": True, "model_us": round(base, 3)})


def _planted_crash(key: str, rate: float) -> bool:
    h = int.from_bytes(hashlib.sha256(("crash|" + key).encode()).digest()[:8], "little")
    return h / 2**64 < rate


def _measure_in_child(task: TaskSpec, schedule: dict[str, Any], crash: bool) -> int:
    """Run the model in a forked child; returns its wait status. A bare fork, because
    Celery's pool processes are daemonic and multiprocessing refuses them children."""
    pid = os.fork()
    if pid == 0:  # child
        try:
            if crash:
                os.abort()  # what an illegal address in a real kernel does to its process
            simulated_result(task, schedule)
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


# Tests hold simulated measurements at a gate, so that a job is still running when they
# look (instead of guessing how long it takes on a loaded machine), and count every
# measurement across processes. The directory's `allow` file, while it exists, holds how
# many measurements may start in all; each start takes a numbered ticket file (O_EXCL:
# one per number, whichever process asks) and waits while there is none left. Each start
# also appends "pid key" to `measured.log` (O_APPEND writes of one short line are whole).
GATE_POLL_S = 0.02


def _allowed(gate: str) -> int | None:
    try:
        return int((Path(gate) / "allow").read_text().strip() or 0)
    except FileNotFoundError:
        return None
    except ValueError:  # being rewritten: read again
        return 0


def pass_gate(gate: str, key: str) -> None:
    """Wait for a ticket of the gate directory, then log the measurement's key."""
    n = 0
    while True:
        allowed = _allowed(gate)
        if allowed is not None and n >= allowed:
            time.sleep(GATE_POLL_S)
            continue
        try:
            os.close(os.open(Path(gate) / f"ticket-{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            n += 1
    fd = os.open(Path(gate) / "measured.log", os.O_CREAT | os.O_APPEND | os.O_WRONLY)
    try:
        os.write(fd, f"{os.getpid()} {key}\n".encode())
    finally:
        os.close(fd)


class SimulatedBackend:
    """Measures nothing: asks the analytical model. `delay_s` imitates a measurement's time.

    With `crash_rate` > 0 every measurement runs in a child process, as the cuda backend's
    do, and that fraction of schedules (fixed per schedule) kills its child: the fault
    tests see the same crash path as a faulting kernel.
    """

    name = "simulated"

    def __init__(self, target: Target, delay_s: float = 0.0, crash_rate: float = 0.0,
                 gate_dir: str = "") -> None:
        self.target = target
        self.delay_s = delay_s
        self.crash_rate = crash_rate
        self.gate_dir = gate_dir  # the tests' gate (above); empty: none

    @property
    def gpu_model(self) -> str:
        return f"{self.target.model} (simulated)"

    def prepare(self, items: Sequence[tuple[TaskSpec, dict[str, Any]]]) -> None:
        """Model a chunk's schedules in one evaluation per task before they are built and
        measured one by one (Backend.prepare): a chunk costs about what one schedule
        does."""
        todo: dict[TaskSpec, list[Row]] = {}
        for task, schedule in items:
            row = tuple(sorted(schedule.items()))
            if (task, row) not in _ROWS and not schedule_problems(task.precision, schedule) \
                    and row not in todo.setdefault(task, []):
                todo[task].append(row)
        for task, rows in todo.items():
            if rows:
                _model_rows(task, rows)

    def build(self, task: TaskSpec, schedule: dict[str, Any]) -> BuildOutcome:
        if _model_us(task, schedule) is None:
            return BuildOutcome("compile_error", log="schedule is not valid for this layer")
        return BuildOutcome("ok", artifact=None)

    def measure(self, task: TaskSpec, schedule: dict[str, Any],
                build: BuildOutcome) -> MeasureOutcome:
        if build.status != "ok":
            return MeasureOutcome(build.status, error=build.log[-2000:] or None)
        if self.gate_dir:
            pass_gate(self.gate_dir, f"{task.shape.key()}|{task.precision.value}|"
                            f"{task.target.name}|{schedule_hash(schedule)}")
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.crash_rate > 0:
            key = f"{task.shape.key()}|{task.precision.value}|{schedule_hash(schedule)}"
            status = _measure_in_child(task, schedule, _planted_crash(key, self.crash_rate))
            if status != 0:
                return MeasureOutcome("runtime_error",
                                      error=f"measuring process died (wait status {status})")
        return simulated_result(task, schedule)

    def baseline_us(self, task: TaskSpec) -> float:
        """The layer's baseline (store/baselines.py), modelled: cuDNN fp32 for fp32_tc,
        cuDNN fp16 for every other precision."""
        if task.precision == Precision.FP32_TC:
            return cudnn_fp32_us(task.shape, task.target)
        return self._cudnn_fp16_us(task)

    def _cudnn_fp16_us(self, task: TaskSpec) -> float:
        return cudnn_fp16_us(task.shape, task.target)

    def close(self) -> None:
        pass
