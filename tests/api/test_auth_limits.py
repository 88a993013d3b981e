"""Tokens and scopes on mutating endpoints, cancel, and the limits of the API."""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import Job, Measurement, Task
from store.settings import Settings
from tests.conftest import Service

# Scopes, revocation and the per-token limits are guarantees of the README.
pytestmark = pytest.mark.guarantee

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}


def body(**over: Any) -> dict[str, Any]:
    return {"shape": {**STAGE2, **over.pop("shape", {})}, "precision": "int8",
            "target": "h200", "trials": 16, **over}


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[..., tuple[TestClient, dict[str, str]]]]:
    clients: list[TestClient] = []

    def make(**settings: Any) -> tuple[TestClient, dict[str, str]]:
        cfg = Settings(data_dir=tmp_path, backend="simulated", **settings)
        migrate.upgrade(cfg.db_url)
        with session_scope(cfg.db_url) as s:
            tokens = {scope: repo.create_token(s, scope, scope)
                      for scope in ("read", "tune", "admin")}
            tokens["tune2"] = repo.create_token(s, "other", "tune")
        client = TestClient(create_app(cfg, dispatcher=False))
        clients.append(client)
        return client, tokens

    yield make
    for c in clients:
        c.close()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_mutating_endpoints_need_a_token_of_the_right_scope(make_api: Any) -> None:
    client, tok = make_api()
    no = client.post("/tune", json=body())
    assert no.status_code == 401 and no.headers["www-authenticate"] == "Bearer"
    assert client.post("/tune", json=body(), headers=auth("tct_wrong")).status_code == 401
    read = client.post("/tune", json=body(), headers=auth(tok["read"]))
    assert read.status_code == 403 and "'tune'" in read.json()["detail"]
    assert client.post("/tune", json=body(), headers=auth(tok["tune"])).status_code == 202
    assert client.post("/tune", json=body(precision="fp16"),
                       headers=auth(tok["admin"])).status_code == 202
    # Reads are open by default.
    assert client.get("/jobs").status_code == 200
    assert client.get("/jobs/1").status_code == 200


def test_reads_need_a_read_token_when_configured(make_api: Any) -> None:
    client, tok = make_api(read_auth=True)
    assert client.get("/jobs").status_code == 401
    assert client.get("/workers").status_code == 401
    assert client.get("/jobs", headers=auth(tok["read"])).status_code == 200
    assert client.get("/schedules", headers=auth(tok["tune"])).status_code == 200


def test_open_service_needs_no_token(make_api: Any) -> None:
    client, _ = make_api(auth="off")
    assert client.post("/tune", json=body()).status_code == 202


def test_cancel_by_submitter_or_admin_only(make_api: Any) -> None:
    client, tok = make_api()
    job = client.post("/tune", json=body(), headers=auth(tok["tune"])).json()["job_id"]
    assert client.post(f"/jobs/{job}/cancel").status_code == 401
    other = client.post(f"/jobs/{job}/cancel", headers=auth(tok["tune2"]))
    assert other.status_code == 403
    mine = client.post(f"/jobs/{job}/cancel", headers=auth(tok["tune"]))
    assert mine.status_code == 200 and mine.json()["status"] == "cancelled"
    assert client.post(f"/jobs/{job}/cancel", headers=auth(tok["admin"])).status_code == 409
    assert client.post("/jobs/999/cancel", headers=auth(tok["admin"])).status_code == 404
    job2 = client.post("/tune", json=body(), headers=auth(tok["tune2"])).json()["job_id"]
    assert job2 != job, "a cancelled job does not hold its task"
    assert client.post(f"/jobs/{job2}/cancel", headers=auth(tok["admin"])).status_code == 200


def test_revoked_token_is_refused(make_api: Any, tmp_path: Path) -> None:
    client, _ = make_api()
    cfg = Settings(data_dir=tmp_path)
    with session_scope(cfg.db_url) as s:
        token = repo.create_token(s, "gone", "tune")
        token_id = repo.find_token(s, token).id  # type: ignore[union-attr]
        repo.revoke_token(s, token_id)
    assert client.post("/tune", json=body(), headers=auth(token)).status_code == 401


def test_rate_limit_on_tune_is_per_token(make_api: Any) -> None:
    client, tok = make_api(tune_per_minute=3)
    codes = [client.post("/tune", json=body(shape={"k": 8 * (i + 1)}),
                         headers=auth(tok["tune"])).status_code for i in range(5)]
    assert codes == [202, 202, 202, 429, 429]
    limited = client.post("/tune", json=body(), headers=auth(tok["tune"]))
    assert int(limited.headers["retry-after"]) >= 1
    assert client.post("/tune", json=body(shape={"k": 96}),
                       headers=auth(tok["tune2"])).status_code == 202


def test_active_jobs_per_token_are_bounded(make_api: Any, tmp_path: Path) -> None:
    client, tok = make_api(active_jobs_per_token=2)
    codes = [client.post("/tune", json=body(shape={"k": 8 * (i + 1)}),
                         headers=auth(tok["tune"])).status_code for i in range(3)]
    assert codes == [202, 202, 429]
    with session_scope(Settings(data_dir=tmp_path).db_url) as s:
        assert s.scalar(select(func.count(Job.id))) == 2


def test_request_body_is_bounded(make_api: Any) -> None:
    client, tok = make_api(max_body_bytes=2048)
    big = body(shape={"n": 8}, padding="x" * 5000)
    resp = client.post("/tune", json=big, headers=auth(tok["tune"]))
    assert resp.status_code == 413 and "larger than 2048" in resp.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: streamed
        yield b'{"shape": {"n": 8, "padding": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}}'

    streamed = client.post("/tune", content=chunks(), headers={
        **auth(tok["tune"]), "content-type": "application/json"})
    assert streamed.status_code == 413


def test_delete_task_needs_admin(make_api: Any, tmp_path: Path) -> None:
    client, tok = make_api()
    resp = client.post("/tune", json=body(), headers=auth(tok["tune"])).json()
    task, job = resp["task_id"], resp["job_id"]
    assert client.delete(f"/tasks/{task}", headers=auth(tok["tune"])).status_code == 403
    assert client.delete(f"/tasks/{task}", headers=auth(tok["admin"])).status_code == 409
    client.post(f"/jobs/{job}/cancel", headers=auth(tok["admin"]))
    assert client.delete(f"/tasks/{task}", headers=auth(tok["admin"])).status_code == 204
    assert client.delete(f"/tasks/{task}", headers=auth(tok["admin"])).status_code == 404
    with session_scope(Settings(data_dir=tmp_path).db_url) as s:
        assert s.scalar(select(func.count(Task.id))) == 0
        assert s.scalar(select(func.count(Job.id))) == 0
        assert s.scalar(select(func.count(Measurement.id))) == 0


def test_embedded_default_prints_a_token_at_first_start(
        make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    path = svc.data_dir / "token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert token in svc.log_path.read_text()  # type: ignore[union-attr]
    resp = httpx.post(f"{svc.url}/tune", json=body(), headers=auth(token))
    assert resp.status_code == 202
    svc.stop()
    svc.start()  # a second start creates no new token
    assert path.read_text().strip() == token
