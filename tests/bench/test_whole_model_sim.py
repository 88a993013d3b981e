"""bench/whole_model_sim.py on a CPU: a zoo model as `tctune plan`'s model file, and a tuned
schedule priced against its space's fastest under the simulated GPU's model."""

from __future__ import annotations

import numpy as np

from bench.whole_model_sim import model_file, priced, render_many
from kernels.runtime import default_schedule
from kernels.space import ScheduleSpace
from kernels.spec import TARGETS, ConvShape, Precision, task_key
from workers.backends.simulated import simulate_latency_us


def test_a_zoo_model_becomes_a_model_file_at_the_batch() -> None:
    doc = model_file("resnet50", 8, "h200")
    assert doc["target"] == "h200" and len(doc["layers"]) == 53  # every conv, repeats too
    assert {la["shape"]["n"] for la in doc["layers"]} == {8}
    assert doc["layers"][0]["name"] == "conv1" and doc["layers"][0]["shape"]["r"] == 7
    assert len({ConvShape.from_dict(la["shape"]).key() for la in doc["layers"]}) == 23


def test_a_schedule_is_priced_against_the_fastest_of_its_space() -> None:
    shape = ConvShape(8, 14, 14, 256, 256, 3, 3, pad=(1, 1))
    h200 = TARGETS["h200"]
    key = task_key(shape, Precision.INT8, h200)
    space = ScheduleSpace(shape, Precision.INT8, h200)
    default = default_schedule(shape, Precision.INT8, h200)[0]
    mine, best = priced(key, default)
    assert 0 < best <= mine
    # the fastest schedule prices at the best itself
    every = simulate_latency_us(shape, Precision.INT8, h200,
                                space.columns(space.valid_indices))
    top = space.schedule_at(int(space.valid_indices[int(np.argmin(every))]))
    assert priced(key, top) == (best, best)
    doc = {"model": "m", "batch": 8, "trials": 48, "tuning_wall_s": 10.0,
           "rows": [{"vs_best": 1.0}, {"vs_best": 1.1}]}
    assert "| m | 8 | 48 |  |  | 10.0 | 2 | 1 | 1.049x | 1.100x |" in render_many([doc])
    doc.update(explore_processes=2, proposals=3, proposal_median_s=0.5)
    assert "| m | 8 | 48 | 2 | 3, 0.5 | 10.0 |" in render_many([doc])


def test_the_explorers_proposals_are_read_from_the_service_log() -> None:
    from bench.whole_model_sim import proposals

    log = ("2026-11-29 18:36:11,198 workers.tasks proposal job=40 strategy=diversity n=12 "
           "history=0 pending=9 prior=465 seconds=1.4187\n"
           "2026-11-29 18:36:12,000 api.app GET /jobs/40 200\n"
           "2026-11-29 18:36:12,162 workers.tasks proposal job=41 strategy=random n=12 "
           "history=0 pending=9 prior=477 seconds=0.5000\n")
    assert proposals(log) == {"proposals": 2, "proposal_median_s": 0.9594,
                              "proposal_sum_s": 1.9}
    assert proposals("")["proposals"] == 0
