"""The one heartbeat (workers/heartbeat.py) as the embedded service and a fleet node use it,
against SQLite, and how a simulated node learns which of its slots measured."""

from __future__ import annotations

import threading
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


def test_a_slot_is_busy_while_it_measures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery sends its signals before and after a task in the thread that runs it: the
    slot's. A slot is busy from the one to the other, and only for a measure task."""
    from workers.app import measure_task, worker_identity

    monkeypatch.setenv("TCTUNE_WORKER_NAME", "node/sim")
    monkeypatch.setenv("TCTUNE_WORKER_SLOTS", "4")
    get_settings.cache_clear()
    activity = SlotActivity()
    activity.watch()
    names: list[str] = []
    started, release = threading.Event(), threading.Event()

    def slot(task: object) -> None:
        names.append(worker_identity())
        signals.task_prerun.send(sender=task)
        started.set()
        release.wait(5)
        signals.task_postrun.send(sender=task)

    other = type("OtherTask", (), {"name": "tctune.other"})()
    try:
        t = threading.Thread(target=slot, args=(measure_task,))
        t.start()
        assert started.wait(5)
        assert activity.busy() == {names[0]}
        release.set()
        t.join()
        assert activity.busy() == set(), "idle once its chunk is done"
        started.clear()
        t = threading.Thread(target=slot, args=(other,))
        t.start()
        assert started.wait(5)
        assert activity.busy() == set(), "only a measure task makes a slot busy"
        t.join()
    finally:
        signals.task_prerun.disconnect(activity._started)
        signals.task_postrun.disconnect(activity._ended)
        get_settings.cache_clear()


def test_the_embedded_service_has_a_worker_row_per_gpu(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """On a host of two GPUs of one model the embedded service measures on both (a measuring
    process each): GET /workers shows a row per GPU, `name#i` as a fleet node's slots."""
    from kernels.spec import get_target
    from workers import embedded, local

    monkeypatch.setattr(embedded, "local_gpu_target", lambda: get_target("h200"))
    monkeypatch.setattr(embedded, "served_targets", lambda _s: ["h200"])
    monkeypatch.setattr(local, "local_gpus", lambda: [0, 1])
    settings = Settings(data_dir=tmp_path, backend="cuda")
    [gpus] = embedded_workers(settings)
    base = f"{embedded.worker_name()}/h200"
    assert gpus.names == (f"{base}#0", f"{base}#1") and gpus.target == "h200"
    assert gpus.backend == "cuda" and gpus.sm == 90
    monkeypatch.setattr(local, "local_gpus", lambda: [0])
    assert embedded_workers(settings)[0].names == (base,)
    # the dispatcher passes its transport's GPUs: the driver is not asked (nor a warning
    # about shared GPUs logged) a second time
    monkeypatch.setattr(local, "local_gpus", lambda: pytest.fail("asked twice"))
    assert embedded_workers(settings, ["0", "0"])[0].names == (f"{base}#0", f"{base}#1")
