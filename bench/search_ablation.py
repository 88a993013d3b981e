"""Ablations of the diversity strategy, replayed like `tctune bench search`.

The service's `diversity` offers what a job may want; the variants below exist only to
measure what a part of it gives (docs/decisions.md, "The paper's diversity step and
annealing for the batch pick"), so they live here. In this replay `diversity` takes two
more options:

- `pool=K` (default 0): the bag pick chooses only among the annealer's top K x batch
  instead of every unseen valid schedule;
- `mutants=M` (default 2): mutants per walker per annealing iteration; 1 is the paper's
  explorer without its diversity step (with `pick=top` or `pool`).

With neither given it is the service's `diversity`, batch for batch.

    python bench/search_ablation.py [replay options] --strategies diversity,diversity:pool=4
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.space import ScheduleSpace  # noqa: E402
from search import replay  # noqa: E402
from search.diversity import DiversityAware  # noqa: E402
from search.model_based import ScoreTable  # noqa: E402
from search.options import Option  # noqa: E402
from search.registry import STRATEGIES as SERVICE_STRATEGIES  # noqa: E402
from search.strategy import History, Strategy  # noqa: E402


class DiversityAblation(DiversityAware):
    """The diversity-aware explorer with the ablation switches of bench/search_ablation.py."""

    OPTIONS = (
        *DiversityAware.OPTIONS,
        Option("pool", int, 0, "> 0: the bag pick chooses among the annealer's top "
               "pool x batch only", minimum=0),
        Option("mutants", int, DiversityAware.ANNEAL_MUTANTS, "mutants per walker per "
               "annealing iteration; 1: no diversity step", minimum=1),
    )

    def __init__(self, space: ScheduleSpace, seed: int = 0, **options: Any) -> None:
        super().__init__(space, seed=seed, **options)
        self.pool: int = self.options["pool"]
        self.anneal_cfg = dataclasses.replace(self.anneal_cfg, mutants=self.options["mutants"])

    def free_rows(self, table: ScoreTable, history: History, want: int,
                  rng: np.random.Generator) -> np.ndarray:
        free = super().free_rows(table, history, want, rng)
        if self.pool > 0:
            free &= np.isin(self.space.valid_indices,
                            self.anneal(table, history, want * self.pool, rng))
        return free


STRATEGIES: dict[str, type[Strategy]] = {**SERVICE_STRATEGIES, "diversity": DiversityAblation}


if __name__ == "__main__":
    raise SystemExit(replay.main(strategies=STRATEGIES, prog="bench/search_ablation.py"))
