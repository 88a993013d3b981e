"""GET /jobs/{id}/events: a real `tctune serve` tunes a job while a client follows its event
stream; every measurement arrives once, in order, then `end`; a reconnect with
Last-Event-ID resumes exactly after the last event seen."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tests.conftest import Service

STAGE3 = {"n": 8, "h": 28, "w": 28, "c": 128, "k": 128, "r": 3, "s": 3, "pad": [1, 1]}
TRIALS = 48


def events(resp: httpx.Response) -> Iterator[tuple[str, int | None, dict[str, Any]]]:
    """(event, id, data) of each SSE message; comment lines are skipped."""
    name, ident, data = "message", None, []
    for line in resp.iter_lines():
        if line == "":
            if data:
                yield name, ident, json.loads("\n".join(data))
            name, ident, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(": ")
            if field == "event":
                name = value
            elif field == "id":
                ident = int(value)
            elif field == "data":
                data.append(value)


def follow(url: str, job_id: int, headers: dict[str, str] | None = None
           ) -> list[tuple[str, int | None, dict[str, Any]]]:
    with httpx.stream("GET", f"{url}/jobs/{job_id}/events", params={"interval": 0.1},
                      headers=headers or {}, timeout=120) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return list(events(resp))


def test_a_stream_follows_a_job_to_its_end(make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    resp = httpx.post(f"{svc.url}/tune", json={"shape": STAGE3, "precision": "fp16",
                                               "target": "h200", "trials": TRIALS},
                      headers=svc.headers)
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["job_id"]

    got = follow(svc.url, job_id)  # opened while the job runs; returns when it has ended
    kinds = [e[0] for e in got]
    assert kinds[-1] == "end" and kinds.count("end") == 1
    assert got[-1][2]["status"] == "done" and got[-1][2]["trials_done"] == TRIALS
    meas = [(ident, data) for kind, ident, data in got if kind == "measurement"]
    assert [d["trial"] for _, d in meas] == list(range(1, TRIALS + 1))
    ids = [ident for ident, _ in meas]
    assert ids == sorted(ids) and len(set(ids)) == TRIALS
    assert all(ident == d["id"] for ident, d in meas)
    # Progress is reported as it changes, and the last report is the finished job's.
    progress = [d for kind, _, d in got if kind == "progress"]
    assert progress[-1]["status"] == "done" and progress[-1]["trials_done"] == TRIALS
    done = [p["trials_done"] for p in progress]
    assert done == sorted(done)
    # The stream agrees with the job's own record.
    state = httpx.get(f"{svc.url}/jobs/{job_id}").json()
    assert [m["id"] for m in state["measurements"]] == ids
    assert progress[-1]["best_us"] == state["best_us"]

    # Reconnecting after the 20th measurement replays exactly the rest, then `end`.
    again = follow(svc.url, job_id, {"Last-Event-ID": str(ids[19])})
    assert [i for k, i, _ in again if k == "measurement"] == ids[20:]
    assert [d["trial"] for k, _, d in again if k == "measurement"] == list(range(21, TRIALS + 1))
    assert again[-1][0] == "end"


def test_unknown_job_and_bad_resume_point_are_refused(
        make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    resp = httpx.get(f"{svc.url}/jobs/999/events")
    assert resp.status_code == 404 and "no job 999" in resp.text
    resp = httpx.get(f"{svc.url}/jobs/1/events", headers={"Last-Event-ID": "abc"})
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["header", "last-event-id"]
    resp = httpx.get(f"{svc.url}/jobs/1/events", params={"interval": 0})
    assert resp.status_code == 422
