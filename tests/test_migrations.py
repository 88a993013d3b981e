"""Migrations take an empty database to head and back, on SQLite and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect

from store import migrate
from store.db import get_engine
from store.models import Base

TABLES = {"task", "job", "candidate", "measurement", "best_schedule", "worker", "api_token"}


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
    migrate.downgrade(url, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    assert migrate.current_revision(url) is None


def test_sqlite_upgrade_and_downgrade(tmp_path: Path) -> None:
    _roundtrip(f"sqlite:///{tmp_path / 'm.db'}")


def test_postgresql_upgrade_and_downgrade(pg_url: str) -> None:
    _roundtrip(pg_url)
