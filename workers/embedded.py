"""The embedded dispatcher: the whole fleet in one machine, no broker.

A thread in the API process runs the dispatch protocol (`workers.protocol`) on the local
transport (`workers.local`): process pools that run the same task functions as the Celery
workers, and an explorer thread for proposals. Like the fleet, a job has up to
`rounds_in_flight` rounds open at once (the next proposed while the current one is
measured), once its first round is measured. All state lives in the database, so a killed
service restarts where it stopped: the sweep sends the open candidates of every job with
nothing on its way again, and measurements are written once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool

from store import repository as repo
from store.db import session_scope
from store.errors import UNAVAILABLE, unavailable_reason
from store.settings import Settings
from workers.backends import local_gpu_target, served_targets
from workers.heartbeat import Heartbeat, Workers
from workers.local import Done, LocalTransport, measure_gpus, worker_name
from workers.protocol import Dispatch, Rounds, Sweeper

log = logging.getLogger(__name__)

# How often the loop sweeps (new jobs, work to send again) and waits for a step at most.
SWEEP_S = 0.2


def embedded_workers(settings: Settings,
                     gpus: list[str | None] | None = None) -> list[Workers]:
    """The worker rows of what this service measures: one per measuring process on a local
    GPU of its model (`gpus`, the transport's; `name#i` where there are several), or one of
    the analytical model ('*': every target)."""
    gpu = local_gpu_target() if settings.backend != "simulated" else None
    out = []
    for target in served_targets(settings):
        name = worker_name() + ("" if target == "*" else f"/{target}")
        if target == "*" or gpu is None:
            out.append(Workers((name,), "analytical model", 0, target, "simulated"))
            continue
        gpus = measure_gpus(settings) if gpus is None else gpus
        names = (name,) if len(gpus) == 1 else tuple(f"{name}#{i}" for i in range(len(gpus)))
        out.append(Workers(names, gpu.model, gpu.sm, target, "cuda"))
    return out


class EmbeddedDispatcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tctune-dispatcher", daemon=True)
        self.transport = LocalTransport(settings, Rounds.embedded(settings))
        self.dispatch = Dispatch(settings, self.transport, self.transport.rounds)
        self.sweeper = Sweeper(self.dispatch, self.transport)
        self._heartbeat: Heartbeat | None = None
        self._swept = 0.0

    # lifecycle
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self.transport.stop()

    def _beat(self) -> None:
        if self._heartbeat is None:  # which GPU is here is asked in the dispatcher's thread
            workers = embedded_workers(self.settings, self.transport.measure_gpus())
            names = {n for w in workers for n in w.names}
            self._heartbeat = Heartbeat(self.settings.db_url, self.settings.heartbeat_s, workers,
                                        lambda _: names if self.transport.working() else ())
        self._heartbeat.beat_if_due()

    def _sweep(self) -> None:
        if time.monotonic() - self._swept >= SWEEP_S:
            self._swept = time.monotonic()
            self.sweeper.sweep()

    def _handle(self, done: Done) -> None:
        if done.error is not None:
            self._failed(done)
        elif done.stage == "explore":
            self.dispatch.explored(done.job_id, done.result)
        elif done.stage == "build":
            self.dispatch.built(done.target, done.candidate_ids)
        else:
            self.transport.backoff.succeeded(done.job_id)
            self.dispatch.measured(done.result)

    def _failed(self, done: Done) -> None:
        exc = done.error
        assert exc is not None
        if done.stage != "explore":
            # Left open: the sweep sends it again once the job has nothing on its way and
            # its pause (growing with each failure in a row) is over.
            log.error("%s of candidate %s failed: %r", done.stage, done.candidate_ids[0], exc)
            self.transport.backoff.failed(done.job_id)
        elif isinstance(exc, UNAVAILABLE):  # the database, not the job: try again later
            log.warning("explore of job %s waits for the database: %s", done.job_id,
                        unavailable_reason(exc))
            self.transport.backoff.failed(done.job_id)
        elif isinstance(exc, BrokenProcessPool):
            # Its explorer process died (killed, out of memory) and a fresh one replaces it:
            # asked again after the job's pause, which grows should the proposal itself be
            # what kills it.
            log.warning("explore of job %s lost its explorer process; asking again", done.job_id)
            self.transport.backoff.failed(done.job_id)
        else:  # a broken job must not stop the others
            log.error("explore failed for job %s", done.job_id, exc_info=exc)
            with session_scope(self.settings.db_url) as s:
                job = repo.get_job(s, done.job_id)
                if job is not None:
                    repo.set_job_status(s, job, "failed", error=f"explorer: {exc}")

    def _run(self) -> None:
        log.info("embedded dispatcher started (pid %s)", os.getpid())
        try:
            self.transport.warm()
        except Exception:  # the first candidate starts them instead
            log.exception("could not start the measuring processes ahead")
        while not self._stop.is_set():
            try:
                self._beat()
                self._sweep()
                for done in self.transport.collect(SWEEP_S):
                    self._handle(done)
            except Exception:
                log.exception("dispatcher loop error; retrying")
                self._stop.wait(1.0)
