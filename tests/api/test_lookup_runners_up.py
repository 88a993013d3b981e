"""POST /schedules/lookup with `runners_up`: each found layer also lists its next fastest right
schedules after its best, fastest first, measured on the best's backend; never the best
itself, a wrong one or one of another task; the count is bounded and a bad one named."""

from __future__ import annotations

import functools
import json
from typing import Any

from fastapi.testclient import TestClient

from kernels.runtime import default_schedule, schedule_fits
from kernels.space import knobs_for
from kernels.spec import ConvShape, Precision, get_target
from store import transfer
from store.db import session_scope

SHAPE = ConvShape(8, 14, 14, 64, 64, 3, 3, pad=(1, 1))
OTHER = ConvShape(8, 14, 14, 64, 128, 3, 3, pad=(1, 1))


@functools.cache
def _schedules() -> list[str]:
    """Distinct schedules valid for both shapes (the default with one knob changed)."""
    h100, p = get_target("h100"), Precision.FP16
    base = default_schedule(SHAPE, p, h100)[0]
    out = [json.dumps(base, sort_keys=True)]
    for knob, values in knobs_for(p).items():
        for v in values:
            s = {**base, knob: v}
            js = json.dumps(s, sort_keys=True)
            if js not in out and all(schedule_fits(sh, p, h100, s) is None
                                     for sh in (SHAPE, OTHER)):
                out.append(js)
    return out


def sched(i: int) -> dict[str, Any]:
    return dict(json.loads(_schedules()[i]))


def store(db: str, shape: ConvShape, schedule: dict[str, Any], us: float | None,
          status: str = "ok", backend: str = "cuda") -> None:
    line = json.dumps({"kind": "measurement", "task": {"shape": shape.to_dict(),
                       "precision": "fp16", "target": "h100"}, "schedule": schedule,
                       "status": status, "median_us": us, "iqr_us": None, "backend": backend})
    with session_scope(db) as s:
        report = transfer.import_lines(s, [line])
        assert not report.errors, report.errors


def lookup(app: TestClient, shapes: list[ConvShape], **extra: Any) -> Any:
    return app.post("/schedules/lookup", json={"layers": [
        {"shape": sh.to_dict(), "precision": "fp16", "target": "h100"} for sh in shapes],
        **extra})


def test_runners_up_are_the_next_fastest_right_schedules(api: tuple[TestClient, str]) -> None:
    app, db = api
    for i, us in enumerate([5.0, 3.0, 4.0, 6.0, 3.5]):
        store(db, SHAPE, sched(i), us)
    store(db, SHAPE, sched(10), 1.0, status="wrong")  # fast but wrong: never a candidate
    store(db, OTHER, sched(11), 3.2)  # another task's
    r = lookup(app, [SHAPE, OTHER, SHAPE.__class__(1, 7, 7, 8, 8, 1, 1)], runners_up=3)
    assert r.status_code == 200, r.text
    first, other, missing = r.json()["results"]
    assert first["schedule"] == sched(1) and first["latency_us"] == 3.0
    assert first["runners_up"] == [{"schedule": sched(4), "latency_us": 3.5},
                                   {"schedule": sched(2), "latency_us": 4.0},
                                   {"schedule": sched(0), "latency_us": 5.0}]
    assert other["runners_up"] == []  # its best is its only right schedule
    assert not missing["found"] and missing["runners_up"] is None
    plain = lookup(app, [SHAPE]).json()["results"][0]
    assert plain["runners_up"] is None and plain["schedule"] == sched(1)
    every = lookup(app, [SHAPE], runners_up=16).json()["results"][0]["runners_up"]
    assert [x["latency_us"] for x in every] == [3.5, 4.0, 5.0, 6.0]


def test_a_bad_count_is_refused_by_name(api: tuple[TestClient, str]) -> None:
    app, _ = api
    for bad in (17, -1, "many"):
        r = lookup(app, [SHAPE], runners_up=bad)
        assert r.status_code == 422, r.text
        assert any(e["loc"] == ["body", "runners_up"] for e in r.json()["detail"]), r.text
