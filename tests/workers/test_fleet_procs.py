"""Several explorer processes (`tctune explorer --procs 2`) or threads (`--threads 2`) with
pipelined rounds, through Celery, Redis and PostgreSQL: jobs finish with exactly their
budget, no schedule measured twice, and no round proposed beyond what one job may have in
flight."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Candidate, Measurement
from tests.workers.test_fleet import Fleet, fleet  # noqa: F401  (the fixture)


@pytest.mark.parametrize("pool", ["--procs", "--threads"])
def test_two_explorers_share_the_jobs(fleet: Fleet, pool: str) -> None:  # noqa: F811
    fleet.start(workers=2, TCTUNE_SIM_DELAY_S="0.02")
    fleet.explorer.kill(signal.SIGTERM)
    fleet.explorer = fleet.run("explorer-procs", "explorer", pool, "2",
                               "--rounds-in-flight", "2")
    jobs = [fleet.submit(48, seed=i, shape={"n": 1 + i, "h": 28, "w": 28, "c": 128, "k": 128,
                                            "r": 3, "s": 3, "pad": [1, 1]})
            for i in range(3)]
    for job_id in jobs:
        fleet.wait(job_id, lambda s: s["status"] == "done")
    for job_id in jobs:
        with session_scope(fleet.db_url) as s:
            hashes = list(s.scalars(select(Measurement.schedule_hash)
                                    .where(Measurement.job_id == job_id)))
            rounds = Counter(s.scalars(select(Candidate.round)
                                       .where(Candidate.job_id == job_id)))
        assert len(hashes) == 48 == len(set(hashes))
        # 48 = 3 rounds of 16: nothing proposed twice or past the budget
        assert rounds == {1: 16, 2: 16, 3: 16}, rounds
    log = (fleet.tmp / "explorer-procs.log").read_text()
    assert "proposal job=" in log and "concurrency: 2" in log
