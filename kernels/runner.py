"""Load built cubins with CuPy, check them, time them; each measurement in a child process.

`DeviceSession` does the GPU work in-process (the bench scripts use it directly, inside a
child of their own). `Runner` owns one long-lived measurement child process (CuPy start-up
costs about a second, too much per candidate) and re-spawns it after a crash, a sticky CUDA
error (illegal address) or a hang: the result is `runtime_error` / `timeout` and the caller
goes on. CuPy is imported only inside functions, so `kernels` imports without a GPU.

Protocol (docs/design.md, "Measurement protocol"): random inputs with a fixed seed per shape;
the output poisoned before the check run; integer outputs exactly equal to the integer
reference (requantized outputs to the exact requantization of the exact accumulators), fp16
within a relative error of the float64 reference, fp32_tc within twice FP32's error of the
float64 reference
(kernels.reference.fp32_tc_rel_tol); then timing with `kernels.timing.time_launches` (CUDA
graph of back-to-back launches over rotating input sets that exceed L2, >= 5 samples of >= 1
ms). A task's cuDNN baseline (`Runner.baseline`, kernels.cudnn) is timed in the same child
with the same harness, on the same GPU as its candidates.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from kernels.build import cubin_path, load_meta
from kernels.launch import alloc_scratch, has_residual, load_function, supports_pdl
from kernels.launch import launch as launch_kernel
from kernels.reference import (
    Problem,
    check_output,
    device_values,
    from_device_output,
    make_problem,
    output_bytes,
    to_device_bytes,
)
from kernels.spec import ConvShape, Precision
from kernels.timing import sets_for_l2, time_launches

POISON = 0xA5
DEFAULT_TIMEOUT_S = 60.0
START_TIMEOUT_S = 120.0
# What the measuring process keeps of the tasks it measured last: their inputs and exact
# reference outputs on the host, their rotating input sets on the GPU. A whole model's jobs
# reach it interleaved, and rebuilding a task's reference (a float64 convolution on the CPU)
# at every switch took longer than the measurement itself.
HOST_PROBLEM_BYTES = 4 << 30
DEVICE_INPUT_BYTES = 4 << 30
# The ready check's predecessor (`DeviceSession.ready_launch`): it lets the next kernel on the
# stream start at once (programmatic dependent launch), waits until the host says that kernel
# is enqueued (`go`, in pinned host memory: a launch's host-side cost varies, any fixed spin
# can be too short), spins a little longer for the GPU to start it, then writes its output: a
# kernel that read that output before its grid-dependency wait reads the poison left there.
LATE_COPY_SRC = r'''
extern "C" __global__ void late_copy(const unsigned char* src, unsigned char* dst,
                                     long long n, const volatile int* go, long long spin,
                                     long long spin_max) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) {
    const long long t0 = clock64();
    long long t = t0;
    while (*go == 0 && t - t0 < spin_max) t = clock64();
    while (clock64() - t < spin) {}
  }
  __syncthreads();
  const long long step = (long long)gridDim.x * blockDim.x;
  const long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x, n16 = n / 16;
  for (long long i = i0; i < n16; i += step)
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  for (long long i = n16 * 16 + i0; i < n; i += step) dst[i] = src[i];
}'''
# Clocks after `go` (about 50 us), and at most in all (about 50 ms: a host that never says go).
LATE_COPY_SPIN, LATE_COPY_SPIN_MAX = 100_000, 100_000_000


class DeviceSession:
    """GPU side: modules, inputs and references cached across measurements of one process."""

    def __init__(self, device: int = 0, max_modules: int = 64,
                 host_problem_bytes: int = HOST_PROBLEM_BYTES,
                 device_input_bytes: int = DEVICE_INPUT_BYTES) -> None:
        import cupy

        self.cp = cupy
        self.device = device
        cupy.cuda.Device(device).use()
        props = cupy.cuda.runtime.getDeviceProperties(device)
        name = props["name"]
        self.gpu_name = name.decode() if isinstance(name, bytes) else str(name)
        self.l2_bytes = int(props.get("l2CacheSize", 50 * 2**20))
        self.sm = int(props["major"]) * 10 + int(props["minor"])
        self._modules: OrderedDict[str, Any] = OrderedDict()
        self._max_modules = max_modules
        self._problems: OrderedDict[tuple[str, str, int], Problem] = OrderedDict()
        self._dev: OrderedDict[tuple[Any, ...], dict[str, Any]] = OrderedDict()
        self._host_budget, self._device_budget = host_problem_bytes, device_input_bytes
        # ready_launch's kernel and its go flag, made at its first use
        self._late_copy: Any = None
        self._go_mem: Any = None
        self._go: Any = None

    # ---- caches -------------------------------------------------------------------------
    def function(self, cache_dir: str, key: str, meta: dict[str, Any]) -> Any:
        if key in self._modules:
            self._modules.move_to_end(key)
            return self._modules[key][1]
        mod, fn = load_function(cubin_path(cache_dir, key), meta)
        self._modules[key] = (mod, fn)
        while len(self._modules) > self._max_modules:
            self._modules.popitem(last=False)
        return fn

    def problem(self, shape: ConvShape, precision: Precision, seed: int | None) -> Problem:
        k = (shape.key(), Precision(precision).value, -1 if seed is None else seed)
        if k in self._problems:
            self._problems.move_to_end(k)
        else:
            self._problems[k] = make_problem(shape, precision, seed)
        # The newest always stays; derived arrays count from when they are made.
        trim_lru(self._problems, lambda p: p.nbytes, self._host_budget, keep=1)
        return self._problems[k]

    def inputs(self, prob: Problem, layout: str, n_sets: int, c_padded: int,
               residual: bool = False) -> dict[str, Any]:
        """Device copies: n_sets of x and w (for rotation, and of x1 for layers over two
        inputs, and of the residual, output-shaped, input of residual builds: it is read from
        DRAM in a network as x is), scale and bias."""
        k = (prob.shape.key(), prob.precision.value, id(prob), layout, n_sets, c_padded,
             residual)
        if k in self._dev and self._dev[k]["problem"]() is prob:  # (not a reused id)
            self._dev.move_to_end(k)
            return self._dev[k]
        xb, wb = prob.device_inputs(layout, c_padded)
        res_bytes = output_bytes(prob.shape, prob.precision.output_bits) if residual else 0
        need = n_sets * (xb.nbytes + wb.nbytes + (prob.x1.nbytes if prob.x1 is not None else 0)
                         + res_bytes)
        trim_lru(self._dev, lambda d: d["dev_bytes"], self._device_budget - need)
        cp = self.cp
        x0, w0 = cp.asarray(xb), cp.asarray(wb)
        d = {"x": [x0] + [x0.copy() for _ in range(n_sets - 1)],
             "w": [w0] + [w0.copy() for _ in range(n_sets - 1)],
             "scale": cp.asarray(prob.scale), "bias": cp.asarray(prob.bias),
             "in_bytes": int(xb.nbytes + wb.nbytes), "res": [None] * n_sets, "res_scale": 1.0,
             "x1": [None] * n_sets, "dev_bytes": int(need),
             "problem": weakref.ref(prob)}  # the host cache decides how long it lives
        if prob.x1 is not None:
            x1 = cp.asarray(prob.device_x1())
            d["x1"] = [x1] + [x1.copy() for _ in range(n_sets - 1)]
        if residual:
            res, d["res_scale"] = prob.residual()
            rb = to_device_bytes(res, prob.precision, layout, 128 // (8 * res.itemsize))
            r0 = cp.asarray(rb)
            d["res"] = [r0] + [r0.copy() for _ in range(n_sets - 1)]
        self._dev[k] = d
        return d

    # ---- one candidate ------------------------------------------------------------------
    def measure(self, cache_dir: str, key: str, *, seed: int | None = None, time_it: bool = True,
                samples: int | None = None) -> dict[str, Any]:
        """Check, then time. Returns {status, median_us, iqr_us, error, detail}."""
        cp = self.cp
        meta = load_meta(cache_dir, key)
        shape = ConvShape.from_dict(meta["shape"])
        prec = Precision(meta["precision"])
        epi = meta["epilogue"]
        out_bits = int(meta["out_bits"])
        layout = meta["layout"]
        fn = self.function(cache_dir, key, meta)
        prob = self.problem(shape, prec, seed)
        y_bytes = output_bytes(shape, out_bits)
        c_padded = int(meta["c_padded"])
        residual = has_residual(meta)
        n_sets = sets_for_l2(self._set_bytes(prob, layout, y_bytes, c_padded, residual),
                             self.l2_bytes) \
            if time_it else 1
        dev = self.inputs(prob, layout, n_sets, c_padded, residual)
        ys = [cp.empty(y_bytes, dtype=cp.uint8) for _ in range(n_sets)]
        ws, counters = alloc_scratch(meta)
        # A back-to-back conv (ConvShape.b2b): its weights, scale and bias, and an output per set.
        b2b = int(epi.get("b2b", 0))
        cref = prob.b2b_ref(bool(epi["relu"]), residual, bool(epi.get("b2b_relu"))) \
            if b2b else None
        if cref is not None:
            c_args = tuple(cp.asarray(a) for a in (cref.device_weights(), cref.scale,
                                                   cref.bias))
            y2s = [cp.empty(cref.expected.size * out_bits // 8, dtype=cp.uint8)
                   for _ in range(n_sets)]

        def launch(i: int) -> None:
            launch_kernel(fn, meta, dev["x"][i], dev["w"][i], dev["scale"], dev["bias"], ys[i],
                          ws, counters, dev["res"][i], dev["res_scale"], x1=dev["x1"][i],
                          b2b=None if cref is None else (*c_args, y2s[i]))

        def check_outputs() -> tuple[bool, dict[str, Any]]:
            y_buf = cp.asnumpy(ys[0])
            ok, stats = check_buffer(prob, y_buf, epi["mode"], bool(epi["relu"]), residual,
                                     layout, out_bits)
            if cref is None or not ok:
                return ok, stats
            got = device_values(cp.asnumpy(y2s[0]), out_bits, prec)
            want = cref.over(device_values(y_buf, out_bits, prec))  # (b2b builds are NHWC)
            ok, b2b_stats = verify_output(
                got.astype(np.float64 if out_bits == 16 else np.int64),
                want.reshape(-1), prec, out_bits, prob.shape.k)
            return ok, {**stats, "b2b": b2b_stats}

        def poison_outputs() -> None:
            ys[0].fill(POISON)
            if cref is not None:
                y2s[0].fill(POISON)

        def check() -> tuple[bool, dict[str, Any]]:
            # Correctness: poisoned output, one launch, exact / tolerance compare.
            poison_outputs()
            launch(0)
            cp.cuda.runtime.deviceSynchronize()
            ok, stats = check_outputs()
            if not ok or not supports_pdl(meta["sm"]):
                return ok, stats
            # Then as a network launches it (kernels.runtime's pdl): after a kernel that
            # writes one input late, every other input ready (launch's *_ready).
            first = [ys[0].copy()] + ([] if cref is None else [y2s[0].copy()])
            poison_outputs()
            late = "x1" if meta.get("concat") else "x"
            self.ready_launch(dev[late][0], lambda: launch_kernel(
                fn, meta, dev["x"][0], dev["w"][0], dev["scale"], dev["bias"], ys[0], ws,
                counters, dev["res"][0], dev["res_scale"], pdl=True, x1=dev["x1"][0],
                b2b=None if cref is None else (*c_args, y2s[0]), w_ready=True,
                res_ready=residual, x_ready=late == "x1"))
            again = [ys[0]] + ([] if cref is None else [y2s[0]])
            if all(bool(cp.array_equal(a, b)) for a, b in zip(first, again, strict=True)):
                return ok, {**stats, "ready": "same"}
            # (split-K's partial sums may add up in another order)
            ok, ready_stats = check_outputs()
            return ok, {**stats, "ready": ready_stats}

        kw = {"samples": samples} if samples else {}
        timer = (lambda: time_launches(launch, n_sets, api="cupy", **kw)) if time_it else None
        return check_then_time(check, timer, {"gpu": self.gpu_name, "n_sets": n_sets})

    def ready_launch(self, late: Any, launch: Callable[[], None]) -> None:
        """Poison `late` (a device buffer), enqueue a kernel that restores it late
        (LATE_COPY_SRC) and `launch` right behind it, and wait for both."""
        cp = self.cp
        if self._late_copy is None:
            # (pinned host memory is mapped at the same address on the device: UVA)
            self._go_mem = cp.cuda.alloc_pinned_memory(4)
            self._go = np.frombuffer(self._go_mem, np.int32, 1)
            self._late_copy = cp.RawKernel(LATE_COPY_SRC, "late_copy")
        keep = late.copy()
        late.fill(POISON)
        self._go[0] = 0
        self._late_copy((32,), (256,), (keep, late, np.int64(late.nbytes),
                                        np.uintp(self._go_mem.ptr), np.int64(LATE_COPY_SPIN),
                                        np.int64(LATE_COPY_SPIN_MAX)))
        try:
            launch()
        finally:
            self._go[0] = 1
            cp.cuda.runtime.deviceSynchronize()

    def baseline(self, shape: ConvShape, dtype: str) -> dict[str, Any]:
        """cuDNN's latency of the layer in `dtype` ('fp16' or 'fp32', TF32 off) on this
        session's GPU (kernels.cudnn.cudnn_baseline). Returns {status, median_us, iqr_us,
        error, detail}; status 'unavailable' where torch cannot be imported."""
        try:
            import torch  # noqa: F401

            from kernels.cudnn import cudnn_baseline
        except ImportError as e:
            return {"status": "unavailable", "median_us": None, "iqr_us": None,
                    "error": f"{type(e).__name__}: {e}", "detail": {}}
        t = cudnn_baseline(shape, dtype, self.l2_bytes, self.device)
        return {"status": "ok", "median_us": round(t.median_us, 4),
                "iqr_us": round(t.iqr_us, 4), "error": None,
                "detail": {"gpu": self.gpu_name, **t.to_dict()}}

    @staticmethod
    def _set_bytes(prob: Problem, layout: str, y_bytes: int, c_padded: int,
                   residual: bool = False) -> int:
        xb, wb = prob.device_inputs(layout, c_padded)
        x1b = 0 if prob.x1 is None else int(prob.x1.nbytes)
        y2b = y_bytes * prob.shape.b2b // prob.shape.k  # a back-to-back conv's output
        return int(xb.nbytes + wb.nbytes + y_bytes + x1b + (y_bytes if residual else 0) + y2b)


def trim_lru(cache: OrderedDict[Any, Any], size: Callable[[Any], int], budget: int,
             keep: int = 0) -> None:
    """Drop `cache`'s least recently used entries (its first) until the sizes of the rest sum
    to at most `budget`; the newest `keep` entries stay whatever their size."""
    total = sum(size(v) for v in cache.values())
    while len(cache) > keep and total > budget:
        total -= size(cache.popitem(last=False)[1])


def check_buffer(prob: Problem, buf: Any, epilogue_mode: str, relu: bool, residual: bool,
                 layout: str, out_bits: int) -> tuple[bool, dict[str, Any]]:
    """The check of a kernel's output bytes against `prob`'s reference: the buffer's
    elements against the expected output in the buffer's own order where the problem has
    that image (the same comparison; converting an int8 output to NHWC values took most of
    its check's time), else its NHWC values against the expected ones."""
    prec, gemm_k = prob.precision, prob.shape.gemm_k
    want = prob.expected_image(epilogue_mode, relu, residual, layout, out_bits)
    if want is not None:
        got = device_values(buf, out_bits, prec)
        if out_bits == 16:  # float64 once: numpy's mixed fp16-fp64 loops are slow
            got = got.astype(np.float64)
        return verify_output(got, want, prec, out_bits, gemm_k)
    return check_values(prob, buf, epilogue_mode, relu, residual, layout, out_bits)


def check_values(prob: Problem, buf: Any, epilogue_mode: str, relu: bool, residual: bool,
                 layout: str, out_bits: int) -> tuple[bool, dict[str, Any]]:
    """The same check through the buffer's NHWC values (int4, fp32 outputs, fp32_tc)."""
    prec = prob.precision
    got = from_device_output(buf, prob.shape, out_bits, prec, layout)
    want = prob.expected(epilogue_mode, relu, residual)
    abs_ref = fp32_tc_abs_ref(prob, epilogue_mode) if prec is Precision.FP32_TC else None
    return verify_output(got, want, prec, out_bits, prob.shape.gemm_k, abs_ref)


def verify_output(got: Any, want: Any, precision: Precision, out_bits: int, gemm_k: int,
                  abs_ref: Any = None) -> tuple[bool, dict[str, Any]]:
    """The output check of one candidate: fp32_tc against float64 within twice FP32's error
    (with the per-element bound of `abs_ref`), the others as `check_output` says."""
    if precision is Precision.FP32_TC:
        return check_output(got, want, precision, out_bits, gemm_k=gemm_k, abs_ref=abs_ref)
    return check_output(got, want, precision, out_bits)


def check_then_time(check: Callable[[], tuple[bool, dict[str, Any]]],
                    timer: Callable[[], Any] | None, detail: dict[str, Any]) -> dict[str, Any]:
    """Check, then time: `timer` (returning a kernels.timing result) runs only after `check`
    passed, so a wrong kernel never gets a latency. None: check only."""
    ok, stats = check()
    detail = {**detail, "check": stats}
    if not ok:
        return {"status": "wrong", "median_us": None, "iqr_us": None,
                "error": f"output differs from the reference: {stats}", "detail": detail}
    if timer is None:
        return {"status": "ok", "median_us": None, "iqr_us": None, "error": None,
                "detail": detail}
    t = timer()
    detail.update(t.to_dict())
    return {"status": "ok", "median_us": round(t.median_us, 4), "iqr_us": round(t.iqr_us, 4),
            "error": None, "detail": detail}


def fp32_tc_abs_ref(prob: Problem, epilogue_mode: str) -> Any:
    """fp32_tc: sum_i |x_i w_i| per output (+ |bias|), the scale of the per-element bound."""
    if prob.abs_acc is None:
        return None
    return prob.abs_acc + (abs(prob.bias.astype("float64")) if epilogue_mode == "bias" else 0.0)


def _is_sticky(e: BaseException) -> bool:
    s = f"{type(e).__name__}: {e}"
    return any(t in s for t in ("ILLEGAL", "illegal", "LAUNCH_FAILED", "MISALIGNED",
                                "cudaErrorLaunch", "unspecified launch failure", "HARDWARE"))


# Thread pools of the numerical libraries in a measuring child: one thread. Its numpy work
# (the correctness check) is small, and one BLAS pool of a thread per core in each of two
# measuring children on one host made every measurement 1.5x slower (H200 x2: 31 ms per
# candidate alone, 45-50 ms with two at once, 32-33 ms with these set).
SINGLE_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def child_env() -> dict[str, str]:
    """The measuring child's environment: the caller's, with the pools at one thread unless
    the caller chose a size."""
    env = dict(os.environ)
    for name in SINGLE_THREAD_ENV:
        env.setdefault(name, "1")
    return env


def _import_torch() -> str | None:
    """Import torch (for cuDNN baselines) before CuPy: on some installs torch's own import
    fails once CuPy is loaded (docs/design.md, "Measurement protocol"). Returns why it is not
    available, or None."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # missing, or a broken install: baselines are skipped, not fatal
        return f"{type(e).__name__}: {e}"
    return None


def _serve(sess: DeviceSession, req: dict[str, Any]) -> dict[str, Any]:
    if req.get("op") == "baseline":
        return sess.baseline(ConvShape.from_dict(req["shape"]), req["dtype"])
    return sess.measure(req["cache_dir"], req["key"], seed=req.get("seed"),
                        time_it=req.get("time_it", True), samples=req.get("samples"))


def _child_main(conn: Any, device: int, with_torch: bool = False) -> None:
    torch_error = _import_torch() if with_torch else "torch not loaded (Runner(with_torch=False))"
    try:
        sess = DeviceSession(device)
    except Exception as e:  # no GPU / no CuPy: say so and stop
        conn.send({"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    conn.send({"ready": True, "gpu": sess.gpu_name, "sm": sess.sm, "torch_error": torch_error})
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        if req is None:
            return
        try:
            conn.send(_serve(sess, req))
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            conn.send({"status": "runtime_error", "median_us": None, "iqr_us": None,
                       "error": msg[-2000:], "detail": {"trace": traceback.format_exc()[-2000:]},
                       "fatal": True})
            # Any CUDA error may leave the context unusable: start clean.
            return


class Runner:
    """Parent side: one measurement child, re-spawned whenever it dies or hangs.

    `with_torch`: the child imports torch at its start, before CuPy, so that it can time
    cuDNN baselines (`baseline`); without torch it still measures, and says why in
    `torch_error`."""

    def __init__(self, device: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S,
                 with_torch: bool = False) -> None:
        self.device = device
        self.timeout_s = timeout_s
        self.with_torch = with_torch
        self.torch_error: str | None = None
        self._proc: Any = None
        self._conn: Any = None
        self.gpu_name: str | None = None
        self.sm: int | None = None
        self.start_error: str | None = None

    def _start(self) -> bool:
        # A plain subprocess, not multiprocessing: the caller may itself be a daemonic pool
        # process (a Celery worker's), and those may not have multiprocessing children.
        parent_sock, child_sock = socket.socketpair()
        argv = [sys.executable, "-m", "kernels.runner", str(self.device),
                str(child_sock.fileno())] + (["torch"] if self.with_torch else [])
        proc = subprocess.Popen(argv, pass_fds=(child_sock.fileno(),),
                                stdin=subprocess.DEVNULL, env=child_env())
        child_sock.close()
        parent = Connection(parent_sock.detach())
        if not parent.poll(START_TIMEOUT_S):
            proc.kill()
            proc.wait(5)
            self.start_error = "measurement process did not start in time"
            return False
        try:
            msg = parent.recv()
        except EOFError:
            msg = {"ready": False, "error": f"measurement process exited ({proc.wait(5)})"}
        if not msg.get("ready"):
            proc.wait(5)
            self.start_error = msg.get("error", "no GPU")
            return False
        self._proc, self._conn = proc, parent
        self.gpu_name, self.sm = msg["gpu"], msg["sm"]
        self.torch_error = msg.get("torch_error")
        return True

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(5)
        if self._conn is not None:
            self._conn.close()
        self._proc = self._conn = None

    def ensure_started(self) -> bool:
        if self._proc is not None and self._proc.poll() is None:
            return True
        self._stop()
        return self._start()

    def measure(self, cache_dir: str | os.PathLike[str], key: str, *, seed: int | None = None,
                time_it: bool = True, samples: int | None = None) -> dict[str, Any]:
        if not Path(cubin_path(cache_dir, key)).exists():
            return {"status": "compile_error", "median_us": None, "iqr_us": None,
                    "error": f"no cubin for {key}", "detail": {}}
        return self._request({"cache_dir": str(cache_dir), "key": key, "seed": seed,
                              "time_it": time_it, "samples": samples})

    def baseline(self, shape: ConvShape, dtype: str) -> dict[str, Any]:
        """cuDNN's latency of `shape` in `dtype` ('fp16', or 'fp32' with TF32 off) on the
        child's GPU, timed as candidates are (DeviceSession.baseline). Status 'ok',
        'unavailable' (no torch in the child: its reason in `error`), or a failure's."""
        if self.ensure_started() and self.torch_error is not None:
            return {"status": "unavailable", "median_us": None, "iqr_us": None,
                    "error": self.torch_error, "detail": {}}
        return self._request({"op": "baseline", "shape": shape.to_dict(), "dtype": dtype})

    def _request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request to the child and wait for its answer (at most timeout_s); a
        crash, hang or fatal error restarts the child and comes back as a status."""
        if not self.ensure_started():
            return {"status": "runtime_error", "median_us": None, "iqr_us": None,
                    "error": f"no measurement process: {self.start_error}", "detail": {}}
        t0 = time.monotonic()
        try:
            self._conn.send(req)
            if not self._conn.poll(self.timeout_s):
                self._stop()
                return {"status": "timeout", "median_us": None, "iqr_us": None,
                        "error": f"no result within {self.timeout_s:.0f} s", "detail": {}}
            res = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            self._stop()
            return {"status": "runtime_error", "median_us": None, "iqr_us": None,
                    "error": f"measurement process died: {e!r}", "detail": {}}
        if res.pop("fatal", False):
            self._stop()
        res.setdefault("detail", {})["wall_s"] = round(time.monotonic() - t0, 3)
        return res

    def close(self) -> None:
        if self._conn is not None and self._proc is not None and self._proc.poll() is None:
            try:
                self._conn.send(None)
                self._proc.wait(5)
            except (OSError, BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self._stop()


if __name__ == "__main__":  # the measurement child: python -m kernels.runner DEVICE FD [torch]
    _child_main(Connection(int(sys.argv[2])), int(sys.argv[1]), "torch" in sys.argv[3:])
