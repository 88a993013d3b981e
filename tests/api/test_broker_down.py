"""While the broker is down, the API answers at once: a new job is stored and announced
later (the explorer's sweeper starts it once the broker is back), and /metrics reports
no queue depths instead of waiting for the broker."""

from __future__ import annotations

import time
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.settings import Settings
from tests.conftest import free_port

LAYER = {"shape": {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3},
         "precision": "int8", "target": "h200", "trials": 8}


def test_tune_and_metrics_answer_fast_while_the_broker_is_down(tmp_path: Path) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    cfg = Settings(data_dir=tmp_path, broker_url=nobody, backend="simulated")
    migrate.upgrade(cfg.db_url)
    with session_scope(cfg.db_url) as s:
        token = repo.create_token(s, "t", "tune")
    with TestClient(create_app(cfg, dispatcher=False)) as client:
        for k in (64, 128):  # the second after the broker is known to be down
            start = time.monotonic()
            resp = client.post("/tune", json={**LAYER, "shape": {**LAYER["shape"], "k": k}},
                               headers={"Authorization": f"Bearer {token}"})
            assert resp.status_code == 202 and time.monotonic() - start < 1.0
        start = time.monotonic()
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and time.monotonic() - start < 1.0
        assert 'tctune_jobs{state="queued"} 2.0' in metrics.text
        assert "tctune_queue_depth{" not in metrics.text
    with session_scope(cfg.db_url) as s:  # both jobs are stored for the sweeper
        assert [j.status for j in repo.active_jobs(s)] == ["queued", "queued"]
