"""Inputs a careless or hostile client sends: every one gets a 4xx that names the field,
never a 5xx; POST /import validates its lines as the API validates its bodies."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.app import create_app
from api.inputs import validation_error
from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import TARGETS, ConvShape, Precision
from store import repository as repo
from store.db import session_scope
from store.models import Job
from store.settings import Settings

SHAPE = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3,
         "stride": [1, 1], "pad": [1, 1], "dilation": [1, 1]}
LAYER_JSON = ('{"shape": {"n": %s, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3}, '
              '"precision": "int8", "target": "h200"}')

Api = tuple[TestClient, dict[str, str]]


@pytest.fixture
def make_api(tmp_path: Path) -> Iterator[Callable[[str], Api]]:
    """A client of an app on `db_url` (a migrated database) with an admin token's header."""
    clients: list[TestClient] = []

    def make(db_url: str, **settings: Any) -> Api:
        cfg = Settings(data_dir=tmp_path, database_url=db_url, backend="simulated", **settings)
        with session_scope(cfg.db_url) as s:
            token = repo.create_token(s, "admin", "admin")
        client = TestClient(create_app(cfg, dispatcher=False), raise_server_exceptions=False)
        clients.append(client)
        return client, {"Authorization": f"Bearer {token}"}

    yield make
    for c in clients:
        c.close()


def _locs(resp: Any) -> list[list[Any]]:
    return [e["loc"] for e in resp.json()["detail"]]


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_422_naming_the_field(make_api: Any, db: str, number: str) -> None:
    client, auth = make_api(db)
    headers = {**auth, "content-type": "application/json"}
    tune = client.post("/tune", content=LAYER_JSON % number, headers=headers)
    assert tune.status_code == 422 and _locs(tune) == [["body", "shape", "n"]], tune.text
    lookup = client.post("/schedules/lookup", content='{"layers": [%s]}' % (LAYER_JSON % number),
                         headers=headers)
    assert lookup.status_code == 422, lookup.text
    assert _locs(lookup) == [["body", "layers", 0, "shape", "n"]]


def test_deeply_nested_body_is_422(make_api: Any, db: str) -> None:
    client, auth = make_api(db)
    deep = "[" * 200_000 + "]" * 200_000
    for body in (deep, '{"shape": %s}' % ("[" * 100 + "]" * 100)):
        resp = client.post("/tune", content=body,
                           headers={**auth, "content-type": "application/json"})
        assert resp.status_code == 422 and "deeper" in resp.text, resp.text[:200]


def test_the_validation_error_handler_answers_any_value() -> None:
    import asyncio

    exc = RequestValidationError([{"type": "x", "loc": ["query", "v"], "msg": "bad",
                                   "input": float("nan"), "ctx": {"le": float("inf"),
                                                                  "obj": object()}}])
    resp = asyncio.run(validation_error(None, exc))  # type: ignore[arg-type]
    detail = json.loads(resp.body)["detail"][0]
    assert resp.status_code == 422 and detail["input"] == "nan" and detail["ctx"]["le"] == "inf"


@pytest.mark.parametrize("url", ["/export?target=%00", "/export?precision=a%00b",
                                 "/schedules?target=%00", "/schedules?precision=%00",
                                 "/jobs?status=%00", "/export?x=1&target=a%00"])
def test_nul_bytes_in_the_query_are_422_naming_the_parameter(make_api: Any, db: str,
                                                             url: str) -> None:
    client, _ = make_api(db)
    resp = client.get(url)  # no token: reads are open
    name = url.rsplit("?", 1)[1].split("&")[-1].split("=")[0]
    assert resp.status_code == 422 and _locs(resp) == [["query", name]], resp.text


def test_last_event_id_with_non_ascii_digits_is_422(make_api: Any, db: str) -> None:
    client, _ = make_api(db)
    for value in ("²".encode("latin-1"), "١".encode(), b"12x"):
        resp = client.get("/jobs/1/events", headers=[(b"Last-Event-ID", value)])
        assert resp.status_code == 422 and _locs(resp) == [["header", "last-event-id"]]


@pytest.mark.parametrize("name", ["%00", "a%00.js", "a" * 5000, "x" * 300 + ".js", "..%2f..",
                                  "%2e%2e"], ids=["nul", "nul-js", "5000", "300-js", "up", "dots"])
def test_odd_static_names_are_4xx(make_api: Any, name: str, tmp_path: Path) -> None:
    from store import migrate

    url = f"sqlite:///{tmp_path / 's.db'}"
    migrate.upgrade(url)
    client, _ = make_api(url)
    resp = client.get(f"/ui/static/{name}")
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:100])


def _line(**over: Any) -> dict[str, Any]:
    shape = ConvShape.from_dict(SHAPE)
    schedule = ScheduleSpace(shape, Precision.INT8, TARGETS["h200"]).schedule_at(0)
    line = {"kind": "measurement",
            "task": {"shape": dict(SHAPE), "precision": "int8", "target": "h200"},
            "schedule": schedule, "schedule_hash": schedule_hash(schedule), "status": "ok",
            "median_us": 7.5, "iqr_us": 0.1, "backend": "simulated", "worker": "w1",
            "measured_at": "2026-11-22T01:53:37+00:00"}
    for key, value in over.items():
        if key.startswith("shape_"):
            line["task"]["shape"][key[6:]] = value
        else:
            line[key] = value
    return line


BAD_LINES = {
    "string for an int": json.dumps(_line(shape_n="8")),
    "unknown shape key": json.dumps(_line(shape_q=3)),
    "worker object": json.dumps(_line(worker={"name": "w1"})),
    "year 1 with offset": json.dumps(_line(measured_at="0001-01-01T00:00:00+05:00")),
    "year 9999 with offset": json.dumps(_line(measured_at="9999-12-31T23:00:00-05:00")),
    "NaN latency": json.dumps(_line(median_us=float("nan"))),
    "NUL in worker": json.dumps(_line(worker="a\x00b")),
    "unknown line key": json.dumps(_line(extra=1)),
    "200k-deep": '{"kind": ' + "[" * 200_000 + "]" * 200_000 + "}",
    "40-deep": json.dumps(_line(schedule=json.loads("[" * 40 + "]" * 40))),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_import_refuses_what_the_api_refuses(make_api: Any, db: str, case: str) -> None:
    client, auth = make_api(db)
    body = json.dumps(_line()) + "\n" + BAD_LINES[case] + "\n"
    resp = client.post("/import", content=body.encode(), headers=auth)
    assert resp.status_code == 422, (resp.status_code, resp.text[:300])
    errors = resp.json()["detail"]["errors"]
    assert errors[0].startswith("line 2: "), errors
    with session_scope(db) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0  # nothing imported


def test_reimport_reports_present_lines_and_adds_no_jobs(make_api: Any, db: str) -> None:
    client, auth = make_api(db)
    other = _line()
    other["schedule"] = ScheduleSpace(ConvShape.from_dict(SHAPE), Precision.INT8,
                                      TARGETS["h200"]).schedule_at(1)
    other["schedule_hash"] = schedule_hash(other["schedule"])
    body = "\n".join(json.dumps(x) for x in (_line(), {**_line(), "kind": "best"}, other))
    first = client.post("/import", content=body.encode(), headers=auth)
    assert first.json() == {"lines": 3, "imported": 2, "already_present": 0, "tasks": 1}
    again = client.post("/import", content=body.encode(), headers=auth)
    assert again.json() == {"lines": 3, "imported": 0, "already_present": 2, "tasks": 1}
    with session_scope(db) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
        # Rows that came from a tuning job of this deployment (its own export re-imported):
        # still present, and no empty "import" job appears for them.
        s.scalars(select(Job)).one().strategy = "random"
    own = client.post("/import", content=body.encode(), headers=auth)
    assert own.json() == {"lines": 3, "imported": 0, "already_present": 2, "tasks": 1}
    with session_scope(db) as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
