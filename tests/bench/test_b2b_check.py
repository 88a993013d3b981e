"""bench/gpu/b2b_check.py's choice of schedules (CPU): random members of the space of the
layer with its back-to-back conv, half of them wgmma where there are enough."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from bench.gpu.b2b_check import PAIRS, _b2b_schedules
from kernels.build import BuildJob, defines
from kernels.spec import Precision


def test_the_check_samples_schedules_that_run_the_pair() -> None:
    rng = np.random.default_rng(0)
    for _, shape, b2b in PAIRS[:2]:
        picked = _b2b_schedules(shape, Precision.INT8, b2b, 6, rng)
        assert [s["MMA"] for s in picked].count("wgmma") == 3 and len(picked) == 6
        for s in picked:  # each builds with the pair's region (defines raises where not)
            assert defines(BuildJob(replace(shape, b2b=b2b), Precision.INT8, 90, s))["TC_B2B"]
    # layer 2's fp16 pair: no schedule holds both weight matrices in shared memory
    assert _b2b_schedules(PAIRS[2][1], Precision.FP16, PAIRS[2][2], 6, rng) == []
