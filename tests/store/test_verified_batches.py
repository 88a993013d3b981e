"""The batches at which a layer has a verified schedule (repository.verified_batches), on
both databases the service runs on, and GET /schedule's 404 naming them."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from kernels.spec import RESNET50_3X3, ConvShape, Precision, get_target, task_key
from store import repository as repo
from store import transfer
from store.db import session_scope

STAGE2 = RESNET50_3X3["stage2"]
H200 = get_target("h200")
SCHEDULE = {"BLK_ROW_WARPS": 2, "BLK_COL_WARPS": 2, "WARP_ROW_TILES": 2, "WARP_COL_TILES": 2,
            "CHUNK": 2, "REORDER_INNER": 0, "DUP_AWARE": 0, "PACK_OUT": 1, "LAYOUT": "nhwc",
            "STAGES": 2, "SPLIT_K": 1}


def _verified(db: str, shape: ConvShape, precision: str = "int8", target: str = "h200",
              status: str = "ok") -> None:
    line = json.dumps({"kind": "measurement", "task": {"shape": shape.to_dict(),
                       "precision": precision, "target": target}, "schedule": SCHEDULE,
                       "status": status, "median_us": 5.0, "iqr_us": None, "backend": "cuda"})
    with session_scope(db) as s:
        report = transfer.import_lines(s, [line])
        assert not report.errors, report.errors


def test_the_batches_of_a_layers_verified_schedules(db: str) -> None:
    for n in (32, 1, 8):
        _verified(db, replace(STAGE2, n=n))
    # not the same layer: other channels, precision, target, a residual, a wrong result
    _verified(db, replace(STAGE2, n=4, k=128))
    _verified(db, replace(STAGE2, n=4), precision="fp16")
    _verified(db, replace(STAGE2, n=4), target="h100")
    _verified(db, replace(STAGE2, n=4, residual=True))
    _verified(db, replace(STAGE2, n=2), status="wrong")
    with session_scope(db) as s:
        asked = task_key(replace(STAGE2, n=16), Precision.INT8, H200)
        assert repo.verified_batches(s, asked) == [1, 8, 32]
        res = task_key(replace(STAGE2, n=16, residual=True), Precision.INT8, H200)
        assert repo.verified_batches(s, res) == [4]
        assert repo.verified_batches(s, task_key(replace(STAGE2, c=32), Precision.INT8,
                                                 H200)) == []


def test_a_missing_schedule_names_the_batches_it_is_verified_at(api: tuple[Any, str]) -> None:
    client, db = api
    _verified(db, STAGE2)
    params = dict(n=32, h=56, w=56, c=64, k=64, r=3, s=3, pad=1, precision="int8",
                  target="h200")
    resp = client.get("/schedule", params=params)
    assert resp.status_code == 404
    assert resp.json()["batches"] == [8] and "verified at batch 8" in resp.json()["detail"]
    assert client.get("/schedule", params={**params, "n": 8}).status_code == 200
    none = client.get("/schedule", params={**params, "c": 32})
    assert none.status_code == 404 and none.json()["batches"] == []


def test_the_client_says_why_a_schedule_is_missing(api: tuple[Any, str]) -> None:
    """`tctune schedule` prints this where the service has no verified schedule."""
    from api.client import Client

    client, db = api
    _verified(db, STAGE2)
    c = Client("http://testserver")
    c.http.close()
    c.http = client  # the app's real routes, in process
    best, why = c.schedule_or_reason(replace(STAGE2, n=32), "int8", "h200")
    assert best is None and "verified at batch 8" in why
    best, why = c.schedule_or_reason(STAGE2, "int8", "h200")
    assert best is not None and best["schedule"] == SCHEDULE and why == ""
