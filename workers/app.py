"""The Celery app of the distributed fleet.

Queues: `explore` (the explorer: one or several processes, up to `rounds_in_flight` rounds
per job), `build` (CPU builders), and one measure queue per target (`measure.h200`,
`measure.t4`, ...) consumed by one worker process per GPU. The task
bodies are the functions of `workers.tasks`, the same the embedded dispatcher runs. The
broker only carries messages: every task re-reads its input from the database and writes
its result once, so a redelivered or re-sent message does nothing twice, and a lost one is
re-sent by the explorer's sweeper (`workers.fleet`).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from celery import Celery, signals

from store.errors import UNAVAILABLE
from store.settings import get_settings
from workers import batcher, tasks
from workers.backends import backend_for, builder_backend
from workers.fleet import dead_after_s

log = logging.getLogger(__name__)

EXPLORE_QUEUE = "explore"
BUILD_QUEUE = "build"


def measure_queue(target: str) -> str:
    return f"measure.{target}"


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
        # Unacknowledged messages come back after this long; the sweeper usually re-sends
        # lost work sooner, from the database.
        broker_transport_options={"visibility_timeout": 3600},
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
RETRY = {"autoretry_for": (*UNAVAILABLE, ConnectionError), "retry_backoff": True,
         "retry_backoff_max": 60, "max_retries": 20}


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


def chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    return [list(ids[i:i + size]) for i in range(0, len(ids), max(1, size))]


def send(task: Any, arg: int | list[int], queue: str, *more: Any) -> None:
    task.apply_async((arg, *more), queue=queue)


# Slot name -> monotonic time of its last measured chunk: what the heartbeat reports as
# busy (asking the database which worker wrote lately cost a scan per beat).
last_measured: dict[str, float] = {}


@app.task(name="tctune.explore", **RETRY)
def explore_task(job_id: int) -> int:
    settings = get_settings()
    prop = tasks.explore_round(settings.db_url, job_id, settings.batch_size,
                               settings.rounds_in_flight, settings.prior_refresh_s,
                               settings.max_round, dead_after_s(settings))
    if prop.ids:
        dispatch(prop.ids, prop.target)
    if prop.more:  # pipelining: the next round is proposed while this one is measured
        send(explore_task, job_id, EXPLORE_QUEUE)
    return len(prop.ids)


def dispatch(candidate_ids: list[int], target: str | None) -> None:
    """Send unbuilt candidates on: one build message per chunk (each builder then sends its
    chunk to the measure queue), so that a round's NVRTC builds run on as many builders at
    once as it has chunks (one message of a whole 32-candidate round took 7-9 s of one
    builder before its GPU saw any of it); or, where the fleet measures with the analytical
    model, straight to the measure queue: the simulated "build" is only a validity check,
    which the measuring worker makes itself for a candidate nobody built (as for a cubin it
    lacks), so the hop would cost a message, a transaction and a process switch for
    nothing."""
    settings = get_settings()
    if settings.backend != "simulated":
        for chunk in chunks(candidate_ids, settings.chunk_size):
            send(build_task, chunk, BUILD_QUEUE, target)
        return
    target = target or tasks.target_of(settings.db_url, candidate_ids[0])
    if target is None:
        return
    for chunk in chunks(candidate_ids, settings.chunk_size):
        send(measure_task, chunk, measure_queue(target), target)


@app.task(name="tctune.build", **RETRY)
def build_task(candidate_ids: list[int], target: str | None = None) -> int:
    settings = get_settings()
    target = target or tasks.target_of(settings.db_url, candidate_ids[0])
    if target is None:
        return 0
    built = tasks.build_many(settings.db_url, candidate_ids, builder_backend(target, settings),
                             publish=True)
    for chunk in chunks(candidate_ids, settings.chunk_size):
        send(measure_task, chunk, measure_queue(target), target)
    return built


@app.task(name="tctune.measure", **RETRY)
def measure_task(candidate_ids: list[int], target: str | None = None) -> int:
    settings = get_settings()
    target = target or tasks.target_of(settings.db_url, candidate_ids[0])
    if target is None:
        return 0
    me = worker_identity()
    # Several GPU slots in this process: their writes go through one group-committing
    # batcher (a transaction for what they finish together instead of one each).
    writer = (batcher.batcher_for(settings.db_url)
              if settings.worker_slots > 1 else None)
    res = tasks.measure_chunk(settings.db_url, candidate_ids, backend_for(target, settings),
                              me, lease_s=settings.lease_s, flush_s=settings.flush_s,
                              writer=writer)
    last_measured[me] = time.monotonic()
    for job_id in sorted(res.closed):  # the result that closes a round starts the next one
        send(explore_task, job_id, EXPLORE_QUEUE)
    return res.written
