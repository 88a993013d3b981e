"""One rule for every endpoint's query: targets and precisions are case-insensitive, an
unknown one is a 422 naming the parameter, and a parameter an endpoint does not take is a
422 too (never silently ignored)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.settings import Settings

LAYER = "n=8&h=56&w=56&c=64&k=64&r=3&s=3&pad=1"
READS = {"/schedule": f"/schedule?{LAYER}&target={{t}}&precision={{p}}",
         "/schedules": "/schedules?target={t}&precision={p}",
         "/schedules jsonl": "/schedules?format=jsonl&target={t}&precision={p}",
         "/export": "/export?target={t}&precision={p}"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    cfg = Settings(data_dir=tmp_path, backend="simulated")
    migrate.upgrade(cfg.db_url)
    with session_scope(cfg.db_url) as s:
        token = repo.create_token(s, "t", "tune")
    with TestClient(create_app(cfg, dispatcher=False)) as c:
        yield c, token


@pytest.mark.parametrize("endpoint", sorted(READS))
@pytest.mark.parametrize("target,precision,bad", [
    ("h999", "int8", "target"), ("h200", "int9", "precision"), ("", "int8", "target")])
def test_an_unknown_target_or_precision_is_422_everywhere(
        client: tuple[TestClient, str], endpoint: str, target: str, precision: str,
        bad: str) -> None:
    c, _ = client
    resp = c.get(READS[endpoint].format(t=target, p=precision))
    assert resp.status_code == 422, resp.text
    assert [e["loc"] for e in resp.json()["detail"]] == [["query", bad]]


@pytest.mark.parametrize("endpoint", sorted(READS))
def test_names_are_case_insensitive_everywhere(client: tuple[TestClient, str],
                                               endpoint: str) -> None:
    c, token = client
    tuned = c.post("/tune", headers={"Authorization": f"Bearer {token}"}, json={
        "shape": {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": 1},
        "precision": "INT8", "target": "H200", "trials": 4})
    assert tuned.status_code == 202 and tuned.json()["task_key"].endswith("|int8|h200")
    resp = c.get(READS[endpoint].format(t="H200", p="Int8"))
    assert resp.status_code in (200, 404), resp.text  # 404: /schedule, nothing measured yet


def test_jobs_filter_by_status_under_its_field_name(client: tuple[TestClient, str]) -> None:
    c, token = client
    c.post("/tune", headers={"Authorization": f"Bearer {token}"}, json={
        "shape": {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3},
        "precision": "int8", "target": "h200", "trials": 4})
    assert len(c.get("/jobs?status=queued").json()) == 1
    assert c.get("/jobs?status=running").json() == []
    assert c.get("/jobs?status=RUNNING").json() == []
    assert len(c.get("/jobs?state=queued").json()) == 1  # the old name still works
    assert c.get("/jobs?status=queued&state=done").status_code == 422
    bad = c.get("/jobs?status=sleeping")
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "status"]


@pytest.mark.parametrize("url", ["/jobs?stat=running", "/schedules?targte=h200",
                                 f"/schedule?{LAYER}&target=h200&precision=int8&x=1",
                                 "/export?format=jsonl", "/workers?limit=3",
                                 "/jobs/1?afterr=3"])
def test_a_parameter_the_endpoint_does_not_take_is_422(client: tuple[TestClient, str],
                                                       url: str) -> None:
    c, _ = client
    resp = c.get(url)
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"][0] == "query"


def test_token_in_the_query_is_never_an_unknown_parameter(client: tuple[TestClient, str]
                                                          ) -> None:
    c, token = client
    assert c.get(f"/jobs?token={token}").status_code == 200
    assert c.get(f"/schedule?{LAYER}&target=h200&precision=int8&token={token}"
                 ).status_code == 404
