"""The task bodies: explore (central), build (CPU), measure (GPU).

Plain functions that read and write through `store`. The embedded dispatcher runs them in
local processes and the Celery app wraps the very same functions. Each one can run twice
for the same input (a redelivered message, a restarted process) without writing twice:
the explorer re-issues its open candidates before proposing more, builds only touch
'pending' candidates, and measurements are unique per (task, schedule hash).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kernels.space import ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target
from store import repository as repo
from store.db import session_scope
from store.models import ACTIVE_JOB_STATES, Job, Task
from workers import artifacts
from workers.backends.base import Backend, BuildOutcome, MeasureOutcome, TaskSpec
from workers.history import history_of, strategy_for

log = logging.getLogger(__name__)

# A candidate whose measurement was started this often without a result (its worker died
# each time) is stored as runtime_error instead of being retried for ever.
MAX_ATTEMPTS = 3
# How long a worker holds a candidate before another may take it over.
LEASE_S = 600.0


def task_spec(task: Task) -> TaskSpec:
    return TaskSpec(ConvShape.from_dict(task.shape), Precision(task.precision),
                    get_target(task.target))


def target_of(db_url: str, candidate_id: int) -> str | None:
    """The target of a candidate's task: which backend (and queue) it needs."""
    with session_scope(db_url) as s:
        cand = repo.get_candidate(s, candidate_id)
        task = cand and repo.get_task(s, cand.task_id)
        return task.target if task else None


def space_of(task: Task) -> ScheduleSpace:
    spec = task_spec(task)
    return ScheduleSpace(spec.shape, spec.precision, spec.target)


def finish_if_done(session: Any, job: Job) -> bool:
    """Mark the job done once its budget is measured; True if it is finished."""
    if job.status not in ACTIVE_JOB_STATES:
        return True
    if repo.job_progress(session, job.id).measured >= job.trials:
        repo.set_job_status(session, job, "done")
        artifacts.prune(session, job.id, job.task_id)
        return True
    return False


def explore(db_url: str, job_id: int, batch_size: int = 32) -> list[int]:
    """Propose the job's next batch; returns the candidate ids to dispatch (build, measure).

    While the job has open candidates nothing new is proposed: those not yet dispatched are
    returned (the rest are on their way, or the sweeper re-sends them once stale).
    """
    with session_scope(db_url) as s:
        job = repo.get_job(s, job_id, lock=True)
        if job is None or job.status not in ACTIVE_JOB_STATES:
            return []
        open_cands = repo.open_candidates(s, job_id)
        if open_cands:
            ids = [c.id for c in open_cands if c.dispatched_at is None]
            repo.mark_dispatched(s, ids)
            return ids
        if finish_if_done(s, job):
            return []
        task = repo.get_task(s, job.task_id)
        assert task is not None
        space = space_of(task)
        started = time.perf_counter()
        history = history_of(s, db_url, task, space)
        remaining = job.trials - repo.job_progress(s, job.id).measured
        strategy = strategy_for(db_url, job, space)
        picks = strategy.propose(history, min(batch_size, remaining))
        # One line per proposal: the fleet benchmark reads the explorer's latency from it.
        log.info("proposal job=%d strategy=%s n=%d history=%d prior=%d seconds=%.4f", job.id,
                 job.strategy, len(picks), len(history.trials), len(history.prior),
                 time.perf_counter() - started)
        if not picks:
            repo.set_job_status(s, job, "done",
                                error="search space exhausted before the trial budget")
            return []
        # Written only now: on SQLite the first write takes the database's write lock, which
        # must not be held while the strategy thinks.
        repo.set_job_status(s, job, "running")
        # Model-based strategies say what they predicted; the dashboard plots it.
        describe = getattr(strategy, "describe", None)
        predictions, insight = describe(history, picks) if describe else ({}, None)
        if insight:
            job.insight = insight
        ids = repo.add_candidates(s, job, space.schedules(picks), repo.next_round(s, job.id),
                                  [predictions.get(i) for i in picks])
        repo.mark_dispatched(s, ids)
        return ids


def build_many(db_url: str, candidate_ids: Sequence[int], backend: Backend,
               publish: bool = False) -> int:
    """Build the still-pending candidates among `candidate_ids`; returns how many it built.
    `publish`: store each cubin in the database for GPU workers on other hosts."""
    with session_scope(db_url) as s:
        todo = [(c.id, task_spec(t), dict(c.schedule))
                for c, _, t in repo.open_candidates_with_context(s, candidate_ids)
                if c.state == "pending"]
    cache_dir = getattr(backend, "cache_dir", None)
    done = []
    for cid, spec, schedule in todo:
        outcome = backend.build(spec, schedule)
        if publish and cache_dir and outcome.status == "ok" and outcome.artifact:
            artifacts.publish(db_url, cache_dir, outcome.artifact)
        done.append((cid, outcome.status, outcome.artifact, outcome.log))
    with session_scope(db_url) as s:
        repo.record_builds(s, done)
    return len(todo)


@dataclass
class _Leased:
    cand_id: int
    task_id: int
    spec: TaskSpec
    schedule: dict[str, Any]
    schedule_hash: str
    job_id: int
    predicted_us: float | None
    built: BuildOutcome


def measure_many(db_url: str, candidate_ids: Sequence[int], backend: Backend, worker: str,
                 lease_s: float = LEASE_S, flush_s: float = 1.0) -> int:
    """Measure a chunk of candidates and store each result once; returns rows written.

    The chunk is leased in one transaction; results are written in groups (at most
    `flush_s` apart) so that a worker killed mid-chunk loses at most that much work, and
    the rest of the chunk is re-issued to another worker once its lease expires. Every
    step is a handful of set-wise statements, whatever the chunk's size.
    """
    leased: list[_Leased] = []
    gave_up: list[tuple[_Leased, MeasureOutcome]] = []
    with session_scope(db_url) as s:
        rows = repo.open_candidates_with_context(s, candidate_ids)
        measured = repo.measured_among(s, [(c.task_id, c.schedule_hash) for c, _, _ in rows])
        retire = {c.id for c, j, _ in rows
                  if j.status not in ACTIVE_JOB_STATES or (c.task_id, c.schedule_hash) in measured}
        repo.retire_candidates(s, sorted(retire))  # nothing to measure (again)
        live = [(c, t) for c, _, t in rows if c.id not in retire]
        mine = repo.lease_candidates(s, [c.id for c, _ in live], worker, lease_s)
        baselines_needed: dict[int, TaskSpec] = {}
        for cand, task in live:
            if cand.id not in mine:
                continue  # another worker holds it
            item = _Leased(cand.id, task.id, task_spec(task), dict(cand.schedule),
                           cand.schedule_hash, cand.job_id, cand.predicted_us,
                           BuildOutcome(cand.build_status or "", cand.artifact,
                                        cand.build_log or ""))
            if cand.attempts >= MAX_ATTEMPTS:  # its workers died each time it was taken
                gave_up.append((item, MeasureOutcome(
                    "runtime_error", error=f"gave up after {cand.attempts} attempts "
                                           "without a result")))
                continue
            if task.baseline_us is None:
                baselines_needed[task.id] = item.spec
            leased.append(item)
    baselines = {tid: b for tid, spec in baselines_needed.items()
                 if (b := _baseline(spec, backend)) is not None}

    written = _flush(db_url, gave_up, backend.name, worker, {})
    pending: list[tuple[_Leased, MeasureOutcome]] = []
    last_flush = time.monotonic()
    cache_dir = getattr(backend, "cache_dir", None)
    for item in leased:
        built = item.built
        if not built.status or (cache_dir and built.status == "ok" and built.artifact
                                and not artifacts.fetch(db_url, cache_dir, built.artifact)):
            built = backend.build(item.spec, item.schedule)  # nobody built it for this host
        pending.append((item, backend.measure(item.spec, item.schedule, built)))
        if time.monotonic() - last_flush >= flush_s:
            written += _flush(db_url, pending, backend.name, worker, baselines)
            pending, baselines, last_flush = [], {}, time.monotonic()
    written += _flush(db_url, pending, backend.name, worker, baselines)
    return written


def _flush(db_url: str, results: list[tuple[_Leased, MeasureOutcome]], backend: str,
           worker: str, baselines: dict[int, float]) -> int:
    """Write a group of results in one transaction; best schedules and job states follow."""
    if not results and not baselines:
        return 0
    with session_scope(db_url) as s:
        for task_id, us in baselines.items():
            repo.set_baseline(s, task_id, us, backend)
        wrote = repo.record_measurements(s, [{
            "task_id": item.task_id, "job_id": item.job_id, "schedule": item.schedule,
            "schedule_hash": item.schedule_hash, "status": out.status,
            "median_us": out.median_us, "iqr_us": out.iqr_us, "backend": backend,
            "worker": worker, "error": (out.error or None) and out.error[-20000:],
            "predicted_us": item.predicted_us} for item, out in results])
        repo.retire_candidates(s, [item.cand_id for item, _ in results])
        for task_id in {t for t, _ in wrote} & {i.task_id for i, o in results if o.status == "ok"}:
            repo.refresh_best(s, task_id)
        for job_id in {item.job_id for item, _ in results}:
            job = repo.get_job(s, job_id)
            if job is not None:
                finish_if_done(s, job)
    return len(wrote)


def _baseline(spec: TaskSpec, backend: Backend) -> float | None:
    """cuDNN fp16 latency of the layer, once per task, where the backend can time it."""
    timer = getattr(backend, "baseline_us", None)
    if timer is None:
        return None
    try:
        return float(timer(spec))
    except Exception:  # a baseline is nice to have; its failure must not lose the result
        log.exception("baseline timing failed for %s", spec.shape.key())
        return None
