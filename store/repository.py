"""The narrow storage interface: tctune's state is read and written through here and through
store/hotpath.py, which holds the set-wise statements of the measurement path (candidates,
leases, results, best schedules: the one implementation of each of those writes).

Writes that a redelivered message could repeat are idempotent by construction (unique keys
with insert-or-ignore), so "at least once" delivery yields "exactly once" rows.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Select, and_, bindparam, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from kernels.spec import ConvShape, Precision, Target, task_key
from store.models import (
    ACTIVE_JOB_STATES,
    ApiToken,
    Artifact,
    BestSchedule,
    Candidate,
    ExplorerStat,
    Job,
    Measurement,
    Task,
    Worker,
    utcnow,
)


def as_utc(dt: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything tctune stores is UTC."""
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


# Bulk updates are decided by the database alone: evaluating their criteria against objects
# in the session would compare SQLite's naive datetimes with aware ones.
NO_SYNC = {"synchronize_session": False}


def insert_for(session: Session, model: type) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert(model) if dialect == "postgresql" else sqlite.insert(model))


# --- tasks and jobs ---------------------------------------------------------------------

def get_or_create_task(session: Session, shape: ConvShape, precision: Precision,
                       target: Target) -> Task:
    key = task_key(shape, precision, target)
    stmt = insert_for(session, Task).values(
        key=key, shape=shape.to_dict(), shape_key=shape.key(),
        precision=Precision(precision).value, target=target.name, created_at=utcnow(),
    ).on_conflict_do_nothing(index_elements=["key"])
    session.execute(stmt)
    return session.scalars(select(Task).where(Task.key == key)).one()


def find_task(session: Session, key: str) -> Task | None:
    return session.scalars(select(Task).where(Task.key == key)).one_or_none()


def verified_batches(session: Session, key: str) -> list[int]:
    """The batches at which the layer of task `key` (its shape, precision and target) has a
    verified schedule, ascending (deploy runs a layer on its record at the nearest larger
    batch: deploy.plan.other_batch_records)."""
    shape_key, precision, target = key.split("|")
    shape = ConvShape.from_key(shape_key)
    rest = shape_key.split("_", 1)[1]  # the key after its batch
    escaped = rest.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    rows = session.scalars(
        select(Task.shape_key).join(BestSchedule, BestSchedule.task_id == Task.id)
        .where(Task.precision == precision, Task.target == target,
               Task.shape_key.like(f"n%!_{escaped}", escape="!")))
    found = {ConvShape.from_key(k) for k in rows}
    return sorted(s.n for s in found if replace(s, n=1) == replace(shape, n=1))


def active_job_for_task(session: Session, task_id: int) -> Job | None:
    return session.scalars(
        select(Job).where(Job.task_id == task_id, Job.status.in_(ACTIVE_JOB_STATES))
        .order_by(Job.id).limit(1)
    ).one_or_none()


def latest_job_for_task(session: Session, task_id: int) -> Job | None:
    return session.scalars(
        select(Job).where(Job.task_id == task_id).order_by(Job.id.desc()).limit(1)
    ).one_or_none()


def create_job(session: Session, task: Task, trials: int, strategy: str, seed: int,
               submitted_by: int | None = None,
               strategy_options: dict[str, Any] | None = None) -> Job:
    job = Job(task_id=task.id, trials=trials, strategy=strategy, seed=seed, status="queued",
              created_at=utcnow(), submitted_by=submitted_by,
              strategy_options=strategy_options or None)
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, job_id: int, lock: bool = False) -> Job | None:
    """`lock`: hold the job's row until commit (PostgreSQL), so that two explorers never
    propose for the same job at once; SQLite serializes writers anyway."""
    return session.get(Job, job_id, with_for_update=lock or None)


def get_task(session: Session, task_id: int) -> Task | None:
    return session.get(Task, task_id)


def active_jobs(session: Session) -> Sequence[Job]:
    return session.scalars(
        select(Job).where(Job.status.in_(ACTIVE_JOB_STATES)).order_by(Job.id)
    ).all()


def list_jobs(session: Session, status: str | None, limit: int) -> Sequence[tuple[Job, Task]]:
    """The newest jobs (in `status` only, if given) with their tasks."""
    stmt = select(Job, Task).join(Task, Task.id == Job.task_id).order_by(Job.id.desc())
    if status:
        stmt = stmt.where(Job.status == status)
    return [(job, task) for job, task in session.execute(stmt.limit(limit))]


def set_job_status(session: Session, job: Job, status: str, error: str | None = None) -> None:
    now = utcnow()
    if status == "running" and job.started_at is None:
        job.started_at = now
    if status in ("done", "failed", "cancelled"):
        job.finished_at = now
    job.status = status
    if error is not None:
        job.error = error


# --- progress ---------------------------------------------------------------------------

@dataclass(frozen=True)
class JobProgress:
    measured: int
    ok: int
    best_us: float | None
    simulated: bool | None


def job_progress(session: Session, job_id: int) -> JobProgress:
    measured, ok, best = session.execute(
        select(func.count(Measurement.id),
               func.count(Measurement.id).filter(Measurement.status == "ok"),
               func.min(Measurement.median_us).filter(Measurement.status == "ok"))
        .where(Measurement.job_id == job_id)
    ).one()
    backend = session.scalars(
        select(Measurement.backend).where(Measurement.job_id == job_id).limit(1)
    ).one_or_none()
    return JobProgress(int(measured), int(ok), best,
                       None if backend is None else backend == "simulated")


def job_measurements(session: Session, job_id: int, after_id: int = 0,
                     limit: int | None = None) -> Sequence[Measurement]:
    stmt = (select(Measurement).where(Measurement.job_id == job_id, Measurement.id > after_id)
            .order_by(Measurement.id))
    if limit:
        stmt = stmt.limit(limit)
    return session.scalars(stmt).all()


def count_job_measurements_upto(session: Session, job_id: int, upto_id: int) -> int:
    return int(session.scalar(
        select(func.count(Measurement.id))
        .where(Measurement.job_id == job_id, Measurement.id <= upto_id)) or 0)


def task_measurements(session: Session, task_id: int) -> Sequence[Measurement]:
    return session.scalars(
        select(Measurement).where(Measurement.task_id == task_id).order_by(Measurement.id)
    ).all()


def prior_measurements_since(session: Session, target: str, precision: str, after_id: int
                             ) -> list[tuple[int, int, dict[str, Any], str, float | None]]:
    """(id, task id, schedule, status, median_us) of measurements on a target and precision
    with id > after_id, oldest first: what new tasks' cost models start from (their layers:
    `task_shapes`)."""
    rows = session.execute(
        select(Measurement.id, Measurement.task_id, Measurement.schedule, Measurement.status,
               Measurement.median_us)
        .join(Task, Task.id == Measurement.task_id)
        .where(Task.target == target, Task.precision == precision, Measurement.id > after_id)
        .order_by(Measurement.id)
    ).all()
    return [tuple(r) for r in rows]  # type: ignore[misc]


def task_shapes(session: Session, task_ids: Iterable[int]) -> dict[int, dict[str, Any]]:
    """Task id -> its shape (as stored)."""
    ids = sorted(set(task_ids))
    if not ids:
        return {}
    return {i: shape for i, shape in session.execute(
        select(Task.id, Task.shape).where(Task.id.in_(ids)))}


# --- candidates -------------------------------------------------------------------------

def mark_dispatched(session: Session, candidate_ids: Sequence[int]) -> None:
    if candidate_ids:
        session.execute(update(Candidate).where(Candidate.id.in_(candidate_ids))
                        .values(dispatched_at=utcnow()).execution_options(**NO_SYNC))


def open_candidates(session: Session, job_ids: Sequence[int]) -> Sequence[Candidate]:
    """The open candidates of these jobs: an embedded dispatcher holding nothing of a job
    on its way sends them all again."""
    if not job_ids:
        return []
    return session.scalars(
        select(Candidate).where(Candidate.job_id.in_(list(job_ids)), Candidate.state != "done")
        .order_by(Candidate.id)).all()


def stale_candidates(session: Session, older_than_s: float) -> Sequence[Candidate]:
    """Open candidates whose message may be lost: sent long ago (or never) and not held
    by a live lease. Re-sending one is safe: the task functions write once."""
    now = utcnow()
    cutoff = now - timedelta(seconds=older_than_s)
    return session.scalars(
        select(Candidate).join(Job, Job.id == Candidate.job_id)
        .where(Job.status.in_(ACTIVE_JOB_STATES), Candidate.state != "done",
               (Candidate.dispatched_at.is_(None)) | (Candidate.dispatched_at < cutoff),
               (Candidate.lease_expires_at.is_(None)) | (Candidate.lease_expires_at < now))
        .order_by(Candidate.id)
    ).all()


def get_candidate(session: Session, candidate_id: int) -> Candidate | None:
    return session.get(Candidate, candidate_id)


def record_builds(session: Session, builds: Sequence[tuple[int, str, str | None, str]]) -> None:
    """(candidate id, status, artifact, log) of finished builds, in one statement."""
    if not builds:
        return
    session.connection().execute(
        update(Candidate.__table__)
        .where(Candidate.__table__.c.id == bindparam("cid"),
               Candidate.__table__.c.state == "pending")
        .values(state="built", build_status=bindparam("st"), artifact=bindparam("art"),
                build_log=bindparam("lg"), lease_owner=None, lease_expires_at=None),
        [{"cid": cid, "st": st, "art": art, "lg": log[-20000:]}
         for cid, st, art, log in builds])


def best_measurement(session: Session, task_id: int) -> Measurement | None:
    """The task's fastest verified measurement."""
    return session.scalars(
        select(Measurement).where(Measurement.task_id == task_id, Measurement.status == "ok",
                                  Measurement.median_us.is_not(None))
        .order_by(Measurement.median_us, Measurement.id).limit(1)
    ).one_or_none()


def best_query(key: str) -> Select[Any]:
    return (select(Measurement, Task)
            .join(BestSchedule, BestSchedule.measurement_id == Measurement.id)
            .join(Task, and_(Task.id == BestSchedule.task_id))
            .where(Task.key == key))


def best_for_key(session: Session, key: str) -> tuple[Measurement, Task] | None:
    row = session.execute(best_query(key)).one_or_none()
    return None if row is None else (row[0], row[1])


def runners_up(session: Session, best: Measurement, k: int) -> list[Measurement]:
    """The task's next `k` fastest right measurements after its best (measured on the best's
    backend), fastest first: what deploy.model_select tries in a whole model."""
    if k <= 0:
        return []
    q = (select(Measurement)
         .where(Measurement.task_id == best.task_id, Measurement.id != best.id,
                Measurement.status == "ok", Measurement.median_us.is_not(None),
                Measurement.backend == best.backend)
         .order_by(Measurement.median_us, Measurement.id).limit(k))
    return list(session.scalars(q))


@dataclass(frozen=True)
class BestRow:
    """What GET /schedule answers with, plus what identifies the version it read."""

    task_id: int
    task_key: str
    measurement_id: int
    updated_at: datetime
    schedule: dict[str, Any]
    median_us: float | None
    iqr_us: float | None
    backend: str
    job_id: int
    measured_at: datetime
    precision: str
    target: str
    baseline_us: float | None
    baseline_backend: str | None


# GET /schedule's read, the service's hottest query: one lookup by the unique (indexed)
# task key, only the columns the answer needs, on a Connection (no ORM objects).
_BEST_ROW = (
    select(Task.id, Task.key, BestSchedule.measurement_id, BestSchedule.updated_at,
           Measurement.schedule, Measurement.median_us, Measurement.iqr_us,
           Measurement.backend, Measurement.job_id, Measurement.created_at, Task.precision,
           Task.target, Task.baseline_us, Task.baseline_backend)
    .select_from(Task)
    .join(BestSchedule, BestSchedule.task_id == Task.id)
    .join(Measurement, Measurement.id == BestSchedule.measurement_id)
    .where(Task.key == bindparam("key"))
)


def best_row_for_key(conn: Connection, key: str) -> BestRow | None:
    row = conn.execute(_BEST_ROW, {"key": key}).first()
    return None if row is None else BestRow(*row)


def best_fingerprint(conn: Connection) -> tuple[Any, ...]:
    """Changes whenever a task's best schedule is set, moved or deleted: a better schedule
    has a new measurement id and every refresh (and a baseline's arrival) stamps updated_at;
    a deletion changes the count. Cheap (one aggregate over best_schedule)."""
    return tuple(conn.execute(select(
        func.count(), func.coalesce(func.sum(BestSchedule.measurement_id), 0),
        func.max(BestSchedule.updated_at))).one())


def best_versions(conn: Connection) -> dict[int, tuple[int, datetime]]:
    """task id -> (best measurement id, updated_at) of every task with a best schedule."""
    return {t: (m, u) for t, m, u in conn.execute(select(
        BestSchedule.task_id, BestSchedule.measurement_id, BestSchedule.updated_at))}


def set_baseline(session: Session, task_id: int, us: float, backend: str) -> None:
    session.execute(update(Task).where(Task.id == task_id)
                    .values(baseline_us=us, baseline_backend=backend)
                    .execution_options(**NO_SYNC))
    # GET /schedule's answer carries the baseline, and its per-process cache notices only
    # changes of best_schedule rows (best_fingerprint): stamp the task's row, if it has one.
    session.execute(update(BestSchedule).where(BestSchedule.task_id == task_id)
                    .values(updated_at=utcnow()).execution_options(**NO_SYNC))


def best_schedules(session: Session, target: str | None = None, precision: str | None = None,
                   limit: int = 1000) -> Sequence[tuple[Task, Measurement]]:
    stmt = (select(Task, Measurement).join(BestSchedule, BestSchedule.task_id == Task.id)
            .join(Measurement, Measurement.id == BestSchedule.measurement_id))
    if target:
        stmt = stmt.where(Task.target == target)
    if precision:
        stmt = stmt.where(Task.precision == precision)
    return [(t, m) for t, m in session.execute(stmt.order_by(Task.id).limit(limit)).all()]


# --- workers ----------------------------------------------------------------------------

def heartbeat(session: Session, name: str, gpu_model: str, sm: int, target: str, backend: str,
              state: str = "idle", started: bool = False) -> None:
    heartbeat_many(session, {name: state}, gpu_model, sm, target, backend, started)


def heartbeat_many(session: Session, states: dict[str, str], gpu_model: str, sm: int,
                   target: str, backend: str, started: bool = False) -> None:
    """Heartbeat of several workers of one node (name -> state) in one statement: a
    simulated node hosts dozens, and one upsert each was a statement per slot per beat.
    `started`: the first beat of a process, which restarts the worker's start time (a
    restarted worker keeps its name)."""
    if not states:
        return
    now = utcnow()
    stmt = insert_for(session, Worker)
    updated = {"gpu_model": stmt.excluded.gpu_model, "sm": stmt.excluded.sm,
               "target": stmt.excluded.target, "backend": stmt.excluded.backend,
               "state": stmt.excluded.state, "last_heartbeat": stmt.excluded.last_heartbeat}
    if started:
        updated["started_at"] = stmt.excluded.started_at
    stmt = stmt.on_conflict_do_update(index_elements=["name"], set_=updated)
    session.execute(stmt, [
        {"name": n, "gpu_model": gpu_model, "sm": sm, "target": target, "backend": backend,
         "state": st, "started_at": now, "last_heartbeat": now}
        for n, st in sorted(states.items())])


def release_dead_leases(session: Session, overdue_s: float) -> int:
    """Free the leases of workers whose heartbeat is more than `overdue_s` late (or that
    said they stopped): a dead worker measures nothing, and its leases would otherwise
    hold their candidates for the whole lease time. They are marked as not sent, so the
    sweeper re-sends them. Returns how many were freed."""
    dead = select(Worker.name).where(
        (Worker.last_heartbeat < utcnow() - timedelta(seconds=overdue_s))
        | (Worker.state == "stopped"))
    res = session.execute(
        update(Candidate).where(Candidate.state != "done", Candidate.lease_owner.in_(dead))
        .values(lease_owner=None, lease_expires_at=None, dispatched_at=None)
        .execution_options(**NO_SYNC))
    return int(res.rowcount or 0)


def all_workers(session: Session) -> Sequence[Worker]:
    return session.scalars(select(Worker).order_by(Worker.name)).all()


def measurements_per_worker(session: Session, since: datetime) -> dict[str, int]:
    rows = session.execute(
        select(Measurement.worker, func.count(Measurement.id))
        .where(Measurement.created_at >= since).group_by(Measurement.worker)).all()
    return {w or "": int(n) for w, n in rows}


def live_workers(session: Session, target: str | None = None,
                 within_s: float = 60.0) -> Sequence[Worker]:
    since = utcnow() - timedelta(seconds=within_s)
    stmt = select(Worker).where(Worker.last_heartbeat >= since, Worker.state != "stopped")
    if target:  # '*' marks a worker of the simulated backend, which serves every target
        stmt = stmt.where(Worker.target.in_((target, "*")))
    return session.scalars(stmt.order_by(Worker.name)).all()


# --- tokens -----------------------------------------------------------------------------

def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, scope: str) -> str:
    """A new bearer token: returned once, stored as its hash."""
    token = "tct_" + secrets.token_urlsafe(32)
    session.add(ApiToken(name=name, scope=scope, token_hash=token_digest(token),
                         created_at=utcnow()))
    session.flush()
    return token


def find_token(session: Session, token: str) -> ApiToken | None:
    return session.scalars(select(ApiToken).where(
        ApiToken.token_hash == token_digest(token), ApiToken.revoked_at.is_(None))).one_or_none()


def count_tokens(session: Session) -> int:
    return int(session.scalar(select(func.count(ApiToken.id))) or 0)


def list_tokens(session: Session) -> Sequence[ApiToken]:
    return session.scalars(select(ApiToken).order_by(ApiToken.id)).all()


def revoke_token(session: Session, token_id: int) -> bool:
    res = session.execute(update(ApiToken).where(ApiToken.id == token_id,
                                                 ApiToken.revoked_at.is_(None))
                          .values(revoked_at=utcnow()).execution_options(**NO_SYNC))
    return bool(res.rowcount)


def active_jobs_of(session: Session, token_id: int) -> int:
    return int(session.scalar(select(func.count(Job.id)).where(
        Job.submitted_by == token_id, Job.status.in_(ACTIVE_JOB_STATES))) or 0)


# --- kernel artifacts -------------------------------------------------------------------
def publish_artifact(session: Session, key: str, cubin: bytes, meta: str) -> None:
    """Store a build under its cache key, once (a second publisher's insert is ignored)."""
    stmt = insert_for(session, Artifact).values(key=key, cubin=cubin, meta=meta,
                                                created_at=utcnow())
    session.execute(stmt.on_conflict_do_nothing(index_elements=["key"]))


def get_artifact(session: Session, key: str) -> tuple[bytes, str] | None:
    row = session.get(Artifact, key)
    return None if row is None else (row.cubin, row.meta)


def prune_artifacts(session: Session, job_id: int, task_id: int) -> int:
    """Drop the artifacts of a finished job's candidates, except its task's best one."""
    best = best_measurement(session, task_id)
    keep = None if best is None else session.scalar(
        select(Candidate.artifact).where(Candidate.task_id == task_id,
                                         Candidate.schedule_hash == best.schedule_hash)
        .limit(1))
    keys = select(Candidate.artifact).where(Candidate.job_id == job_id,
                                            Candidate.artifact.is_not(None))
    stmt = delete(Artifact).where(Artifact.key.in_(keys))
    if keep:
        stmt = stmt.where(Artifact.key != keep)
    return int(session.execute(stmt.execution_options(synchronize_session=False)).rowcount or 0)


# --- fleet counts (/metrics) ------------------------------------------------------------
@dataclass
class FleetCounts:
    jobs: list[tuple[str, int]]  # (status, jobs)
    measurements: list[tuple[str, str, int]]  # (status, backend, measurements)
    open_candidates: list[tuple[str, int]]  # (state, candidates not measured yet)
    explorers: list[ExplorerStat]


def fleet_counts(session: Session) -> FleetCounts:
    return FleetCounts(
        jobs=[(st, n) for st, n in session.execute(
            select(Job.status, func.count()).group_by(Job.status))],
        measurements=[(st, b, n) for st, b, n in session.execute(
            select(Measurement.status, Measurement.backend, func.count())
            .group_by(Measurement.status, Measurement.backend))],
        open_candidates=[(st, n) for st, n in session.execute(
            select(Candidate.state, func.count()).where(Candidate.state != "done")
            .group_by(Candidate.state))],
        explorers=list(session.scalars(select(ExplorerStat))))


# --- explorer stats ---------------------------------------------------------------------

def add_explorer_stat(session: Session, name: str, proposals: int, seconds_sum: float,
                      buckets: dict[str, int], fits_scratch: int, fits_extend: int,
                      proposed: int) -> None:
    """Add an explorer process's counts since its last write to its row (created at the
    first). Read, add, write: only that process writes its row."""
    row = session.get(ExplorerStat, name)
    if row is None:
        row = ExplorerStat(name=name, proposals=0, seconds_sum=0.0, buckets={},
                           fits_scratch=0, fits_extend=0, proposed=0)
        session.add(row)
    row.proposals += proposals
    row.seconds_sum += seconds_sum
    # A new dict: an in-place change of a JSON column is not seen by the session.
    row.buckets = {k: row.buckets.get(k, 0) + buckets.get(k, 0)
                   for k in row.buckets.keys() | buckets.keys()}
    row.fits_scratch += fits_scratch
    row.fits_extend += fits_extend
    row.proposed += proposed
    row.updated_at = utcnow()
    session.flush()
