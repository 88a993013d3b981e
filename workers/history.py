"""What the explorer hands a strategy: the task's history and the target's prior.

The explorer is one long-lived process, so it keeps two caches that only save time, never
change an answer: the prior of each (target, precision) — up to 50,000 measurements of
other layers, read incrementally by id — and one strategy instance per job (strategies
cache features and models; a fresh instance proposes the same from the same history)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kernels.space import ScheduleSpace
from kernels.spec import ConvShape
from search.registry import make_strategy
from search.strategy import History, PriorTrial, Strategy, Trial
from store import repository as repo
from store.models import Job, Task

PRIOR_LIMIT = 50_000
STRATEGY_CACHE = 64


@dataclass
class _Prior:
    last_id: int = 0
    rows: list[tuple[int, PriorTrial]] = field(default_factory=list)  # (task id, trial), by id


_priors: dict[tuple[str, str, str], _Prior] = {}
_strategies: OrderedDict[tuple[str, int], Strategy] = OrderedDict()


def prior_of(session: Any, db_url: str, target: str, precision: str,
             exclude_task: int) -> list[PriorTrial]:
    """Other layers' measurements on this target and precision, newest first."""
    cache = _priors.setdefault((db_url, target, precision), _Prior())
    for mid, task_id, shape, sched, status, us in repo.prior_measurements_since(
            session, target, precision, cache.last_id):
        cache.rows.append((task_id, PriorTrial(ConvShape.from_dict(shape), sched, status, us)))
        cache.last_id = mid
    if len(cache.rows) > 2 * PRIOR_LIMIT:  # keep memory bounded; the newest matter
        del cache.rows[:-PRIOR_LIMIT - 1000]
    out: list[PriorTrial] = []
    for task_id, trial in reversed(cache.rows):
        if task_id != exclude_task:
            out.append(trial)
            if len(out) >= PRIOR_LIMIT:
                break
    return out


def history_of(session: Any, db_url: str, task: Task, space: ScheduleSpace) -> History:
    trials = []
    for m in repo.task_measurements(session, task.id):
        try:
            trials.append(Trial(space.index_of(m.schedule), m.status, m.median_us))
        except (KeyError, ValueError):  # a schedule from an older space: not ours to replay
            continue
    return History(trials=trials,
                   prior=prior_of(session, db_url, task.target, task.precision, task.id))


def strategy_for(db_url: str, job: Job, space: ScheduleSpace) -> Strategy:
    key = (db_url, job.id)
    strat = _strategies.get(key)
    if strat is None:
        strat = make_strategy(job.strategy, space, seed=job.seed)
        _strategies[key] = strat
        while len(_strategies) > STRATEGY_CACHE:
            _strategies.popitem(last=False)
    _strategies.move_to_end(key)
    return strat
