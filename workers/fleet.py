"""The processes of the distributed fleet: explorer (with its sweeper), builder, worker.

Each is a Celery worker on its own queues (`workers.app`) plus what it owes the database:
the explorer runs the protocol's sweep (`workers.protocol.Sweeper`: jobs that need a
round, candidates whose message was lost, leases of dead workers); every measuring
process announces its GPUs and heartbeats (`workers.heartbeat`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session

from store import hotpath as hp
from store.models import utcnow
from store.settings import Settings, set_for_processes
from workers.heartbeat import Heartbeat, Workers
from workers.periodic import every
from workers.protocol import Dispatch, Sweeper
from workers.queues import MEASURE_TASK, CeleryTransport, QueueWatch, queue_depths

log = logging.getLogger(__name__)

GIL_SWITCH_S = 0.0005  # an explorer's threads hand each other the GIL this often (default 5 ms)


def explorer_sweeper(settings: Settings) -> Sweeper:
    """The fleet's sweep: the protocol on the Celery queues, lost work judged by the
    database and the queues' depths."""
    from workers.app import app

    dispatch = Dispatch.fleet(settings, CeleryTransport(app))
    watch = QueueWatch(settings, lambda queues: queue_depths(app, queues),
                       dispatch.measure_unbuilt)
    return Sweeper(dispatch, watch, free_dead_leases=True)


def _no_pre_ping() -> None:
    """Before any engine exists (the heartbeat's and the sweeper's threads make one at their
    first beat): no ping per connection checkout, a round trip per transaction; Celery's
    retries handle a connection lost with PostgreSQL. TCTUNE_DB_PRE_PING overrides."""
    if "TCTUNE_DB_PRE_PING" not in os.environ:
        set_for_processes(db_pre_ping=False)


def _celery(args: list[str]) -> None:
    _no_pre_ping()
    from workers.app import app

    # Two INFO lines per message (received, succeeded) cost a worker measurably at
    # hundreds of messages a second; failures and retries still log (ERROR, WARNING).
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)

    app.worker_main(["worker", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                     *args])


def run_explorer(settings: Settings, procs: int = 1, threads: int = 1) -> None:
    """The central explorer: all jobs, up to `settings.rounds_in_flight` rounds each;
    restart-safe. `procs` > 1: that many processes take explore messages (a prefork pool),
    each proposing for one job at a time; the job's row lock keeps two from proposing for
    one job. `threads` > 1: that many threads of this process do, sharing its spaces,
    strategies and base models (processes each train their own). One sweeper (this
    process) for all of them."""
    _no_pre_ping()
    from search import cost_model  # sets OMP_WAIT_POLICY=PASSIVE before XGBoost loads

    # One XGBoost thread per model call by default (TCTUNE_XGB_THREADS): a second
    # OpenMP thread cost more CPU than it saved (0.24 vs 0.12 CPU-s per fit on an idle
    # 2-core machine, 0.165 vs 0.152 on a busy one; the same trees, so the same proposals).
    cost_model.NTHREAD = max(1, settings.xgb_threads)
    every(settings.sweep_s, explorer_sweeper(settings).sweep, "sweeper")
    if threads > 1:
        # A thread back from numpy or XGBoost waits for the GIL until the one running Python
        # gives it up, by default every 5 ms: a proposal's hundreds of array steps then
        # waited seconds behind the other thread's SQLAlchemy and JSON.
        sys.setswitchinterval(GIL_SWITCH_S)
    pool = ["-P", "threads", "-c", str(threads)] if threads > 1 else \
        ["-P", "solo"] if procs <= 1 else ["-P", "prefork", "-c", str(procs)]
    _celery(["-Q", "explore", *pool, "-n", f"explorer-{os.getpid()}@{socket.gethostname()}"])


def run_builder(settings: Settings, concurrency: int) -> None:
    _celery(["-Q", "build", "-P", "prefork", "-c", str(concurrency),
             "-n", f"builder-{os.getpid()}@{socket.gethostname()}"])


class SlotActivity:
    """Which GPU slots of this process are measuring a chunk now: what its heartbeat
    reports as busy (asking the database which worker wrote lately cost a scan per beat).
    Learnt from Celery's own signals before and after a task, sent in the thread that runs
    it, the slot's thread.

    Why now, not "measured lately": the explorer's round size counts the idle GPUs, and a
    simulated slot that measures a chunk of 0.27 s every few seconds read busy for the two
    heartbeat periods (20 s) after each: 160-193 of 256 slots busy while 13-93 held a chunk,
    so most rounds stayed at the smallest size (bench/RESULTS.md "Fleet by simulation")."""

    def __init__(self) -> None:
        self._running: set[str] = set()

    def watch(self) -> None:
        from celery import signals

        signals.task_prerun.connect(self._started, weak=False)
        signals.task_postrun.connect(self._ended, weak=False)

    @staticmethod
    def _measures(sender: Any) -> bool:
        return getattr(sender, "name", None) == MEASURE_TASK

    def _started(self, sender: Any = None, **_: Any) -> None:
        if self._measures(sender):
            from workers.app import worker_identity

            self._running.add(worker_identity())

    def _ended(self, sender: Any = None, **_: Any) -> None:
        if self._measures(sender):
            from workers.app import worker_identity

            self._running.discard(worker_identity())

    def busy(self) -> set[str]:
        return set(self._running)


def run_worker(settings: Settings, gpu: int | None, simulate: str | None,
               slots: int = 1) -> None:
    """One process per GPU: measures the target's queue. A simulated node may host several
    simulated GPUs (`slots` threads, each a worker of its own) — how a benchmark puts
    hundreds of workers on a small machine."""
    from kernels.spec import get_target
    from workers.backends import local_gpu_target

    _no_pre_ping()
    if simulate:
        target = get_target(simulate)
        model, sm, backend = f"{target.model} (simulated)", target.sm, "simulated"
        set_for_processes(backend="simulated")
        name = f"{socket.gethostname()}/sim-{target.name}-{os.getpid()}"
    else:
        found = local_gpu_target()
        if found is None:
            raise SystemExit(f"no known GPU visible as CUDA device {gpu}")
        target, model, sm, backend = found, found.model, found.sm, "cuda"
        name = f"{socket.gethostname()}/gpu{gpu}"
    set_for_processes(worker_name=name, worker_slots=slots)
    names = (name,) if slots <= 1 else tuple(f"{name}#{i}" for i in range(slots))
    recent = 2 * settings.heartbeat_s
    activity = SlotActivity()

    def busy(s: Session) -> Collection[str]:
        if slots > 1:  # the slots are this process's threads: it knows who measured
            return activity.busy()
        # the task runs in a pool child: ask the database
        return hp.workers_measured_since(s, names, utcnow() - timedelta(seconds=recent))

    if slots > 1:
        activity.watch()
    heartbeat = Heartbeat(settings.db_url, settings.heartbeat_s,
                          [Workers(names, model, sm, target.name, backend)], busy)
    every(settings.heartbeat_s, heartbeat.beat, "heartbeat")
    pool = ["-P", "prefork", "-c", "1"] if slots <= 1 else ["-P", "threads", "-c", str(slots)]
    try:
        # prefork with one child: Celery's time limits apply, and a GPU is used by one task.
        _celery(["-Q", f"measure.{target.name}", *pool, "-n",
                 f"{name.replace('/', '-')}@{socket.gethostname()}"])
    finally:
        heartbeat.stopped()
