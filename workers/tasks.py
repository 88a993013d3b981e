"""The task bodies: explore (central), build (CPU), measure (GPU).

Plain functions that read and write through `store`. The embedded dispatcher runs them in
local processes and the Celery app wraps the very same functions. Each one can run twice
for the same input (a redelivered message, a restarted process) without writing twice:
the explorer re-issues its open candidates before proposing more, builds only touch
'pending' candidates, and measurements are unique per (task, schedule hash).
"""

from __future__ import annotations

import logging
from typing import Any

from kernels.space import ScheduleSpace
from kernels.spec import ConvShape, Precision, get_target
from search.registry import make_strategy
from search.strategy import History, PriorTrial, Trial
from store import repository as repo
from store.db import session_scope
from store.models import ACTIVE_JOB_STATES, Job, Task
from workers.backends.base import Backend, BuildOutcome, TaskSpec

log = logging.getLogger(__name__)

# A candidate whose measurement was started this often without a result (its worker died
# each time) is stored as runtime_error instead of being retried for ever.
MAX_ATTEMPTS = 3
# How long a worker holds a candidate before another may take it over.
LEASE_S = 600.0


def task_spec(task: Task) -> TaskSpec:
    return TaskSpec(ConvShape.from_dict(task.shape), Precision(task.precision),
                    get_target(task.target))


def space_of(task: Task) -> ScheduleSpace:
    spec = task_spec(task)
    return ScheduleSpace(spec.shape, spec.precision, spec.target)


def _history(session: Any, task: Task, space: ScheduleSpace) -> History:
    trials = []
    for m in repo.task_measurements(session, task.id):
        try:
            trials.append(Trial(space.index_of(m.schedule), m.status, m.median_us))
        except (KeyError, ValueError):  # a schedule from an older space: not ours to replay
            continue
    prior = [PriorTrial(ConvShape.from_dict(shape), sched, status, us)
             for shape, sched, status, us in
             repo.prior_measurements(session, task.target, task.precision, task.id)]
    return History(trials=trials, prior=prior)


def finish_if_done(session: Any, job: Job) -> bool:
    """Mark the job done once its budget is measured; True if it is finished."""
    if job.status not in ACTIVE_JOB_STATES:
        return True
    if repo.job_progress(session, job.id).measured >= job.trials:
        repo.set_job_status(session, job, "done")
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
        repo.set_job_status(s, job, "running")
        space = space_of(task)
        history = _history(s, task, space)
        remaining = job.trials - repo.job_progress(s, job.id).measured
        strategy = make_strategy(job.strategy, space, seed=job.seed)
        picks = strategy.propose(history, min(batch_size, remaining))
        if not picks:
            repo.set_job_status(s, job, "done",
                                error="search space exhausted before the trial budget")
            return []
        # Model-based strategies say what they predicted; the dashboard plots it.
        predictions: dict[int, float] = getattr(strategy, "predictions", None) or {}
        insight = getattr(strategy, "insight", None)
        if insight:
            job.insight = insight
        ids = repo.add_candidates(s, job, space.schedules(picks), repo.next_round(s, job.id),
                                  [predictions.get(i) for i in picks])
        repo.mark_dispatched(s, ids)
        return ids


def build(db_url: str, candidate_id: int, backend: Backend) -> str | None:
    """Build one candidate (idempotent); returns its build status or None if not needed."""
    with session_scope(db_url) as s:
        cand = repo.get_candidate(s, candidate_id)
        if cand is None or cand.state != "pending":
            return None
        task = repo.get_task(s, cand.task_id)
        assert task is not None
        spec, schedule = task_spec(task), dict(cand.schedule)
    outcome = backend.build(spec, schedule)
    with session_scope(db_url) as s:
        repo.record_build(s, candidate_id, outcome.status, outcome.artifact, outcome.log)
    return outcome.status


def measure(db_url: str, candidate_id: int, backend: Backend, worker: str,
            lease_s: float = LEASE_S) -> bool:
    """Measure one candidate and store the result once; True if this call wrote it."""
    with session_scope(db_url) as s:
        cand = repo.get_candidate(s, candidate_id)
        if cand is None or cand.state == "done":
            return False
        job = repo.get_job(s, cand.job_id)
        if job is None or job.status not in ACTIVE_JOB_STATES \
                or repo.is_measured(s, cand.task_id, cand.schedule_hash):
            repo.retire_candidate(s, cand.id)  # nothing to measure (again)
            return False
        if cand.attempts >= MAX_ATTEMPTS:
            repo.record_measurement(s, cand, "runtime_error", None, None, backend.name, worker,
                                    f"gave up after {cand.attempts} attempts without a result")
            finish_if_done(s, job)
            return True
        if not repo.lease_candidate(s, cand.id, worker, lease_s):
            return False  # another worker holds it
        task = repo.get_task(s, cand.task_id)
        assert task is not None
        task_id, has_baseline = task.id, task.baseline_us is not None
        spec, schedule = task_spec(task), dict(cand.schedule)
        built = BuildOutcome(cand.build_status or "", cand.artifact, cand.build_log or "")
    if built.status == "":  # no builder got to it: build here
        built = backend.build(spec, schedule)
    outcome = backend.measure(spec, schedule, built)
    baseline = None if has_baseline else _baseline(spec, backend)
    with session_scope(db_url) as s:
        if baseline is not None:
            repo.set_baseline(s, task_id, baseline, backend.name)
        cand = repo.get_candidate(s, candidate_id)
        assert cand is not None
        wrote = repo.record_measurement(s, cand, outcome.status, outcome.median_us,
                                        outcome.iqr_us, backend.name, worker, outcome.error)
        if wrote and outcome.status == "ok":
            repo.refresh_best(s, cand.task_id)
        job = repo.get_job(s, cand.job_id)
        if job is not None:
            finish_if_done(s, job)
    return wrote


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
