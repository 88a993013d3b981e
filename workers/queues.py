"""The fleet's transport: the protocol's messages on Celery queues.

Queues: `explore` (the explorer processes), `build` (CPU builders) and one measure queue
per target (`measure.h200`, `measure.t4`, ...), consumed by one worker process per GPU.
A message carries candidate ids only; the task bodies are in `workers.app`. What is on
its way the fleet infers (`QueueWatch`): a candidate sent lately, or held by a live lease,
or whose queue still has messages waiting, is not lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

from celery import Celery
from sqlalchemy.orm import Session

from store import repository as repo
from store.settings import Settings
from workers.protocol import Open, with_targets

EXPLORE_QUEUE = "explore"
BUILD_QUEUE = "build"

# Task names: how a message names its body (a process sends what it does not run).
EXPLORE_TASK = "tctune.explore"
BUILD_TASK = "tctune.build"
MEASURE_TASK = "tctune.measure"


def measure_queue(target: str) -> str:
    return f"measure.{target}"


class CeleryTransport:
    """One message per step. `retry=False`: a broker that is down fails the send at once
    instead of holding the caller (the API's notice of a new job: the sweeper starts the
    job anyway)."""

    def __init__(self, app: Celery, retry: bool = True) -> None:
        self.app, self.retry = app, retry
        self._local = threading.local()  # the producer of this thread's open `batch`

    def _send(self, name: str, args: tuple[object, ...], queue: str) -> None:
        self.app.send_task(name, args, queue=queue, retry=self.retry,
                           producer=getattr(self._local, "producer", None))

    @contextmanager
    def batch(self) -> Iterator[None]:
        """The messages sent inside go to the broker together when it closes (on Redis one
        pipelined round trip; a transport that cannot batch sends each at once); on an
        error inside, none of them. Why: a round's chunks went out one round trip each,
        and on a busy machine those waits were a sixth of the fleet explorer's time."""
        if getattr(self._local, "producer", None) is not None:  # nested: the outer one's
            yield
            return
        with self.app.producer_or_acquire() as producer, producer.batch():
            self._local.producer = producer
            try:
                yield
            finally:
                self._local.producer = None

    def send_explore(self, job_id: int) -> None:
        self._send(EXPLORE_TASK, (job_id,), EXPLORE_QUEUE)

    def send_build(self, target: str, candidate_ids: list[int]) -> None:
        self._send(BUILD_TASK, (candidate_ids, target), BUILD_QUEUE)

    def send_measure(self, target: str, candidate_ids: list[int]) -> None:
        self._send(MEASURE_TASK, (candidate_ids, target), measure_queue(target))


def queue_depths(app: Celery, queues: list[str]) -> dict[str, int]:
    """Messages waiting in each queue (0 for a queue the broker does not know)."""
    out: dict[str, int] = {}
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for q in queues:
            try:
                out[q] = int(channel.queue_declare(q, passive=True).message_count)
            except Exception:  # not declared yet: nothing is waiting in it
                out[q] = 0
    return out


class QueueWatch:
    """What the fleet's explorer knows of work on its way (`protocol.InFlight`).

    A job between rounds is usually on its way (its explore message sent by the task that
    closed its round); only one that stays so `redispatch_s`, or was never started, is
    explored from the sweep. A candidate is lost when it was not sent within
    `redispatch_s`, no live lease holds it, and its queue has drained (after a broker
    restart every queue is empty): one still waiting in a queue is not lost."""

    def __init__(self, settings: Settings, depths: Callable[[list[str]], dict[str, int]],
                 measure_unbuilt: bool) -> None:
        self.settings, self.depths = settings, depths
        self.measure_unbuilt = measure_unbuilt  # where pending ones are sent
        self._explored_at: dict[int, float] = {}  # job id -> monotonic time of the sweep's

    def explores_due(self, job_ids: Sequence[int]) -> list[int]:
        now = time.monotonic()
        due = [j for j in job_ids
               if now - self._explored_at.get(j, -1e18) >= self.settings.redispatch_s]
        self._explored_at.update(dict.fromkeys(due, now))
        return due

    def lost(self, session: Session, active: Collection[int]) -> list[Open]:
        stale = with_targets(session, repo.stale_candidates(session, self.settings.redispatch_s))
        if not stale:
            return []
        depth = self.depths([BUILD_QUEUE] + sorted({measure_queue(c.target) for c in stale}))
        return [c for c in stale if depth.get(self.queue_of(c), 0) == 0]

    def queue_of(self, cand: Open) -> str:
        if cand.state == "pending" and not self.measure_unbuilt:
            return BUILD_QUEUE
        return measure_queue(cand.target)
