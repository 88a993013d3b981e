"""The fleet explorer's round size: batch_size while GPUs are fed, larger (up to max_round, in
steps of batch_size) while GPUs of the target are idle with nothing queued for them; in
SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from store.models import Candidate
from workers import tasks

H200 = TARGETS["h200"]


@pytest.fixture(autouse=True)
def _fresh_counts() -> None:
    tasks._unfed.clear()  # per-process memory of the last count: each test asks afresh


def _job(url: str, trials: int, shape: str = "stage3") -> int:
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, RESNET50_3X3[shape], Precision.INT8, H200)
        return repo.create_job(s, task, trials, "random", 0).id


def _gpus(url: str, idle: int, busy: int = 0, target: str = "h200") -> None:
    states = {f"{target}-node/gpu{i}": "idle" for i in range(idle)}
    states.update({f"{target}-node/busy{i}": "busy" for i in range(busy)})
    with session_scope(url) as s:
        repo.heartbeat_many(s, states, "NVIDIA H200", 90, target, "simulated")


def _proposed(url: str, job_id: int) -> int:
    with session_scope(url) as s:
        return int(s.scalar(select(func.count()).select_from(Candidate)
                            .where(Candidate.job_id == job_id)) or 0)


def test_rounds_stay_at_the_batch_size_while_no_gpu_waits(db: str) -> None:
    _gpus(db, idle=0, busy=40)
    job = _job(db, 1000)
    tasks.explore_round(db, job, 32, max_round=256)
    assert _proposed(db, job) == 32


def test_idle_gpus_make_the_round_larger_in_steps_of_the_batch(db: str) -> None:
    _gpus(db, idle=70, busy=10)
    _gpus(db, idle=50, target="t4")  # another target's GPUs do not count
    with session_scope(db) as s:
        assert hp.unfed_gpus(s, "h200", 60) == 70
    job = _job(db, 1000)
    tasks.explore_round(db, job, 32, max_round=256)
    assert _proposed(db, job) == 96  # 70 idle -> 3 batches
    # Those 96 now wait for a GPU: the next job's round is back to one batch.
    tasks._unfed.clear()
    with session_scope(db) as s:
        assert hp.unfed_gpus(s, "h200", 60) == 0
    other = _job(db, 1000, "stage2")
    tasks.explore_round(db, other, 32, max_round=256)
    assert _proposed(db, other) == 32


def test_the_round_is_capped_by_max_round_and_the_budget(db: str) -> None:
    _gpus(db, idle=900)
    job = _job(db, 1000)
    tasks.explore_round(db, job, 32, max_round=128)
    assert _proposed(db, job) == 128
    small = _job(db, 40, "stage2")
    tasks.explore_round(db, small, 32, rounds_in_flight=1, max_round=128)
    assert _proposed(db, small) == 40
    fixed = _job(db, 1000, "stage4")
    tasks.explore_round(db, fixed, 32, max_round=0)  # off: fixed rounds
    assert _proposed(db, fixed) == 32


def test_a_silent_worker_is_not_an_idle_gpu(db: str) -> None:
    _gpus(db, idle=100)
    with session_scope(db) as s:
        assert hp.unfed_gpus(s, "h200", 60) == 100
        assert hp.unfed_gpus(s, "h200", -1) == 0  # every heartbeat older than the window


def test_an_idle_gpu_takes_a_whole_chunk(db: str) -> None:
    _gpus(db, idle=20, busy=5)
    job = _job(db, 1000)
    tasks.explore_round(db, job, 32, max_round=256, chunk=8)
    assert _proposed(db, job) == 160  # 20 idle GPUs x a chunk of 8 each
    tasks._unfed.clear()
    with session_scope(db) as s:
        # The 160 queued keep all 20 busy (a candidate each would say 0 of 160 fed).
        assert hp.unfed_gpus(s, "h200", 60, chunk=8) == 0
        assert hp.unfed_gpus(s, "h200", 60, chunk=16) == 10
    _gpus(db, idle=40, busy=5)  # 40 idle now, 160 queued cover 20 of them
    other = _job(db, 1000, "stage2")
    tasks.explore_round(db, other, 32, max_round=256, chunk=8)
    assert _proposed(db, other) == 160


def test_the_count_is_spent_by_chunks_between_refreshes(db: str) -> None:
    _gpus(db, idle=30)
    first, second = _job(db, 1000), _job(db, 1000, "stage2")
    tasks.explore_round(db, first, 32, max_round=128, chunk=8)
    assert _proposed(db, first) == 128  # 30 x 8 = 240 wanted, capped: 16 GPUs fed
    # Within the refresh interval the explorer counts down what it proposed itself.
    tasks.explore_round(db, second, 32, max_round=256, chunk=8)
    assert _proposed(db, second) == 128  # the other 14 GPUs: 112, in steps of 32


def test_a_paced_job_spreads_a_short_budget_over_rounds(db: str) -> None:
    """With `job_rounds` (the embedded service's default: 4) a job of fewer than that many
    batches proposes its budget in that many rounds of at least 8, so that most of it goes out
    after the model's other layers have measured (workers/seeds.py); longer jobs, and jobs
    without pacing, keep the batch size."""
    assert [tasks.paced_round(t, 4) for t in (1, 12, 40, 90, 128, 1000)] == \
        [8, 8, 10, 23, 32, 250]
    assert tasks.paced_round(40, 0) == 40
    _gpus(db, idle=0, busy=40)
    job = _job(db, 40)
    sizes = []
    for _ in range(6):
        before = _proposed(db, job)
        tasks.explore_round(db, job, 32, rounds_in_flight=8, job_rounds=4)
        sizes.append(_proposed(db, job) - before)
    assert sizes == [10, 10, 10, 10, 0, 0]
    unpaced = _job(db, 40, "stage2")
    tasks.explore_round(db, unpaced, 32, rounds_in_flight=8)
    assert _proposed(db, unpaced) == 32
    long = _job(db, 1000, "stage4")
    tasks.explore_round(db, long, 32, job_rounds=4)
    assert _proposed(db, long) == 32


def test_the_embedded_service_paces_and_the_fleet_does_not() -> None:
    from store.settings import Settings
    from workers.protocol import Rounds

    settings = Settings()
    assert settings.job_rounds == 4
    assert Rounds.embedded(settings).job_rounds == 4
    assert Rounds.fleet(settings).job_rounds == 0
