"""The processes of the distributed fleet: explorer (with its sweeper), builder, worker.

Each is a Celery worker on its own queues plus what it owes the database: the explorer
sweeps for jobs that need a round and for candidates whose message was lost (a broker
restart, a worker killed before it took the lease); every measure worker announces its GPU
and heartbeats.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import timedelta

from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from store.models import utcnow
from store.settings import Settings, set_for_processes

log = logging.getLogger(__name__)


# A worker this many heartbeat periods late is dead, not slow (a beat is one statement).
DEAD_AFTER_BEATS = 4


def dead_after_s(settings: Settings) -> float:
    return DEAD_AFTER_BEATS * settings.heartbeat_s


def sweep_once(settings: Settings, last_explore: dict[int, float]) -> tuple[int, int]:
    """Start rounds for jobs with fewer rounds in flight than allowed (a new job, or a lost
    explore message) and re-send stale candidates. Returns (explore messages, re-sent
    candidates)."""
    from workers import app as celery_app

    explores, resent = 0, 0
    now = time.monotonic()
    with session_scope(settings.db_url) as s:
        freed = repo.release_dead_leases(s, dead_after_s(settings))
        if freed:
            log.warning("freed %d candidates leased by workers without a heartbeat", freed)
        for job_id, rounds in hp.open_rounds_per_job(s).items():  # one query for all jobs
            if rounds >= max(1, settings.rounds_in_flight):
                continue
            # A job between rounds is usually on its way (its explore message sent); only
            # one that stays so this long, or has never started, is started from here.
            if now - last_explore.get(job_id, -1e9) >= settings.redispatch_s:
                celery_app.send(celery_app.explore_task, job_id, celery_app.EXPLORE_QUEUE)
                last_explore[job_id] = now
                explores += 1
        stale = repo.stale_candidates(s, settings.redispatch_s)
        targets = {t.id: t.target for t in
                   (repo.get_task(s, tid) for tid in {c.task_id for c in stale}) if t}
        # A candidate still waiting in a queue is not lost: only re-send where its queue
        # has drained (after a broker restart every queue is empty).
        depth = queue_depths([celery_app.BUILD_QUEUE] + [celery_app.measure_queue(t)
                                                         for t in set(targets.values())])
        direct = settings.backend == "simulated"  # pending ones go straight to measure
        stale = [c for c in stale if depth.get(
            celery_app.BUILD_QUEUE if c.state == "pending" and not direct
            else celery_app.measure_queue(targets[c.task_id]), 0) == 0]
        # One message per chunk of a job's candidates in the same step, as first sent.
        groups: dict[tuple[int, str, str], list[int]] = {}
        for cand in stale:
            key = (cand.job_id, cand.state, targets[cand.task_id])
            groups.setdefault(key, []).append(cand.id)
        for (_, state, target), ids in groups.items():
            resent += len(ids)  # unbuilt ones too: each is a candidate sent again
            if state == "pending":
                celery_app.dispatch(ids, target)
                continue
            for chunk in celery_app.chunks(ids, settings.chunk_size):
                celery_app.send(celery_app.measure_task, chunk,
                                celery_app.measure_queue(target), target)
        repo.mark_dispatched(s, [c.id for c in stale])
    if resent:
        log.warning("re-sent %d candidates whose messages were lost", resent)
    return explores, resent


def queue_depths(queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue (0 for a queue the broker does not know)."""
    from workers.app import app

    out: dict[str, int] = {}
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for q in queues:
            try:
                out[q] = int(channel.queue_declare(q, passive=True).message_count)
            except Exception:  # not declared yet: nothing is waiting in it
                out[q] = 0
    return out


def _loop(interval: float, body: object, name: str) -> threading.Thread:
    def run() -> None:
        while True:
            try:
                body()  # type: ignore[operator]
            except Exception:  # the database or broker is away: try again next time
                log.exception("%s failed; retrying", name)
            time.sleep(interval)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _celery(args: list[str]) -> None:
    # Before any engine exists: Celery's retries handle a connection lost with PostgreSQL.
    if "TCTUNE_DB_PRE_PING" not in os.environ:
        set_for_processes(db_pre_ping=False)
    from workers.app import app

    # Two INFO lines per message (received, succeeded) cost a worker measurably at
    # hundreds of messages a second; failures and retries still log (ERROR, WARNING).
    for name in ("celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)

    app.worker_main(["worker", "--loglevel", "INFO", "--without-gossip", "--without-mingle",
                     *args])


def run_explorer(settings: Settings, procs: int = 1) -> None:
    """The central explorer: all jobs, up to `settings.rounds_in_flight` rounds each;
    restart-safe. `procs` > 1: that many processes take explore messages (a prefork pool),
    each proposing for one job at a time; the job's row lock keeps two from proposing for
    one job. One sweeper (this process) for all of them."""
    from search import cost_model  # sets OMP_WAIT_POLICY=PASSIVE before XGBoost loads

    # One XGBoost thread per explorer process by default (TCTUNE_XGB_THREADS): a second
    # OpenMP thread cost more CPU than it saved (0.24 vs 0.12 CPU-s per fit on an idle
    # 2-core machine, 0.165 vs 0.152 on a busy one; the same trees, so the same proposals).
    cost_model.NTHREAD = max(1, settings.xgb_threads)
    last_explore: dict[int, float] = {}
    _loop(settings.sweep_s, lambda: sweep_once(settings, last_explore), "sweeper")
    pool = ["-P", "solo"] if procs <= 1 else ["-P", "prefork", "-c", str(procs)]
    _celery(["-Q", "explore", *pool, "-n", f"explorer-{os.getpid()}@{socket.gethostname()}"])


def run_builder(settings: Settings, concurrency: int) -> None:
    _celery(["-Q", "build", "-P", "prefork", "-c", str(concurrency),
             "-n", f"builder-{os.getpid()}@{socket.gethostname()}"])


def run_worker(settings: Settings, gpu: int | None, simulate: str | None,
               slots: int = 1) -> None:
    """One process per GPU: measures the target's queue. A simulated node may host several
    simulated GPUs (`slots` threads, each a worker of its own) — how a benchmark puts
    hundreds of workers on a small machine."""
    from kernels.spec import get_target
    from workers.backends import local_gpu_target

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
    names = [name] if slots <= 1 else [f"{name}#{i}" for i in range(slots)]

    first = [True]

    def beat() -> None:
        from workers.app import last_measured

        with session_scope(settings.db_url) as s:
            if slots > 1:  # the slots are this process's threads: it knows who measured
                since = time.monotonic() - 2 * settings.heartbeat_s
                busy = {n for n, t in list(last_measured.items()) if t >= since}
            else:  # the task runs in a pool child: ask the database
                busy = hp.workers_measured_since(
                    s, names, utcnow() - timedelta(seconds=2 * settings.heartbeat_s))
            repo.heartbeat_many(s, {n: "busy" if n in busy else "idle" for n in names},
                                model, sm, target.name, backend, started=first[0])
        first[0] = False

    _loop(settings.heartbeat_s, beat, "heartbeat")
    pool = ["-P", "prefork", "-c", "1"] if slots <= 1 else ["-P", "threads", "-c", str(slots)]
    try:
        # prefork with one child: Celery's time limits apply, and a GPU is used by one task.
        _celery(["-Q", f"measure.{target.name}", *pool, "-n",
                 f"{name.replace('/', '-')}@{socket.gethostname()}"])
    finally:
        with session_scope(settings.db_url) as s:
            repo.heartbeat_many(s, dict.fromkeys(names, "stopped"), model, sm, target.name,
                                backend)
