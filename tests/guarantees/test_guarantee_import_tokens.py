"""Guarantees of POST /import and of tokens, through the API against SQLite and PostgreSQL:

- import is all-or-nothing (a file with one bad line, even the last, writes nothing) and
  idempotent (the same file again adds nothing and changes no best schedule);
- a revoked token is refused, also one the API has seen before, once its cached lookup is
  TOKEN_CACHE_S old (the README's limits and scopes: tests/api/test_auth_limits.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api import auth
from api.app import create_app
from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import repository as repo
from store import transfer
from store.db import session_scope
from store.models import BestSchedule, Job, Measurement, Task
from store.settings import Settings

pytestmark = pytest.mark.guarantee

SHAPE = RESNET50_3X3["stage3"]
SPACE = ScheduleSpace(SHAPE, Precision.INT8, TARGETS["h200"])
SCHEDULES = SPACE.schedules(SPACE.valid_indices[:6])


def _line(i: int, **over: object) -> str:
    return json.dumps({"kind": "measurement", "task": {
        "shape": SHAPE.to_dict(), "precision": "int8", "target": "h200"},
        "schedule": SCHEDULES[i], "status": "ok", "median_us": 10.0 + i, "iqr_us": 0.1,
        "backend": "cuda", "worker": "n/gpu0", "measured_at": "2026-11-22T01:53:37+00:00",
        **over})


@pytest.fixture
def api(db: str, tmp_path: Path) -> Iterator[tuple[TestClient, str, str]]:
    cfg = Settings(data_dir=tmp_path, database_url=db, backend="simulated")
    with session_scope(db) as s:
        admin = repo.create_token(s, "admin", "admin")
    with TestClient(create_app(cfg, dispatcher=False)) as client:
        yield client, admin, db


def _counts(db: str) -> tuple[int, int, int, int]:
    with session_scope(db) as s:
        return tuple(int(s.scalar(select(func.count()).select_from(t)) or 0)  # type: ignore[return-value]
                     for t in (Task, Job, Measurement, BestSchedule))


def _import(client: TestClient, token: str, lines: list[str]) -> tuple[int, dict]:
    resp = client.post("/import", content="\n".join(lines) + "\n",
                       headers={"Authorization": f"Bearer {token}",
                                "content-type": "application/x-ndjson"})
    return resp.status_code, resp.json()


@pytest.mark.parametrize("bad", [
    _line(5, status="fast"),
    _line(5, median_us=None),
    _line(5, schedule={**SCHEDULES[5], "CHUNK": 3}),
    "{not json",
], ids=["unknown status", "ok without a time", "knob outside the space", "not JSON"])
def test_an_import_with_one_bad_line_writes_nothing(
        api: tuple[TestClient, str, str], bad: str) -> None:
    client, admin, db = api
    code, body = _import(client, admin, [_line(i) for i in range(5)] + [bad])
    assert code == 422, body
    assert "line 6" in json.dumps(body)
    assert _counts(db) == (0, 0, 0, 0), "nothing of a refused file is written"


def test_an_import_is_idempotent(api: tuple[TestClient, str, str]) -> None:
    client, admin, db = api
    lines = [_line(i) for i in range(6)] + [_line(0, kind="best")]
    code, first = _import(client, admin, lines)
    assert code == 200 and first["imported"] == 6 and first["already_present"] == 0, first
    counts = _counts(db)
    with session_scope(db) as s:
        exported = list(transfer.export_lines(s))
    code, again = _import(client, admin, lines)
    assert code == 200 and again["imported"] == 0 and again["already_present"] == 6, again
    assert _counts(db) == counts
    with session_scope(db) as s:
        assert list(transfer.export_lines(s)) == exported, "the same file changes nothing"


def test_a_revoked_token_is_refused_once_its_lookup_is_stale(
        api: tuple[TestClient, str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    client, _, db = api
    with session_scope(db) as s:
        token = repo.create_token(s, "soon gone", "admin")
        token_id = repo.find_token(s, token).id  # type: ignore[union-attr]
    assert _import(client, token, [_line(0)])[0] == 200  # seen: its lookup is cached
    with session_scope(db) as s:
        assert repo.revoke_token(s, token_id)
    clock = auth.time.monotonic() + auth.TOKEN_CACHE_S + 0.1
    monkeypatch.setattr(auth.time, "monotonic", lambda: clock)
    code, _ = _import(client, token, [_line(1)])
    assert code == 401, "a revoked token is refused within TOKEN_CACHE_S"
    with session_scope(db) as s:
        assert repo.find_token(s, token) is None
