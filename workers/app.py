"""The Celery app of the distributed fleet and its task bodies.

Each task runs a step of `workers.tasks` and hands what follows to the dispatch protocol
(`workers.protocol`), which sends it on the queues (`workers.queues`); the embedded
dispatcher runs the same steps and the same protocol on local processes. The broker only
carries messages: every task re-reads its input from the database and writes its result
once, so a redelivered or re-sent message does nothing twice, and a lost one is re-sent by
the explorer's sweeper (`workers.fleet`).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from typing import Any

from celery import Celery, signals

from store.settings import Settings, get_settings
from workers import batcher, tasks
from workers.backends import backend_for, builder_backend
from workers.backoff import celery_retry_options
from workers.protocol import Dispatch
from workers.queues import BUILD_TASK, EXPLORE_QUEUE, EXPLORE_TASK, MEASURE_TASK, CeleryTransport


def make_app() -> Celery:
    settings = get_settings()
    app = Celery("tctune", broker=settings.broker_url or "redis://127.0.0.1:6379/0")
    app.conf.update(
        task_acks_late=True,  # a task is acknowledged once its result is written...
        task_reject_on_worker_lost=True,  # ...and requeued if its worker dies mid-task
        worker_prefetch_multiplier=1,  # a GPU worker holds one message at a time
        task_ignore_result=True,  # results live in the database
        task_default_queue=EXPLORE_QUEUE,
        task_create_missing_queues=True,
        task_soft_time_limit=settings.task_soft_limit_s,
        task_time_limit=settings.task_soft_limit_s + 60,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # ride out a broker restart
        # Redis keeps no copy of a delivered message until its acknowledgement (kombu's
        # ack emulation, two MULTI/EXEC round trips per message: a sixth of a simulated
        # worker's CPU). A message whose whole worker process died is lost; the sweeper
        # re-sends its candidates from the database (redispatch_s), as it did before
        # Redis's own restore (after the visibility timeout, an hour). A dead prefork
        # child's message is still requeued (reject_on_worker_lost), and a worker that
        # shuts down puts back what it holds.
        broker_transport_options={"ack_emulation": False},
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    return app


app = make_app()


@signals.worker_process_init.connect
def _fresh_connections(**_: Any) -> None:
    """A forked pool child must not share its parent's database sockets."""
    from store.db import get_engine

    get_engine(get_settings().db_url).dispose(close=False)


def dispatch(settings: Settings) -> Dispatch:
    """The protocol as the fleet runs it, sending on this app's queues."""
    return Dispatch.fleet(settings, CeleryTransport(app))


_slot = threading.local()
_slots = itertools.count()


def worker_identity() -> str:
    """This measuring process's name; with several slots (a simulated node's threads, each
    one GPU) every thread is a worker of its own: name#slot."""
    settings = get_settings()
    base = settings.worker_name or f"{socket.gethostname()}-{os.getpid()}"
    if settings.worker_slots <= 1:
        return base
    if not hasattr(_slot, "n"):
        _slot.n = next(_slots)
    return f"{base}#{_slot.n}"


@app.task(name=EXPLORE_TASK, **celery_retry_options())
def explore_task(job_id: int) -> int:
    return dispatch(get_settings()).explore(job_id)


def _target(settings: Settings, candidate_ids: list[int], target: str | None) -> str | None:
    """The chunk's target: named by its message, else its first candidate's (None: gone)."""
    return target or tasks.target_of(settings.db_url, candidate_ids[0])


@app.task(name=BUILD_TASK, **celery_retry_options())
def build_task(candidate_ids: list[int], target: str | None = None) -> int:
    settings = get_settings()
    if (target := _target(settings, candidate_ids, target)) is None:
        return 0
    built = tasks.build_many(settings.db_url, candidate_ids, builder_backend(target, settings),
                             publish=True)
    dispatch(settings).built(target, candidate_ids)
    return built


@app.task(name=MEASURE_TASK, **celery_retry_options())
def measure_task(candidate_ids: list[int], target: str | None = None) -> int:
    settings = get_settings()
    if (target := _target(settings, candidate_ids, target)) is None:
        return 0
    # Several GPU slots in this process: their writes go through one group-committing
    # batcher (a transaction for what they finish together instead of one each).
    writer = (batcher.batcher_for(settings.db_url)
              if settings.worker_slots > 1 else None)
    res = tasks.measure_chunk(settings.db_url, candidate_ids, backend_for(target, settings),
                              worker_identity(), lease_s=settings.lease_s,
                              flush_s=settings.flush_s, writer=writer)
    dispatch(settings).measured(res.closed)
    return res.written
