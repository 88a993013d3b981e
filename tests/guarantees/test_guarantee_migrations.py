"""Guarantee: migrations keep every table's rows, on SQLite and on PostgreSQL.

Every table is filled at head with a row whose every column holds a value; then, for each
revision below head, the database goes down to it and back up. Each step must keep every
row of every table that exists on both sides of it, with every column that exists on both
sides unchanged (what a step adds comes back empty, what it removes is gone: those are
its purpose). The fill is repeated before each step, so each starts with every table full.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import JSON, DateTime, Float, Integer, LargeBinary, MetaData, String, Text

from store import migrate
from store.db import get_engine
from store.models import Base

pytestmark = pytest.mark.guarantee

DOWN_TO = ["0009", "0008", "0007", "0006", "0005", "0004", "0003", "0002", "0001"]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'm.db'}"
    else:
        yield request.getfixturevalue("pg_url")


def _value(col: Any, gen: int) -> Any:
    base = gen * 1000 + 1
    if col.foreign_keys or (col.primary_key and isinstance(col.type, Integer)):
        return base  # one row per table and generation: ids line up
    t = col.type
    if isinstance(t, JSON):
        return {"column": col.name, "gen": gen, "list": [1, 2.5, "x"]}
    if isinstance(t, DateTime):
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) + timedelta(minutes=gen)
    if isinstance(t, LargeBinary):
        return bytes([gen % 256, 0, 1, 255]) * 4
    if isinstance(t, Integer):
        return 7 + gen
    if isinstance(t, Float):
        return 1.5 + gen
    if isinstance(t, Text | String):
        text = f"{col.table.name}.{col.name}#{gen}"
        return text[-t.length:] if getattr(t, "length", None) else text
    raise AssertionError(f"no test value for {col.table.name}.{col.name} ({t})")


def fill(url: str, gen: int) -> None:
    """One row in every table of the newest schema, every column set."""
    with get_engine(url).begin() as conn:
        for table in Base.metadata.sorted_tables:
            conn.execute(table.insert().values({c.name: _value(c, gen) for c in table.columns}))


def _norm(v: Any) -> Any:
    if isinstance(v, datetime):
        return (v if v.tzinfo else v.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    if isinstance(v, dict | list):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def dump(url: str) -> dict[str, dict[str, list[Any]]]:
    """table -> column -> its values in primary-key order, of every table there is."""
    meta = MetaData()
    engine = get_engine(url)
    meta.reflect(engine)
    out: dict[str, dict[str, list[Any]]] = {}
    with engine.connect() as conn:
        for name, table in meta.tables.items():
            if name == "alembic_version":
                continue
            rows = conn.execute(table.select().order_by(*table.primary_key.columns)).all()
            out[name] = {c.name: [_norm(r._mapping[c.name]) for r in rows]
                         for c in table.columns}
    return out


def _kept(before: dict[str, dict[str, list[Any]]], after: dict[str, dict[str, list[Any]]],
          step: str) -> None:
    for table in before.keys() & after.keys():
        for col in before[table].keys() & after[table].keys():
            assert after[table][col] == before[table][col], f"{step}: {table}.{col} changed"


def test_every_step_down_and_up_keeps_every_table_s_rows(url: str) -> None:
    migrate.upgrade(url)
    rows: dict[str, int] = {}  # rows each table should hold: a table a step dropped restarts
    for gen, rev in enumerate(DOWN_TO, 1):
        fill(url, gen)
        head = dump(url)
        rows = {t: rows.get(t, 0) + 1 for t in head}
        assert {t: len(next(iter(cols.values()))) for t, cols in head.items()} == rows, \
            "every table filled"
        migrate.downgrade(url, rev)
        down = dump(url)
        rows = {t: n for t, n in rows.items() if t in down}
        _kept(head, down, f"down to {rev}")
        migrate.upgrade(url)
        up = dump(url)
        _kept(down, up, f"up from {rev}")
        assert up.keys() == head.keys()
    assert migrate.current_revision(url) == migrate.head_revision(url)
