"""Every job's first round starts with the runtime's default schedule of its layer (so a
tuned layer is never slower than the untuned default), whatever the strategy, then the best
schedules of the nearest layers measured on the target (transfer seeds); later rounds and
spaces that cannot hold them are not seeded. In SQLite and PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from kernels.runtime import default_schedule
from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import RESNET50_3X3, TARGETS, ConvShape, Precision
from search.strategy import History, PriorTrial, Trial
from store import hotpath as hp
from store import repository as repo
from store.db import session_scope
from store.models import Candidate
from workers import tasks
from workers.backends.base import TaskSpec
from workers.seeds import (
    TRANSFER_SEEDS,
    layer_bests,
    neighbour_bests,
    start_points,
    transfer_points,
    valid_index,
)

H100 = TARGETS["h100"]


def _rounds(url: str, job_id: int) -> dict[int, list[str]]:
    with session_scope(url) as s:
        rows = s.execute(select(Candidate.round, Candidate.schedule_hash)
                         .where(Candidate.job_id == job_id).order_by(Candidate.id)).all()
    out: dict[int, list[str]] = {}
    for rnd, h in rows:
        out.setdefault(rnd, []).append(h)
    return out


@pytest.mark.parametrize("strategy", ["random", "diversity"])
def test_the_first_round_starts_with_the_default_schedule(db: str, strategy: str) -> None:
    shape = RESNET50_3X3["stage3"]
    with session_scope(db) as s:
        task = repo.get_or_create_task(s, shape, Precision.INT8, H100)
        job = repo.create_job(s, task, 100, strategy, 0).id
    tasks.explore_round(db, job, 8, rounds_in_flight=2)
    tasks.explore_round(db, job, 8, rounds_in_flight=2)  # a second round, nothing measured
    rounds = _rounds(db, job)
    default = schedule_hash(default_schedule(shape, Precision.INT8, H100)[0])
    first, second = (rounds[r] for r in sorted(rounds))
    assert first[0] == default and len(first) == 8 and len(set(first)) == 8
    assert default not in second and len(second) == 8


def test_no_seed_once_the_job_has_measured_or_where_the_space_lacks_it() -> None:
    shape = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))
    spec = TaskSpec(shape, Precision.FP16, H100)
    space = ScheduleSpace(shape, Precision.FP16, H100)
    [seed] = start_points(spec, space, History())
    assert schedule_hash(space.schedule_at(seed)) == schedule_hash(
        default_schedule(shape, Precision.FP16, H100)[0])
    assert start_points(spec, space, History(trials=[Trial(seed, "ok", 5.0)])) == []
    assert start_points(spec, space, History(pending={seed})) == []
    # a space restricted away from the default's instruction path holds no seed
    other = "sync" if space.schedule_at(seed)["MMA"] == "wgmma" else "wgmma"
    narrow = ScheduleSpace(shape, Precision.FP16, H100, restrict={"MMA": [other]})
    assert start_points(spec, narrow, History()) == []


def _valid_in_both(a: ScheduleSpace, b: ScheduleSpace, n: int) -> list[dict]:
    both = [i for i in a.valid_indices[::37] if b.is_valid(a.schedule_at(int(i)))]
    return [a.schedule_at(int(i)) for i in both[:n]]


def test_transfer_seeds_are_the_nearest_layers_bests() -> None:
    shape = ConvShape(8, 28, 28, 128, 256, 3, 3, pad=(1, 1))
    near = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))  # one octave of K away
    far = ConvShape(8, 14, 14, 256, 1024, 1, 1)  # another filter size
    spec = TaskSpec(shape, Precision.FP16, H100)
    space = ScheduleSpace(shape, Precision.FP16, H100)
    a, b, c, d, e = _valid_in_both(space, ScheduleSpace(near, Precision.FP16, H100), 5)
    assert ScheduleSpace(far, Precision.FP16, H100).is_valid(c)
    prior = [PriorTrial(far, c, "ok", 5.0), PriorTrial(near, a, "ok", 10.0),
             PriorTrial(near, b, "ok", 8.0),  # near's best
             PriorTrial(near, e, "error", None),
             PriorTrial(shape, d, "ok", 1.0)]  # the layer's own: not a neighbour
    default = start_points(spec, space, History())
    seeds = start_points(spec, space, History(prior=prior))
    assert seeds == default + [space.index_of(b), space.index_of(c)]
    # later rounds: no default; a neighbour's best only while the job has not seen it
    measured = [Trial(i, "ok", 3.0) for i in seeds]
    assert start_points(spec, space, History(trials=measured, prior=prior)) == []
    assert start_points(spec, space, History(trials=measured[:2], prior=prior)) == seeds[2:]
    newer = [*prior, PriorTrial(near, a, "ok", 7.0)]  # near's best is now a
    assert start_points(spec, space, History(trials=measured, prior=newer)) == \
        [space.index_of(a)]


def test_transfer_seeds_skip_what_the_space_lacks_and_stop_at_the_limit() -> None:
    shape = ConvShape(8, 28, 28, 128, 256, 3, 3, pad=(1, 1))
    space = ScheduleSpace(shape, Precision.FP16, H100)
    others = [ConvShape(8, 28, 28, 128, 256 + 32 * (i + 1), 3, 3, pad=(1, 1))
              for i in range(TRANSFER_SEEDS + 3)]  # farther and farther away
    scheds = _valid_in_both(space, ScheduleSpace(others[0], Precision.FP16, H100),
                            TRANSFER_SEEDS + 3)
    wgmma_only = ScheduleSpace(shape, Precision.FP16, H100, restrict={"MMA": ["wgmma"]})
    prior = [PriorTrial(o, s, "ok", 1.0 + i)
             for i, (o, s) in enumerate(zip(others, scheds, strict=True))]
    assert transfer_points(shape, space, prior, TRANSFER_SEEDS) == \
        [space.index_of(s) for s in scheds[:TRANSFER_SEEDS]]
    held = [s for s in scheds if s["MMA"] == "wgmma"]
    assert 0 < len(held) < len(scheds)  # the restricted space lacks the others' MMA value
    assert transfer_points(shape, wgmma_only, prior, 99) == \
        [wgmma_only.index_of(s) for s in held]


def test_the_validity_lookup_agrees_with_the_rules() -> None:
    shape = ConvShape(8, 28, 28, 128, 256, 3, 3, pad=(1, 1))
    space = ScheduleSpace(shape, Precision.FP16, H100)
    wgmma_only = ScheduleSpace(shape, Precision.FP16, H100, restrict={"MMA": ["wgmma"]})
    rng = np.random.default_rng(0)
    # Valid and invalid schedules alike (most of the product is invalid).
    scheds = [space.schedule_at(int(i)) for i in rng.integers(0, space.size, 300)]
    scheds += [space.schedule_at(int(i)) for i in rng.choice(space.valid_indices, 100)]
    for sp in (space, wgmma_only):
        got = [valid_index(sp, s) for s in scheds]
        want = [sp.index_of(s) if _is_valid(sp, s) else None for s in scheds]
        assert got == want
        assert any(g is None for g in got) and any(g is not None for g in got)


def _is_valid(space: ScheduleSpace, sched: dict) -> bool:
    try:
        return space.is_valid(sched)
    except (KeyError, ValueError):
        return False


def test_each_layers_best_is_found_once_per_prior() -> None:
    near = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))
    far = ConvShape(8, 14, 14, 256, 1024, 1, 1)
    space = ScheduleSpace(near, Precision.FP16, H100)
    a, b, c = (space.schedule_at(int(i)) for i in space.valid_indices[:3])
    prior = [PriorTrial(far, c, "ok", 5.0), PriorTrial(near, a, "ok", 8.0),
             PriorTrial(near, b, "ok", 8.0), PriorTrial(far, a, "error", None)]
    bests = layer_bests(prior)
    assert bests == {far: (5.0, c), near: (8.0, a)}  # of equal latencies the first
    other = ConvShape(8, 28, 28, 128, 256, 3, 3, pad=(1, 1))
    # Every layer's ranking comes from the one table of the list (not a pass each).
    assert neighbour_bests(other, prior) == [a, c] and neighbour_bests(near, prior) == [c]
    assert layer_bests(prior) is bests
    newer = [*prior, PriorTrial(far, b, "ok", 1.0)]  # another list: found again
    assert layer_bests(newer)[far] == (1.0, b) and layer_bests(prior)[far] == (5.0, c)


def test_a_job_starts_from_the_best_of_a_tuned_neighbour(db: str) -> None:
    """Through the explorer and the database: a layer measured first lends its best
    schedule to the next layer's first round."""
    tuned = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))
    fresh = ConvShape(8, 28, 28, 128, 256, 3, 3, pad=(1, 1))
    space = ScheduleSpace(fresh, Precision.FP16, H100)
    slow, fast = _valid_in_both(space, ScheduleSpace(tuned, Precision.FP16, H100), 2)
    with session_scope(db) as s:
        task = repo.get_or_create_task(s, tuned, Precision.FP16, H100)
        job = repo.create_job(s, task, 2, "random", 0)
        hp.record_results(s, [{"task_id": task.id, "job_id": job.id, "schedule": sched,
                               "schedule_hash": schedule_hash(sched), "status": "ok",
                               "median_us": us, "backend": "cuda"}
                              for sched, us in ((slow, 9.0), (fast, 4.0))])
        task2 = repo.get_or_create_task(s, fresh, Precision.FP16, H100)
        job2 = repo.create_job(s, task2, 32, "diversity", 0).id
    tasks.explore_round(db, job2, 32)
    [first] = _rounds(db, job2).values()
    default = schedule_hash(default_schedule(fresh, Precision.FP16, H100)[0])
    # the neighbour's best, right after the default; its slower schedule is no seed
    assert first[:2] == [default, schedule_hash(fast)] and len(first) == 32
