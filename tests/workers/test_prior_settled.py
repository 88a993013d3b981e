"""The prior a fleet's strategies learn from moves only once it has grown by half (each new
list costs a base model and every job a scoring of its space), while the transfer seeds
read the newest one. In SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from workers import history

H200 = TARGETS["h200"]


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    history._priors.clear()
    history._prior_views.clear()


def _measure(url: str, shape: str, first: int, count: int) -> None:
    with session_scope(url) as s:
        task = repo.get_or_create_task(s, RESNET50_3X3[shape], Precision.INT8, H200)
        job = repo.create_job(s, task, 10_000, "random", 0)
        space = ScheduleSpace(RESNET50_3X3[shape], Precision.INT8, H200)
        scheds = space.schedules(space.valid_indices[first:first + count])
        hp.record_results(s, [{"task_id": task.id, "job_id": job.id, "schedule": sc,
                               "schedule_hash": schedule_hash(sc), "status": "ok",
                               "median_us": 10.0 + i, "backend": "simulated"}
                              for i, sc in enumerate(scheds)])


def _prior(url: str, settled: bool) -> list:
    with session_scope(url) as s:
        # A window that has always passed: every call reads what was written since.
        return history.prior_of(s, url, "h200", "int8", -1, 1e-9, settled=settled)


def test_the_strategies_prior_moves_as_it_grows_by_half(db: str) -> None:
    _measure(db, "stage2", 0, 40)
    first = _prior(db, settled=True)
    assert len(first) == 40
    _measure(db, "stage3", 0, 19)  # 19 < 40 / 2: the strategies keep the list they had
    assert _prior(db, settled=True) is first
    fresh = _prior(db, settled=False)
    assert len(fresh) == 59  # the seeds' list has the new rows
    _measure(db, "stage4", 0, 1)  # 20 rows since: half of 40
    moved = _prior(db, settled=True)
    assert len(moved) == 60 and moved is not first
    assert moved is _prior(db, settled=False)  # one list for both while nothing is new
    assert _prior(db, settled=True) is moved


def test_without_a_window_every_read_is_the_newest(db: str) -> None:
    _measure(db, "stage2", 0, 40)
    with session_scope(db) as s:
        a = history.prior_of(s, db, "h200", "int8", -1, 0.0, settled=True)
    _measure(db, "stage3", 0, 3)
    with session_scope(db) as s:
        b = history.prior_of(s, db, "h200", "int8", -1, 0.0, settled=True)
    assert (len(a), len(b)) == (40, 43)


def test_a_grown_prior_reaches_the_strategies_once_its_base_model_is_trained(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A live model-based strategy of the target: the grown list's base model is trained in
    # the background while the strategies keep the settled list; then the list moves, and
    # no strategy trains on it (what the proposal that trained it used to wait for).
    from search.cost_model import CostModel
    from search.registry import make_strategy

    space = ScheduleSpace(RESNET50_3X3["stage2"], Precision.INT8, H200)
    strategy = history._strategies.put((db, 1), make_strategy("diversity", space, seed=0))
    try:
        _measure(db, "stage2", 0, 40)
        first = _prior(db, settled=True)
        _measure(db, "stage3", 0, 20)
        assert _prior(db, settled=True) is first  # still the settled list: training now
        warming = history._priors[(db, "h200", "int8")].warming
        if warming is not None:  # (unless it is done already)
            warming.join(timeout=60)
        moved = _prior(db, settled=True)
        assert len(moved) == 60 and history._priors[(db, "h200", "int8")].warming is None

        def no_training(*_: object, **__: object) -> None:
            raise AssertionError("the base model should be trained already")

        monkeypatch.setattr(CostModel, "fit", no_training)
        assert strategy.base_model(moved) is not None  # type: ignore[attr-defined]
    finally:
        history._strategies.clear()


def test_a_failed_training_ahead_still_hands_the_list_over(
        db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from search.registry import make_strategy

    space = ScheduleSpace(RESNET50_3X3["stage2"], Precision.INT8, H200)
    strategy = history._strategies.put((db, 1), make_strategy("diversity", space, seed=0))

    def broken(prior: object) -> None:
        raise RuntimeError("no memory")

    monkeypatch.setattr(strategy, "warm_prior", broken)
    try:
        _measure(db, "stage2", 0, 40)
        first = _prior(db, settled=True)
        _measure(db, "stage3", 0, 20)
        assert _prior(db, settled=True) is first
        warming = history._priors[(db, "h200", "int8")].warming
        if warming is not None:  # (it may have failed already)
            warming.join(timeout=60)
        assert len(_prior(db, settled=True)) == 60  # the strategies train on demand
    finally:
        history._strategies.clear()
