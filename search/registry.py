"""Strategies selectable per job by name ("strategy" in POST /tune)."""

from __future__ import annotations

from typing import Any

from kernels.space import ScheduleSpace
from search.diversity import DiversityAware
from search.grid import GridSearch
from search.random_search import RandomSearch
from search.sa import SimulatedAnnealing
from search.strategy import Strategy

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (RandomSearch, GridSearch, SimulatedAnnealing, DiversityAware)
}
DEFAULT_STRATEGY = "diversity"


def make_strategy(name: str, space: ScheduleSpace, seed: int = 0, **options: Any) -> Strategy:
    try:
        cls = STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None
    return cls(space, seed=seed, **options)
