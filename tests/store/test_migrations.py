"""Migrations take an empty database to head and back, on SQLite and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect

from store import migrate
from store.db import get_engine
from store.models import Base

TABLES = {"task", "job", "candidate", "measurement", "best_schedule", "worker", "api_token",
          "artifact", "rate_bucket", "explorer_stat"}


def _roundtrip(url: str) -> None:
    migrate.upgrade(url)
    engine = get_engine(url)
    insp = inspect(engine)
    assert set(insp.get_table_names()) >= TABLES
    assert migrate.current_revision(url) == migrate.head_revision(url)
    # The migration creates exactly the columns the models declare.
    for table in Base.metadata.sorted_tables:
        cols = {c["name"] for c in inspect(engine).get_columns(table.name)}
        assert cols == {c.name for c in table.columns}, table.name
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("measurement")}
    assert ("task_id", "schedule_hash") in uniques
    # 0006: the partial index of open candidates, gone again one step down.
    assert "ix_candidate_open" in {i["name"] for i in insp.get_indexes("candidate")}
    migrate.downgrade(url, "0005")
    assert "ix_candidate_open" not in {i["name"] for i in inspect(engine).get_indexes(
        "candidate")}
    migrate.downgrade(url, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    assert migrate.current_revision(url) is None


def test_sqlite_upgrade_and_downgrade(tmp_path: Path) -> None:
    _roundtrip(f"sqlite:///{tmp_path / 'm.db'}")


def test_postgresql_upgrade_and_downgrade(pg_url: str) -> None:
    _roundtrip(pg_url)


def test_migrations_keep_the_data(tmp_path: Path) -> None:
    """SQLite rebuilds tables in batch migrations: no cascade may eat the measurements."""
    from sqlalchemy import func, select

    from kernels.space import ScheduleSpace
    from kernels.spec import RESNET50_3X3, TARGETS, Precision
    from store import hotpath as hp
    from store import repository as repo
    from store.db import session_scope
    from store.models import Measurement

    url = f"sqlite:///{tmp_path / 'keep.db'}"
    migrate.upgrade(url)
    shape = RESNET50_3X3["stage2"]
    space = ScheduleSpace(shape, Precision.INT8, TARGETS["h200"])
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, shape, Precision.INT8, TARGETS["h200"])
        job = repo.create_job(s, task, 16, "random", 0)
        ids = hp.add_candidates(s, job.id, task.id, space.schedules(space.valid_indices[:16]),
                                1, [None] * 16)
        hp.record_results(s, [
            {"task_id": task.id, "job_id": job.id, "schedule": c.schedule,
             "schedule_hash": c.schedule_hash, "status": "ok", "median_us": 1.0 + i,
             "backend": "simulated"}
            for i, c in enumerate(repo.get_candidate(s, cid) for cid in ids)])
    for rev in ("0001", "head", "0003", "head"):
        (migrate.downgrade if rev != "head" else migrate.upgrade)(url, rev)
        with session_scope(url) as s:
            assert s.scalar(select(func.count(Measurement.id))) == 16, rev
