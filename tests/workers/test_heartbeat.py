"""The one heartbeat (workers/heartbeat.py) as the embedded service and a fleet node use it,
against SQLite, and how a simulated node learns which of its slots measured."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from celery import signals
from sqlalchemy import select

from store import migrate
from store.db import session_scope
from store.models import Worker
from store.settings import Settings, get_settings
from workers.embedded import embedded_workers
from workers.fleet import SlotActivity
from workers.heartbeat import Heartbeat, Workers


def _rows(db: str) -> dict[str, tuple[str, str, str]]:
    with session_scope(db) as s:
        return {w.name: (w.state, w.target, w.backend) for w in s.scalars(select(Worker))}


def test_beats_name_the_busy_and_the_stopped(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, backend="simulated")
    migrate.upgrade(settings.db_url)
    node = Workers(("node/sim#0", "node/sim#1"), "H200 (simulated)", 90, "h200", "simulated")
    busy: set[str] = set()
    beat = Heartbeat(settings.db_url, 60.0, [*embedded_workers(settings), node],
                     lambda _: busy)
    beat.beat_if_due()
    embedded = embedded_workers(settings)[0].names[0]
    assert _rows(settings.db_url) == {
        embedded: ("idle", "*", "simulated"),
        "node/sim#0": ("idle", "h200", "simulated"),
        "node/sim#1": ("idle", "h200", "simulated")}
    busy.add("node/sim#1")
    beat.beat_if_due()  # not due yet: a period is 60 s
    assert _rows(settings.db_url)["node/sim#1"][0] == "idle"
    beat.beat()
    assert _rows(settings.db_url)["node/sim#1"][0] == "busy"
    beat.stopped()
    assert {state for state, _, _ in _rows(settings.db_url).values()} == {"stopped"}


def test_a_slot_that_measured_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery sends its success signal in the thread that ran the task: the slot's."""
    from workers.app import measure_task, worker_identity

    monkeypatch.setenv("TCTUNE_WORKER_NAME", "node/sim")
    monkeypatch.setenv("TCTUNE_WORKER_SLOTS", "4")
    get_settings.cache_clear()
    activity = SlotActivity()
    activity.watch()
    names: list[str] = []

    def slot(measured: bool) -> None:
        names.append(worker_identity())
        if measured:
            signals.task_success.send(sender=measure_task, result=1)

    try:
        for measured in (True, False):
            t = threading.Thread(target=slot, args=(measured,))
            t.start()
            t.join()
        assert activity.busy(10.0) == {names[0]} and names[0] != names[1]
        time.sleep(0.05)
        assert activity.busy(0.01) == set(), "busy only while it measured lately"
    finally:
        signals.task_success.disconnect(activity._succeeded)
        get_settings.cache_clear()
