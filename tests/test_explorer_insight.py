"""The explorer stores what the cost model predicted and which knobs it finds important."""

from __future__ import annotations

import numpy as np

from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, TARGETS, Precision
from search.registry import make_strategy
from search.strategy import History, Trial
from workers.backends.simulated import simulate_latency_us

SHAPE = RESNET50_3X3["stage3"]


def test_predictions_track_measurements_after_a_few_rounds() -> None:
    space = ScheduleSpace(SHAPE, Precision.INT8, TARGETS["h100"])
    strat = make_strategy("diversity", space, seed=0)
    history = History()
    preds: dict[int, float] = {}
    for _ in range(4):
        picks = strat.propose(history, 32)
        preds, insight = strat.describe(history, picks)  # type: ignore[attr-defined]
        lat = simulate_latency_us(SHAPE, Precision.INT8, TARGETS["h100"],
                                  space.columns(np.array(picks)))
        history = History(trials=history.trials + [
            Trial(i, "ok", float(v)) for i, v in zip(picks, lat, strict=True)])
    assert insight is not None
    imp = insight["knob_importance"]
    assert set(imp) == set(space.knobs) and abs(sum(imp.values()) - 1) < 1e-3
    assert len(preds) == 32 and all(v > 0 for v in preds.values())
    p = np.log([preds[i] for i in picks])
    assert np.corrcoef(p, np.log(lat))[0, 1] > 0.4


def test_random_search_describes_nothing() -> None:
    space = ScheduleSpace(SHAPE, Precision.INT8, TARGETS["h100"])
    assert not hasattr(make_strategy("random", space), "describe")
