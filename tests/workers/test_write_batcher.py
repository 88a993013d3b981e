"""The per-process write batcher (group commit of several GPU slots' results).

What must hold: many slots finishing chunks at once through one batcher write every
measurement exactly once (measurements == budget, no duplicate schedule hash), each slot
learns which of its rounds it closed (every round's closing is seen by someone), fewer
transactions than groups are taken, and a failed transaction fails every slot in it
(each then retries its own message) without writing anything.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from sqlalchemy import select

from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import repository as repo
from store.db import session_scope
from store.models import BestSchedule, Candidate, Job, Measurement, Task
from workers import tasks
from workers.backends.simulated import SimulatedBackend
from workers.batcher import WriteBatcher
from workers.tasks import WriteGroup

H200 = TARGETS["h200"]


def _jobs(url: str, n: int, trials: int) -> list[int]:
    with session_scope(url) as s:
        # Two jobs per task: the same schedule may be proposed by both (one row per task).
        tasks_ = [repo.get_or_create_task(s, RESNET50_3X3[st], Precision.INT8, H200)
                  for st in ("stage2", "stage3")]
        return [repo.create_job(s, tasks_[j % 2], trials, "random", seed=j).id
                for j in range(n)]


def test_slots_through_one_batcher_write_each_result_once(db: str) -> None:
    backend = SimulatedBackend(H200, delay_s=0.002)
    jobs = _jobs(db, 4, 48)
    batcher = WriteBatcher(db)
    closed: Counter[int] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def slot(n: int, chunks: list[list[int]]) -> None:
        try:
            for ids in chunks:
                res = tasks.measure_chunk(db, ids, backend, f"node#{n}", 60, 0.005,
                                          writer=batcher)
                with lock:
                    closed.update(res.closed)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for _ in range(8):  # rounds of 16 until every budget is spent
        chunks = []
        for job_id in jobs:
            ids = tasks.explore_round(db, job_id, 16).ids
            chunks += [ids[i:i + 4] for i in range(0, len(ids), 4)]
        if not chunks:
            break
        # 8 slots, each with its share of the chunks, all writing at once.
        threads = [threading.Thread(target=slot, args=(n, chunks[n::8])) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    with session_scope(db) as s:
        rows = list(s.scalars(select(Measurement)))
        by_job = Counter(m.job_id for m in rows)
        statuses = {j.id: j.status for j in s.scalars(select(Job))}
        open_ = s.scalars(select(Candidate).where(Candidate.state != "done")).all()
    # Measured once per (task, schedule); a job's budget is kept (a schedule another job
    # of the task measured first still counts for the task, not twice).
    assert len(rows) == len({(m.task_id, m.schedule_hash) for m in rows})
    assert all(n <= 48 for n in by_job.values())
    assert sum(by_job.values()) == len(rows)
    assert not open_
    assert all(st == "done" for st in statuses.values()), statuses
    # Every round that closed was reported to a slot (the explorer's next round depends
    # on it): 3 rounds of 16 per job, at least.
    assert all(closed[j] >= 3 for j in jobs), closed
    assert batcher.groups >= batcher.transactions > 0


def test_a_failed_batch_fails_every_slot_in_it_and_writes_nothing(db: str) -> None:
    backend = SimulatedBackend(H200)
    job = _jobs(db, 1, 32)[0]
    ids = tasks.explore_round(db, job, 32).ids
    gate = threading.Event()
    calls: list[int] = []

    def failing(url: str, groups: Sequence[WriteGroup]) -> list[tuple[int, set[int]]]:
        gate.wait(5)  # hold the first transaction so that the others queue behind it
        calls.append(len(groups))
        raise ConnectionError("database went away")

    batcher = WriteBatcher(db, failing)
    failures: list[BaseException] = []

    def slot(part: list[int]) -> None:
        try:
            tasks.measure_chunk(db, part, backend, "node#x", 60, 10.0, writer=batcher)
        except ConnectionError as exc:
            failures.append(exc)

    threads = [threading.Thread(target=slot, args=(ids[i:i + 8],)) for i in range(0, 32, 8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert len(failures) == 4  # each slot raises: its task retries its message
    assert sum(calls) == 4
    with session_scope(db) as s:
        assert not s.scalars(select(Measurement)).all()
    # The retry (a redelivered message: own lease) writes each result once.
    good = WriteBatcher(db)
    written = sum(tasks.measure_chunk(db, ids[i:i + 8], backend, "node#x", 60, 10.0,
                                      writer=good).written for i in range(0, 32, 8))
    assert written == 32


def test_concurrent_writers_of_one_task_keep_its_fastest_as_best(db: str) -> None:
    """Writers in transactions of their own (processes of their own, in the fleet) that
    write results and baselines of one task at once: none fails (no deadlock between their
    locks), every candidate is measured, and the best is the fastest of all, whatever order
    their transactions commit in."""
    backend = SimulatedBackend(H200)
    jobs = _jobs(db, 4, 64)  # two jobs per task
    chunks = []
    for job_id in jobs:
        ids = tasks.explore_round(db, job_id, 64).ids
        chunks += [ids[i:i + 2] for i in range(0, len(ids), 2)]
    errors: list[BaseException] = []

    def slot(n: int) -> None:
        try:
            for ids in chunks[n::8]:  # each worker times the baselines it finds missing
                tasks.measure_chunk(db, ids, backend, f"w#{n}", 60, 10.0)
        except BaseException as e:  # noqa: BLE001 - reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=slot, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with session_scope(db) as s:
        assert {c.state for c in s.scalars(select(Candidate))} == {"done"}
        assert all(t.baseline_us for t in s.scalars(select(Task)))
        rows = list(s.scalars(select(Measurement)))
        for task_id in {m.task_id for m in rows}:
            fastest = min((m for m in rows if m.task_id == task_id and m.status == "ok"),
                          key=lambda m: (m.median_us, m.id))
            best = s.get(BestSchedule, task_id)
            assert best is not None and best.measurement_id == fastest.id


def test_groups_waiting_together_share_one_transaction(db: str) -> None:
    """While one transaction is being written, the groups that arrive wait and then go in
    one transaction together (batching on; with it off each would take its own)."""
    import time

    backend = SimulatedBackend(H200)
    job = _jobs(db, 1, 32)[0]
    ids = tasks.explore_round(db, job, 32).ids
    release = threading.Event()
    sizes: list[int] = []

    def held(url: str, groups: Sequence[WriteGroup]) -> list[tuple[int, set[int]]]:
        sizes.append(len(groups))
        if len(sizes) == 1:
            assert release.wait(60), "the test never released the first transaction"
        return tasks.write_groups(url, groups)

    batcher = WriteBatcher(db, held)
    threads = [threading.Thread(target=tasks.measure_chunk,
                                args=(db, ids[i:i + 8], backend, f"node#{i}", 60, 10.0),
                                kwargs={"writer": batcher}) for i in range(0, 32, 8)]
    threads[0].start()
    deadline = time.monotonic() + 60
    while not sizes:  # the first group's transaction has started
        assert time.monotonic() < deadline, "the first group never reached the batcher"
        time.sleep(0.01)
    for t in threads[1:]:
        t.start()
    while len(batcher._queue) < 3:  # the other three wait behind it
        assert time.monotonic() < deadline, f"{len(batcher._queue)} of 3 groups queued"
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(60)
    assert sizes == [1, 3] and batcher.transactions == 2 and batcher.groups == 4
    with session_scope(db) as s:
        assert len(s.scalars(select(Measurement)).all()) == 32
