"""The fleet's hot path and pipelined explorer, in-process against real databases.

What must hold however the work is split: a redelivered chunk writes nothing twice, a
lease keeps a chunk to one worker until it expires, pipelined rounds never exceed the
budget nor propose a schedule twice, and two explorers racing for one job (the row lock)
never put more than the allowed rounds in flight.
"""

from __future__ import annotations

import threading
from collections import Counter

from sqlalchemy import func, select

from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import hotpath as hp
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import BestSchedule, Candidate, Job, Measurement
from workers import history, tasks
from workers.backends.simulated import SimulatedBackend

H200 = TARGETS["h200"]
SHAPE = RESNET50_3X3["stage3"]


def _job(url: str, trials: int, strategy: str = "random", seed: int = 0) -> int:
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, SHAPE, Precision.INT8, H200)
        return repo.create_job(s, task, trials, strategy, seed).id


def _measured(url: str, job_id: int) -> list[Measurement]:
    with session_scope(url) as s:
        return list(s.scalars(select(Measurement).where(Measurement.job_id == job_id)))


def _run_round(url: str, ids: list[int], backend: SimulatedBackend, chunk: int = 8) -> set[int]:
    tasks.build_many(url, ids, backend)
    closed: set[int] = set()
    for i in range(0, len(ids), chunk):
        closed |= tasks.measure_chunk(url, ids[i:i + chunk], backend, "w#0", 60).closed
    return closed


def test_a_redelivered_chunk_writes_nothing_twice(db: str) -> None:
    backend = SimulatedBackend(H200)
    job_id = _job(db, 16)
    ids = tasks.explore_round(db, job_id, 16).ids
    tasks.build_many(db, ids, backend)
    assert tasks.measure_chunk(db, ids[:8], backend, "w#0", 60).written == 8
    # The same message again (a redelivery), and the chunk with the rest of the round:
    # only the rest is written.
    assert tasks.measure_chunk(db, ids[:8], backend, "w#0", 60).written == 0
    res = tasks.measure_chunk(db, ids, backend, "w#1", 60)
    assert res.written == 8 and res.closed == {job_id}
    rows = _measured(db, job_id)
    assert len(rows) == 16 == len({m.schedule_hash for m in rows})
    with session_scope(db) as s:
        best = s.get(BestSchedule, rows[0].task_id)
        assert best is not None
        fastest = min((m for m in rows if m.status == "ok"), key=lambda m: (m.median_us, m.id))
        assert best.measurement_id == fastest.id
        job = s.get(Job, job_id)
        assert job is not None and job.status == "done"


def test_a_lease_keeps_a_chunk_to_its_worker_until_it_expires(db: str) -> None:
    job_id = _job(db, 8)
    ids = tasks.explore_round(db, job_id, 8).ids
    with session_scope(db) as s:
        mine, rounds = hp.lease_chunk(s, ids, "a", 60)
        assert [r.id for r in mine] == ids and rounds == {(job_id, 1)}
    with session_scope(db) as s:
        assert hp.lease_chunk(s, ids, "b", 60)[0] == []  # held by a
        assert len(hp.lease_chunk(s, ids, "a", 60)[0]) == 8  # a may take it again
    with session_scope(db) as s:
        hp.lease_chunk(s, ids[:4], "a", -1)  # a's lease on four of them has expired
    with session_scope(db) as s:
        taken, _ = hp.lease_chunk(s, ids, "b", 60)
        assert [r.id for r in taken] == ids[:4]
        assert all(r.attempts == 3 for r in taken)  # a took them three times


def test_pipelined_rounds_keep_the_budget_and_never_repeat(db: str) -> None:
    backend = SimulatedBackend(H200)
    job_id = _job(db, 100)
    first = tasks.explore_round(db, job_id, 16, rounds_in_flight=2)
    assert len(first.ids) == 16 and first.more
    second = tasks.explore_round(db, job_id, 16, rounds_in_flight=2)
    assert len(second.ids) == 16 and not second.more
    # Two rounds open: a third explore proposes nothing.
    assert tasks.explore_round(db, job_id, 16, rounds_in_flight=2).ids == []
    queue = [first.ids, second.ids]
    rounds = 2
    while queue:
        ids = queue.pop(0)
        closed = _run_round(db, ids, backend)
        assert closed == {job_id} or not closed
        prop = tasks.explore_round(db, job_id, 16, rounds_in_flight=2)
        if prop.ids:
            rounds += 1
            queue.append(prop.ids)
    rows = _measured(db, job_id)
    assert len(rows) == 100 == len({m.schedule_hash for m in rows})
    with session_scope(db) as s:
        cands = list(s.scalars(select(Candidate).where(Candidate.job_id == job_id)))
        job = s.get(Job, job_id)
    assert len(cands) == 100 and rounds == 7  # 6 x 16 + 4: never proposed past the budget
    assert job is not None and job.status == "done"


def test_racing_explorers_never_exceed_the_rounds_in_flight(pg_url: str) -> None:
    """Many explore calls at once for one job (messages from round closes, the sweeper and
    several explorer processes): the row lock serializes them."""
    migrate.upgrade(pg_url)
    job_id = _job(pg_url, 1000)
    results: list[list[int]] = []

    def call() -> None:
        results.append(tasks.explore_round(pg_url, job_id, 32, rounds_in_flight=2).ids)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with session_scope(pg_url) as s:
        per_round = Counter(s.scalars(select(Candidate.round)
                                      .where(Candidate.job_id == job_id)))
        hashes = list(s.scalars(select(Candidate.schedule_hash)
                                .where(Candidate.job_id == job_id)))
    assert per_round == {1: 32, 2: 32}
    assert len(set(hashes)) == 64
    handed = [i for ids in results for i in ids]
    assert len(handed) == len(set(handed)) == 64  # each candidate dispatched once


def test_trials_cache_sees_a_row_committed_late(db: str) -> None:
    """Ids are not commit order: a row with a lower id than one already read must still
    reach the strategy's history."""
    space = ScheduleSpace(SHAPE, Precision.INT8, H200)
    job_id = _job(db, 10)
    with session_scope(db) as s:
        task_id = s.scalar(select(Job.task_id).where(Job.id == job_id))
        scheds = space.schedules(space.valid_indices[:3])
        row = {"task_id": task_id, "job_id": job_id, "status": "ok", "backend": "simulated"}
        hp.record_results(s, [{**row, "schedule": scheds[1],
                               "schedule_hash": schedule_hash(scheds[1]),
                               "median_us": 2.0, "id": 20}])
    with session_scope(db) as s:
        assert len(history.trials_of(s, db, task_id, space)) == 1
    with session_scope(db) as s:  # committed now, with an id below the one already read
        hp.record_results(s, [{**row, "schedule": scheds[0],
                               "schedule_hash": schedule_hash(scheds[0]),
                               "median_us": 1.0, "id": 10}])
    with session_scope(db) as s:
        trials = history.trials_of(s, db, task_id, space)
        assert [t.index for t in trials] == [int(i) for i in space.valid_indices[:2]]
        assert s.scalar(select(func.count(Measurement.id))) == 2


def test_a_job_pipelines_only_once_its_first_round_is_measured(db: str) -> None:
    """pipeline_after (the embedded dispatcher's): no second round proposed from nothing."""
    backend = SimulatedBackend(H200)
    job_id = _job(db, 64)
    first = tasks.explore_round(db, job_id, 16, rounds_in_flight=2, pipeline_after=16)
    assert len(first.ids) == 16
    assert tasks.explore_round(db, job_id, 16, rounds_in_flight=2, pipeline_after=16).ids == []
    _run_round(db, first.ids, backend)
    second = tasks.explore_round(db, job_id, 16, rounds_in_flight=2, pipeline_after=16)
    third = tasks.explore_round(db, job_id, 16, rounds_in_flight=2, pipeline_after=16)
    assert len(second.ids) == 16 and len(third.ids) == 16  # now two rounds in flight
    assert not set(second.ids) & set(third.ids)


def test_open_candidates_and_trials_map_by_hash_whoever_proposed_them(db: str) -> None:
    """The explorer maps the schedule hashes it proposed to space indices without reading
    the schedules; candidates and measurements it did not propose (another explorer, a
    restart) are read and mapped, and a schedule of an older space is left out."""
    space = ScheduleSpace(SHAPE, Precision.INT8, H200)
    job_id = _job(db, 64)
    mine = tasks.explore_round(db, job_id, 8, rounds_in_flight=2).ids
    with session_scope(db) as s:
        job = repo.get_job(s, job_id)
        assert job is not None
        task_id = job.task_id
        proposed = {space.index_of(c.schedule) for c in
                    s.scalars(select(Candidate).where(Candidate.id.in_(mine)))}
        # Another process's round: none of its hashes is known here.
        seen = proposed | {int(i) for i in space.valid_indices[:8]}
        theirs = [int(i) for i in space.valid_indices if int(i) not in seen][:4]
        hp.add_candidates(s, job_id, task_id, space.schedules(theirs), None, [None] * 4)
        old = {**space.schedule_at(theirs[0]), "CHUNK": 3}  # no such knob value
        hp.add_candidates(s, job_id, task_id, [old], None, [None])
    with session_scope(db) as s:
        open_rows, _ = hp.open_and_measured(s, job_id)
        assert len(open_rows) == 8 + 4 + 1
        assert history.pending_of(s, db, task_id, space, open_rows) == proposed | set(theirs)
        # Measured: one of ours, one of theirs and the old one.
        ours = next(iter(proposed))
        row = {"task_id": task_id, "job_id": job_id, "status": "ok", "backend": "simulated",
               "median_us": 1.0}
        hp.record_results(s, [{**row, "schedule": sched, "schedule_hash": schedule_hash(sched)}
                              for sched in (space.schedule_at(ours),
                                            space.schedule_at(theirs[1]), old)])
    history._indices.clear()  # a restarted explorer knows no hash
    with session_scope(db) as s:
        assert sorted(t.index for t in history.trials_of(s, db, task_id, space)) == \
            sorted([ours, theirs[1]])


def test_candidates_of_a_round_share_its_stamps(db: str) -> None:
    """add_candidates: one value per round for what its rows share, the next round's
    number, the dispatch stamp and each row's own prediction (None too)."""
    space = ScheduleSpace(SHAPE, Precision.INT8, H200)
    job_id = _job(db, 64)
    with session_scope(db) as s:
        job = repo.get_job(s, job_id)
        assert job is not None
        first = hp.add_candidates(s, job_id, job.task_id, space.schedules(space.valid_indices[:3]),
                                  None, [1.5, None, 2.5], dispatched=True)
        second = hp.add_candidates(s, job_id, job.task_id,
                                   space.schedules(space.valid_indices[2:5]), None,
                                   [None] * 3)
        assert len(first) == 3 and len(second) == 2  # the repeated schedule is ignored
        rows = {c.id: c for c in s.scalars(select(Candidate).where(Candidate.job_id == job_id))}
    assert [rows[i].predicted_us for i in first] == [1.5, None, 2.5]
    assert {rows[i].round for i in first} == {1} and {rows[i].round for i in second} == {2}
    assert all(rows[i].dispatched_at is not None for i in first)
    assert all(rows[i].dispatched_at is None for i in second)
    assert {(c.state, c.attempts, c.task_id) for c in rows.values()} == {
        ("pending", 0, rows[first[0]].task_id)}
    assert all(c.schedule_hash == schedule_hash(c.schedule) for c in rows.values())


def test_the_prior_names_each_rows_layer(db: str) -> None:
    """prior_of: rows of several tasks, each with its own layer's shape (read once per
    task), and the new rows of a later read."""
    space = ScheduleSpace(SHAPE, Precision.INT8, H200)
    other = RESNET50_3X3["stage4"]
    with session_scope(db) as s:
        tids = [repo.get_or_create_task(s, shape, Precision.INT8, H200).id
                for shape in (SHAPE, other)]
        jids = [repo.create_job(s, repo.get_task(s, t), 10, "random", 0).id for t in tids]

    def write(k: int) -> None:
        with session_scope(db) as s:
            hp.record_results(s, [{
                "task_id": t, "job_id": j, "status": "ok", "backend": "simulated",
                "median_us": float(k + 1), "schedule": space.schedule_at(int(i)),
                "schedule_hash": schedule_hash(space.schedule_at(int(i)))}
                for t, j in zip(tids, jids, strict=True)
                for i in space.valid_indices[k:k + 2]])

    write(0)
    with session_scope(db) as s:
        prior = history.prior_of(s, db, "h200", "int8", exclude_task=-1)
        assert [p.shape for p in prior] == [other, other, SHAPE, SHAPE]  # newest first
    write(2)
    with session_scope(db) as s:
        prior = history.prior_of(s, db, "h200", "int8", exclude_task=tids[1])
        assert [p.shape for p in prior] == [SHAPE] * 4
        assert [p.median_us for p in prior] == [3.0, 3.0, 1.0, 1.0]


def test_a_write_retires_its_candidates_and_moves_the_best(db: str) -> None:
    """`write_results` (one statement on PostgreSQL): the rows once, the candidates
    retired, and the best moved only by a faster row."""
    backend = SimulatedBackend(H200)
    job_id = _job(db, 16)
    ids = tasks.explore_round(db, job_id, 16).ids
    assert tasks.measure_chunk(db, ids[:8], backend, "w#0", 60).written == 8
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job is not None
        task_id = job.task_id
        best = s.scalar(select(Measurement.median_us).join(
            BestSchedule, BestSchedule.measurement_id == Measurement.id)
            .where(BestSchedule.task_id == task_id))
        open_rows = s.scalars(select(Candidate).where(Candidate.id.in_(ids[8:10]))).all()
        assert best is not None and all(c.state != "done" for c in open_rows)
        row = {"task_id": task_id, "job_id": job_id, "status": "ok", "backend": "simulated"}
        slower, faster = ({**row, "schedule": dict(c.schedule), "schedule_hash": c.schedule_hash,
                           "median_us": us} for c, us in zip(open_rows, (best * 2, best / 2),
                                                              strict=True))
        wrote, now_best = hp.write_results(s, [slower], [open_rows[0].id])
        assert wrote == {(task_id, slower["schedule_hash"])}
        assert now_best in (None, {task_id: best})
        hp.refresh_best_after_write(s, [(task_id, slower["schedule_hash"], best * 2)], now_best)
        wrote, now_best = hp.write_results(s, [faster, slower], [open_rows[1].id])
        assert wrote == {(task_id, faster["schedule_hash"])}  # the slower one is there already
        hp.refresh_best_after_write(s, [(task_id, faster["schedule_hash"], best / 2)], now_best)
    with session_scope(db) as s:
        assert {c.state for c in s.scalars(select(Candidate).where(
            Candidate.id.in_(ids[8:10])))} == {"done"}
        assert s.scalar(select(Measurement.median_us).join(
            BestSchedule, BestSchedule.measurement_id == Measurement.id)
            .where(BestSchedule.task_id == task_id)) == best / 2
