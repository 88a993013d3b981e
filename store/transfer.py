"""Measurements and best schedules as JSON lines, so results move between deployments.

Each line is one object:

    {"kind": "measurement" | "best",
     "task": {"shape": {n, h, w, c, k, r, s, stride, pad, dilation},
              "precision": "int8", "target": "h200"},
     "schedule": {knob: value, ...}, "schedule_hash": "...",
     "status": "ok", "median_us": 6.9, "iqr_us": 0.1, "backend": "cuda" | "simulated",
     "worker": "...", "measured_at": "2026-11-22T01:53:37Z"}

"best" lines repeat the measurement that is each task's best schedule. Import validates
every line first and writes nothing if one is bad; a valid file is imported idempotently
(measurements are unique per task and schedule), and best schedules are recomputed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernels.space import schedule_hash, schedule_problems
from kernels.spec import TARGETS, ConvShape, Precision, get_target
from store import repository as repo
from store.models import BestSchedule, Job, Measurement, Task, utcnow

KINDS = ("measurement", "best")
STATUSES = ("ok", "wrong", "compile_error", "runtime_error", "timeout")
BACKENDS = ("cuda", "simulated")
IMPORT_STRATEGY = "import"


def _line(kind: str, task: Task, m: Measurement) -> str:
    return json.dumps({
        "kind": kind,
        "task": {"shape": task.shape, "precision": task.precision, "target": task.target},
        "schedule": m.schedule, "schedule_hash": m.schedule_hash, "status": m.status,
        "median_us": m.median_us, "iqr_us": m.iqr_us, "backend": m.backend,
        "worker": m.worker, "measured_at": repo.as_utc(m.created_at).isoformat(),  # type: ignore[union-attr]
    }, sort_keys=True) + "\n"


def export_lines(session: Session, target: str | None = None,
                 precision: str | None = None) -> Iterator[str]:
    stmt = select(Task).order_by(Task.id)
    if target:
        stmt = stmt.where(Task.target == target)
    if precision:
        stmt = stmt.where(Task.precision == precision)
    for task in session.scalars(stmt):
        best_id = session.scalar(select(BestSchedule.measurement_id)
                                 .where(BestSchedule.task_id == task.id))
        for m in repo.task_measurements(session, task.id):
            yield _line("measurement", task, m)
            if m.id == best_id:
                yield _line("best", task, m)


@dataclass
class Parsed:
    shape: ConvShape
    precision: Precision
    target: str
    schedule: dict[str, Any]
    status: str
    median_us: float | None
    iqr_us: float | None
    backend: str
    worker: str | None
    measured_at: datetime | None


@dataclass
class ImportReport:
    lines: int = 0
    imported: int = 0
    already_present: int = 0
    tasks: int = 0
    errors: list[str] = field(default_factory=list)


def _num(d: dict[str, Any], name: str, required: bool) -> float | None:
    v = d.get(name)
    if v is None:
        if required:
            raise ValueError(f"{name} is required for status ok")
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


def parse_line(raw: str) -> Parsed:
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError("a line must be a JSON object")
    if d.get("kind", "measurement") not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    task = d.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("shape"), dict):
        raise ValueError("task.shape is required")
    shape = ConvShape.from_dict(task["shape"])
    precision = Precision(task.get("precision"))
    if str(task.get("target", "")).lower() not in TARGETS:
        raise ValueError(f"unknown target {task.get('target')!r}")
    target = get_target(task["target"])
    if problems := shape.problems(precision, target):
        raise ValueError("; ".join(f"shape.{f}: {m}" for f, m in problems))
    schedule = d.get("schedule")
    if not isinstance(schedule, dict):
        raise ValueError("schedule must be an object")
    if problems := schedule_problems(precision, schedule):
        raise ValueError("; ".join(f"schedule.{f}: {m}" for f, m in problems))
    if "schedule_hash" in d and d["schedule_hash"] != schedule_hash(schedule):
        raise ValueError("schedule_hash does not match the schedule")
    status = d.get("status")
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}")
    backend = d.get("backend")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    when = d.get("measured_at")
    return Parsed(shape, precision, target.name, schedule, status,
                  _num(d, "median_us", status == "ok"), _num(d, "iqr_us", False), backend,
                  str(d["worker"])[:128] if d.get("worker") else None,
                  datetime.fromisoformat(when) if when else None)


def parse_all(lines: Iterable[str], max_errors: int = 20) -> tuple[list[Parsed], list[str]]:
    parsed, errors = [], []
    for no, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            parsed.append(parse_line(raw))
        except (ValueError, TypeError, KeyError) as exc:
            errors.append(f"line {no}: {exc}")
            if len(errors) >= max_errors:
                errors.append("... stopped after that many errors")
                break
    return parsed, errors


def import_lines(session: Session, lines: Iterable[str]) -> ImportReport:
    """Validate everything, then write; errors leave the database untouched."""
    parsed, errors = parse_all(lines)
    report = ImportReport(lines=len(parsed), errors=errors)
    if errors:
        return report
    tasks: dict[str, tuple[Task, Job]] = {}
    seen: set[tuple[str, str, str, str]] = set()
    for p in parsed:
        ident = (p.shape.key(), p.precision.value, p.target, schedule_hash(p.schedule))
        if ident in seen:  # a "best" line repeats its measurement line
            continue
        seen.add(ident)
        task = repo.get_or_create_task(session, p.shape, p.precision, get_target(p.target))
        if task.key not in tasks:
            job = session.scalars(select(Job).where(
                Job.task_id == task.id, Job.strategy == IMPORT_STRATEGY)).first()
            if job is None:  # imported rows hang off one finished "import" job per task
                job = repo.create_job(session, task, 0, IMPORT_STRATEGY, 0)
                repo.set_job_status(session, job, "done")
            tasks[task.key] = (task, job)
        task, job = tasks[task.key]
        stmt = repo.insert_for(session, Measurement).values(
            task_id=task.id, job_id=job.id, schedule=p.schedule,
            schedule_hash=schedule_hash(p.schedule), status=p.status, median_us=p.median_us,
            iqr_us=p.iqr_us, backend=p.backend, worker=p.worker,
            created_at=p.measured_at or utcnow(),
        ).on_conflict_do_nothing(index_elements=["task_id", "schedule_hash"])
        # RETURNING, not rowcount: PostgreSQL's driver reports -1 here (true) whether or
        # not the row went in.
        if session.execute(stmt.returning(Measurement.id)).first() is not None:
            report.imported += 1
        else:
            report.already_present += 1
    for task, job in tasks.values():
        job.trials = repo.job_progress(session, job.id).measured
        repo.refresh_best(session, task.id)
    report.tasks = len(tasks)
    return report
