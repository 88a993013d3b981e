"""Strategies selectable per job by name ("strategy" in POST /tune, with "strategy_options").

The names are stored with every job: they stay as they are whatever the modules are called
("sa" is search/xgb_tuner.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kernels.space import ScheduleSpace
from search.diversity import DiversityAware
from search.grid import GridSearch
from search.options import OptionError, parse_pairs, resolve
from search.random_search import RandomSearch
from search.strategy import Strategy
from search.xgb_tuner import XGBTuner

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (RandomSearch, GridSearch, XGBTuner, DiversityAware)
}
DEFAULT_STRATEGY = "diversity"

Registry = Mapping[str, type[Strategy]]


def strategy_class(name: str, strategies: Registry = STRATEGIES) -> type[Strategy]:
    try:
        return strategies[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; known: {', '.join(strategies)}") from None


def make_strategy(name: str, space: ScheduleSpace, seed: int = 0, **options: Any) -> Strategy:
    return strategy_class(name)(space, seed=seed, **options)


def check_options(name: str, options: Mapping[str, Any], strategies: Registry = STRATEGIES
                  ) -> dict[str, Any]:
    """The given options checked against the strategy's declaration, as their declared types
    (only those given: the defaults stay the strategy's). OptionError names a bad one."""
    cls = strategy_class(name, strategies)
    values = resolve(name, cls.OPTIONS, options)
    return {k: values[k] for k in options}


def parse_spec(spec: str, strategies: Registry = STRATEGIES) -> tuple[str, dict[str, Any]]:
    """'NAME[:key=value...]' -> (name, options as their declared types). ValueError for an
    unknown strategy, OptionError for an unknown option or a bad value."""
    name, *pairs = spec.strip().split(":")
    return name, parse_pairs(name, strategy_class(name, strategies).OPTIONS, pairs)


def strategies_help(strategies: Registry = STRATEGIES) -> str:
    """Every strategy with its options, from their declarations (CLI and replay --help)."""
    return "\n".join(cls.help_text() for cls in strategies.values())


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "OptionError", "Registry", "check_options",
           "make_strategy", "parse_spec", "strategies_help", "strategy_class"]
