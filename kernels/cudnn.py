"""cuDNN's convolution (PyTorch's `F.conv2d`) timed with the kernels' harness
(kernels.timing.time_launches): the baseline the service stores for every task measured on a
GPU (`cudnn_baseline`, run in the measuring child of kernels.runner), and the benchmarks that
compare against cuDNN (bench/fp32_tc.py, bench/conv_vs_cudnn.py's `baselines`, which e2e_gpu
and pipeline_probe use, and bench/resnet50_e2e.py and bench/gpu/runtime_defaults.py on their
layers' own tensors).

Per variant, in the order given: random inputs in [-1, 1) from one CPU generator seeded 1234
(so the order decides each variant's data), NCHW tensors in channels_last (NHWC activations
and KRSC weights in memory, as our kernels take them), as many input sets as it takes to
exceed L2 (outputs rotating with them), then `F.conv2d` through `time_launches(api="torch")`:
the same warm-up, CUDA graph, samples and median as every candidate's timing, with each of
two algorithm picks, the faster one counting (`ALGORITHM_PICKS`).

Why two picks: `cudnn.benchmark` times one cold run of each candidate algorithm the first time
a process meets a shape, and on an H100 it picked algorithms up to 1.7x slower than the
fastest from one process to the next, while cuDNN's heuristic pick (benchmark off) stayed
within 2.5% from process to process and within 1.1x of the fastest pick of any mode on every
distinct conv of ResNet-50 at batch 8 (bench/gpu/cudnn_stability.py,
bench/data/cudnn_stability_h100.json).

torch is imported inside the functions: `kernels` imports without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from kernels.spec import ConvShape
from kernels.timing import Timing, sets_for_l2, time_launches

# (result name, torch dtype name, allow TF32)
Variant = tuple[str, str, bool]
# extra(name, input sets, n_sets) -> more timings, run after a variant's conv with its inputs
Extra = Callable[[str, list[Any], int], dict[str, float]]
# The baseline precisions (store/baselines.py) as torch dtypes; TF32 is off for both.
BASELINE_DTYPES = {"fp16": "float16", "fp32": "float32"}
SEED = 1234
# (cudnn.benchmark, flip allow_tf32): the heuristic's pick, then benchmark's. PyTorch caches
# a shape's algorithm under a key that holds allow_tf32 and is looked up before either mode
# chooses, so for 16-bit inputs (whose math TF32 does not touch) the benchmark pass flips the
# flag to get a choice of its own; for fp32 it would change the math, so there the second
# pass reuses the first's algorithm.
ALGORITHM_PICKS = ((False, False), (True, True))
T = TypeVar("T")


@contextmanager
def algorithm_pick(benchmark: bool, flip: bool, half: bool, tf32: bool = False
                   ) -> Iterator[None]:
    """cuDNN's flags for one of ALGORITHM_PICKS (`half`: 16-bit inputs), put back after."""
    import torch

    flags = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.allow_tf32 = tf32 != (flip and half)
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = flags


def fastest_pick(timed: Callable[[], T], us: Callable[[T], float], half: bool,
                 tf32: bool = False, picks: Sequence[tuple[bool, bool]] = ALGORITHM_PICKS
                 ) -> T:
    """`timed()` under each of cuDNN's algorithm picks; the result with the least `us`."""
    results = []
    for benchmark, flip in picks:
        with algorithm_pick(benchmark, flip, half, tf32):
            results.append(timed())
    return min(results, key=us)


def time_cudnn_conv(shape: ConvShape, x0: Any, w0: Any, l2_bytes: int, tf32: bool = False,
                    picks: Sequence[tuple[bool, bool]] = ALGORITHM_PICKS,
                    residual: Any = None) -> tuple[Timing, list[Any], int]:
    """cuDNN's conv of `shape` on NCHW tensors x0, w0 (made channels_last here), over as many
    input sets as it takes to exceed L2, with the faster of the two algorithm picks (TF32
    allowed for fp32 inputs if `tf32`). `residual`: an NCHW tensor of the output's shape
    that PyTorch adds to each conv's output after it (a ResNet block's add), rotating with the
    inputs. Returns the harness's timing, the input sets and their count; cuDNN's flags are
    left as they were."""
    import torch
    import torch.nn.functional as F

    x0 = x0.contiguous(memory_format=torch.channels_last)
    w0 = w0.contiguous(memory_format=torch.channels_last)
    out_elements = shape.gemm_m * shape.k * (1 if residual is None else 2)
    per = (x0.numel() + w0.numel() + out_elements) * x0.element_size()
    n_sets = sets_for_l2(per, l2_bytes)
    xl = [x0] + [x0.clone() for _ in range(n_sets - 1)]
    wl = [w0] + [w0.clone() for _ in range(n_sets - 1)]
    rl: list[Any] = []
    if residual is not None:
        r0 = residual.contiguous(memory_format=torch.channels_last)
        rl = [r0] + [r0.clone() for _ in range(n_sets - 1)]

    # The outputs rotate too, as ours do (kernels.runner): a result dropped at once would be
    # freed and its buffer handed to the next launch (in a graph capture as well), so every
    # launch would write the same L2-resident lines and never pay for its output's DRAM
    # writes. Slot i holds set i's output until set i runs again.
    ys: list[Any] = [None] * n_sets

    def conv(i: int) -> None:
        ys[i] = F.conv2d(xl[i], wl[i], stride=shape.stride, padding=shape.pad,
                         dilation=shape.dilation)
        if rl:
            ys[i].add_(rl[i])

    best = fastest_pick(lambda: time_launches(conv, n_sets, api="torch"),
                        lambda t: t.median_us, x0.element_size() == 2, tf32, picks)
    return best, xl, n_sets


def _random_inputs(shape: ConvShape, dtype: Any, gen: Any, device: Any) -> tuple[Any, Any]:
    import torch

    xs, ws = (shape.n, shape.c, shape.h, shape.w), (shape.k, shape.c, shape.r, shape.s)
    x0 = (torch.rand(xs, generator=gen) * 2 - 1).to(device, dtype)
    w0 = (torch.rand(ws, generator=gen) * 2 - 1).to(device, dtype)
    return x0, w0


def cudnn_conv_times(shape: ConvShape, l2_bytes: int, variants: Sequence[Variant], *,
                     extra: Extra | None = None, device: str = "cuda") -> dict[str, float]:
    """Median latency (us) of cuDNN's conv of `shape` for each variant."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(SEED)
    out: dict[str, float] = {}
    for name, dtype_name, tf32 in variants:
        x0, w0 = _random_inputs(shape, getattr(torch, dtype_name), g, device)
        t, xl, n_sets = time_cudnn_conv(shape, x0, w0, l2_bytes, tf32)
        out[name] = t.median_us
        if extra is not None:
            out.update(extra(name, xl, n_sets))
        del xl
    return out


def cudnn_baseline(shape: ConvShape, dtype: str, l2_bytes: int, device: int = 0) -> Timing:
    """cuDNN's latency of `shape` in `dtype` ('fp16', or 'fp32' with TF32 off) on CUDA device
    `device`: a task's baseline. The inputs are those of the first variant of
    `cudnn_conv_times`; the tensors' memory is returned to the device afterwards (the
    measuring child goes on with CuPy). A layer over two inputs (shape.concat) is what it
    replaces: cuDNN's two 1x1 layers, x1's and x's, timed one after the other and summed
    (medians and IQRs). A layer with a residual (shape.residual) is what it replaces too:
    cuDNN's conv, then PyTorch's add of the residual (a random tensor of the output's shape
    drawn after x and w) in place on its output, one after the other in each timed launch.
    A layer with a back-to-back conv (shape.b2b): the two layers it replaces, summed."""
    import torch

    parts = shape.b2b_parts() if shape.b2b else shape.concat_parts() if shape.concat else ()
    if parts:
        ts = [cudnn_baseline(part, dtype, l2_bytes, device) for part in parts]
        return Timing(sum(t.median_us for t in ts), sum(t.iqr_us for t in ts))

    torch_dtype = getattr(torch, BASELINE_DTYPES[dtype])
    with torch.cuda.device(device):
        try:
            g = torch.Generator(device="cpu").manual_seed(SEED)
            dev = torch.device("cuda", device)
            x0, w0 = _random_inputs(shape, torch_dtype, g, dev)
            r0 = None
            if shape.residual:
                out = (shape.n, shape.k, shape.p, shape.q)
                r0 = (torch.rand(out, generator=g) * 2 - 1).to(dev, torch_dtype)
            timing, xl, _ = time_cudnn_conv(shape, x0, w0, l2_bytes, residual=r0)
            del x0, w0, xl, r0
        finally:
            torch.cuda.empty_cache()
    return timing
