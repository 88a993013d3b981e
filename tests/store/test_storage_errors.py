"""The storage's failures mapped in one place (store/errors.py), against a real PostgreSQL
that goes away under a running API and the embedded dispatcher's explore step, and comes
back: 503 with Retry-After and the driver's reason (no SQL) while it is gone, the same
answers as before once it is back, and no job failed for it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from api.app import create_app
from kernels.spec import ConvShape
from store import migrate
from store import repository as repo
from store.db import get_engine, session_scope
from store.settings import Settings
from tests.conftest import PG_ADMIN_URL

SHAPE = ConvShape(8, 14, 14, 256, 256, 3, 3, pad=(1, 1))


class Outage:
    """Takes the test's database away (its connections ended, the database renamed) and
    brings it back under its name."""

    def __init__(self, url: str) -> None:
        self.name = url.rsplit("/", 1)[1]
        self.admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")

    def _rename(self, old: str, new: str) -> None:
        # A running service reconnects at once: end its sessions and rename in a retry loop
        # until no session came back in between.
        for attempt in range(50):
            with self.admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE datname = :d AND pid <> pg_backend_pid()"), {"d": old})
                try:
                    conn.execute(text(f'ALTER DATABASE "{old}" RENAME TO "{new}"'))
                    return
                except OperationalError:
                    if attempt == 49:
                        raise
            time.sleep(0.05)

    def __enter__(self) -> Outage:
        self._rename(self.name, self.name + "_away")
        return self

    def __exit__(self, *_: object) -> None:
        self._rename(self.name + "_away", self.name)
        self.admin.dispose()


@pytest.fixture
def pg_api(pg_url: str, tmp_path) -> Iterator[tuple[TestClient, str]]:
    settings = Settings(data_dir=tmp_path, database_url=pg_url, backend="simulated",
                        auth="off")
    migrate.upgrade(pg_url)
    with TestClient(create_app(settings, dispatcher=False)) as client:
        yield client, pg_url


def test_the_api_answers_503_while_the_database_is_away_and_recovers(pg_api) -> None:
    client, url = pg_api
    assert client.get("/healthz").status_code == 200
    assert client.get("/jobs/12345").status_code == 404
    with Outage(url):
        for path in ("/healthz", "/jobs/12345", "/jobs"):
            r = client.get(path)
            assert r.status_code == 503, (path, r.text)
            assert r.headers["Retry-After"] == "5"
            detail = r.json()["detail"]
            assert detail.startswith("the database is unavailable, try again: ")
            assert "SELECT" not in detail and "[SQL" not in detail
        r = client.post("/tune", json={"shape": SHAPE.to_dict(), "precision": "int8",
                                       "target": "t4", "trials": 8})
        assert r.status_code == 503, r.text
    assert client.get("/healthz").status_code == 200
    assert client.get("/jobs/12345").status_code == 404
    with session_scope(url) as s:
        assert repo.active_jobs(s) == []  # the refused submission left nothing behind


def test_a_job_outlives_a_database_outage_mid_run(make_service, pg_url: str) -> None:
    """The embedded service on PostgreSQL with slow simulated measurements; the database goes
    away mid-job for a few seconds. Whatever step that hits (listing jobs, a proposal, a
    build, a measurement's write), the job is not failed, and it ends with its budget
    measured exactly once."""
    import httpx
    from sqlalchemy import select

    from store.models import Job, Measurement

    migrate.upgrade(pg_url)
    svc = make_service(TCTUNE_DATABASE_URL=pg_url, TCTUNE_SIM_DELAY_S="0.05",
                       TCTUNE_BATCH_SIZE="8").start()
    job_id = httpx.post(f"{svc.url}/tune", json={"shape": SHAPE.to_dict(), "precision": "int8",
                                                 "target": "t4", "trials": 48},
                        headers=svc.headers).json()["job_id"]

    def state() -> dict:
        r = httpx.get(f"{svc.url}/jobs/{job_id}", headers=svc.headers, timeout=30)
        return r.json() if r.status_code == 200 else {"status": f"http {r.status_code}"}

    deadline = time.monotonic() + 60
    while state().get("trials_done", 0) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    with Outage(pg_url):
        time.sleep(3)
        assert state()["status"] == "http 503"
    deadline = time.monotonic() + 120
    while (st := state())["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline, st
        time.sleep(0.3)
    assert st["status"] == "done", st
    get_engine(pg_url).dispose()
    with session_scope(pg_url) as s:
        hashes = list(s.scalars(select(Measurement.schedule_hash)
                                .where(Measurement.job_id == job_id)))
        assert s.get(Job, job_id).error is None
    assert len(hashes) == 48 and len(set(hashes)) == 48
