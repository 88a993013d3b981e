"""One backoff policy (workers/backoff.py): the embedded dispatcher's pauses and the fleet
tasks' Celery retries double alike up to the same cap."""

from __future__ import annotations

import time

from celery.utils.time import get_exponential_backoff_interval

from store.errors import UNAVAILABLE
from workers.app import explore_task, measure_task
from workers.backoff import MAX_DELAY_S, MAX_RETRIES, Backoff, delay_s


def test_pauses_double_up_to_the_cap_and_end_on_success() -> None:
    assert [delay_s(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert delay_s(30) == MAX_DELAY_S == 60
    b = Backoff()
    assert b.ready(7)
    assert b.failed(7) == 1 and b.failed(7) == 2 and not b.ready(7)
    assert b.ready(8), "pauses are per key"
    b.succeeded(7)
    assert b.ready(7) and b.failed(7) == 1, "a success starts the count again"


def test_celery_tasks_retry_with_the_same_policy() -> None:
    for task in (explore_task, measure_task):
        assert set(UNAVAILABLE) | {ConnectionError} == set(task.autoretry_for)
        assert task.max_retries == MAX_RETRIES and task.retry_backoff_max == MAX_DELAY_S
    # Celery's countdown before retry n (0-based), without its jitter: ours for n + 1.
    assert [get_exponential_backoff_interval(1, n, int(MAX_DELAY_S)) for n in range(8)] \
        == [delay_s(n + 1) for n in range(8)]


def test_a_pause_ends() -> None:
    b = Backoff()
    b.failed("job")
    assert not b.ready("job")
    time.sleep(1.05)
    assert b.ready("job")
