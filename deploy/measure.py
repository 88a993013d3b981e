"""How a whole model is timed and checked, one way for `tctune-deploy` and bench/model_e2e.py:
one CUDA graph of back-to-back forwards over inputs rotating past L2 (kernels.timing, as
every baseline is timed), PyTorch's strongest inference compilation, and the agreement of
logits in float64."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def forward_ms(fn: Any, inputs: list[Any]) -> float:
    """Median milliseconds per forward: one CUDA graph of back-to-back calls, rotating over
    `inputs`, timed with each of cuDNN's algorithm picks for the convolutions PyTorch runs
    (kernels.cudnn.fastest_pick: benchmark mode alone picks slow algorithms at times), the
    faster counting."""
    from kernels.cudnn import fastest_pick

    return fastest_pick(lambda: forward_us(fn, inputs), float,
                        half=inputs[0].element_size() == 2) / 1e3


def forward_us(fn: Any, inputs: list[Any]) -> float:
    """Median microseconds per forward: one CUDA graph of back-to-back calls rotating over
    `inputs` (kernels.timing), PyTorch's convolutions on cuDNN's pick as it stands: how
    deploy.model_select compares one model's schedules."""
    import torch

    from kernels.timing import time_launches

    outs: list[Any] = [None] * len(inputs)  # each set's output lives until its next call

    def launch(i: int) -> None:
        outs[i] = fn(inputs[i])

    with torch.no_grad():
        return time_launches(launch, len(inputs), api="torch").median_us


def model_ruler(fast: Any, inputs: list[Any], compiled: bool) -> Callable[[], float]:
    """The forward's time (µs, `forward_us`) that deploy.model_select compares a model's
    schedules by: the optimized model as it will run, compiled (`compile_for_inference`, once)
    or eager. Compiled once is enough: a fused layer's op finds its module when it runs
    (deploy.torch_op), so a schedule set afterwards is the one the compiled forward runs."""
    fn = compile_for_inference(fast, inputs[0]) if compiled else fast
    return lambda: forward_us(fn, inputs)


def compile_for_inference(model: Any, example: Any) -> Any:
    """`torch.compile` with inference freezing (BatchNorm folded, weights constant),
    compiled by one call on `example`."""
    import torch
    import torch._inductor.config as inductor

    inductor.freezing = True
    fn = torch.compile(model)
    with torch.no_grad():
        fn(example)
    return fn


def agreement(got: Any, want: Any) -> tuple[float, float]:
    """(relative L2 error, cosine similarity) of two outputs, in float64."""
    g, w = got.double().flatten().cpu(), want.double().flatten().cpu()
    return float((g - w).norm() / w.norm()), float((g @ w) / (g.norm() * w.norm()))
