"""The schedules a job measures in its first round before the strategy's picks.

- The runtime's default schedule of the layer (kernels.runtime.default_schedule, the one a
  layer nobody tuned runs): a job's best is never slower than what the runtime would run
  untuned, whatever the strategy and however few its trials.
- Transfer seeds: the best schedules of the most similar layers already measured on the same
  target and precision (the history's prior), as many as `TRANSFER_SEEDS`. The layers of
  one network share structure (a ResNet's 1x1 layers differ in size, not in what tiles
  suit them), so a neighbour's best is often this layer's best or close to it, and the
  strategy's model learns from these measurements like from any other.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from kernels.space import ScheduleSpace
from kernels.spec import ConvShape
from workers.backends.base import TaskSpec

log = logging.getLogger(__name__)

# Neighbours' bests in a first round (of 32 by default): enough to carry a model's
# structure across its layers, few enough to leave the round to the strategy.
TRANSFER_SEEDS = 8


def start_points(spec: TaskSpec, space: ScheduleSpace, history: Any) -> list[int]:
    """Space indices to measure first: only for a job with nothing measured or open yet, and
    only what its space holds (a replay's or a restricted space may not). The default
    first, then the transfer seeds, nearest layer first, without repeats."""
    if history.trials or history.pending:
        return []
    default = _default_point(spec, space)
    near = transfer_points(spec.shape, space, history.prior, TRANSFER_SEEDS + len(default))
    return default + [i for i in near if i not in default][:TRANSFER_SEEDS]


def _default_point(spec: TaskSpec, space: ScheduleSpace) -> list[int]:
    from kernels.runtime import default_schedule

    try:
        sched, _ = default_schedule(spec.shape, spec.precision, spec.target)
        if not space.is_valid(sched):
            return []
        return [space.index_of(sched)]
    except (ValueError, KeyError):  # no default for this layer on this path: nothing to seed
        log.debug("no default schedule to seed for %s", spec, exc_info=True)
        return []


def shape_distance(a: ConvShape, b: ConvShape) -> float:
    """How unlike two layers are for a kernel schedule: the implicit GEMM's sizes (output
    pixels, output channels, reduction) in octaves, plus a step for another filter size,
    stride or input channel class (few channels fold taps; wide ones do not)."""
    def gemm(s: ConvShape) -> tuple[int, int, int]:
        return s.n * s.p * s.q, s.k, s.c * s.r * s.s

    d = sum(abs(math.log2(x / y)) for x, y in zip(gemm(a), gemm(b), strict=True))
    if (a.r, a.s, a.stride) != (b.r, b.s, b.stride):
        d += 4.0
    if (a.c < 16) != (b.c < 16):
        d += 4.0
    return d


def transfer_points(shape: ConvShape, space: ScheduleSpace, prior: Any, n: int) -> list[int]:
    """Up to `n` space indices: each other layer's fastest measured schedule (of the prior:
    other layers on this target and precision), nearest layer first (`shape_distance`),
    where this space holds it and has it valid; repeats dropped."""
    best: dict[ConvShape, tuple[float, dict[str, Any]]] = {}
    for t in prior:
        if t.status != "ok" or t.median_us is None or t.shape == shape:
            continue
        have = best.get(t.shape)
        if have is None or t.median_us < have[0]:
            best[t.shape] = (t.median_us, t.schedule)
    out: list[int] = []
    for other in sorted(best, key=lambda s: (shape_distance(shape, s), s.key())):
        sched = best[other][1]
        try:
            if not space.is_valid(sched):
                continue
            i = space.index_of(sched)
        except (KeyError, ValueError):  # a knob value this space does not have
            continue
        if i not in out:
            out.append(i)
            if len(out) >= n:
                break
    return out
