"""Cubins built on one host reach GPU workers on another through the database."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kernels.build import BuildJob, build, cubin_path
from kernels.space import ScheduleSpace
from kernels.spec import TARGETS, ConvShape, Precision
from store import hotpath as hp
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import Artifact
from workers import artifacts

SHAPE = ConvShape(1, 8, 8, 32, 32, 3, 3, pad=(1, 1))


def test_publish_fetch_and_prune(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'a.db'}"
    migrate.upgrade(db)
    space = ScheduleSpace(SHAPE, Precision.INT8, TARGETS["h100"])
    sched = space.schedule_at(int(np.random.default_rng(0).choice(space.valid_indices)))
    res = build(BuildJob(SHAPE, Precision.INT8, 90, sched), tmp_path / "builder")
    assert res.status == "ok", res.log
    assert artifacts.publish(db, tmp_path / "builder", res.key)
    assert artifacts.publish(db, tmp_path / "builder", res.key)  # twice: still one row
    assert not artifacts.fetch(db, tmp_path / "gpu", "no-such-key")
    assert artifacts.fetch(db, tmp_path / "gpu", res.key)
    assert cubin_path(tmp_path / "gpu", res.key).read_bytes() == \
        cubin_path(tmp_path / "builder", res.key).read_bytes()

    # A finished job keeps only its task's best artifact.
    with session_scope(db) as s:
        task = repo.get_or_create_task(s, SHAPE, Precision.INT8, TARGETS["h100"])
        job = repo.create_job(s, task, 2, "random", 0)
        other = space.schedule_at(int(space.valid_indices[0]))
        ids = hp.add_candidates(s, job.id, task.id, [sched, other], 1, [None, None])
        repo.record_builds(s, [(cid, "ok", key, "")
                               for cid, key in zip(ids, [res.key, "other-key"], strict=True)])
        s.execute(repo.insert_for(s, Artifact).values(key="other-key", cubin=b"x", meta="{}"))
        hp.record_results(s, [
            {"task_id": task.id, "job_id": job.id, "schedule": c.schedule,
             "schedule_hash": c.schedule_hash, "status": "ok", "median_us": us,
             "backend": "cuda"}
            for us, c in zip([1.0, 2.0], (repo.get_candidate(s, i) for i in ids), strict=True)])
        hp.refresh_best_many(s, [task.id])
        assert artifacts.prune(s, job.id, task.id) == 1
        assert [a.key for a in s.query(Artifact)] == [res.key]
