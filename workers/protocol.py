"""The dispatch protocol: what follows each step of a job, once for both transports.

A job moves by messages: explore (propose a round of candidates) -> build (chunks of them,
CPU) -> measure (chunks, on a GPU of the target) -> explore again once a measurement closes
a round (or at once while the job may have another round in flight). `Dispatch` decides
what to send after each step; a `Transport` carries it: Celery queues for the fleet
(`workers.queues`), local process pools and an explorer thread for the embedded service
(`workers.local`). The database is the source of truth: every step re-reads its input and
writes its result once, so a message that arrives twice does nothing twice.

What no message brings about is the `Sweeper`'s: a job that needs a round and has none on
its way (a new job, a lost explore message), candidates whose message was lost (a broker
restart, a killed process, a step that gave up) and the leases of dead workers. Which
work is on its way only the transport can tell (`InFlight`): the embedded one knows its
futures; the fleet infers it from the database and the broker's queues.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session

from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from store.models import Candidate
from store.settings import Settings
from workers import tasks
from workers.heartbeat import dead_after_s

log = logging.getLogger(__name__)


class Transport(Protocol):
    """Carries the protocol's messages to whoever runs the step (workers.tasks)."""

    def send_explore(self, job_id: int) -> None: ...

    def send_build(self, target: str, candidate_ids: list[int]) -> None: ...

    def send_measure(self, target: str, candidate_ids: list[int]) -> None: ...

    # Optional: `batch()`, a context whose sends go out together (`CeleryTransport.batch`).


@dataclass(frozen=True)
class Open:
    """An open candidate, as the sweeper re-sends it."""

    id: int
    job_id: int
    state: str  # pending (to build) or built (to measure)
    target: str


class InFlight(Protocol):
    """What a transport knows of the work on its way; the sweeper sends the rest again."""

    def explores_due(self, job_ids: Sequence[int]) -> list[int]:
        """Of these jobs (active, with fewer rounds open than allowed), those to explore now
        (nothing on its way will); they count as explored from here."""
        ...

    def lost(self, session: Session, active: Collection[int]) -> list[Open]:
        """Open candidates of the `active` jobs whose message is gone."""
        ...


def chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    return [list(ids[i:i + size]) for i in range(0, len(ids), max(1, size))]


def with_targets(session: Session, candidates: Iterable[Candidate]) -> list[Open]:
    """Candidates with the target of their task (the queue they go to)."""
    cands = list(candidates)
    targets = {t.id: t.target for t in
               (repo.get_task(session, tid) for tid in {c.task_id for c in cands}) if t}
    return [Open(c.id, c.job_id, c.state, targets[c.task_id]) for c in cands
            if c.task_id in targets]


@dataclass(frozen=True)
class Rounds:
    """How a job's rounds are proposed (the knobs of `tasks.explore_round`)."""

    batch_size: int
    rounds_in_flight: int
    prior_refresh_s: float = 0.0
    max_round: int = 0
    alive_s: float = 20.0
    pipeline_after: int = 0
    chunk: int = 1  # candidates per measure message: what an idle GPU takes at once
    job_rounds: int = 0  # a job's budget in at least this many rounds (0: no pacing)

    @classmethod
    def fleet(cls, settings: Settings) -> Rounds:
        # Rounds grow while GPUs wait (max_round); the prior is reused for a while, since
        # hundreds of workers write all the time.
        return cls(settings.batch_size, settings.rounds_in_flight, settings.prior_refresh_s,
                   settings.max_round, dead_after_s(settings), chunk=settings.chunk_size)

    @classmethod
    def embedded(cls, settings: Settings) -> Rounds:
        # A job's first round is measured before the next is proposed: short jobs (a whole
        # model at a few dozen trials a layer) would otherwise spend their budget blind.
        # A short job's budget goes out over several rounds (`job_rounds`), each seeded by
        # the bests the model's other layers have found by then.
        return cls(settings.batch_size, settings.rounds_in_flight,
                   pipeline_after=settings.batch_size, job_rounds=settings.job_rounds)

    def propose(self, db_url: str, job_id: int) -> tasks.Proposal:
        return tasks.explore_round(db_url, job_id, self.batch_size, self.rounds_in_flight,
                                   self.prior_refresh_s, self.max_round, self.alive_s,
                                   self.pipeline_after, self.chunk, self.job_rounds)


@dataclass(frozen=True)
class Dispatch:
    """The protocol's steps for one deployment, sending through `transport`.

    `measure_unbuilt`: candidates go straight to measurement, where the fleet measures
    with the analytical model: its "build" is only a validity check, which the measuring
    worker makes itself for a candidate nobody built (as for a cubin it lacks), so the
    hop would cost a message, a transaction and a process switch for nothing."""

    settings: Settings
    transport: Transport
    rounds: Rounds
    measure_unbuilt: bool = False

    @classmethod
    def fleet(cls, settings: Settings, transport: Transport) -> Dispatch:
        return cls(settings, transport, Rounds.fleet(settings),
                   measure_unbuilt=settings.backend == "simulated")

    def explore(self, job_id: int) -> int:
        """Propose the job's next round and send it on; returns how many were sent."""
        prop = self.rounds.propose(self.settings.db_url, job_id)
        self.explored(job_id, prop)
        return len(prop.ids)

    def explored(self, job_id: int, prop: tasks.Proposal) -> None:
        if prop.ids and prop.target:
            self.send(prop.ids, prop.target)
        if prop.more:  # pipelining: the next round is proposed while this one is measured
            self.transport.send_explore(job_id)

    def send(self, candidate_ids: Sequence[int], target: str) -> None:
        """Unbuilt candidates on their way: a build message per chunk (a round's NVRTC
        builds then run on as many builders at once as it has chunks), or a measure
        message per chunk (`measure_unbuilt`); all of them in one batch where the
        transport batches."""
        with self._batch():
            for chunk in chunks(candidate_ids, self.settings.chunk_size):
                if self.measure_unbuilt:
                    self.transport.send_measure(target, chunk)
                else:
                    self.transport.send_build(target, chunk)

    def built(self, target: str, candidate_ids: Sequence[int]) -> None:
        with self._batch():
            for chunk in chunks(candidate_ids, self.settings.chunk_size):
                self.transport.send_measure(target, chunk)

    def _batch(self) -> AbstractContextManager[None]:
        batch = getattr(self.transport, "batch", None)
        return nullcontext() if batch is None else batch()  # type: ignore[no-any-return]

    def measured(self, closed: Iterable[int]) -> None:
        """The result that closes a round starts the job's next one."""
        for job_id in sorted(closed):
            self.transport.send_explore(job_id)

    def resend(self, candidates: Sequence[Open]) -> None:
        """Candidates whose message was lost, sent again as first sent: a message per chunk
        of one job's candidates in one step."""
        groups: dict[tuple[int, str, str], list[int]] = {}
        for c in candidates:
            groups.setdefault((c.job_id, c.state, c.target), []).append(c.id)
        for (_, state, target), ids in groups.items():
            if state == "pending":
                self.send(ids, target)
            else:
                self.built(target, ids)


@dataclass(frozen=True)
class Swept:
    explores: int  # explore messages sent
    resent: int  # candidates sent again (unbuilt ones too: each is a candidate sent again)
    freed: int  # leases of dead workers freed


class Sweeper:
    """The protocol's periodic step (see the module's doc). `free_dead_leases`: workers in
    other processes may die (the fleet); a worker whose heartbeat is 4 periods late is
    dead, and its leases are freed at once instead of after `lease_s`."""

    def __init__(self, dispatch: Dispatch, in_flight: InFlight,
                 free_dead_leases: bool = False) -> None:
        self.dispatch, self.in_flight = dispatch, in_flight
        self.free_dead_leases = free_dead_leases

    def sweep(self) -> Swept:
        settings = self.dispatch.settings
        freed = 0
        with session_scope(settings.db_url) as s:
            if self.free_dead_leases:
                freed = repo.release_dead_leases(s, dead_after_s(settings))
                if freed:
                    log.warning("freed %d candidates leased by workers without a heartbeat",
                                freed)
            rounds = hp.open_rounds_per_job(s)  # active job -> rounds open; one query
            lost = self.in_flight.lost(s, rounds)
            self.dispatch.resend(lost)
            repo.mark_dispatched(s, [c.id for c in lost])
            want = [j for j, n in rounds.items() if n < max(1, settings.rounds_in_flight)]
            due = self.in_flight.explores_due(want)
            for job_id in due:
                self.dispatch.transport.send_explore(job_id)
        if lost:
            log.warning("re-sent %d candidates whose messages were lost", len(lost))
        return Swept(len(due), len(lost), freed)
