"""The `simulated` backend: an analytical model of a named GPU, for machines without one.

It turns (shape, schedule) into a latency from the quantities that decide a Tensor Core
conv's speed: waves of blocks over the SMs, tile waste at the edges, occupancy (threads,
registers, shared memory), arithmetic at the target's peak per precision (int4 on sm_90 is
emulated and slow), bytes moved through L2 and DRAM, shared-memory traffic, pipeline depth,
split-K reduction and the epilogue. The result is deterministic per (shape, schedule) plus
small seeded noise, and every result it makes is stored and shown as simulated.

The model is written over numpy columns so that a whole space can be simulated at once
(the offline replay datasets of the search benchmark come from here until GPU ones exist).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from kernels.space import (
    WGMMA_M,
    WGMMA_N_PER_TILE,
    ScheduleSpace,
    geometry,
    mma_is_wgmma,
    schedule_hash,
    schedule_problems,
)
from kernels.spec import ConvShape, Precision, Target, instruction_shape
from workers.backends.base import BuildOutcome, MeasureOutcome, TaskSpec

LAUNCH_US = 2.5  # launch and tail of one kernel
SMEM_BYTES_PER_CLK = 128  # per SM
L2_OVER_DRAM = 2.5  # L2 bandwidth relative to DRAM bandwidth
NOISE_SIGMA = 0.015  # relative spread of repeated timings on a real GPU
FP32_TC_PRODUCTS = {"scaled3": 3.0, "binomial4": 4.0, "karatsuba": 3.3}


# FP32 lanes (FFMA per clock) of one SM, by compute capability.
FP32_LANES = {75: 64, 80: 64, 86: 128, 89: 128, 90: 128}
# The share of the FFMA peak cuDNN fp32 (TF32 off) reached on H100 for ResNet-50's stage-2
# and stage-3 3x3 layers at batch 8 (78 and 83 us: bench/RESULTS.md, "Kernels vs cuDNN").
CUDNN_FP32_EFFICIENCY = 0.35
LAUNCH_US = 3.0


def cudnn_fp32_us(shape: ConvShape, target: Target) -> float:
    """Modelled cuDNN fp32 (TF32 off): FFMA on the CUDA cores, or the memory traffic of
    fp32 tensors if that takes longer."""
    peak = target.sms * FP32_LANES.get(target.sm, 128) * 2 * target.boost_mhz * 1e6
    compute_s = shape.flops / (peak * CUDNN_FP32_EFFICIENCY)
    memory_s = shape.tensor_bytes(Precision.FP32_TC) / (target.bandwidth_gbs * 1e9 * 0.8)
    return round(max(compute_s, memory_s) * 1e6 + LAUNCH_US, 3)


def simulate_latency_us(shape: ConvShape, precision: Precision, target: Target,
                        cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """Noise-free modelled latency in microseconds for each schedule in `cols`."""
    p = Precision(precision)
    inst = instruction_shape(p, target.sm)
    g = geometry(shape, p, target, cols)
    f64 = np.float64
    clock_hz = target.boost_mhz * 1e6
    wrt, wct = cols["WARP_ROW_TILES"].astype(f64), cols["WARP_COL_TILES"].astype(f64)
    stages, split_k = cols["STAGES"].astype(f64), cols["SPLIT_K"].astype(f64)
    dup, pack = cols["DUP_AWARE"] == 1, cols["PACK_OUT"] >= 1
    reorder = cols["REORDER_INNER"] == 1
    nhwcnc = cols["LAYOUT"] == "nhwcnc"
    bits = p.operand_bits
    in_bytes = p.input_bits / 8
    wg = mma_is_wgmma(cols, np.shape(wrt))  # warpgroup tiles, operands read from smem

    # Occupancy from threads, registers and shared memory.
    frag = np.where(wg, 0.0, (wrt * inst.m * inst.k + wct * inst.n * inst.k) * bits / 32 / 32)
    regs = np.minimum(target.max_regs_per_thread, g.acc_regs + frag + 40)
    threads = g.threads.astype(f64)
    by_threads = target.max_threads_per_sm // threads
    by_regs = target.regs_per_sm // (threads * np.ceil(regs / 8) * 8)
    by_smem = np.where(g.smem_bytes > 0,
                       target.smem_per_sm_kib * 1024 // np.maximum(g.smem_bytes, 1), 64)
    blocks_per_sm = np.maximum(1, np.minimum.reduce(
        [np.full_like(threads, target.max_blocks_per_sm), by_threads, by_regs, by_smem]))
    warps_per_sm = blocks_per_sm * g.warps
    # Independent mma chains per warp and resident warps both hide latency.
    ilp = np.minimum(wrt * wct, 8.0)
    issue_eff = 1.0 - np.exp(-warps_per_sm * ilp / 12.0)

    # Waves: the last partial wave runs at partial occupancy.
    slots = target.sms * blocks_per_sm
    waves = g.grid_blocks / slots
    wave_eff = waves / np.ceil(waves)

    # Arithmetic on padded tiles.
    pad_m = np.ceil(shape.gemm_m / g.block_m) * g.block_m
    pad_n = np.ceil(shape.gemm_n / g.block_n) * g.block_n
    pad_k = np.ceil(shape.gemm_k / (g.block_k * split_k)) * g.block_k * split_k
    work = 2.0 * pad_m * pad_n * pad_k
    peak = target.peak(p) * 1e12
    if p is Precision.FP32_TC:
        peak = peak / np.vectorize(FP32_TC_PRODUCTS.get)(cols["SPLIT"]).astype(f64)
    # mma.sync reaches about 70% of the datasheet peak on Hopper (wgmma owns the rest).
    sync_eff = np.where(wg, 0.85, 0.68 if target.sm >= 90 else 0.9)
    t_mma = work / (peak * sync_eff * issue_eff * wave_eff)

    # Shared memory: each warp reads its A and B fragments for every k-step.
    blocks = g.grid_blocks.astype(f64)
    k_iters = g.k_iters.astype(f64)
    smem_read = np.where(
        wg, blocks * k_iters * (g.warps / 4) * (wrt * WGMMA_M + wct * WGMMA_N_PER_TILE),
        blocks * k_iters * g.warps * (wrt * inst.m + wct * inst.n)) * g.block_k * bits / 8
    epi_bits = np.where(pack, p.output_bits, 32)
    smem_epi = 2.0 * pad_m * pad_n * epi_bits / 8
    t_smem = (smem_read + smem_epi) / (target.sms * SMEM_BYTES_PER_CLK * clock_hz * wave_eff)

    # Global traffic: blocks load their A rows (or the receptive field) and B columns.
    tiles_n = np.ceil(shape.gemm_n / g.block_n)
    tiles_m = np.ceil(shape.gemm_m / g.block_m)
    a_im2col = tiles_n * pad_m * shape.gemm_k * in_bytes
    # Duplicate-aware loads fetch each input pixel of the receptive field once per channel
    # slice; with filter rows outer (REORDER_INNER=0) the field is reloaded per filter row.
    a_dup = tiles_n * tiles_m * g.footprint_pixels * shape.c * in_bytes
    a_dup = np.where(reorder, a_dup, a_dup * np.minimum(shape.r, 2.0))
    a_bytes = np.where(dup, np.minimum(a_dup, a_im2col), a_im2col)
    b_bytes = tiles_m * pad_n * shape.gemm_k * in_bytes
    # Narrow rows of plain NHWC waste 32-byte sectors; NHWCnc keeps them whole.
    row_bytes = np.minimum(shape.c, g.block_k) * in_bytes
    sector_eff = np.where(nhwcnc, 1.0, np.minimum(1.0, row_bytes / 32.0))
    l2_bytes = a_bytes / sector_eff + b_bytes
    unique = shape.tensor_elements()
    out_bytes = unique["output"] * p.output_bits / 8
    dram_bytes = (unique["input"] + unique["weight"]) * in_bytes + out_bytes
    bw = target.bandwidth_gbs * 1e9
    t_mem = np.maximum(dram_bytes / bw, l2_bytes / (bw * L2_OVER_DRAM * wave_eff))

    # Pipelining: one stage serialises loads and math; more stages overlap them.
    overlap = np.where(stages >= 2, 1.0 - 0.35 / stages, 0.0)
    t_main = np.maximum(t_mma, t_mem) + (1.0 - overlap) * np.minimum(t_mma, t_mem) + t_smem * 0.5
    # Per-iteration barrier and address arithmetic, paid on every wave.
    sync_cycles = np.where(stages >= 2, 120.0, 200.0) * np.where(dup, 1.25, 1.0) * \
        np.where(wg, 0.7, 1.0)  # one instruction per warpgroup tile and k-step
    t_sync = np.ceil(waves) * k_iters * sync_cycles / clock_hz
    # Split-K: partial sums through global memory and a reduction pass.
    t_split = np.where(split_k > 1,
                       split_k * shape.gemm_m * shape.gemm_n * 4 * 2 / bw + LAUNCH_US * 1e-6, 0.0)
    return (t_main + t_sync + t_split) * 1e6 + LAUNCH_US


def _noise(key: str) -> float:
    seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return float(np.exp(np.random.default_rng(seed).normal(0.0, NOISE_SIGMA)))


@lru_cache(maxsize=256)
def _model_of(task: TaskSpec) -> tuple[ScheduleSpace, np.ndarray]:
    """The task's space and the model's latency of every schedule (NaN: invalid), computed
    once per task and process: a worker measures one schedule at a time, and the model is
    elementwise, so a table lookup gives the very number a one-row call would. This keeps
    the simulated GPU's own CPU cost per measurement in microseconds, not milliseconds."""
    space = ScheduleSpace(task.shape, task.precision, task.target)
    table = np.full(space.size, np.nan)
    valid = space.valid_indices
    table[valid] = simulate_latency_us(task.shape, task.precision, task.target,
                                       space.columns(valid))
    return space, table


def _model_us(task: TaskSpec, schedule: Mapping[str, Any]) -> float | None:
    """The modelled latency of a schedule, or None where it is not valid for the layer."""
    space, table = _model_of(task)
    if schedule_problems(task.precision, schedule):
        return None
    us = float(table[space.index_of(schedule)])
    return None if np.isnan(us) else us


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
        """The best fp16 schedule of a library kernel without the paper's three
        optimizations (plain loads, 32-bit epilogue, NHWC). The paper: Choi, Kwon, Lee,
        Choi and Lim, "Learning from Distinctive Candidates to Optimize Reduced-Precision
        Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources")."""
        space = ScheduleSpace(task.shape, Precision.FP16, task.target,
                              restrict={"DUP_AWARE": [0], "PACK_OUT": [0], "LAYOUT": ["nhwc"]})
        lat = simulate_latency_us(task.shape, Precision.FP16, task.target,
                                  space.columns(space.valid_indices))
        return round(float(lat.min()), 3)

    def close(self) -> None:
        pass
