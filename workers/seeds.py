"""The schedules a job's round measures before the strategy's picks.

- First round: the runtime's default schedule of the layer (kernels.runtime.default_schedule,
  the one a layer nobody tuned runs): a job's best is never slower than what the runtime
  would run untuned, whatever the strategy and however few its trials.
- Every round: transfer seeds, the fastest schedules of the `TRANSFER_SEEDS` most similar
  layers measured on the same target and precision (the history's prior), those the job
  has not measured or proposed yet. The layers of one network share structure (a
  ResNet's 1x1 layers differ in size, not in what tiles suit them), so a neighbour's best
  is often this layer's best or close to it. Because every round looks again, layers tuned
  at the same time hand each other their bests as they find them; once the neighbours'
  bests are measured here, no round gets a seed until one of them changes.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from kernels.space import ScheduleSpace, schedule_problems
from kernels.spec import ConvShape, gemm_distance
from workers.backends.base import TaskSpec
from workers.lru import Lru

log = logging.getLogger(__name__)

# Neighbours' bests per round (of 32 by default): enough to carry a model's structure across
# its layers, few enough to leave the round to the strategy.
TRANSFER_SEEDS = 8


def start_points(spec: TaskSpec, space: ScheduleSpace, history: Any) -> list[int]:
    """Space indices to measure first in the job's next round: the default (first round
    only), then the transfer seeds, nearest layer first; only what the space holds and has
    valid (a replay's or a restricted space may not), nothing measured or pending."""
    first = not history.trials and not history.pending
    out = _default_point(spec, space) if first else []
    return out + transfer_points(spec.shape, space, history.prior, TRANSFER_SEEDS,
                                 exclude=history.seen | set(out))


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
    stride or input channel class (few channels fold taps; wide ones do not), and a small one
    for a residual on one of them (the same layer's best is a near neighbour either way); a
    back-to-back conv on one of them is a larger one (its tiles must cover all K channels:
    few of the other's bests run it)."""
    d = gemm_distance(a, b)
    if a.residual != b.residual:
        d += 0.5
    if bool(a.b2b) != bool(b.b2b):
        d += 2.0
    if (a.r, a.s, a.stride) != (b.r, b.s, b.stride):
        d += 4.0
    if (a.c < 16) != (b.c < 16):
        d += 4.0
    return d


# The prior is one list per (target, precision) and version, shared by every job of the
# explorer (workers/history.py) and never changed once handed out: each layer's best in it
# is found once per list (one pass over up to 50,000 measurements, not one per job), and its
# neighbours' ranking is kept per (list, layer), so that a round costs the walk down that
# ranking. Each entry holds the list itself, so its id stays its own.
_BESTS: Lru[tuple[int, int], tuple[Any, dict[ConvShape, tuple[float, dict[str, Any]]]]] = \
    Lru(8)
_RANKINGS: Lru[tuple[int, int, ConvShape], tuple[Any, list[dict[str, Any]]]] = Lru(64)


def layer_bests(prior: Any) -> dict[ConvShape, tuple[float, dict[str, Any]]]:
    """Each layer's fastest ok measurement in `prior` (latency, schedule); of equals the
    first in the list's order."""
    key = (id(prior), len(prior))
    hit = _BESTS.get(key)
    if hit is not None and hit[0] is prior:
        return hit[1]
    best: dict[ConvShape, tuple[float, dict[str, Any]]] = {}
    for t in prior:
        if t.status != "ok" or t.median_us is None:
            continue
        have = best.get(t.shape)
        if have is None or t.median_us < have[0]:
            best[t.shape] = (t.median_us, t.schedule)
    _BESTS.put(key, (prior, best))
    return best


def neighbour_bests(shape: ConvShape, prior: Any) -> list[dict[str, Any]]:
    """Each other layer's fastest ok schedule in `prior`, nearest layer first."""
    key = (id(prior), len(prior), shape)
    hit = _RANKINGS.get(key)
    if hit is not None and hit[0] is prior:
        return hit[1]
    best = layer_bests(prior)
    ranked = [best[s][1] for s in sorted((s for s in best if s != shape),
                                         key=lambda s: (shape_distance(shape, s), s.key()))]
    _RANKINGS.put(key, (prior, ranked))
    return ranked


def valid_index(space: ScheduleSpace, sched: dict[str, Any]) -> int | None:
    """The schedule's index in the space if the space holds it and has it valid, else None.
    By lookup in the space's valid schedules (the explorer's strategies enumerate them
    anyway), not by a pass of the kernel's rules per schedule (`ScheduleSpace.is_valid`)."""
    try:
        if schedule_problems(space.precision, sched):
            return None
        i = space.index_of(sched)
    except (KeyError, ValueError):  # a knob value this space does not have
        return None
    valid = space.valid_indices
    pos = int(np.searchsorted(valid, i))
    return i if pos < len(valid) and int(valid[pos]) == i else None


def transfer_points(shape: ConvShape, space: ScheduleSpace, prior: Any, n: int,
                    exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """The fastest schedules of the `n` nearest other layers whose best this space holds
    and has valid (`neighbour_bests`; repeats count once), less those in `exclude`."""
    near: list[int] = []
    for sched in neighbour_bests(shape, prior):
        if len(near) >= n:
            break
        i = valid_index(space, sched)
        if i is not None and i not in near:
            near.append(i)
    return [i for i in near if i not in exclude]
