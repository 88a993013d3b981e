"""The schedules a job measures in its first round before the strategy's picks: the runtime's
default schedule of the layer (kernels.runtime.default_schedule, the one a layer nobody tuned
runs). So a job's best is never slower than what the runtime would run untuned, whatever the
strategy and however few its trials; the strategy's model learns from it like from any
measurement."""

from __future__ import annotations

import logging
from typing import Any

from kernels.space import ScheduleSpace
from workers.backends.base import TaskSpec

log = logging.getLogger(__name__)


def start_points(spec: TaskSpec, space: ScheduleSpace, history: Any) -> list[int]:
    """Space indices to measure first: only for a job with nothing measured or open yet, and
    only what its space holds (a replay's or a restricted space may not)."""
    if history.trials or history.pending:
        return []
    from kernels.runtime import default_schedule

    try:
        sched, _ = default_schedule(spec.shape, spec.precision, spec.target)
        if not space.is_valid(sched):
            return []
        return [space.index_of(sched)]
    except (ValueError, KeyError):  # no default for this layer on this path: nothing to seed
        log.debug("no default schedule to seed for %s", spec, exc_info=True)
        return []
