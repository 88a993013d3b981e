"""Every job's first round starts with the runtime's default schedule of its layer (so a
tuned layer is never slower than the untuned default), whatever the strategy; later rounds
and spaces that cannot hold it are not seeded. In SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from kernels.runtime import default_schedule
from kernels.space import ScheduleSpace, schedule_hash
from kernels.spec import RESNET50_3X3, TARGETS, ConvShape, Precision
from search.strategy import History, Trial
from store import repository as repo
from store.db import session_scope
from store.models import Candidate
from workers import tasks
from workers.backends.base import TaskSpec
from workers.seeds import start_points

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
