"""Revocation and limits hold for the service as a whole: every API process reads the same
token and rate-limit rows, so neither a per-process cache nor a second process (`tctune
serve --workers 2`) stretches them; dead workers give their leases back."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api import auth as auth_module
from api.app import create_app
from kernels.space import ScheduleSpace
from kernels.spec import TARGETS, ConvShape, Precision
from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from store.models import Candidate, Worker, utcnow
from store.settings import Settings

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}


def body(k: int = 64) -> dict[str, Any]:
    return {"shape": {**STAGE2, "k": k}, "precision": "int8", "target": "h200", "trials": 8}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def apps(tmp_path: Path, db: str) -> Iterator[Callable[..., list[TestClient]]]:
    """`n` API apps (as `tctune serve --workers n` runs them) on one migrated database."""
    made: list[TestClient] = []

    def make(n: int = 2, **settings: Any) -> list[TestClient]:
        cfg = Settings(data_dir=tmp_path, database_url=db, backend="simulated", **settings)
        clients = [TestClient(create_app(cfg, dispatcher=False)) for _ in range(n)]
        made.extend(clients)
        return clients

    yield make
    for c in made:
        c.close()


def _token(db: str, scope: str = "tune") -> tuple[str, int]:
    with session_scope(db) as s:
        token = repo.create_token(s, scope, scope)
        found = repo.find_token(s, token)
        assert found is not None
        return token, found.id


def _revoke(db: str, token_id: int) -> None:
    with session_scope(db) as s:
        assert repo.revoke_token(s, token_id)


@pytest.mark.guarantee
def test_a_revoked_token_mutates_nothing_at_once(apps: Any, db: str) -> None:
    a, b = apps(2)
    token, token_id = _token(db)
    assert a.post("/tune", json=body(8), headers=bearer(token)).status_code == 202
    assert b.post("/tune", json=body(16), headers=bearer(token)).status_code == 202
    _revoke(db, token_id)
    for client in (a, b):
        refused = client.post("/tune", json=body(24), headers=bearer(token))
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


@pytest.mark.guarantee
def test_a_revoked_token_reads_for_at_most_the_documented_second(apps: Any, db: str) -> None:
    assert auth_module.TOKEN_CACHE_S <= 1.0
    a, b = apps(2, read_auth=True)
    token, token_id = _token(db, "read")
    assert a.get("/jobs", headers=bearer(token)).status_code == 200
    assert b.get("/jobs", headers=bearer(token)).status_code == 200
    _revoke(db, token_id)
    time.sleep(auth_module.TOKEN_CACHE_S + 0.05)
    assert a.get("/jobs", headers=bearer(token)).status_code == 401
    assert b.get("/jobs", headers=bearer(token)).status_code == 401


def test_mutations_take_the_token_from_the_header_only(apps: Any, db: str) -> None:
    (client,) = apps(1, read_auth=True)
    token, _ = _token(db)
    in_query = client.post(f"/tune?token={token}", json=body())
    assert in_query.status_code == 401 and "Authorization header" in in_query.json()["detail"]
    assert client.post("/jobs/1/cancel", params={"token": token}).status_code == 401
    assert client.post("/tune", json=body(), headers=bearer(token)).status_code == 202
    # Reads still accept ?token= (a link to a protected read).
    assert client.get("/jobs", params={"token": token}).status_code == 200


def test_the_tune_rate_holds_across_api_processes(apps: Any, db: str) -> None:
    a, b = apps(2, tune_per_minute=4)
    token, _ = _token(db)
    codes = [(a if i % 2 else b).post("/tune", json=body(8 * (i + 1)), headers=bearer(token))
             for i in range(8)]
    assert [r.status_code for r in codes] == [202] * 4 + [429] * 4
    assert all(int(r.headers["retry-after"]) >= 1 for r in codes[4:])
    other, _ = _token(db)  # another token has its own budget
    assert a.post("/tune", json=body(128), headers=bearer(other)).status_code == 202


def test_the_tune_rate_holds_under_concurrent_requests(apps: Any, db: str) -> None:
    clients = apps(2, tune_per_minute=5)
    token, _ = _token(db)

    def post(i: int) -> int:
        return clients[i % 2].post("/tune", json=body(8 * (i + 1)),
                                   headers=bearer(token)).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(post, range(16)))
    assert sorted(codes) == [202] * 5 + [429] * 11


def test_the_active_jobs_429_says_when_to_retry(apps: Any, db: str) -> None:
    (client,) = apps(1, active_jobs_per_token=1)
    token, _ = _token(db)
    assert client.post("/tune", json=body(8), headers=bearer(token)).status_code == 202
    full = client.post("/tune", json=body(16), headers=bearer(token))
    assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1


def test_metrics_need_a_read_token_when_reads_do(apps: Any, db: str) -> None:
    (closed,) = apps(1, read_auth=True)
    assert closed.get("/metrics").status_code == 401
    token, _ = _token(db, "read")
    assert closed.get("/metrics", headers=bearer(token)).status_code == 200
    (open_,) = apps(1)
    assert open_.get("/metrics").status_code == 200


def test_a_dead_workers_leases_are_released_by_the_sweeper(db: str) -> None:
    from tests.guarantees.test_guarantee_delivery import Recorded
    from workers.protocol import Dispatch, Sweeper
    from workers.queues import QueueWatch

    cfg = Settings(database_url=db, backend="simulated", heartbeat_s=5)
    shape = ConvShape.from_dict(STAGE2)
    space = ScheduleSpace(shape, Precision.INT8, TARGETS["h200"])
    now = utcnow()
    with session_scope(db) as s:
        task = repo.get_or_create_task(s, shape, Precision.INT8, TARGETS["h200"])
        job = repo.create_job(s, task, 8, "random", 0)
        repo.set_job_status(s, job, "running")
        hp.add_candidates(s, job.id, job.task_id, [space.schedule_at(i) for i in range(3)], 1,
                          [None] * 3)
        for name, beat in (("dead", now - timedelta(seconds=30)), ("alive", now)):
            repo.heartbeat(s, name, "H200", 90, "h200", "simulated")
            s.execute(Worker.__table__.update().where(Worker.name == name)
                      .values(last_heartbeat=beat))
        cands = s.scalars(select(Candidate).order_by(Candidate.id)).all()
        for cand, owner in zip(cands, ("dead", "alive", "dead"), strict=True):
            cand.state = "built"
            cand.lease_owner = owner
            cand.lease_expires_at = now + timedelta(seconds=100)
            cand.dispatched_at = now
    sent = Recorded()
    dispatch = Dispatch.fleet(cfg, sent)
    watch = QueueWatch(cfg, lambda names: {}, dispatch.measure_unbuilt)
    watch.explores_due([job.id])  # its explore was just sent
    assert Sweeper(dispatch, watch, free_dead_leases=True).sweep().freed == 2
    with session_scope(db) as s:
        owners = [c.lease_owner for c in s.scalars(select(Candidate).order_by(Candidate.id))]
    assert owners == [None, "alive", None]  # 30 s without a beat: dead; the live one keeps
    assert sorted(sent.sent) == [cands[0].id, cands[2].id]


def test_a_restarted_worker_shows_its_new_start_time(db: str) -> None:
    with session_scope(db) as s:
        repo.heartbeat(s, "node/gpu0", "H200", 90, "h200", "cuda", started=True)
        s.execute(Worker.__table__.update().values(started_at=utcnow() - timedelta(hours=3)))
    with session_scope(db) as s:
        repo.heartbeat(s, "node/gpu0", "H200", 90, "h200", "cuda")  # a later beat
        first = repo.as_utc(s.scalars(select(Worker)).one().started_at)
        assert first is not None and utcnow() - first > timedelta(hours=2)
    with session_scope(db) as s:
        repo.heartbeat(s, "node/gpu0", "H200", 90, "h200", "cuda", started=True)  # restart
        again = repo.as_utc(s.scalars(select(Worker)).one().started_at)
        assert again is not None and utcnow() - again < timedelta(minutes=1)
