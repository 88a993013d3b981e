"""Strategies selectable per job by name ("strategy" in POST /tune).

The names are stored with every job: they stay as they are whatever the modules are called
("sa" is search/xgb_tuner.py).
"""

from __future__ import annotations

from typing import Any

from kernels.space import ScheduleSpace
from search.diversity import DiversityAware
from search.grid import GridSearch
from search.random_search import RandomSearch
from search.strategy import Strategy
from search.xgb_tuner import XGBTuner

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (RandomSearch, GridSearch, XGBTuner, DiversityAware)
}
DEFAULT_STRATEGY = "diversity"


def make_strategy(name: str, space: ScheduleSpace, seed: int = 0, **options: Any) -> Strategy:
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None
    return cls(space, seed=seed, **options)
