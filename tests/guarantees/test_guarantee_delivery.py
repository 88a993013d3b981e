"""Guarantees of the fleet's delivery, in-process against SQLite and PostgreSQL:

- each candidate is measured at most once on a GPU: a redelivered or re-sent message, and
  a candidate leased by a worker that crashed, are not measured again while its lease
  holds, and never once its result is stored (counted at the backend, not in the table,
  whose unique key would hide a second measurement);
- a lost candidate (a broker restart, a worker killed holding it) is re-sent by the
  sweeper once its queue has drained and its lease expired, and the sweeper's count says
  how many it re-sent;
- a candidate whose workers died MAX_ATTEMPTS (3, the README's number) times is stored as
  runtime_error without being measured again.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from kernels.space import schedule_hash
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from store.models import Candidate, Job, Measurement, utcnow
from store.settings import Settings
from workers import tasks
from workers.backends.base import BuildOutcome, MeasureOutcome, TaskSpec
from workers.backends.simulated import SimulatedBackend
from workers.protocol import Dispatch, Sweeper
from workers.queues import QueueWatch

pytestmark = pytest.mark.guarantee

H200 = TARGETS["h200"]
SHAPE = RESNET50_3X3["stage3"]


class CountingBackend(SimulatedBackend):
    """Counts measurements per schedule: what ran on the "GPU", whatever got stored."""

    def __init__(self) -> None:
        super().__init__(H200)
        self.calls: Counter[str] = Counter()

    def measure(self, task: TaskSpec, schedule: dict[str, Any],
                build: BuildOutcome) -> MeasureOutcome:
        self.calls[schedule_hash(schedule)] += 1
        return super().measure(task, schedule, build)


def _job(url: str, trials: int) -> int:
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, SHAPE, Precision.INT8, H200)
        return repo.create_job(s, task, trials, "random", 0).id


def _crash_holding(url: str, ids: list[int], worker: str) -> None:
    """A worker takes the lease of `ids` and dies before writing anything."""
    with session_scope(url) as s:
        rows, _ = hp.lease_chunk(s, ids, worker, 60)
    assert sorted(r.id for r in rows) == sorted(ids)


def _expire_leases(url: str, ids: list[int]) -> None:
    """Time passes: the leases of `ids` run out (set in the past, no sleeping)."""
    with session_scope(url) as s:
        s.execute(update(Candidate).where(Candidate.id.in_(ids))
                  .values(lease_expires_at=utcnow() - timedelta(seconds=1))
                  .execution_options(synchronize_session=False))


def _measurements(url: str, job_id: int) -> list[Measurement]:
    with session_scope(url) as s:
        return list(s.scalars(select(Measurement).where(Measurement.job_id == job_id)))


def test_redelivered_and_crashed_chunks_are_measured_at_most_once(db: str) -> None:
    backend = CountingBackend()
    job_id = _job(db, 16)
    ids = tasks.explore_round(db, job_id, 16).ids
    assert len(ids) == 16
    first, second = ids[:8], ids[8:]
    # Worker A measures and commits the first half; the same message comes again (a
    # redelivery after A's ack was lost) to A and to B: nothing is measured twice.
    assert tasks.measure_chunk(db, first, backend, "A", 60).written == 8
    assert tasks.measure_chunk(db, first, backend, "A", 60).written == 0
    assert tasks.measure_chunk(db, first, backend, "B", 60).written == 0
    # Worker C takes the second half and crashes: while its lease holds, the requeued
    # message measures nothing; once it expired, B measures each candidate once.
    _crash_holding(db, second, "C")
    assert tasks.measure_chunk(db, second, backend, "B", 60).written == 0
    _expire_leases(db, second)
    assert tasks.measure_chunk(db, second, backend, "B", 60).written == 8
    # The sweeper's re-send arriving late (the broker restarted meanwhile): nothing more.
    assert tasks.measure_chunk(db, ids, backend, "D", 60).written == 0
    rows = _measurements(db, job_id)
    assert len(rows) == 16
    assert set(backend.calls) == {m.schedule_hash for m in rows}
    twice = {h: n for h, n in backend.calls.items() if n > 1}
    assert not twice, f"measured more than once on the GPU: {twice}"


class Recorded:
    """The broker stood in for (`protocol.Transport`): the candidate ids sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_explore(self, job_id: int) -> None:
        pass

    def send_build(self, target: str, candidate_ids: list[int]) -> None:
        self.sent.extend(candidate_ids)

    def send_measure(self, target: str, candidate_ids: list[int]) -> None:
        self.sent.extend(candidate_ids)


def _sweep(db: str, depth: int = 0, redispatch_s: float = 60.0) -> tuple[int, int, list[int]]:
    """One sweep of the fleet's sweeper, with the broker stood in for and its queues
    `depth` deep: (explores, re-sent count, ids sent)."""
    settings = Settings(database_url=db, backend="simulated", redispatch_s=redispatch_s,
                        chunk_size=4)
    sent = Recorded()
    dispatch = Dispatch.fleet(settings, sent)
    watch = QueueWatch(settings, lambda queues: dict.fromkeys(queues, depth),
                       dispatch.measure_unbuilt)
    swept = Sweeper(dispatch, watch, free_dead_leases=True).sweep()
    return swept.explores, swept.resent, sorted(sent.sent)


def _age_dispatch(db: str, ids: list[int], seconds: float) -> None:
    with session_scope(db) as s:
        s.execute(update(Candidate).where(Candidate.id.in_(ids))
                  .values(dispatched_at=utcnow() - timedelta(seconds=seconds))
                  .execution_options(synchronize_session=False))


def test_lost_candidates_are_re_sent_counted_and_measured_once(db: str) -> None:
    backend = CountingBackend()
    job_id = _job(db, 12)
    ids = tasks.explore_round(db, job_id, 12).ids
    built, unbuilt, held = ids[:4], ids[4:8], ids[8:]
    tasks.build_many(db, built, backend)
    _crash_holding(db, held, "C")  # C took these and died
    # Just sent: not lost yet.
    assert _sweep(db)[1:] == (0, [])
    # The broker restarted long ago and lost every message: sent too long ago.
    _age_dispatch(db, ids, 3600)
    # Messages still waiting in their queues are not lost: nothing re-sent.
    assert _sweep(db, depth=3)[1:] == (0, [])
    # Queues drained: the built and the unbuilt ones are re-sent, each once, and counted;
    # C's are not while its lease holds.
    _, resent, sent = _sweep(db)
    assert sent == sorted(built + unbuilt) and resent == 8
    assert _sweep(db)[1:] == (0, []), "re-sent ones are fresh again"
    # C's lease runs out: those are lost too, and re-sent after the redispatch period.
    _expire_leases(db, held)
    _age_dispatch(db, ids, 3600)
    _, resent, sent = _sweep(db)
    assert sent == sorted(ids) and resent == 12  # the first 8 were never measured either
    for i in range(0, len(sent), 4):  # the re-sent messages arrive, some twice
        tasks.measure_chunk(db, sent[i:i + 4], backend, "B", 60)
        tasks.measure_chunk(db, sent[i:i + 4], backend, "D", 60)
    assert len(_measurements(db, job_id)) == 12
    assert sum(backend.calls.values()) == 12, backend.calls
    assert _sweep(db)[1:] == (0, []), "nothing open is left to re-send"


def test_a_candidate_is_given_up_after_max_attempts(db: str) -> None:
    assert tasks.MAX_ATTEMPTS == 3, "the README documents 3 attempts"
    backend = CountingBackend()
    job_id = _job(db, 2)
    doomed, lucky = tasks.explore_round(db, job_id, 2).ids
    for worker in ("w1", "w2", "w3"):  # each worker dies measuring `doomed`
        _crash_holding(db, [doomed], worker)
        _expire_leases(db, [doomed])
    for worker in ("w1", "w2"):  # `lucky` two times only
        _crash_holding(db, [lucky], worker)
        _expire_leases(db, [lucky])
    assert tasks.measure_chunk(db, [doomed, lucky], backend, "w4", 60).written == 2
    rows = {m.schedule_hash: m for m in _measurements(db, job_id)}
    with session_scope(db) as s:
        hashes = {c.id: c.schedule_hash for c in s.scalars(select(Candidate))}
    gave_up = rows[hashes[doomed]]
    assert gave_up.status == "runtime_error" and gave_up.median_us is None
    assert "gave up after 3 attempts" in (gave_up.error or "")
    assert backend.calls[hashes[doomed]] == 0, "a given-up candidate is not measured again"
    assert rows[hashes[lucky]].status == "ok" and backend.calls[hashes[lucky]] == 1


def test_a_schedule_measured_for_the_task_is_not_measured_for_another_job(db: str) -> None:
    """Two jobs of one task propose the same schedules: one measurement per schedule."""
    backend = CountingBackend()
    first, second = _job(db, 8), _job(db, 8)
    ids = tasks.explore_round(db, first, 8).ids
    with session_scope(db) as s:
        scheds = [c.schedule for c in s.scalars(select(Candidate).where(Candidate.id.in_(ids)))]
        task_id = s.get(Job, first).task_id  # type: ignore[union-attr]
        assert s.get(Job, second).task_id == task_id  # type: ignore[union-attr]
        again = hp.add_candidates(s, second, task_id, scheds, 1, [None] * len(scheds),
                                  dispatched=True)
    assert tasks.measure_chunk(db, ids, backend, "A", 60).written == 8
    assert tasks.measure_chunk(db, again, backend, "B", 60).written == 0
    assert sum(backend.calls.values()) == 8, backend.calls
    with session_scope(db) as s:
        assert all(c.state == "done" for c in
                   s.scalars(select(Candidate).where(Candidate.id.in_(again))))


class SlowBackend(CountingBackend):
    """A busy host: each measurement takes `seconds`; `during(n)` runs inside the n-th."""

    def __init__(self, seconds: float, during: dict[int, Any]) -> None:
        super().__init__()
        self.seconds, self.during = seconds, during

    def measure(self, task: TaskSpec, schedule: dict[str, Any],
                build: BuildOutcome) -> MeasureOutcome:
        import time

        n = sum(self.calls.values()) + 1
        out = super().measure(task, schedule, build)
        time.sleep(self.seconds)
        if n in self.during:
            self.during[n]()
        return out


def test_one_measurement_longer_than_the_lease_keeps_its_chunk(db: str) -> None:
    # The first measurement alone takes three leases (a loaded host): the lease keeper
    # renews it meanwhile, so B, handed the chunk after the first lease would have run out,
    # takes none of it; A measures each candidate once.
    job_id = _job(db, 3)
    ids = tasks.explore_round(db, job_id, 3).ids
    other = CountingBackend()
    taken: list[int] = []
    slow = SlowBackend(1.8, {1: lambda: taken.append(
        tasks.measure_chunk(db, ids, other, "B", 0.6).written)})
    assert tasks.measure_chunk(db, ids, slow, "A", 0.6, flush_s=100).written == 3
    assert taken == [0] and not other.calls
    assert len(_measurements(db, job_id)) == 3


def test_a_slow_worker_keeps_its_lease_and_a_stalled_one_skips_what_was_taken(
        db: str) -> None:
    # A chunk that outlasts its lease (6 x 0.5 s against 1.2 s) on a live worker: its lease
    # is renewed as it goes, so the sweeper's re-send of its message, delivered to B after
    # the first lease would have run out, measures nothing.
    job_id = _job(db, 12)
    ids = tasks.explore_round(db, job_id, 12).ids
    first, second = ids[:6], ids[6:]
    other = CountingBackend()
    taken: list[int] = []
    slow = SlowBackend(0.5, {4: lambda: taken.append(
        tasks.measure_chunk(db, first, other, "B", 1.2, flush_s=100).written)})
    assert tasks.measure_chunk(db, first, slow, "A", 1.2, flush_s=100).written == 6
    assert taken == [0] and not other.calls
    # A worker that stalls past its lease (its host froze while it measured the first
    # candidate): B takes the rest and measures it; A, going on, measures none of it.
    def stall() -> None:
        _expire_leases(db, second[1:])
        taken.append(tasks.measure_chunk(db, second[1:], other, "B", 60).written)

    stalled = SlowBackend(0.0, {1: stall})
    assert tasks.measure_chunk(db, second, stalled, "A", 0.0, flush_s=0).written == 1
    assert taken[-1] == 5
    rows = _measurements(db, job_id)
    assert len(rows) == 12
    both = slow.calls + other.calls + stalled.calls
    twice = {h: n for h, n in both.items() if n > 1}
    assert not twice, f"measured more than once on the GPU: {twice}"
