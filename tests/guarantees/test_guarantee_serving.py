"""Guarantee: a wrong, failed or timed-out result is never served, by GET /schedule,
POST /schedules/lookup (its best or its runners-up), GET /schedules or export's `best`
lines.

Non-ok rows with a latency faster than every verified one reach the database both ways
they can: an import (the format allows a latency on any status) and a worker's write (a
backend that reports a latency with a failed status). Every place that picks a task's best
schedule is exercised: the repository's recompute (import), the SQLite write path (a
recompute over the task), and PostgreSQL's write path (the rows just written).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api.app import create_app
from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import hotpath as hp
from store import repository as repo
from store import transfer
from store.db import session_scope
from store.models import BestSchedule, Measurement
from store.settings import Settings
from workers import tasks
from workers.backends.base import BuildOutcome, MeasureOutcome

pytestmark = pytest.mark.guarantee

SHAPE = RESNET50_3X3["stage3"]
H200 = TARGETS["h200"]
SPACE = ScheduleSpace(SHAPE, Precision.INT8, H200)
SCHEDULES = SPACE.schedules(SPACE.valid_indices[:8])
QUERY = dict(n=SHAPE.n, h=SHAPE.h, w=SHAPE.w, c=SHAPE.c, k=SHAPE.k, r=SHAPE.r, s=SHAPE.s,
             pad=1, precision="int8", target="h200")
FAILED = ("wrong", "runtime_error", "timeout", "compile_error")


def _line(schedule: dict[str, Any], status: str, us: float | None) -> str:
    return json.dumps({"kind": "measurement", "task": {
        "shape": SHAPE.to_dict(), "precision": "int8", "target": "h200"},
        "schedule": schedule, "status": status, "median_us": us, "iqr_us": None,
        "backend": "cuda"})


@pytest.fixture
def client(db: str, tmp_path: Path) -> Iterator[TestClient]:
    cfg = Settings(data_dir=tmp_path, database_url=db, backend="simulated",
                   schedule_cache_s=0)
    with TestClient(create_app(cfg, dispatcher=False)) as c:
        yield c


def _served(client: TestClient, db: str) -> list[tuple[str, float | None]]:
    """(where, latency) of the task's best as every read path serves it."""
    out: list[tuple[str, float | None]] = []
    one = client.get("/schedule", params=QUERY)
    assert one.status_code == 200, one.text
    out.append(("GET /schedule", one.json()["latency_us"]))
    bulk = client.post("/schedules/lookup", json={"layers": [{
        "shape": {**SHAPE.to_dict()}, "precision": "int8", "target": "h200"}]})
    assert bulk.status_code == 200, bulk.text
    out.append(("lookup", bulk.json()["results"][0]["latency_us"]))
    listed = client.get("/schedules", params={"format": "jsonl"}).text.splitlines()
    out += [("GET /schedules", json.loads(x)["latency_us"]) for x in listed]
    with session_scope(db) as s:
        lines = [json.loads(x) for x in transfer.export_lines(s)]
    bests = [x for x in lines if x["kind"] == "best"]
    assert len(bests) == 1
    assert bests[0]["status"] == "ok", "export's best line is a verified measurement"
    out.append(("export best", bests[0]["median_us"]))
    return out


def _assert_serves(client: TestClient, db: str, us: float) -> None:
    for where, got in _served(client, db):
        assert got == us, f"{where} serves {got}, the fastest verified is {us}"
    with session_scope(db) as s:
        verified = sorted(m.median_us for m in s.scalars(select(Measurement).where(
            Measurement.status == "ok")))
    bulk = client.post("/schedules/lookup", json={"layers": [{
        "shape": SHAPE.to_dict(), "precision": "int8", "target": "h200"}], "runners_up": 16})
    assert bulk.status_code == 200, bulk.text
    runners_up = [r["latency_us"] for r in bulk.json()["results"][0]["runners_up"]]
    assert runners_up == verified[1:17], "the runners-up are the next verified rows, in order"


def test_imported_failures_with_a_latency_are_never_served(client: TestClient, db: str) -> None:
    lines = [_line(SCHEDULES[0], "ok", 50.0)]
    lines += [_line(sched, st, 1.0 + i) for i, (sched, st) in
              enumerate(zip(SCHEDULES[1:], FAILED, strict=False))]
    with session_scope(db) as s:
        report = transfer.import_lines(s, lines)
    assert not report.errors and report.imported == 5
    _assert_serves(client, db, 50.0)


def test_written_failures_with_a_latency_are_never_served(client: TestClient, db: str) -> None:
    """A backend reporting a latency with a failed status: its rows are stored, never
    best, on either database's write path, also where an imported failure is faster."""
    with session_scope(db) as s:
        transfer.import_lines(s, [_line(SCHEDULES[0], "ok", 50.0),
                                  _line(SCHEDULES[1], "timeout", 0.5)])
        job_id = repo.create_job(s, repo.get_or_create_task(s, SHAPE, Precision.INT8, H200),
                                 8, "random", 0).id
    ids = tasks.explore_round(db, job_id, 8).ids
    with session_scope(db) as s:
        rows, _ = hp.lease_chunk(s, ids, "w", 60)
        spec = tasks.task_spec(repo.get_or_create_task(s, SHAPE, Precision.INT8, H200))
    leased = [tasks._Leased(r.id, r.task_id, spec, r.schedule, r.schedule_hash, r.job_id,
                            None, BuildOutcome("ok")) for r in rows]
    outcomes = [MeasureOutcome("wrong", 0.1), MeasureOutcome("runtime_error", 0.2),
                MeasureOutcome("ok", 40.0)] + [MeasureOutcome("ok", 60.0 + i)
                                               for i in range(len(leased) - 3)]
    tasks.write_groups(db, [tasks.WriteGroup(list(zip(leased, outcomes, strict=False)),
                                             "cuda", "w", {})])
    _assert_serves(client, db, 40.0)


def test_best_refresh_ignores_a_failed_row_it_is_pointed_at(db: str) -> None:
    """refresh_best_after_write is handed the verified rows; handed a failed one anyway
    (a caller's mistake), that row still never becomes the task's best."""
    with session_scope(db) as s:
        transfer.import_lines(s, [_line(SCHEDULES[0], "ok", 50.0),
                                  _line(SCHEDULES[1], "wrong", 0.5)])
        task_id = repo.get_or_create_task(s, SHAPE, Precision.INT8, H200).id
    with session_scope(db) as s:
        hp.refresh_best_after_write(s, [(task_id, schedule_hash(SCHEDULES[1]), 0.5)])
    with session_scope(db) as s:
        best = s.get(BestSchedule, task_id)
        assert best is not None
        m = s.scalars(select(Measurement).where(Measurement.id == best.measurement_id)).one()
        assert m.status == "ok" and m.median_us == 50.0
