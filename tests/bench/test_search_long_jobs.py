"""bench/search_long_jobs.py: a job on a modelled space runs to its budget and reports
how close its best came to the space's, and when."""

from __future__ import annotations

import numpy as np

from bench.search_long_jobs import CHECKPOINTS, run_job, truth
from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from workers.backends.simulated import simulate_latency_us


def test_a_job_runs_to_its_budget_and_reports_its_best_against_the_space() -> None:
    space = ScheduleSpace(RESNET50_3X3["stage3"], Precision.INT8, TARGETS["h200"],
                          restrict={"MMA": ["wgmma"], "TMA": [1], "HALO": [0], "PERSIST": [0]})
    true_us = truth(space, 0.1, seed=7)
    model = simulate_latency_us(space.shape, space.precision, space.target,
                                space.columns(space.valid_indices))
    # Each schedule's own factor: fixed per seed, about the asked spread.
    np.testing.assert_array_equal(true_us, truth(space, 0.1, seed=7))
    assert 0.08 < np.std(np.log(true_us / model)) < 0.12
    job = run_job(space, true_us, [], "diversity:rounds=20:iters=60", seed=0, trials=300,
                  batch=64)
    # No prior: a first design of 24, then rounds of 64 up to the budget (the last 20).
    assert job["measurements"] == 300 and job["proposals"] == 6
    found = job["found_vs_best"]
    assert set(found) == {str(c) for c in CHECKPOINTS if c <= 300}
    assert found["256"] <= found["128"] and min(found.values()) >= 1.0
    assert job["final_vs_best"] <= found["256"]
    best_at = job["trials_to_best"]
    assert best_at is None or (best_at <= 300 and job["final_vs_best"] == 1.0)
    assert job["cpu_ms_per_measurement"] > 0
