"""The embedded dispatcher: the whole fleet in one machine, no broker.

A thread in the API process dispatches: it hands build and measure tasks to local process
pools that run the same task functions as the Celery workers, and proposals to an explorer
thread of their own, so that measurements keep flowing while a strategy thinks. Like the
fleet's explorer, a job has up to `rounds_in_flight` rounds open at once (the next proposed
while the current one is measured; `tasks.explore_round`), once its first round is
measured. All state lives in the database, so a killed service restarts where it stopped:
the explorer re-issues open candidates first and measurements are written once.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from store import repository as repo
from store.db import session_scope
from store.errors import UNAVAILABLE, unavailable_reason
from store.settings import Settings
from workers import tasks
from workers.backends import backend_for, local_gpu_target, served_targets

log = logging.getLogger(__name__)

# --- child processes --------------------------------------------------------------------
_child_settings: Settings | None = None


# How often a pool child checks that the service that started it is still there.
PARENT_CHECK_S = 1.0


def _init_child(settings_json: str, parent_pid: int | None = None) -> None:
    global _child_settings
    _child_settings = Settings.model_validate_json(settings_json)
    if parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True,
                         name="parent-watch").start()


def _exit_with_parent(parent_pid: int) -> None:
    """A pool child blocks on its task queue even after the service is gone (SIGKILL, OOM):
    it would keep its GPU context and database connections forever. Exit once re-parented."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def child_build(candidate_id: int) -> int:
    assert _child_settings is not None
    target = tasks.target_of(_child_settings.db_url, candidate_id)
    if not target:
        return 0
    backend = backend_for(target, _child_settings)
    return tasks.build_many(_child_settings.db_url, [candidate_id], backend)


def child_measure(candidate_id: int) -> int:
    assert _child_settings is not None
    target = tasks.target_of(_child_settings.db_url, candidate_id)
    if not target:
        return 0
    backend = backend_for(target, _child_settings)
    return tasks.measure_many(_child_settings.db_url, [candidate_id], backend, worker_name(),
                              _child_settings.lease_s)


def worker_name() -> str:
    return f"embedded@{socket.gethostname()}"


# --- the dispatcher ---------------------------------------------------------------------

class EmbeddedDispatcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tctune-dispatcher", daemon=True)
        self._pools: dict[str, ProcessPoolExecutor] = {}
        self._meta: dict[Future[Any], tuple[str, int, int]] = {}  # future -> (stage, cand, job)
        self._inflight: dict[int, int] = {}  # job id -> futures outstanding
        # Proposals run here, one at a time, while the loop goes on feeding the pools.
        self._explorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tctune-explore")
        self._exploring: dict[Future[Any], int] = {}  # explore future -> job id
        # job id -> its futures outstanding when its last proposal added nothing: asked
        # again only once one of them has finished (or none is left).
        self._waiting: dict[int, int] = {}
        self._last_beat = 0.0
        self._beaten = False  # the first heartbeat restarts the fleet page's start time
        # job id -> (monotonic time before which it is not re-explored, failures in a row)
        self._backoff: dict[int, tuple[float, int]] = {}

    # lifecycle
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self._explorer.shutdown(wait=False, cancel_futures=True)
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)

    def _pool(self, stage: str) -> ProcessPoolExecutor:
        if stage not in self._pools:
            n = self.settings.build_processes if stage == "build" \
                else self.settings.measure_processes
            # spawn, not fork: this process runs threads (uvicorn, this dispatcher).
            self._pools[stage] = ProcessPoolExecutor(
                max_workers=max(1, n), mp_context=mp.get_context("spawn"),
                initializer=_init_child,
                initargs=(self.settings.model_dump_json(), os.getpid()))
        return self._pools[stage]

    def _submit(self, stage: str, candidate_id: int, job_id: int) -> None:
        fn = child_build if stage == "build" else child_measure
        try:
            fut = self._pool(stage).submit(fn, candidate_id)
        except BrokenProcessPool:
            self._pools.pop(stage, None)
            fut = self._pool(stage).submit(fn, candidate_id)
        self._meta[fut] = (stage, candidate_id, job_id)
        self._inflight[job_id] = self._inflight.get(job_id, 0) + 1

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.settings.heartbeat_s:
            return
        self._last_beat = now
        gpu = local_gpu_target() if self.settings.backend != "simulated" else None
        with session_scope(self.settings.db_url) as s:
            for target in served_targets(self.settings):
                name = worker_name() + ("" if target == "*" else f"/{target}")
                backend = "simulated" if target == "*" else "cuda"
                model = gpu.model if (gpu and target != "*") else "analytical model"
                repo.heartbeat(s, name, model, gpu.sm if gpu and target != "*" else 0,
                               target, backend, state="busy" if self._meta else "idle",
                               started=not self._beaten)
        self._beaten = True

    def _explore_jobs(self) -> None:
        """Ask the explorer thread for the next round of each active job that may take one
        and is not being explored already."""
        with session_scope(self.settings.db_url) as s:
            job_ids = [j.id for j in repo.active_jobs(s)]
        busy = set(self._exploring.values())
        for job_id in job_ids:
            inflight = self._inflight.get(job_id, 0)
            if job_id in busy or self._backoff.get(job_id, (0.0, 0))[0] > time.monotonic() \
                    or (inflight and self._waiting.get(job_id) == inflight):
                continue
            self._exploring[self._explorer.submit(self._explore, job_id, not inflight)] = job_id

    def _explore(self, job_id: int, drained: bool) -> tasks.Proposal:
        """In the explorer thread. A job with nothing in flight here (`drained`) has no open
        candidate on its way: any open one (a failed step, a killed service's) is sent again."""
        if drained:
            with session_scope(self.settings.db_url) as s:
                repo.forget_dispatches(s, job_id)
        # A job's first round is measured before the next is proposed: short jobs (a whole
        # model at a few dozen trials a layer) would otherwise spend their budget blind.
        return tasks.explore_round(self.settings.db_url, job_id, self.settings.batch_size,
                                   self.settings.rounds_in_flight,
                                   pipeline_after=self.settings.batch_size)

    def _explored(self, fut: Future[Any]) -> None:
        job_id = self._exploring.pop(fut)
        try:
            ids = fut.result().ids
        except UNAVAILABLE as exc:  # the database, not the job: try again later
            log.warning("explore of job %s waits for the database: %s", job_id,
                        unavailable_reason(exc))
            self._back_off(job_id)
            return
        except Exception as exc:  # a broken job must not stop the others
            log.error("explore failed for job %s", job_id, exc_info=exc)
            with session_scope(self.settings.db_url) as s:
                job = repo.get_job(s, job_id)
                if job is not None:
                    repo.set_job_status(s, job, "failed", error=f"explorer: {exc}")
            return
        if ids:
            self._waiting.pop(job_id, None)
        else:
            self._waiting[job_id] = self._inflight.get(job_id, 0)
        for cid in ids:
            self._submit("build", cid, job_id)

    def _collect(self) -> None:
        if not self._meta and not self._exploring:
            self._stop.wait(0.2)
            return
        done, _ = wait([*self._meta, *self._exploring], timeout=0.2,
                       return_when=FIRST_COMPLETED)
        for fut in done:
            if fut in self._exploring:
                self._explored(fut)
                continue
            stage, cid, job_id = self._meta.pop(fut)
            self._inflight[job_id] -= 1
            if not self._inflight[job_id]:
                del self._inflight[job_id]
            exc = fut.exception()
            if isinstance(exc, BrokenProcessPool):
                # A child died (killed, out of memory): a fresh pool retries the step; the
                # task functions skip what was already written.
                self._pools.pop(stage, None)
                self._submit(stage, cid, job_id)
            elif exc is not None:
                # Left open: a later explore round re-issues it, after a growing pause.
                log.error("%s of candidate %s failed: %r", stage, cid, exc)
                self._back_off(job_id)
            elif stage == "build":
                self._submit("measure", cid, job_id)
            else:
                self._backoff.pop(job_id, None)

    def _back_off(self, job_id: int) -> None:
        """Leave the job alone for a pause that doubles with each failure in a row."""
        fails = self._backoff.get(job_id, (0.0, 0))[1] + 1
        self._backoff[job_id] = (time.monotonic() + min(60.0, 0.5 * 2**fails), fails)

    def _run(self) -> None:
        log.info("embedded dispatcher started (pid %s)", os.getpid())
        while not self._stop.is_set():
            try:
                self._heartbeat()
                self._explore_jobs()
                self._collect()
            except Exception:
                log.exception("dispatcher loop error; retrying")
                self._stop.wait(1.0)
