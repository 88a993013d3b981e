"""CUTLASS 3.x sm90 implicit-GEMM convolution (fprop) as a baseline: build here, run on an H100.

The kernels are CUTLASS's own (bench/cutlass/conv_sm90.cu: the conv CollectiveBuilder for
Sm90 with KernelImplicitTmaWarpSpecializedSm90, ConvUniversal, ConvUniversalAdapter), built
into one shared library with a C ABI and driven through ctypes. Tensors: x NHWC, w KRSC,
y NPQK. Precisions: fp16 (fp32 accumulate, fp16 out) and int8 (int32 accumulate, int8 out:
y = sat8(rint(float(acc) * alpha)) with one float scale alpha, done by CUTLASS's sm90
LinearCombination epilogue; no per-channel scale or bias).

On a CPU machine with nvcc (CUDA 12.x/13) and network access for the headers:
  python -m bench.cutlass_conv build --out DIR     # -> DIR/libtctune_cutlass.so, SASS summary
  python -m bench.cutlass_conv sass --lib DIR/libtctune_cutlass.so
On the GPU machine (PyTorch with CUDA; no compiler needed):
  python -m bench.cutlass_conv check --lib DIR/libtctune_cutlass.so [--json OUT]

From Python: CutlassLib(path).time_us(shape, precision, l2_bytes) -> (median us, None) for the
fastest config whose output is right, or (None, reason) where CUTLASS cannot run the shape.

The headers come from the `nvidia-cutlass` wheel (the `bench` extra pins it): from an
installed `cutlass_library` package, TCTUNE_CUTLASS_DIR, --cutlass, or the wheel fetched with
`pip download --no-deps` into build/cutlass-<version>/ (git-ignored).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernels.spec import ConvShape, Precision

REPO = Path(__file__).resolve().parent.parent
SOURCE = Path(__file__).resolve().parent / "cutlass" / "conv_sm90.cu"
LIB_NAME = "libtctune_cutlass.so"
CUTLASS_VERSION = "4.2.0.0"  # the C++ API this source is written against (it moves)
ABI_VERSION = 1  # TCTUNE_CUTLASS_ABI in conv_sm90.cu
PRECISIONS = (Precision.FP16, Precision.INT8)
# Status codes of conv_sm90.cu (TctuneStatus).
OK, BAD_CONFIG, BAD_SHAPE, CHANNELS_ALIGN, OUTPUT_ALIGN, CUTLASS_REFUSED = 0, 1, 2, 3, 4, 5
NVCC_FLAGS = ("-gencode", "arch=compute_90a,code=sm_90a", "-O3", "-std=c++17",
              "--expt-relaxed-constexpr", "-DNDEBUG", "-Xcompiler=-fPIC,-fvisibility=hidden")

# ---- the C ABI ---------------------------------------------------------------------------
_SHAPE = [ctypes.c_int] * 13  # n, h, w, c, k, r, s, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w
# name -> (restype, argtypes); tests compare this with the extern "C" functions of the source.
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "tctune_cutlass_abi_version": (ctypes.c_int, []),
    "tctune_cutlass_num_configs": (ctypes.c_int, []),
    "tctune_cutlass_config_name": (ctypes.c_char_p, [ctypes.c_int]),
    "tctune_cutlass_config_precision": (ctypes.c_char_p, [ctypes.c_int]),
    "tctune_cutlass_config_info": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "tctune_cutlass_can_implement": (ctypes.c_int, [ctypes.c_int, *_SHAPE]),
    "tctune_cutlass_workspace_size": (ctypes.c_size_t, [ctypes.c_int, *_SHAPE]),
    "tctune_cutlass_run": (ctypes.c_int, [ctypes.c_int, *_SHAPE, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                                          ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]),
    "tctune_cutlass_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "tctune_cutlass_last_error": (ctypes.c_char_p, []),
}


def shape_args(shape: ConvShape) -> tuple[int, ...]:
    """The 13 shape ints of every shape-taking function, in the ABI's order."""
    return (shape.n, shape.h, shape.w, shape.c, shape.k, shape.r, shape.s,
            shape.pad[0], shape.pad[1], shape.stride[0], shape.stride[1],
            shape.dilation[0], shape.dilation[1])


@dataclass(frozen=True)
class Config:
    index: int
    name: str
    precision: Precision
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem_bytes: int
    threads: int
    stages: int


@dataclass
class ConfigResult:
    """One config on one (shape, precision): refused, wrong, error or timed."""

    config: str
    status: str  # ok | wrong | refused | error
    median_us: float | None = None
    iqr_us: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


class CutlassLib:
    """The built library (ctypes). Importing this module and loading the library need no GPU;
    `time_us` needs PyTorch with CUDA on an sm_90 device."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        for name, (res, args) in SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.restype, fn.argtypes = res, args
        abi = self.lib.tctune_cutlass_abi_version()
        if abi != ABI_VERSION:
            raise RuntimeError(f"{self.path}: ABI {abi}, this module speaks {ABI_VERSION}: "
                               "rebuild the library from this checkout")
        self.configs = [self._config(i) for i in range(self.lib.tctune_cutlass_num_configs())]
        # Per config, the last time_us call's outcome (for `check` and the benchmark's notes).
        self.last: list[ConfigResult] = []

    def _config(self, i: int) -> Config:
        info = (ctypes.c_int * 9)()
        if self.lib.tctune_cutlass_config_info(i, info) != OK:
            raise RuntimeError(f"config {i}: no info")
        return Config(i, self.lib.tctune_cutlass_config_name(i).decode(),
                      Precision(self.lib.tctune_cutlass_config_precision(i).decode()),
                      (info[0], info[1], info[2]), (info[3], info[4], info[5]),
                      info[6], info[7], info[8])

    def configs_for(self, precision: Precision) -> list[Config]:
        return [c for c in self.configs if c.precision is Precision(precision)]

    def status_string(self, status: int) -> str:
        return self.lib.tctune_cutlass_status_string(status).decode()

    def last_error(self) -> str:
        return self.lib.tctune_cutlass_last_error().decode()

    def can_implement(self, config: int, shape: ConvShape) -> int:
        return int(self.lib.tctune_cutlass_can_implement(config, *shape_args(shape)))

    def workspace_size(self, config: int, shape: ConvShape) -> int:
        return int(self.lib.tctune_cutlass_workspace_size(config, *shape_args(shape)))

    def run(self, config: int, shape: ConvShape, x: int, w: int, y: int, alpha: float,
            workspace: int, workspace_bytes: int, stream: int) -> None:
        """Enqueue one conv on `stream` (device pointers as ints); raises on a nonzero status."""
        st = self.lib.tctune_cutlass_run(config, *shape_args(shape), x, w, y, alpha,
                                         workspace or None, workspace_bytes, stream or None)
        if st != OK:
            msg = self.status_string(st)
            raise RuntimeError(f"{self.configs[config].name}: {msg} {self.last_error()}".strip())

    # ---- the baseline ----------------------------------------------------------------------
    def refusal(self, shape: ConvShape, precision: Precision) -> tuple[list[Config], str | None]:
        """The configs that can run `shape`, or the reason none can (no GPU needed)."""
        p = Precision(precision)
        if p not in PRECISIONS:
            return [], f"CUTLASS baseline covers fp16 and int8, not {p.value}"
        if shape.groups != 1:
            return [], f"grouped convolution (groups={shape.groups}) is not in the library"
        configs = self.configs_for(p)
        if not configs:
            return [], f"{self.path.name} has no {p.value} configs"
        able, why = [], []
        for c in configs:
            st = self.can_implement(c.index, shape)
            if st == OK:
                able.append(c)
            else:
                why.append(st)
        if able:
            return able, None
        vec = 128 // p.input_bits
        reasons = []
        for st in sorted(set(why)):
            if st == CHANNELS_ALIGN:
                reasons.append(f"C={shape.c} is not a multiple of {vec} ({p.value}: TMA im2col "
                               "loads 16-byte channel vectors)")
            elif st == OUTPUT_ALIGN:
                reasons.append(f"K={shape.k} is not a multiple of {128 // p.output_bits} "
                               f"({p.value} output: the TMA epilogue stores 16-byte vectors)")
            else:
                reasons.append(self.status_string(st))
        return [], "CUTLASS sm90 conv cannot run this shape: " + "; ".join(reasons)

    def time_us(self, shape: ConvShape, precision: Precision, l2_bytes: int
                ) -> tuple[float | None, str | None]:
        """Median latency (us) of the fastest config that runs `shape` right, timed with
        kernels.timing.time_launches over input/output sets that exceed L2 (as
        kernels.cudnn times cuDNN); (None, reason) where no config can run it or none is
        right. Per-config outcomes are left in `self.last`."""
        self.last = []
        p = Precision(precision)
        able, reason = self.refusal(shape, p)
        if reason is not None:
            return None, reason
        try:
            import torch
        except ImportError:
            return None, "PyTorch is not installed"
        if not torch.cuda.is_available():
            return None, "no CUDA device"
        cap = torch.cuda.get_device_capability()
        if cap != (9, 0):
            return None, f"the library holds sm_90a code only; this GPU is sm_{cap[0]}{cap[1]}"
        return _time_configs(self, able, shape, p, l2_bytes)


# ---- measuring on the GPU (PyTorch tensors, CUTLASS launches) ----------------------------
SEED = 1234  # as kernels.cudnn: one CPU generator, so the data is the same every run


@dataclass
class _Problem:
    x: Any  # NCHW view of NHWC memory (channels_last)
    w: Any  # KCRS view of KRSC memory (channels_last)
    expected: Any  # numpy NHWC: float64 (fp16) or int64 (int8, after requantization)
    alpha: float
    y: Any  # output NKPQ view of NPQK memory


def _make_problem(shape: ConvShape, p: Precision, device: str = "cuda") -> _Problem:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from kernels.reference import requantize

    g = torch.Generator(device="cpu").manual_seed(SEED)
    xs, ws = (shape.n, shape.c, shape.h, shape.w), (shape.k, shape.c, shape.r, shape.s)
    cl = torch.channels_last
    conv = {"stride": shape.stride, "padding": shape.pad, "dilation": shape.dilation}
    if p is Precision.FP16:
        x = (torch.rand(xs, generator=g) * 2 - 1).half().to(device).contiguous(memory_format=cl)
        w = (torch.rand(ws, generator=g) * 2 - 1).half().to(device).contiguous(memory_format=cl)
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False  # a float32 reference, not TF32
        try:
            ref = F.conv2d(x.float(), w.float(), **conv)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        expected = ref.permute(0, 2, 3, 1).double().cpu().numpy()
        alpha = 1.0
        dtype = torch.float16
    else:
        x = torch.randint(-128, 128, xs, generator=g, dtype=torch.int8).to(device)
        w = torch.randint(-128, 128, ws, generator=g, dtype=torch.int8).to(device)
        x, w = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)
        # float64 holds every int32 accumulator exactly (float32 would not past 2^24).
        acc = F.conv2d(x.double().contiguous(), w.double().contiguous(), **conv)
        acc = acc.permute(0, 2, 3, 1).cpu().numpy()
        acc = np.rint(acc).astype(np.int64)
        # One scale that spreads the outputs over the int8 range (a few saturate), so every
        # accumulator is seen through a fine quantization step (as kernels.reference does).
        alpha = float(np.float32(127 * 0.4 / (float(acc.std()) + 1.0)))
        k = shape.k
        expected = requantize(acc, np.full(k, alpha, np.float32), np.zeros(k, np.float32),
                              8, relu=False)
        dtype = torch.int8
    y = torch.empty((shape.n, shape.k, shape.p, shape.q), dtype=dtype, device=device,
                    memory_format=cl)
    return _Problem(x, w, expected, alpha, y)


def _check(lib: Any, c: Config, shape: ConvShape, p: Precision, prob: _Problem,
           ws: Any, ws_bytes: int) -> tuple[bool, dict[str, Any]]:
    """One launch on a poisoned output, compared with the reference."""
    import torch

    from kernels.reference import check_output

    prob.y.fill_(float("nan") if p is Precision.FP16 else 85)
    gpu = prob.y.is_cuda  # (CPU tensors: the tests' stand-in library)
    stream = torch.cuda.current_stream().cuda_stream if gpu else 0
    lib.run(c.index, shape, prob.x.data_ptr(), prob.w.data_ptr(), prob.y.data_ptr(),
            prob.alpha, ws, ws_bytes, stream)
    if gpu:
        torch.cuda.synchronize()
    got = prob.y.permute(0, 2, 3, 1).cpu().numpy()
    if p is Precision.FP16:
        ok, stats = check_output(got.astype("float64"), prob.expected, p, 16)
    else:
        ok, stats = check_output(got.astype("int64"), prob.expected, p, 8)
    return ok, stats


def _time_configs(lib: CutlassLib, configs: Sequence[Config], shape: ConvShape, p: Precision,
                  l2_bytes: int) -> tuple[float | None, str | None]:
    import torch

    from kernels.timing import sets_for_l2, time_launches

    prob = _make_problem(shape, p)
    ws_bytes = max(lib.workspace_size(c.index, shape) for c in configs)
    ws_t = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
    ws = ws_t.data_ptr() if ws_t is not None else 0
    right: list[Config] = []
    for c in configs:
        try:
            ok, stats = _check(lib, c, shape, p, prob, ws, ws_bytes)
        except Exception as e:  # a launch error; a fault also ends every later config
            lib.last.append(ConfigResult(c.name, "error", detail={"error": str(e)[-300:]}))
            continue
        if ok:
            right.append(c)
        else:
            lib.last.append(ConfigResult(c.name, "wrong", detail=stats))
    if not right:
        bad = ", ".join(f"{r.config}: {r.status} {r.detail}" for r in lib.last)
        return None, f"no CUTLASS config gave the right output ({bad})"

    # Input and output sets rotating past L2, as kernels.cudnn.time_cudnn_conv does.
    per = (prob.x.numel() + prob.w.numel() + prob.y.numel()) * prob.x.element_size()
    n_sets = sets_for_l2(per, l2_bytes)
    xl = [prob.x] + [prob.x.clone() for _ in range(n_sets - 1)]
    wl = [prob.w] + [prob.w.clone() for _ in range(n_sets - 1)]
    yl = [prob.y] + [torch.empty_like(prob.y) for _ in range(n_sets - 1)]
    ptrs = [(a.data_ptr(), b.data_ptr(), o.data_ptr()) for a, b, o in zip(xl, wl, yl, strict=True)]
    best: tuple[float, str] | None = None
    for c in right:
        def launch(i: int, c: Config = c) -> None:
            x, w, y = ptrs[i]
            # The harness's stream (its capture stream while it records the graph).
            lib.run(c.index, shape, x, w, y, prob.alpha, ws, ws_bytes,
                    torch.cuda.current_stream().cuda_stream)

        try:
            t = time_launches(launch, n_sets, api="torch")
        except Exception as e:
            lib.last.append(ConfigResult(c.name, "error", detail={"error": str(e)[-300:]}))
            continue
        lib.last.append(ConfigResult(c.name, "ok", t.median_us, t.iqr_us,
                                     {"n_sets": n_sets, "launches": t.launches_per_sample}))
        if best is None or t.median_us < best[0]:
            best = (t.median_us, c.name)
    del xl, wl, yl
    if best is None:
        return None, "every right config failed while timed: " + "; ".join(
            f"{r.config}: {r.detail.get('error')}" for r in lib.last if r.status == "error")
    return best[0], None


# ---- building (CPU) ----------------------------------------------------------------------
def source_configs(source: Path = SOURCE) -> list[tuple[int, str, str]]:
    """(index, name, precision) of every config the source defines, in order."""
    rows = re.findall(r'^\s*X\((\d+), "([^"]+)", "(\w+)"', source.read_text(), re.M)
    return [(int(i), name, prec) for i, name, prec in rows]


def _has_headers(d: Path) -> bool:
    return (d / "include" / "cutlass" / "conv" / "collective" / "collective_builder.hpp"
            ).is_file() and (d / "tools" / "util" / "include" / "cutlass" / "util").is_dir()


def cache_dir() -> Path:
    return REPO / "build" / f"cutlass-{CUTLASS_VERSION}"


def find_cutlass(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """CUTLASS's source folder (holding include/ and tools/util/include/), without fetching:
    the argument, TCTUNE_CUTLASS_DIR, an installed nvidia-cutlass, or the fetched cache."""
    cands: list[Path] = []
    if explicit:
        cands.append(Path(explicit))
    if os.environ.get("TCTUNE_CUTLASS_DIR"):
        cands.append(Path(os.environ["TCTUNE_CUTLASS_DIR"]))
    spec = importlib.util.find_spec("cutlass_library")
    if spec is not None and spec.submodule_search_locations:
        cands += [Path(p) / "source" for p in spec.submodule_search_locations]
    cands.append(cache_dir() / "cutlass_library" / "source")
    for c in cands:
        for d in (c, c / "source", c / "cutlass_library" / "source"):
            if _has_headers(d):
                return d
    return None


def fetch_cutlass() -> Path:
    """Download the nvidia-cutlass wheel (no dependencies: only its headers are used) and
    unpack its C++ sources into build/cutlass-<version>/."""
    dest = cache_dir()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        f"nvidia-cutlass=={CUTLASS_VERSION}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("nvidia_cutlass-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.startswith(
                ("cutlass_library/source/include/", "cutlass_library/source/tools/util/include/"))]
            z.extractall(dest, members)
    found = find_cutlass(dest)
    if found is None:
        raise RuntimeError(f"no CUTLASS headers in the nvidia-cutlass {CUTLASS_VERSION} wheel")
    return found


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.exists()), None)


def _run_timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return time.time() - t0, r.stderr


def build(out: str | os.PathLike[str], *, cutlass: str | os.PathLike[str] | None = None,
          configs: Sequence[int] | None = None, jobs: int | None = None,
          nvcc: str | None = None, log: Any = print) -> Path:
    """Compile conv_sm90.cu into out/libtctune_cutlass.so: one object per config (in parallel,
    `jobs` at a time) plus the registry, linked with the static CUDA runtime. `configs`:
    the source's config indices to build (default all); the library numbers them from 0."""
    nvcc = nvcc or nvcc_path()
    if nvcc is None:
        raise RuntimeError("nvcc not found (CUDA 12.x or 13 toolkit)")
    src = find_cutlass(cutlass) or fetch_cutlass()
    out_dir = Path(out)
    obj_dir = out_dir / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)
    all_cfgs = source_configs()
    want = sorted(set(configs)) if configs is not None else [i for i, _, _ in all_cfgs]
    mask = sum(1 << i for i in want)
    inc = ["-I", str(src / "include"), "-I", str(src / "tools" / "util" / "include")]
    base = [nvcc, *NVCC_FLAGS, *inc, "-c", str(SOURCE)]
    jobs_list = [(f"part{i}", [*base, f"-DTCTUNE_PART={i}", "-o", str(obj_dir / f"part{i}.o")])
                 for i in want]
    jobs_list.append(("registry", [*base, "-DTCTUNE_PART=-1", f"-DTCTUNE_BUILT_MASK={mask}u",
                                   "-o", str(obj_dir / "registry.o")]))
    log(f"CUTLASS headers: {src}")
    log(f"compiling {len(want)} configs + registry, {jobs or os.cpu_count()} at a time")
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count()) as ex:
        futs = {name: ex.submit(_run_timed, cmd) for name, cmd in jobs_list}
        for name, f in futs.items():
            secs, _ = f.result()
            log(f"  {name}: {secs:.0f} s")
    lib = out_dir / LIB_NAME
    objs = [str(obj_dir / f"part{i}.o") for i in want] + [str(obj_dir / "registry.o")]
    # Static cudart, its symbols kept inside (no clash with PyTorch's libcudart).
    _run_timed([nvcc, "-shared", "-cudart", "static", "-o", str(lib), *objs,
                "-Xlinker", "--exclude-libs,ALL"])
    log(f"built {lib} ({lib.stat().st_size / 2**20:.1f} MiB) in {time.time() - t0:.0f} s")
    names = {i: name for i, name, _ in all_cfgs}
    for i in want:
        for line in sass_report(obj_dir / f"part{i}.o"):
            log(f"  {names[i]}: {line}")
    return lib


def sass_report(binary: str | os.PathLike[str]) -> list[str]:
    """Per kernel in `binary` (object, cubin or shared library): its wgmma opcodes (HGMMA for
    fp16, IGMMA for int8), TMA opcodes, registers and local memory (spills)."""
    from kernels.sass import cuobjdump_path, nvdisasm_path

    tool = cuobjdump_path()
    if tool is None:
        return ["cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"]
    env = dict(os.environ)
    dis = nvdisasm_path()
    if dis:
        env["PATH"] = str(Path(dis).parent) + os.pathsep + env.get("PATH", "")
    sass = subprocess.run([tool, "-sass", str(binary)], capture_output=True, text=True,
                          env=env, check=True).stdout
    res = subprocess.run([tool, "-res-usage", str(binary)], capture_output=True, text=True,
                         env=env, check=True).stdout
    usage = dict(re.findall(r"Function (\S+):\s*\n\s*(REG:.*)", res))
    lines = []
    for fn, body in re.findall(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S):
        if "device_kernel" not in fn:
            continue
        mma = sorted(set(re.findall(r"\b([HIQ]GMMA\.[\w.]+)", body)))
        tma = sorted(set(re.findall(r"\b(UTMA(?:LDG|STG)\.[\w.]+)", body)))
        u = usage.get(fn, "")
        reg = re.search(r"REG:(\d+)", u)
        local = re.search(r"LOCAL:(\d+)", u)
        spills = len(re.findall(r"\b(?:LDL|STL)\b", body))
        lines.append(f"{' '.join(mma) or 'no wgmma'} | {' '.join(tma)} | "
                     f"REG {reg.group(1) if reg else '?'} LOCAL {local.group(1) if local else '?'}"
                     f" LDL/STL {spills}")
    return lines or ["no CUTLASS kernels found"]


# ---- the GPU check -----------------------------------------------------------------------
def check_shapes() -> list[tuple[str, ConvShape]]:
    return [
        ("3x3", ConvShape(8, 28, 28, 128, 128, 3, 3, pad=1)),
        ("1x1", ConvShape(8, 14, 14, 256, 1024, 1, 1)),
        ("1x1 stride 2", ConvShape(8, 28, 28, 256, 512, 1, 1, stride=2)),
        ("3x3 stride 2, tails", ConvShape(3, 21, 19, 32, 48, 3, 3, stride=2, pad=1)),
        ("3x3 dilation 2", ConvShape(2, 17, 19, 32, 64, 3, 3, pad=2, dilation=2)),
        ("C=24, K=40 (fp16 only)", ConvShape(2, 15, 15, 24, 40, 3, 3, pad=1)),
        ("7x7 stem, C=3", ConvShape(8, 224, 224, 3, 64, 7, 7, stride=2, pad=3)),
    ]


def cmd_check(a: argparse.Namespace) -> int:
    import torch

    from kernels.cudnn import cudnn_conv_times

    lib = CutlassLib(a.lib)
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 50 * 2**20))
    print(f"{props.name}, L2 {l2 >> 20} MiB; {lib.path}: "
          + ", ".join(f"{c.name} ({c.smem_bytes // 1024} KiB smem, {c.stages} stages)"
                      for c in lib.configs), flush=True)
    rows: list[dict[str, Any]] = []
    failed = False
    for label, shape in check_shapes():
        cudnn = None
        try:
            cudnn = cudnn_conv_times(shape, l2, [("fp16", "float16", False)])["fp16"]
        except Exception as e:  # cuDNN's time is context here, not what is checked
            print(f"  cuDNN fp16 failed: {e}")
        for p in PRECISIONS:
            us, reason = lib.time_us(shape, p, l2)
            per = [vars(r) for r in lib.last]
            failed |= any(r.status in ("wrong", "error") for r in lib.last)
            rows.append({"shape": shape.to_dict(), "label": label, "precision": p.value,
                         "median_us": us, "reason": reason, "configs": per,
                         "cudnn_fp16_us": cudnn})
            head = f"{label:<24} {p.value:<5}"
            if us is None:
                print(f"{head} -> {reason}", flush=True)
            else:
                print(f"{head} -> best {us:8.2f} us (cuDNN fp16 {cudnn or float('nan'):.2f} us)")
            for r in lib.last:
                t = f"{r.median_us:8.2f} us" if r.median_us is not None else ""
                detail = "" if r.status == "ok" else r.detail
                print(f"    {r.config:<26} {r.status:<6} {t} {detail}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"device": props.name, "rows": rows}, indent=1))
    print("WRONG OR FAILED CONFIGS" if failed else "all checked configs right")
    return 1 if failed else 0


def cmd_build(a: argparse.Namespace) -> int:
    cfgs = [int(x) for x in a.configs.split(",")] if a.configs else None
    build(a.out, cutlass=a.cutlass, configs=cfgs, jobs=a.jobs)
    return 0


def cmd_sass(a: argparse.Namespace) -> int:
    for line in sass_report(a.lib):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the library (CPU, nvcc)")
    b.add_argument("--out", required=True, help="output folder for libtctune_cutlass.so")
    b.add_argument("--cutlass", help="CUTLASS source folder (include/, tools/util/include/)")
    b.add_argument("--configs", help="comma-separated config indices (default: all)")
    b.add_argument("--jobs", type=int, help="parallel nvcc processes (default: CPU count)")
    b.set_defaults(fn=cmd_build)
    s = sub.add_parser("sass", help="wgmma / TMA opcodes, registers, spills per kernel")
    s.add_argument("--lib", required=True)
    s.set_defaults(fn=cmd_sass)
    c = sub.add_parser("check", help="correctness and times of every config (GPU)")
    c.add_argument("--lib", required=True)
    c.add_argument("--json", help="write the results here")
    c.set_defaults(fn=cmd_check)
    a = ap.parse_args(argv)
    return int(a.fn(a))


if __name__ == "__main__":
    sys.exit(main())
