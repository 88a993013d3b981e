"""/metrics speaks Prometheus and counts what happens."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.app import create_app
from store import migrate
from store.settings import Settings

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": 1}


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_requests_and_jobs(tmp_path: Path) -> None:
    cfg = Settings(data_dir=tmp_path, auth="off")
    migrate.upgrade(cfg.db_url)
    with TestClient(create_app(cfg, dispatcher=False)) as client:
        client.post("/tune", json={"shape": STAGE2, "precision": "int8", "target": "h200"})
        client.post("/tune", json={"shape": STAGE2, "precision": "fp16", "target": "h200"})
        for job in (1, 2, 3):
            client.get(f"/jobs/{job}")
        resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    got = _samples(resp.text)
    assert got[("tctune_http_requests_total",
                (("method", "POST"), ("route", "/tune"), ("status", "202")))] == 2
    assert got[("tctune_http_requests_total",
                (("method", "GET"), ("route", "/jobs/{job_id}"), ("status", "200")))] == 2
    assert got[("tctune_http_requests_total",
                (("method", "GET"), ("route", "/jobs/{job_id}"), ("status", "404")))] == 1
    assert got[("tctune_jobs", (("state", "queued"),))] == 2
    assert got[("tctune_http_request_seconds_count",
                (("method", "POST"), ("route", "/tune")))] == 2
