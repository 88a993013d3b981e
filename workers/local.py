"""The embedded service's transport: the protocol's messages as local work.

Builds and measurements go to process pools that run the same task functions as the
fleet's Celery workers (one candidate per pool task, so that results land one at a time;
a measuring process per local GPU),
proposals to an explorer thread (or processes) of their own, so that measurements keep
flowing while a strategy thinks. It knows exactly what is on its way: its futures.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from store import repository as repo
from store.settings import Settings
from workers import tasks
from workers.backends import backend_for, local_gpu_target, local_gpus
from workers.backoff import Backoff
from workers.protocol import Open, Rounds, with_targets

log = logging.getLogger(__name__)

# --- child processes --------------------------------------------------------------------
_child_settings: Settings | None = None


# How often a pool child checks that the service that started it is still there.
PARENT_CHECK_S = 1.0


def _init_child(settings_json: str, parent_pid: int | None = None,
                log_level: int | None = None, gpu: str | None = None) -> None:
    global _child_settings
    if gpu is not None:  # before anything in this new process asks the driver for a device
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    _child_settings = Settings.model_validate_json(settings_json)
    if log_level is not None:  # the service's log lines (a proposal's) from its children too
        logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(message)s")
    if parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True,
                         name="parent-watch").start()


def _exit_with_parent(parent_pid: int) -> None:
    """A pool child blocks on its task queue even after the service is gone (SIGKILL, OOM):
    it would keep its GPU context and database connections forever. Exit once re-parented."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


def child_build(candidate_id: int, target: str) -> int:
    assert _child_settings is not None
    backend = backend_for(target, _child_settings)
    return tasks.build_many(_child_settings.db_url, [candidate_id], backend)


def child_measure(candidate_id: int, target: str) -> set[int]:
    """Measures one candidate; returns the jobs one of whose rounds it closed."""
    assert _child_settings is not None
    backend = backend_for(target, _child_settings)
    return tasks.measure_chunk(_child_settings.db_url, [candidate_id], backend,
                               worker_name(), _child_settings.lease_s).closed


def child_warm() -> str:
    """A measuring process readies its GPU before the first candidate: its measuring child
    (torch, CuPy, the CUDA context) takes over 10 s to start on an H200 host. Returns the
    GPU's name, or what it measures with instead."""
    assert _child_settings is not None
    target = None if _child_settings.backend == "simulated" else local_gpu_target()
    if target is None:
        return "the analytical model"
    backend = backend_for(target.name, _child_settings)
    return str(getattr(backend, "gpu_model", target.model))


def child_explore(rounds: Rounds, job_id: int) -> tasks.Proposal:
    assert _child_settings is not None
    return rounds.propose(_child_settings.db_url, job_id)


def worker_name() -> str:
    return f"embedded@{socket.gethostname()}"


def measure_gpus(settings: Settings) -> list[str | None]:
    """The GPU (a CUDA_VISIBLE_DEVICES value) of each measuring process: one process per
    local GPU of the local target's model unless `measure_processes` says how many (then
    they take the GPUs in turn); None for a process that measures through the model only."""
    gpus = [] if settings.backend == "simulated" else local_gpus()
    n = settings.measure_processes or max(1, len(gpus))
    if not gpus:
        return [None] * n
    if n > len(gpus):
        log.warning("%d measuring processes share %d GPUs: their timings disturb each other",
                    n, len(gpus))
    return [str(gpus[i % len(gpus)]) for i in range(n)]


# --- the transport ----------------------------------------------------------------------

@dataclass(frozen=True)
class Done:
    """A step that finished: `result` is the step's (a Proposal, a count, closed jobs), or
    `error` what it raised."""

    stage: str  # explore, build or measure
    job_id: int
    target: str
    candidate_ids: list[int]
    result: Any = None
    error: BaseException | None = None


class LocalTransport:
    """`protocol.Transport` and `protocol.InFlight` on local pools; `collect` hands back
    the steps that finished. What is on its way is counted per job: a job with nothing on
    its way and not paused (`backoff`, after a failed step) is what the sweep looks at."""

    def __init__(self, settings: Settings, rounds: Rounds) -> None:
        self.settings, self.rounds = settings, rounds
        self.backoff = Backoff()
        # build; measure0, measure1, ... (a process each, on its own GPU: measure_gpus); and
        # with `explore_processes` > 1 explore0, explore1, ...
        self._pools: dict[str, ProcessPoolExecutor] = {}
        self._gpu_of: dict[str, str | None] = {}  # measuring pool -> its GPU (asked at first use)
        self._measuring: dict[str, int] = {}  # measuring pool -> its candidates on their way
        # Proposals run here while the loop goes on feeding the pools: one at a time on a
        # thread, or with `explore_processes` > 1 one per process, a job always on the same
        # process (its strategy and model stay there between its rounds).
        self._explorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tctune-explore")
        # future -> (stage, its pool, job, target, candidate)
        self._meta: dict[Future[Any], tuple[str, str, int, str, int]] = {}
        self._exploring: dict[Future[Any], int] = {}  # explore future -> job id
        self._again: set[int] = set()  # jobs asked to explore while exploring
        self._inflight: dict[int, int] = {}  # job id -> its futures outstanding
        # candidate id -> job id, learnt from the proposals and lost lists this transport
        # made itself, for the candidates on their way
        self._job_of: dict[int, int] = {}

    # what is on its way
    def busy(self, job_id: int) -> bool:
        return job_id in self._inflight or job_id in self._exploring.values()

    def quiet(self) -> bool:
        """Nothing at all on its way."""
        return not self._meta and not self._exploring

    def working(self) -> bool:
        """Any build or measurement on its way (the heartbeat's busy)."""
        return bool(self._meta)

    def _idle(self, job_id: int) -> bool:
        return not self.busy(job_id) and self.backoff.ready(job_id)

    def explores_due(self, job_ids: Sequence[int]) -> list[int]:
        return [j for j in job_ids if self._idle(j)]

    def lost(self, session: Session, active: Collection[int]) -> list[Open]:
        """Every open candidate of a job with nothing on its way: a killed service's, or
        one whose step failed (after the job's pause). A lease does not hold them back:
        one under this service's worker name (a killed service's) is taken again by the
        pool child that measures, which has the same name."""
        idle = [j for j in active if self._idle(j)]
        lost = with_targets(session, repo.open_candidates(session, idle)) if idle else []
        self._job_of.update((c.id, c.job_id) for c in lost)
        return lost

    # sending
    def send_explore(self, job_id: int) -> None:
        if job_id in self._exploring.values():
            self._again.add(job_id)  # asked again once this one is done
            return
        n = self.settings.explore_processes
        if n <= 1:
            fut = self._explorer.submit(self.rounds.propose, self.settings.db_url, job_id)
        else:
            fut = self._submit_to(f"explore{job_id % n}", child_explore, self.rounds, job_id)
        self._exploring[fut] = job_id

    def send_build(self, target: str, candidate_ids: list[int]) -> None:
        for cid in candidate_ids:
            self._submit("build", cid, target)

    def send_measure(self, target: str, candidate_ids: list[int]) -> None:
        for cid in candidate_ids:
            self._submit("measure", cid, target)

    def warm(self) -> list[Future[Any]]:
        """Start every measuring process and its GPU now, not at the first candidate: a
        service's first job then waits for none of it."""
        self.measure_gpus()
        futures = [self._submit_to(pool, child_warm) for pool in self._gpu_of]
        for fut in futures:
            fut.add_done_callback(_log_warm)
        return futures

    def measure_gpus(self) -> list[str | None]:
        if not self._gpu_of:  # the driver asked once, in the dispatcher's thread
            self._gpu_of = {f"measure{i}": gpu
                            for i, gpu in enumerate(measure_gpus(self.settings))}
            self._measuring = dict.fromkeys(self._gpu_of, 0)
        return list(self._gpu_of.values())

    def _pool(self, name: str) -> ProcessPoolExecutor:
        if name not in self._pools:
            gpu = self._gpu_of.get(name)
            # spawn, not fork: this process runs threads (uvicorn, this dispatcher).
            self._pools[name] = ProcessPoolExecutor(
                max_workers=self.settings.build_processes if name == "build" else 1,
                mp_context=mp.get_context("spawn"), initializer=_init_child,
                initargs=(self.settings.model_dump_json(), os.getpid(),
                          logging.getLogger().getEffectiveLevel(), gpu))
        return self._pools[name]

    def _submit_to(self, pool: str, fn: Any, *args: Any) -> Future[Any]:
        """fn(*args) on the named pool; a pool broken by a dead child is replaced first."""
        try:
            return self._pool(pool).submit(fn, *args)
        except BrokenProcessPool:
            self._pools.pop(pool, None)
            return self._pool(pool).submit(fn, *args)

    def _submit(self, stage: str, candidate_id: int, target: str) -> None:
        job_id = self._job_of[candidate_id]
        if stage == "build":
            pool, fn = "build", child_build
        else:  # the measuring process (GPU) with the fewest candidates on their way
            self.measure_gpus()
            pool, fn = min(self._measuring, key=self._measuring.__getitem__), child_measure
            self._measuring[pool] += 1
        fut = self._submit_to(pool, fn, candidate_id, target)
        self._meta[fut] = (stage, pool, job_id, target, candidate_id)
        self._inflight[job_id] = self._inflight.get(job_id, 0) + 1

    # receiving
    def collect(self, timeout: float) -> list[Done]:
        """Wait up to `timeout` for steps to finish; the ones that did."""
        if self.quiet():
            time.sleep(timeout)
            return []
        finished, _ = wait([*self._meta, *self._exploring], timeout=timeout,
                           return_when=FIRST_COMPLETED)
        out = []
        for fut in finished:
            if fut in self._exploring:
                job_id = self._exploring.pop(fut)
                result, error = _outcome(fut)
                if isinstance(error, BrokenProcessPool):  # its process died: a new one
                    self._pools.pop(f"explore{job_id % self.settings.explore_processes}", None)
                if result is not None:
                    self._job_of.update(dict.fromkeys(result.ids, job_id))
                out.append(Done("explore", job_id, "", [], result, error))
                if job_id in self._again:
                    self._again.discard(job_id)
                    self.send_explore(job_id)
                continue
            stage, pool, job_id, target, cid = self._meta.pop(fut)
            self._inflight[job_id] -= 1
            if not self._inflight[job_id]:
                del self._inflight[job_id]
            if pool in self._measuring:
                self._measuring[pool] -= 1
            result, error = _outcome(fut)
            if isinstance(error, BrokenProcessPool):
                # A child died (killed, out of memory): a fresh pool retries the step; the
                # task functions skip what was already written.
                self._pools.pop(pool, None)
                self._submit(stage, cid, target)
                continue
            if stage == "measure" or error is not None:  # the end of its way
                self._job_of.pop(cid, None)
            out.append(Done(stage, job_id, target, [cid], result, error))
        return out

    def stop(self) -> None:
        self._explorer.shutdown(wait=False, cancel_futures=True)
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)


def _log_warm(fut: Future[Any]) -> None:
    result, error = _outcome(fut)
    if error is not None:  # measured again at the first candidate, which says why
        log.warning("a measuring process did not get ready: %r", error)
    else:
        log.info("a measuring process is ready: %s", result)


def _outcome(fut: Future[Any]) -> tuple[Any, BaseException | None]:
    error = fut.exception()
    return (None, error) if error is not None else (fut.result(), None)
