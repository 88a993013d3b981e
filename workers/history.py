"""What the explorer hands a strategy: the task's history and the target's prior.

The explorer is one long-lived process, so it keeps caches that save time: each task's
trials (read incrementally by id, checked by count, so never a different answer), the
prior of each (target, precision) — up to 50,000 measurements of other layers, read
incrementally by id, at most every `prior_refresh_s` if asked (a prior up to that old; the
strategies' copy moves only as it grows by half, `settled`, and once the live strategies'
base models on it are trained, in a background thread) — and one strategy instance
per job (strategies cache features and models; a fresh instance proposes the same from
the same history)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from kernels.space import ScheduleSpace
from kernels.spec import ConvShape
from search.registry import make_strategy
from search.strategy import History, PriorTrial, Strategy, Trial
from store import hotpath as hp
from store import repository as repo
from store.models import Job
from workers.lru import Lru

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger(__name__)

PRIOR_LIMIT = 50_000
# With a refresh window, the prior handed to strategies is replaced once the rows read since
# it was made are at least this fraction of it: every new list is a new base model and, at
# each job's next retraining, a scoring of its whole space by it (0.1-0.2 s a job); read
# every 30 s, a fleet's prior changed at every read. The base model trains on at most
# 12,000 sampled rows (search.cost_model.MAX_PRIOR_ROWS), so a list grown by less than
# half teaches it little; the transfer seeds take the newest list (`seed_prior`).
PRIOR_GROWTH = 0.5
# The strategies of the active jobs, kept between their proposals: one made anew costs its
# space's features and scores again (0.5-1 s on a 150,000-schedule space), and a whole model's
# jobs (DenseNet-121: 132) propose in turn, so a cache that holds fewer than all of them
# misses on every proposal. Bounded by their arrays' bytes (about 30 MB a job on such spaces,
# `footprint`: some 60 of the largest in a process, more of smaller ones), not by a count.
STRATEGY_CACHE = 1024
STRATEGY_BYTES = 2 << 30
TRIALS_CACHE = 256


@dataclass
class _Prior:
    last_id: int = 0
    rows: list[tuple[int, PriorTrial]] = field(default_factory=list)  # (task id, trial), by id
    read_at: float = -1e18  # monotonic time of the last read
    version: int = 0  # moves whenever rows were added
    read: int = 0  # rows read so far (never trimmed)
    settled: tuple[int, list[PriorTrial]] | None = None  # (read then, the strategies' list)
    warming: threading.Thread | None = None  # training the next settled list's base models


@dataclass
class _Trials:
    last_id: int = 0
    rows: int = 0  # measurements read, whether or not they index into today's space
    trials: list[Trial] = field(default_factory=list)


# The readers below update these caches in place: one at a time (an explorer's threads).
_reading = threading.RLock()
_priors: dict[tuple[str, str, str], _Prior] = {}
# (db, target, precision, task) -> (prior version, the prior that task's strategy gets)
_prior_views: Lru[tuple[str, str, str, int], tuple[int, list[PriorTrial]]] = Lru(TRIALS_CACHE)
_trials: Lru[tuple[str, int], _Trials] = Lru(TRIALS_CACHE)
_strategies: Lru[tuple[str, int], Strategy] = Lru(STRATEGY_CACHE, lambda st: st.footprint(),
                                                  STRATEGY_BYTES)
# (db, task) -> schedule hash -> its index in the task's space (None: not a schedule of it).
# A hash names one schedule, so the explorer maps its open candidates and new measurements
# by the hashes it proposed instead of decoding each row's schedule (JSON) and looking it
# up: that was a tenth of the fleet explorer's CPU. Unknown hashes (another process's
# proposals, a restart) are read and mapped as before.
_indices: Lru[tuple[str, int], dict[str, int | None]] = Lru(TRIALS_CACHE)
# (db, task) -> its layer: a task's shape never changes, so the prior's rows name the task.
_shapes: dict[tuple[str, int], ConvShape] = {}


def _one_reader(f: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(f)
    def locked(*args: P.args, **kwargs: P.kwargs) -> R:
        with _reading:
            return f(*args, **kwargs)
    return locked


@_one_reader
def prior_of(session: Any, db_url: str, target: str, precision: str,
             exclude_task: int, refresh_s: float = 0.0, settled: bool = False
             ) -> list[PriorTrial]:
    """Other layers' measurements on this target and precision, newest first.

    `refresh_s` > 0: read new rows at most that often, and hand every task the same list
    (the target's measurements, the task's own among them): the base model trained on it
    (cached by the prior's content) is reused by every job instead of retrained each
    round. On a busy fleet the prior grows with every write, and retraining on it (per
    task, as the prior excluded the task) was most of the explorer's time. `settled`
    (with `refresh_s` > 0): the list as it was when last replaced, which happens once the
    rows read since are `PRIOR_GROWTH` of it (what strategies get)."""
    cache = _priors.setdefault((db_url, target, precision), _Prior())
    now = time.monotonic()
    if now - cache.read_at >= refresh_s:
        cache.read_at = now
        before = cache.last_id
        rows = repo.prior_measurements_since(session, target, precision, cache.last_id)
        new = {t for _, t, _, _, _ in rows if (db_url, t) not in _shapes}
        for t, shape in repo.task_shapes(session, new).items():
            _shapes[(db_url, t)] = ConvShape.from_dict(shape)
        for mid, task_id, sched, status, us in rows:
            cache.rows.append((task_id, PriorTrial(_shapes[(db_url, task_id)], sched, status,
                                                   us)))
            cache.last_id = mid
            cache.read += 1
        if cache.last_id != before:
            cache.version += 1
        if len(cache.rows) > 2 * PRIOR_LIMIT:  # keep memory bounded; the newest matter
            del cache.rows[:-PRIOR_LIMIT - 1000]
    # With a window, one prior for every task of the target and precision (its own rows
    # included, up to the last read): the base model trained on it is then shared by all
    # their jobs (search caches it by the prior's content) — one training per window and
    # target instead of one per task, which on a fleet of many layers was the explorer.
    if refresh_s > 0:
        exclude_task = -1
        have = cache.settled
        if settled and have is not None and (cache.warming is not None or cache.read - have[0]
                                             < max(1, int(PRIOR_GROWTH * len(have[1])))):
            return have[1]
    key = (db_url, target, precision, exclude_task)
    view = _prior_views.get(key)
    if view is not None and view[0] == cache.version:
        out = view[1]
    else:
        out = []
        for task_id, trial in reversed(cache.rows):
            if task_id != exclude_task:
                out.append(trial)
                if len(out) >= PRIOR_LIMIT:
                    break
        _prior_views.put(key, (cache.version, out))
    if settled and refresh_s > 0:
        return _settle(cache, out, db_url, target, precision)
    return out


def _settle(cache: _Prior, newest: list[PriorTrial], db_url: str, target: str,
            precision: str) -> list[PriorTrial]:
    """The strategies' prior, moving to `newest`: at once the first time; after that only
    once the live strategies' base models on it are trained, which a thread does while they
    go on with the settled one (the proposal that trained one was a fleet's slowest)."""
    if cache.settled is None:
        cache.settled = (cache.read, newest)
        return newest
    learners = [st for (db, _), st in _strategies.items() if db == db_url and
                st.space.target.name == target and st.space.precision.value == precision and
                hasattr(st, "warm_prior")]
    if not learners:
        cache.settled = (cache.read, newest)
        return newest
    read = cache.read
    cache.warming = threading.Thread(target=_warm, args=(cache, read, newest, learners),
                                     name="prior-warm", daemon=True)
    cache.warming.start()
    return cache.settled[1]


def _warm(cache: _Prior, read: int, prior: list[PriorTrial], learners: list[Strategy]) -> None:
    """Train the base models of `prior` (one per distinct model settings), then hand it to
    the strategies. A failure leaves it to the strategies, which train on demand."""
    try:
        for st in learners:  # cached by settings and prior: the first of each trains
            st.warm_prior(prior)  # type: ignore[attr-defined]
    except Exception:
        log.warning("training the prior's base model ahead failed", exc_info=True)
    finally:
        with _reading:
            cache.settled = (read, prior)
            cache.warming = None


def known_indices(db_url: str, task_id: int) -> dict[str, int | None]:
    """The task's schedule hashes mapped so far (`_indices`); callers add what they map."""
    return _indices.get_or_make((db_url, task_id), dict)


@_one_reader
def remember_indices(db_url: str, task_id: int, pairs: Iterable[tuple[str, int]]) -> None:
    """Hashes of schedules just proposed for the task and their indices in its space."""
    known_indices(db_url, task_id).update(pairs)


def _index_or_none(space: ScheduleSpace, sched: dict[str, Any]) -> int | None:
    try:
        return space.index_of(sched)
    except (KeyError, ValueError):  # a schedule from an older space: not ours
        return None


def map_hashes(known: dict[str, int | None], space: ScheduleSpace,
               read: list[tuple[str, dict[str, Any]]]) -> None:
    """Add (hash, schedule) pairs read from the database to `known`."""
    for h, sched in read:
        known[h] = _index_or_none(space, sched)


@_one_reader
def pending_of(session: Any, db_url: str, task_id: int, space: ScheduleSpace,
               open_rows: list[hp.OpenRow]) -> set[int]:
    """Space indices of the job's open candidates (those of an older space left out)."""
    known = known_indices(db_url, task_id)
    map_hashes(known, space, hp.candidate_schedules(
        session, [r.id for r in open_rows if r.schedule_hash not in known]))
    return {i for r in open_rows if (i := known.get(r.schedule_hash)) is not None}


@_one_reader
def trials_of(session: Any, db_url: str, task_id: int, space: ScheduleSpace) -> list[Trial]:
    """The task's measurements as trials, oldest first, read incrementally by id. A row
    committed after a newer one was read (ids are not commit order) shows up as a count
    mismatch (rows up to the last id read), and then the task is read again whole: the
    answer is the full set the database has committed."""
    key = (db_url, task_id)
    cache = _trials.get(key) or _Trials()
    known = known_indices(db_url, task_id)
    for _ in range(2):
        rows = hp.task_measurements_since(session, task_id, cache.last_id)
        map_hashes(known, space, hp.measurement_schedules(
            session, [mid for mid, h, _, _ in rows if h not in known]))
        for mid, h, status, us in rows:
            cache.rows += 1
            cache.last_id = mid
            i = known.get(h)
            if i is not None:
                cache.trials.append(Trial(i, status, us))
        if cache.rows == hp.task_measurement_count(session, task_id, cache.last_id):
            break
        cache = _Trials()
    _trials.put(key, cache)
    return list(cache.trials)


def history_of(session: Any, db_url: str, task_id: int, target: str, precision: str,
               space: ScheduleSpace, prior_refresh_s: float = 0.0) -> History:
    """The task's trials and the prior its strategy learns from (`prior_of`, settled)."""
    return History(trials=trials_of(session, db_url, task_id, space),
                   prior=prior_of(session, db_url, target, precision, task_id,
                                  prior_refresh_s, settled=True))


def seed_prior(session: Any, db_url: str, task_id: int, target: str, precision: str,
               prior_refresh_s: float = 0.0) -> list[PriorTrial]:
    """The newest prior (at most `prior_refresh_s` old), for the transfer seeds: layers
    tuned at the same time hand each other their bests as soon as they are read."""
    return prior_of(session, db_url, target, precision, task_id, prior_refresh_s)


def strategy_for(db_url: str, job: Job, space: ScheduleSpace) -> Strategy:
    key = (db_url, job.id)
    return _strategies.get_or_make(key, lambda: make_strategy(
        job.strategy, space, seed=job.seed, **(job.strategy_options or {})))
