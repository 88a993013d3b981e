"""SQLAlchemy 2.0 models. The database is the source of truth; the broker only carries
messages. Every schema change comes with an Alembic migration in migrations/versions/."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
ACTIVE_JOB_STATES = ("queued", "running")
CANDIDATE_STATES = ("pending", "built", "done")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    })


class Task(Base):
    """A (layer shape, precision, target) to tune; one best schedule is kept per task."""

    __tablename__ = "task"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), unique=True)
    shape: Mapped[dict[str, Any]] = mapped_column(JSON)
    shape_key: Mapped[str] = mapped_column(String(160))
    precision: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(32), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # cuDNN fp16 latency of the same layer on the target (what a speedup is quoted against).
    baseline_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline_backend: Mapped[str | None] = mapped_column(String(16), nullable=True)


class ApiToken(Base):
    """A bearer token; only its hash is stored. Scopes nest: admin > tune > read."""

    __tablename__ = "api_token"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class RateBucket(Base):
    """A token bucket of one limit and caller (store/ratelimit.py), shared by every API
    process: `level` requests were left at `at` (Unix seconds); `granted` says whether the
    last take was allowed (what the take's RETURNING reads)."""

    __tablename__ = "rate_bucket"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    level: Mapped[float] = mapped_column(Float)
    at: Mapped[float] = mapped_column(Float)
    granted: Mapped[int] = mapped_column(Integer)


class Job(Base):
    """One tuning run of a task with a trial budget and a strategy."""

    __tablename__ = "job"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id", ondelete="CASCADE"), index=True)
    trials: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(32))
    # The options the job gave its strategy (checked against its declaration when the job
    # was submitted); None: the strategy's defaults.
    strategy_options: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The token that submitted it (None: the service runs open) may cancel it.
    submitted_by: Mapped[int | None] = mapped_column(
        ForeignKey("api_token.id", ondelete="SET NULL"), nullable=True, index=True)
    # What the explorer's cost model said in its last round (knob importance and the like).
    insight: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class Candidate(Base):
    """A schedule the explorer proposed for a job: the ledger that makes a lost build or
    measure message recoverable (re-issued after its lease expires) and never doubled."""

    __tablename__ = "candidate"
    __table_args__ = (UniqueConstraint("job_id", "schedule_hash"),
                      Index("ix_candidate_job_state", "job_id", "state"),
                      # The open ones only (a few per job, however long the history): what
                      # the fleet asks after every write (is the round closed?) and sweep.
                      Index("ix_candidate_open", "job_id", "round",
                            postgresql_where=text("state != 'done'"),
                            sqlite_where=text("state != 'done'")))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id", ondelete="CASCADE"))
    round: Mapped[int] = mapped_column(Integer)
    schedule: Mapped[dict[str, Any]] = mapped_column(JSON)
    schedule_hash: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="pending")
    build_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    build_log: Mapped[str | None] = mapped_column(Text, nullable=True)
    artifact: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True),
                                                              nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The cost model's predicted latency when the explorer proposed it (None: no model yet).
    predicted_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    # When a build/measure message for it was last sent: the sweeper re-sends stale ones.
    dispatched_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True),
                                                           nullable=True)


class Measurement(Base):
    """One measured schedule. Unique per task: a schedule is measured once, whatever job or
    redelivered message asks for it again."""

    __tablename__ = "measurement"
    __table_args__ = (UniqueConstraint("task_id", "schedule_hash"),
                      Index("ix_measurement_job_id_id", "job_id", "id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"))
    schedule: Mapped[dict[str, Any]] = mapped_column(JSON)
    schedule_hash: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    median_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    iqr_us: Mapped[float | None] = mapped_column(Float, nullable=True)
    backend: Mapped[str] = mapped_column(String(16))
    worker: Mapped[str | None] = mapped_column(String(128), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    predicted_us: Mapped[float | None] = mapped_column(Float, nullable=True)


class BestSchedule(Base):
    """The best verified (status ok) measurement of a task, kept current after each batch."""

    __tablename__ = "best_schedule"
    task_id: Mapped[int] = mapped_column(ForeignKey("task.id", ondelete="CASCADE"),
                                         primary_key=True)
    measurement_id: Mapped[int] = mapped_column(ForeignKey("measurement.id", ondelete="CASCADE"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Worker(Base):
    """A measuring process (one per GPU) and its heartbeat."""

    __tablename__ = "worker"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(128))
    sm: Mapped[int] = mapped_column(Integer)
    target: Mapped[str] = mapped_column(String(32), index=True)
    backend: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="idle")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Artifact(Base):
    """A built kernel (cubin + launch metadata), for GPU workers on other hosts than the
    builder. Keyed by the build's cache key: a hash of source, options and sm."""

    __tablename__ = "artifact"
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    cubin: Mapped[bytes] = mapped_column(LargeBinary)
    meta: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ExplorerStat(Base):
    """One explorer process's work (workers/explorer_stats.py writes it, GET /metrics sums
    every row). Its counts only grow, and the row of an explorer gone stays: its work still
    counts toward the fleet's totals, which Prometheus reads as counters."""

    __tablename__ = "explorer_stat"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)  # host:pid
    proposals: Mapped[int] = mapped_column(Integer, default=0)
    seconds_sum: Mapped[float] = mapped_column(Float, default=0.0)
    # Proposals per histogram bucket, by upper bound ("0.01", ..., "+Inf"), not cumulative:
    # a bucket added later needs no migration.
    buckets: Mapped[dict[str, int]] = mapped_column(JSON)
    fits_scratch: Mapped[int] = mapped_column(Integer, default=0)
    fits_extend: Mapped[int] = mapped_column(Integer, default=0)
    proposed: Mapped[int] = mapped_column(Integer, default=0)  # candidates
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
