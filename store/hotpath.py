"""The fleet's hot path in set-wise Core statements: lease a chunk, write its results,
refresh best schedules, close rounds, pick jobs for the explorer.

Every measurement passes through here, so each step is a few statements whatever the
chunk's size, with no ORM objects (profiled: ORM loads, per-call compilation of
multi-row INSERTs and one round trip per job were most of a measurement's CPU). The
statements are built once and cached by SQLAlchemy; lists travel as expanding IN
parameters, and rows as executemany (insertmanyvalues: one INSERT per batch) or, on
PostgreSQL, as one array per column with the schedules as one JSON array.
Exactly-once is kept by the same keys as before: unique (task, schedule hash) with
insert-or-ignore, and a lease that only a free or own candidate can take.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    bindparam,
    distinct,
    exists,
    func,
    literal,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from kernels.space import schedule_hash
from store.models import (
    ACTIVE_JOB_STATES,
    BestSchedule,
    Candidate,
    Job,
    Measurement,
    Task,
    Worker,
    utcnow,
)

C = Candidate.__table__.c
M = Measurement.__table__.c
J = Job.__table__.c


@dataclass(frozen=True)
class ChunkRow:
    """What a measuring worker needs of one open candidate of its chunk."""

    id: int
    task_id: int
    job_id: int
    round: int
    schedule: dict[str, Any]
    schedule_hash: str
    predicted_us: float | None
    build_status: str | None
    artifact: str | None
    build_log: str | None
    attempts: int  # before this lease


_CHUNK = (
    select(C.id, C.task_id, C.job_id, C.round, C.schedule, C.schedule_hash, C.predicted_us,
           C.build_status, C.artifact, C.build_log, C.attempts, J.status,
           exists().where(M.task_id == C.task_id, M.schedule_hash == C.schedule_hash)
           .label("measured"))
    .join(Job.__table__, J.id == C.job_id)
    .where(C.id.in_(bindparam("ids", expanding=True)), C.state != "done")
    .order_by(C.id)
)


# PostgreSQL: read, retire and lease in one statement (one round trip instead of three).
# `cand` is what the generic path reads; the two updates touch disjoint rows; the lease's
# conditions are re-checked on the row's latest version as in the generic UPDATE.
_LEASE_PG = text(
    "WITH cand AS ("
    " SELECT c.id, c.job_id, c.round, (j.status = ANY(:active) AND NOT EXISTS ("
    "  SELECT 1 FROM measurement m WHERE m.task_id = c.task_id"
    "  AND m.schedule_hash = c.schedule_hash)) AS live"
    " FROM candidate c JOIN job j ON j.id = c.job_id"
    " WHERE c.id = ANY(:ids) AND c.state != 'done'),"
    " retired AS ("
    " UPDATE candidate SET state = 'done', lease_owner = NULL, lease_expires_at = NULL"
    " WHERE id IN (SELECT id FROM cand WHERE NOT live) RETURNING id),"
    " leased AS ("
    " UPDATE candidate SET lease_owner = :owner, lease_expires_at = :expires,"
    " attempts = attempts + 1"
    " WHERE id IN (SELECT id FROM cand WHERE live) AND state != 'done'"
    " AND (lease_expires_at IS NULL OR lease_expires_at < :now OR lease_owner = :owner)"
    " RETURNING id, task_id, job_id, round, schedule, schedule_hash, predicted_us,"
    " build_status, artifact, build_log, attempts - 1 AS attempts)"
    " SELECT true AS mine, l.id, l.task_id, l.job_id, l.round, l.schedule, l.schedule_hash,"
    " l.predicted_us, l.build_status, l.artifact, l.build_log, l.attempts FROM leased l"
    " UNION ALL SELECT false, c.id, NULL, c.job_id, c.round, NULL, NULL, NULL, NULL, NULL,"
    " NULL, NULL FROM cand c")


def lease_chunk(session: Session, ids: Sequence[int], owner: str, seconds: float
                ) -> tuple[list[ChunkRow], set[tuple[int, int]]]:
    """Lease the open candidates of `ids` that nobody else holds; retire those with nothing
    left to measure (job over, or the schedule measured for the task already). One
    statement on PostgreSQL, three elsewhere (read, retire, lease). Returns the leased rows
    and the (job, round) of every open candidate read (what may close once the chunk is
    done)."""
    if not ids:
        return [], set()
    if session.get_bind().dialect.name == "postgresql":
        now = utcnow()
        got = session.execute(_LEASE_PG, {
            "ids": list(ids), "owner": owner, "now": now,
            "expires": now + timedelta(seconds=seconds), "active": list(ACTIVE_JOB_STATES)})
        out, rounds = [], set()
        for r in got:
            if r.mine:
                out.append(ChunkRow(r.id, r.task_id, r.job_id, r.round, r.schedule,
                                    r.schedule_hash, r.predicted_us, r.build_status,
                                    r.artifact, r.build_log, r.attempts))
            else:
                rounds.add((r.job_id, r.round))
        return sorted(out, key=lambda r: r.id), rounds
    rows = session.execute(_CHUNK, {"ids": list(ids)}).all()
    rounds = {(r.job_id, r.round) for r in rows}
    retire = [r.id for r in rows if r.status not in ACTIVE_JOB_STATES or r.measured]
    retire_candidates(session, retire)
    gone = set(retire)
    live = {r.id: r for r in rows if r.id not in gone}
    if not live:
        return [], rounds
    now = utcnow()
    mine = session.execute(
        update(Candidate.__table__)
        .where(C.id.in_(list(live)), C.state != "done",
               C.lease_expires_at.is_(None) | (C.lease_expires_at < now)
               | (C.lease_owner == owner))
        .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=seconds),
                attempts=C.attempts + 1)
        .returning(C.id)).scalars().all()
    out = []
    for i in sorted(mine):
        r = live[i]
        out.append(ChunkRow(r.id, r.task_id, r.job_id, r.round, r.schedule, r.schedule_hash,
                            r.predicted_us, r.build_status, r.artifact, r.build_log,
                            r.attempts))
    return out, rounds


_RETIRE_PG = text("UPDATE candidate SET state = 'done', lease_owner = NULL,"
                  " lease_expires_at = NULL WHERE id = ANY(:ids)")


def retire_candidates(session: Session, ids: Sequence[int]) -> None:
    if not ids:
        return
    if session.get_bind().dialect.name == "postgresql":  # no IN list to render per call
        session.execute(_RETIRE_PG, {"ids": list(ids)})
        return
    session.execute(update(Candidate.__table__).where(C.id.in_(list(ids)))
                    .values(state="done", lease_owner=None, lease_expires_at=None))


def renew_leases(session: Session, ids: Sequence[int], owner: str, seconds: float) -> set[int]:
    """Extend `owner`'s lease on the open candidates of `ids` it still holds; returns them.
    One whose lease ran out and was taken by another worker is not renewed: its holder
    measures it, this one must not."""
    if not ids:
        return set()
    got = session.execute(
        update(Candidate.__table__)
        .where(C.id.in_(list(ids)), C.state != "done", C.lease_owner == owner)
        .values(lease_expires_at=utcnow() + timedelta(seconds=seconds))
        .returning(C.id))
    return set(got.scalars().all())


# Statements built once per dialect: building one costs more CPU than running it.
_statements: dict[tuple[str, str], Any] = {}


def _statement(session: Session, name: str) -> Any:
    dialect = session.get_bind().dialect.name
    stmt = _statements.get((dialect, name))
    if stmt is None:
        stmt = _statements[(dialect, name)] = _BUILDERS[name](dialect)
    return stmt


def _insert(dialect: str, table: Any) -> Any:
    return (postgresql.insert(table) if dialect == "postgresql" else sqlite.insert(table))


def _record_stmt(dialect: str) -> Any:
    return (_insert(dialect, Measurement.__table__)
            .on_conflict_do_nothing(index_elements=["task_id", "schedule_hash"])
            .returning(M.task_id, M.schedule_hash))


def _best_stmt(dialect: str) -> Any:
    best = (select(M.task_id, M.id, bindparam("now"))
            .where(M.task_id == bindparam("task_id"), M.status == "ok",
                   M.median_us.is_not(None))
            .order_by(M.median_us, M.id).limit(1))
    stmt = _insert(dialect, BestSchedule.__table__).from_select(
        ["task_id", "measurement_id", "updated_at"], best)
    return stmt.on_conflict_do_update(
        index_elements=["task_id"],
        set_={"measurement_id": stmt.excluded.measurement_id,
              "updated_at": stmt.excluded.updated_at},
        where=BestSchedule.__table__.c.measurement_id != stmt.excluded.measurement_id)


def _candidates_stmt(dialect: str) -> Any:
    return (_insert(dialect, Candidate.__table__)
            .on_conflict_do_nothing(index_elements=["job_id", "schedule_hash"])
            .returning(C.id))


_BUILDERS = {"record": _record_stmt, "best": _best_stmt, "candidates": _candidates_stmt}

# PostgreSQL: a whole group of rows as one array per column, in one short statement that
# psycopg parses once and the server prepares once. A multi-row VALUES statement is new
# text for every row count and too long for psycopg's statement cache, and parsing it
# was most of the explorer's and a good part of a worker's CPU per write. The schedules go
# as one JSON array (`json_array_elements`, zipped with the columns by ROWS FROM): as a
# json[] psycopg quoted and escaped every one of their quotes in Python, most of the
# insert's CPU.
_RECORD_PG = text(
    "INSERT INTO measurement (task_id, job_id, schedule, schedule_hash, status, median_us,"
    " iqr_us, backend, worker, error, predicted_us, created_at)"
    " SELECT * FROM ROWS FROM (unnest(:task_id ::integer[]), unnest(:job_id ::integer[]),"
    " json_array_elements(:schedule ::json), unnest(:schedule_hash ::varchar[]),"
    " unnest(:status ::varchar[]), unnest(:median_us ::float8[]), unnest(:iqr_us ::float8[]),"
    " unnest(:backend ::varchar[]), unnest(:worker ::varchar[]), unnest(:error ::text[]),"
    " unnest(:predicted_us ::float8[]), unnest(:created_at ::timestamptz[]))"
    " ON CONFLICT (task_id, schedule_hash) DO NOTHING RETURNING task_id, schedule_hash")
# The round: the given one, or (NULL) the job's next, in the same statement. What a round's
# rows share (job, task, state, stamps) goes as one value each (psycopg dumps an array's
# elements one by one in Python), the schedules as one JSON array as above.
_CANDIDATES_PG = text(
    "INSERT INTO candidate (job_id, task_id, round, schedule, schedule_hash, state, attempts,"
    " created_at, predicted_us, dispatched_at)"
    " SELECT :job ::integer, :task_id ::integer, coalesce(:round ::integer,"
    " (SELECT coalesce(max(c.round), 0) + 1 FROM candidate c WHERE c.job_id = :job)),"
    " u.schedule, u.schedule_hash, 'pending', 0, :created_at ::timestamptz, u.predicted_us,"
    " :dispatched_at ::timestamptz"
    " FROM ROWS FROM (json_array_elements(:schedule ::json),"
    " unnest(:schedule_hash ::varchar[]), unnest(:predicted_us ::float8[]))"
    " AS u(schedule, schedule_hash, predicted_us)"
    " ON CONFLICT (job_id, schedule_hash) DO NOTHING RETURNING id")


def _insert_rows(session: Session, name: str, pg: Any, rows: list[dict[str, Any]]) -> Any:
    """Insert rows (dicts with the same keys) and return the RETURNING rows."""
    if session.get_bind().dialect.name != "postgresql":
        return session.connection().execute(_statement(session, name), rows)
    arrays = {k: [r[k] for r in rows] for k in rows[0]}
    arrays["schedule"] = json.dumps(arrays["schedule"])
    return session.execute(pg, arrays)


def record_results(session: Session, rows: Sequence[dict[str, Any]]) -> set[tuple[int, str]]:
    """Insert results once (executemany, one cached statement); returns the (task id,
    schedule hash) pairs written by this call — a pair measured before stays as it was."""
    if not rows:
        return set()
    params = _result_params(rows)
    if "id" in params[0]:  # an explicit id (tests of commit order): the generic statement
        res = session.connection().execute(_statement(session, "record"), params)
    else:
        res = _insert_rows(session, "record", _RECORD_PG, params)
    return {(t, h) for t, h in res}


def _result_params(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    now = utcnow()
    return [{"created_at": now, "error": None, "median_us": None, "iqr_us": None,
             "predicted_us": None, "worker": None, **r} for r in rows]


# PostgreSQL: a worker's write in one statement: its results inserted, its candidates
# retired, and the current best of each of their tasks read (`refresh_best_after_write`'s
# first look), where these were three round trips. The retirement is a WITH that nothing
# reads, which PostgreSQL runs once the query is done (ExecPostprocessPlan), so after the
# insert: the order of the statements it replaces (a row's unique-index entry before its
# candidate's row lock, no new deadlock between two writers). The best is read in the
# statement's snapshot, as of just before the insert: never faster than what a later
# statement would see (a best only gets faster), so no task that needs its best moved is
# left alone (those whose new rows are all slower than that best are).
_WRITE_PG = text(
    "WITH retired AS (UPDATE candidate SET state = 'done', lease_owner = NULL,"
    " lease_expires_at = NULL WHERE id = ANY(:retire)),"
    " ins AS (" + _RECORD_PG.text.split(" RETURNING ")[0] + " RETURNING task_id, schedule_hash)"
    " SELECT true AS written, task_id, schedule_hash, NULL::float8 AS best_us FROM ins"
    " UNION ALL SELECT false, b.task_id, NULL, m.median_us FROM best_schedule b"
    " JOIN measurement m ON m.id = b.measurement_id WHERE b.task_id = ANY(:best_tasks)")


def write_results(session: Session, rows: Sequence[dict[str, Any]], retire: Sequence[int]
                  ) -> tuple[set[tuple[int, str]], dict[int, float] | None]:
    """A measuring worker's results: insert them once (`record_results`) and retire the
    candidates `retire`. Returns the (task id, schedule hash) pairs written and, on
    PostgreSQL (one statement), the current best latency of each of their tasks that has
    one, for `refresh_best_after_write` (elsewhere None: it reads them itself)."""
    if not rows or session.get_bind().dialect.name != "postgresql":
        wrote = record_results(session, rows)
        retire_candidates(session, retire)
        return wrote, None
    params = _result_params(rows)
    arrays = {k: [r[k] for r in params] for k in params[0]}
    arrays["schedule"] = json.dumps(arrays["schedule"])
    wrote: set[tuple[int, str]] = set()
    best: dict[int, float] = {}
    for written, task_id, h, us in session.execute(_WRITE_PG, {
            **arrays, "retire": list(retire), "best_tasks": sorted(set(arrays["task_id"]))}):
        if written:
            wrote.add((task_id, h))
        else:
            best[task_id] = us
    return wrote, best


def add_candidates(session: Session, job_id: int, task_id: int,
                   schedules: Sequence[dict[str, Any]], round_no: int | None,
                   predicted_us: Sequence[float | None], dispatched: bool = False,
                   hashes: Sequence[str] | None = None) -> list[int]:
    """Insert a round's proposals (ignoring any the job already has); the new ids.
    `round_no` None: the job's next round (its highest + 1), worked out by the insert
    itself on PostgreSQL (the caller holds the job's row lock). `dispatched`: stamp them
    as sent (the caller sends them right after its commit). `hashes`: the schedules'
    `schedule_hash`, where the caller has them already."""
    if not schedules:
        return []
    now = utcnow()
    pg = session.get_bind().dialect.name == "postgresql"
    if round_no is None and not pg:
        round_no = next_round(session, job_id)
    if hashes is None:
        hashes = [schedule_hash(sched) for sched in schedules]
    params = [{"job_id": job_id, "task_id": task_id, "round": round_no, "schedule": sched,
               "schedule_hash": h, "state": "pending", "attempts": 0,
               "created_at": now, "predicted_us": pred,
               "dispatched_at": now if dispatched else None}
              for sched, h, pred in zip(schedules, hashes, predicted_us, strict=True)]
    if pg:
        return sorted(i for (i,) in session.execute(_CANDIDATES_PG, {
            "job": job_id, "task_id": task_id, "round": round_no, "created_at": now,
            "dispatched_at": now if dispatched else None,
            "schedule": json.dumps([r["schedule"] for r in params]),
            "schedule_hash": [r["schedule_hash"] for r in params],
            "predicted_us": [r["predicted_us"] for r in params]}))
    return sorted(i for (i,) in session.connection().execute(
        _statement(session, "candidates"), params))


def next_round(session: Session, job_id: int) -> int:
    """The job's next round number: its highest so far + 1."""
    return int(session.scalar(
        select(func.coalesce(func.max(C.round), 0)).where(C.job_id == job_id)) or 0) + 1


def refresh_best_many(session: Session, task_ids: Iterable[int]) -> None:
    """Point each task's best schedule at its fastest verified measurement, in one statement
    per task; the row is only touched when the best moved (what GET /schedule's cache
    watches)."""
    now = utcnow()
    for task_id in sorted(set(task_ids)):
        session.execute(_statement(session, "best"), {"task_id": task_id, "now": now})


# PostgreSQL: the best of each task against the rows just written only (a best never gets
# worse: measurements are not deleted but with their task), for every task in one
# statement. Before it, the writer takes a per-task transaction lock (in task order: no
# deadlock), so that its statement's snapshot sees the rows of every writer of the task
# before it (committed when their lock was released): of two writers of one task, the later
# compares against the earlier one's best, whichever is faster. A writer touches a task's
# best_schedule row (a move, a baseline's stamp) only under that lock, and takes all its locks
# in one sorted sweep: a row lock taken before the sweep could be waited on by a writer that
# holds the sweep's lock (a deadlock).
_BEST_LOCK_PG = text(
    "SELECT pg_advisory_xact_lock(1952805748, t)"
    " FROM (SELECT t FROM unnest(:tasks ::integer[]) AS t ORDER BY t) AS sorted")
_BEST_NEW_PG = text(
    "INSERT INTO best_schedule (task_id, measurement_id, updated_at)"
    " SELECT DISTINCT ON (m.task_id) m.task_id, m.id, :now FROM measurement m"
    " JOIN unnest(:task_id ::integer[], :schedule_hash ::varchar[]) AS w(task_id, h)"
    " ON m.task_id = w.task_id AND m.schedule_hash = w.h"
    " WHERE m.status = 'ok' AND m.median_us IS NOT NULL"
    " ORDER BY m.task_id, m.median_us, m.id"
    " ON CONFLICT (task_id) DO UPDATE SET measurement_id = excluded.measurement_id,"
    " updated_at = excluded.updated_at"
    " WHERE best_schedule.measurement_id != excluded.measurement_id AND ("
    "  SELECT (b.median_us, b.id) > (n.median_us, n.id) FROM measurement b, measurement n"
    "  WHERE b.id = best_schedule.measurement_id AND n.id = excluded.measurement_id)"
    " IS NOT FALSE")


_BEST_NOW_PG = text(
    "SELECT b.task_id, m.median_us FROM best_schedule b"
    " JOIN measurement m ON m.id = b.measurement_id WHERE b.task_id = ANY(:tasks)")


def refresh_best_after_write(session: Session,
                             written: Iterable[tuple[int, str, float]],
                             now_best: dict[int, float] | None = None,
                             lock_also: Iterable[int] = ()) -> None:
    """Move each task's best to the fastest of the rows just written (task, schedule hash,
    median of the verified ones) where it beats the current best. PostgreSQL: a task whose
    new rows are all slower than its best as this transaction sees it is left alone (a
    best only gets faster, so it stays so) without taking its lock, which most writes do
    once a search has found its good schedules; the others take the lock and move in one
    statement. Elsewhere each touched task's best is recomputed. `now_best`: the tasks'
    current bests as read in this transaction already (`write_results`), else read here.
    `lock_also`: tasks whose best_schedule row the caller touches next in this transaction
    (a baseline's stamp), locked in the same sorted sweep (PostgreSQL)."""
    rows = sorted(set(written))
    if session.get_bind().dialect.name != "postgresql":
        if rows:
            refresh_best_many(session, {t for t, _, _ in rows})
        return
    fastest: dict[int, float] = {}
    for t, _, us in rows:
        fastest[t] = min(us, fastest.get(t, us))
    if now_best is None and fastest:
        now_best = {t: us for t, us in session.execute(_BEST_NOW_PG,
                                                        {"tasks": sorted(fastest)})}
    now_best = now_best or {}
    maybe = {t for t, us in fastest.items() if t not in now_best or us <= now_best[t]}
    lock = maybe | set(lock_also)
    if lock:
        session.execute(_BEST_LOCK_PG, {"tasks": sorted(lock)})
    if not maybe:
        return
    pairs = [(t, h) for t, h, _ in rows if t in maybe]
    session.execute(_BEST_NEW_PG, {"task_id": [t for t, _ in pairs],
                                   "schedule_hash": [h for _, h in pairs], "now": utcnow()})


# A job can only have reached its budget with nothing open (the explorer never has more
# than trials - measured open): its measurements are counted only then, not at every write.
_BUDGET_PG = text(
    "SELECT j.id FROM job j WHERE j.id = ANY(:ids) AND j.status = ANY(:active)"
    " AND CASE WHEN EXISTS (SELECT 1 FROM candidate c WHERE c.job_id = j.id"
    " AND c.state != 'done') THEN false"  # CASE: the count only where nothing is open
    " ELSE (SELECT count(*) FROM measurement m WHERE m.job_id = j.id) >= j.trials END")


def jobs_reaching_budget(session: Session, job_ids: Iterable[int]) -> list[int]:
    """Active jobs among `job_ids` whose measurements reached their trial budget."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    if session.get_bind().dialect.name == "postgresql":
        return [i for (i,) in session.execute(_BUDGET_PG, {
            "ids": ids, "active": list(ACTIVE_JOB_STATES)})]
    counted = (select(func.count()).where(M.job_id == J.id).scalar_subquery())
    rows = session.execute(select(J.id).where(
        J.id.in_(ids), J.status.in_(ACTIVE_JOB_STATES), counted >= J.trials))
    return [i for (i,) in rows]


# One probe of the open candidates' partial index per (job, round): a join let the planner
# scan the whole candidate table.
_STILL_OPEN_PG = text(
    "SELECT p.job_id, p.round FROM unnest(:jobs ::integer[], :rounds ::integer[])"
    " AS p(job_id, round) WHERE EXISTS (SELECT 1 FROM candidate c"
    " WHERE c.job_id = p.job_id AND c.round = p.round AND c.state != 'done')")


def closed_rounds(session: Session, rounds: Iterable[tuple[int, int]]) -> set[int]:
    """Jobs among the (job, round) pairs one of whose rounds has no open candidate left."""
    pairs = sorted(set(rounds))
    if not pairs:
        return set()
    if session.get_bind().dialect.name == "postgresql":
        still = {(j, r) for j, r in session.execute(_STILL_OPEN_PG, {
            "jobs": [j for j, _ in pairs], "rounds": [r for _, r in pairs]})}
        return {j for j, r in pairs if (j, r) not in still}
    still_open = {(j, r) for j, r in session.execute(
        select(C.job_id, C.round).where(tuple_(C.job_id, C.round).in_(pairs),
                                        C.state != "done").distinct())}
    return {j for j, r in pairs if (j, r) not in still_open}


@dataclass(frozen=True)
class OpenRow:
    id: int
    round: int
    schedule_hash: str  # its schedule: `candidate_schedules` (the explorer maps most by hash)
    dispatched: bool


_ONE = select(literal(1).label("one")).subquery()
_OPEN_AND_MEASURED = (
    select(select(func.count()).where(M.job_id == bindparam("job_id")).scalar_subquery(),
           C.id, C.round, C.schedule_hash, C.dispatched_at)
    .select_from(_ONE.outerjoin(Candidate.__table__,
                                (C.job_id == bindparam("job_id")) & (C.state != "done")))
    .order_by(C.id))


def open_and_measured(session: Session, job_id: int) -> tuple[list[OpenRow], int]:
    """The job's open candidates and how many measurements it has, in one round trip (the
    explorer asks both for every round)."""
    rows = session.execute(_OPEN_AND_MEASURED, {"job_id": job_id}).all()
    measured = int(rows[0][0]) if rows else 0
    return [OpenRow(i, r, h, d is not None) for _, i, r, h, d in rows if i is not None], \
        measured


def _schedules_of(session: Session, cols: Any, ids: Sequence[int]
                  ) -> list[tuple[str, dict[str, Any]]]:
    """(schedule hash, schedule) of these rows of a table's columns `cols` (C or M)."""
    if not ids:
        return []
    return [(h, sched) for h, sched in session.execute(
        select(cols.schedule_hash, cols.schedule).where(cols.id.in_(list(ids))))]


def candidate_schedules(session: Session, ids: Sequence[int]
                        ) -> list[tuple[str, dict[str, Any]]]:
    """(schedule hash, schedule) of these candidates."""
    return _schedules_of(session, C, ids)


def measurement_schedules(session: Session, ids: Sequence[int]
                          ) -> list[tuple[str, dict[str, Any]]]:
    """(schedule hash, schedule) of these measurements."""
    return _schedules_of(session, M, ids)


def measured_count(session: Session, job_id: int) -> int:
    return int(session.scalar(select(func.count()).where(M.job_id == job_id)) or 0)


def open_rounds_per_job(session: Session) -> dict[int, int]:
    """Active job id -> how many of its rounds have open candidates (0 included)."""
    rows = session.execute(
        select(J.id, func.count(distinct(C.round)))
        .select_from(Job.__table__)
        .outerjoin(Candidate.__table__, (C.job_id == J.id) & (C.state != "done"))
        .where(J.status.in_(ACTIVE_JOB_STATES)).group_by(J.id).order_by(J.id))
    return {j: int(n) for j, n in rows}


# Per active job of the target, its open candidates by their partial index: the planner
# cannot but take the index for one job's rows. Counted over the whole table (the open ones
# first, as a materialized CTE, then their target), the rows a busy fleet had finished
# grew the count past the partial index's worth: a parallel scan of all 170,000 candidates,
# 60-120 ms a call (once a second) of PostgreSQL's CPU and the explorer's time, and more
# the longer the service runs.
_QUEUED_PG = text(
    "SELECT coalesce(sum(o.n), 0) FROM job j JOIN task t ON t.id = j.task_id"
    " CROSS JOIN LATERAL (SELECT count(*) AS n FROM candidate c WHERE c.job_id = j.id"
    " AND c.state != 'done' AND c.lease_owner IS NULL) o"
    " WHERE t.target = :target AND j.status = ANY(:active)")


def unfed_gpus(session: Session, target: str, alive_s: float, chunk: int = 1) -> int:
    """GPUs of the target that are idle (heartbeat within `alive_s`) minus those the
    candidates of its active jobs waiting for a GPU (open, not leased) will keep busy,
    `chunk` of them per GPU (a measure message's): how many would wait for the explorer if
    it proposed nothing more."""
    idle = session.scalar(select(func.count()).select_from(Worker).where(
        Worker.target == target, Worker.state == "idle",
        Worker.last_heartbeat >= utcnow() - timedelta(seconds=alive_s))) or 0
    if session.get_bind().dialect.name == "postgresql":
        queued = session.scalar(_QUEUED_PG, {"target": target,
                                             "active": list(ACTIVE_JOB_STATES)}) or 0
    else:
        queued = session.scalar(
            select(func.count()).select_from(Candidate.__table__)
            .join(Job.__table__, J.id == C.job_id)
            .join(Task.__table__, Task.__table__.c.id == J.task_id)
            .where(C.state != "done", C.lease_owner.is_(None),
                   J.status.in_(ACTIVE_JOB_STATES), Task.__table__.c.target == target)) or 0
    kept_busy = -(-int(queued) // max(1, chunk))  # GPUs the queued chunks occupy (rounded up)
    return max(0, int(idle) - kept_busy)


@dataclass(frozen=True)
class PendingRow:
    id: int
    task_id: int
    schedule: dict[str, Any]


def workers_measured_since(session: Session, names: Sequence[str], after: datetime
                           ) -> set[str]:
    """Which of these workers wrote a measurement at or after `after` (a GPU worker's
    heartbeat: busy or idle)."""
    return {w for (w,) in session.execute(
        select(M.worker).where(M.worker.in_(list(names)), M.created_at >= after).distinct())}


def pending_among(session: Session, ids: Sequence[int]) -> list[PendingRow]:
    """The still-unbuilt candidates among `ids`."""
    if not ids:
        return []
    return [PendingRow(*r) for r in session.execute(
        select(C.id, C.task_id, C.schedule)
        .where(C.id.in_(list(ids)), C.state == "pending").order_by(C.id))]


def tasks_with_baseline(session: Session, task_ids: Iterable[int]) -> set[int]:
    ids = sorted(set(task_ids))
    if not ids:
        return set()
    t = Task.__table__.c
    return {i for (i,) in session.execute(
        select(t.id).where(t.id.in_(ids), t.baseline_us.is_not(None)))}


def first_open_candidates(session: Session, job_ids: Iterable[int]) -> dict[int, int]:
    """job id -> the lowest id among its open (not done) candidates; jobs with none are
    left out. Reads the open candidates' partial index (a few rows per job)."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    return {j: c for j, c in session.execute(
        select(C.job_id, func.min(C.id)).where(C.job_id.in_(ids), C.state != "done")
        .group_by(C.job_id))}


def task_of_candidate(session: Session, candidate_id: int) -> int | None:
    return session.scalar(select(C.task_id).where(C.id == candidate_id))


def task_measurements_since(session: Session, task_id: int, after_id: int
                            ) -> list[tuple[int, str, str, float | None]]:
    """(id, schedule hash, status, median_us) of a task's measurements with id > after_id
    (their schedules: `measurement_schedules`)."""
    return [tuple(r) for r in session.execute(  # type: ignore[misc]
        select(M.id, M.schedule_hash, M.status, M.median_us)
        .where(M.task_id == task_id, M.id > after_id).order_by(M.id))]


def task_measurement_count(session: Session, task_id: int, upto_id: int) -> int:
    return int(session.scalar(select(func.count()).where(M.task_id == task_id,
                                                         M.id <= upto_id)) or 0)
