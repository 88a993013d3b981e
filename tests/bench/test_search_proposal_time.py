"""bench/search_proposal_time.py: a new job's start is timed on a layer the prior does not
hold, its first proposal a full batch over the freshly enumerated space."""

from __future__ import annotations

import numpy as np

from bench.search_proposal_time import make_history, new_jobs
from kernels.spec import Precision
from search import model_based
from search.registry import make_strategy
from search.strategy import History


def test_new_jobs_time_each_start_on_a_layer_outside_the_prior() -> None:
    space, history, _ = make_history(1200, Precision.INT8, np.random.default_rng(0))
    model_based._PRIOR_CACHE.clear()
    make_strategy("diversity", space, seed=0).propose(History(prior=history.prior), 32)
    trained = len(model_based._PRIOR_CACHE)
    starts = new_jobs("diversity", {}, history.prior, 2)
    assert len(starts["enumerate_cpu_s"]) == len(starts["first_proposal_cpu_s"]) == 2
    assert all(s > 0 for s in starts["enumerate_cpu_s"] + starts["first_proposal_cpu_s"])
    # The base model was the one trained before: a start pays no training.
    assert len(model_based._PRIOR_CACHE) == trained == 1
    assert {t.shape.n for t in history.prior} == {1, 8, 32}
