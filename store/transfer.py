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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    ValidationError,
    field_validator,
    model_validator,
)
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernels.space import schedule_hash, schedule_problems
from kernels.spec import ConvShape, Precision, get_target
from store import hotpath as hp
from store import repository as repo
from store.jsoncheck import parse_json
from store.layer import LayerIn
from store.models import BestSchedule, Job, Measurement, Task, utcnow

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


# Import refuses times it could not store or compare (year 1 or 9999 with an offset
# overflows on conversion to UTC).
EARLIEST, LATEST = datetime(1970, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC)
Microseconds = Annotated[StrictFloat, Field(ge=0)]  # ints pass; strings do not


class MeasurementLine(BaseModel):
    """One line of an export, validated like the API's input: the task is a LayerIn."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["measurement", "best"] = "measurement"
    task: LayerIn
    schedule: dict[str, Any]
    schedule_hash: str | None = Field(None, max_length=64)
    status: Literal["ok", "wrong", "compile_error", "runtime_error", "timeout"]
    median_us: Microseconds | None = None
    iqr_us: Microseconds | None = None
    backend: Literal["cuda", "simulated"]
    worker: str | None = Field(None, max_length=128)
    measured_at: datetime | None = None

    @field_validator("measured_at")
    @classmethod
    def _storable(cls, v: datetime | None) -> datetime | None:
        if v is None:
            return None
        try:
            utc = v.astimezone(UTC) if v.tzinfo else v.replace(tzinfo=UTC)
        except OverflowError:
            raise ValueError("is out of range once converted to UTC") from None
        if not EARLIEST <= utc < LATEST:
            raise ValueError(f"must lie between {EARLIEST.year} and {LATEST.year}")
        return utc

    @model_validator(mode="after")
    def _whole(self) -> MeasurementLine:
        problems = [f"task.shape.{f}: {m}" for f, m in self.task.problems()]
        problems += [f"schedule.{f}: {m}"
                     for f, m in schedule_problems(Precision(self.task.precision),
                                                     self.schedule)]
        if not problems and self.schedule_hash is not None \
                and self.schedule_hash != schedule_hash(self.schedule):
            problems.append("schedule_hash does not match the schedule")
        if self.status == "ok" and self.median_us is None:
            problems.append("median_us is required for status ok")
        if problems:
            raise ValueError("; ".join(problems))
        return self


def parse_line(raw: str) -> Parsed:
    value, problems = parse_json(raw, loc=())
    if problems:
        raise ValueError("; ".join(f"{_where(loc)}{msg}" for loc, msg in problems))
    try:
        line = MeasurementLine.model_validate(value)
    except ValidationError as exc:
        raise ValueError("; ".join(
            f"{_where(e['loc'])}{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors(include_url=False)[:5])) from None
    return Parsed(line.task.shape.to_shape(), Precision(line.task.precision), line.task.target,
                  line.schedule, line.status, line.median_us, line.iqr_us, line.backend,
                  line.worker, line.measured_at)


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) + ": " if loc else ""


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
    tasks: dict[str, tuple[Task, Job | None]] = {}
    seen: set[tuple[str, str, str, str]] = set()
    for p in parsed:
        digest = schedule_hash(p.schedule)
        ident = (p.shape.key(), p.precision.value, p.target, digest)
        if ident in seen:  # a "best" line repeats its measurement line
            continue
        seen.add(ident)
        task = repo.get_or_create_task(session, p.shape, p.precision, get_target(p.target))
        if task.key not in tasks:
            tasks[task.key] = (task, session.scalars(select(Job).where(
                Job.task_id == task.id, Job.strategy == IMPORT_STRATEGY)).first())
        task, job = tasks[task.key]
        if session.scalar(select(Measurement.id).where(
                Measurement.task_id == task.id, Measurement.schedule_hash == digest)):
            report.already_present += 1
            continue
        if job is None:  # imported rows hang off one finished "import" job per task,
            # created only when a row is new (a re-import adds no empty job)
            job = repo.create_job(session, task, 0, IMPORT_STRATEGY, 0)
            repo.set_job_status(session, job, "done")
            tasks[task.key] = (task, job)
        # RETURNING says whether the row was written (rowcount is -1 on some drivers); a
        # concurrent import may have written it since the check above.
        stmt = repo.insert_for(session, Measurement).values(
            task_id=task.id, job_id=job.id, schedule=p.schedule, schedule_hash=digest,
            status=p.status, median_us=p.median_us, iqr_us=p.iqr_us, backend=p.backend,
            worker=p.worker, created_at=p.measured_at or utcnow(),
        ).on_conflict_do_nothing(index_elements=["task_id", "schedule_hash"]
                                 ).returning(Measurement.id)
        if session.execute(stmt).scalar() is not None:
            report.imported += 1
        else:
            report.already_present += 1
    for _task, job in tasks.values():
        if job is not None:
            job.trials = repo.job_progress(session, job.id).measured
    hp.refresh_best_many(session, (task.id for task, _ in tasks.values()))
    report.tasks = len(tasks)
    return report
