"""AutoTVM's XGBTuner: the XGBoost cost model searched by simulated annealing
(search/annealing.py), no diversity step. Registered as "sa", the name jobs store.

Its defaults: a plan of 64 candidates is made each time 64 more trials have been measured
(the model is retrained then, on all of them); batches walk the plan in order, skipping
what was measured or is pending, and the plan's last 5% are random schedules instead. Until
the first 64 trials (and with no prior to start from) the schedules are random.

Stateless like every strategy: the plan of epoch e (e = trials // 64) is recomputed from the
first 64*e trials of the history, with its own seeded generator, and cached per epoch.
One deviation: AutoTVM keeps its walkers from one plan to the next; here each plan's walk
starts from random points (the walkers are not part of the stored history).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.space import ScheduleSpace
from search.annealing import anneal
from search.model_based import ModelBasedStrategy, prior_fingerprint
from search.options import Option
from search.strategy import History


class XGBTuner(ModelBasedStrategy):
    """AutoTVM's XGBTuner: batches from plans annealed on the XGBoost cost model."""

    name = "sa"
    OPTIONS = (
        *ModelBasedStrategy.OPTIONS,
        Option("plan_size", int, 64, "trials between two plans; each plan is this many "
               "candidates, made by a retrained model", minimum=1, maximum=4096),
        Option("eps_greedy", float, 0.05, "fraction of each plan's candidates replaced by "
               "random schedules", minimum=0, maximum=1),
    )

    def __init__(self, space: ScheduleSpace, seed: int = 0, **options: Any) -> None:
        super().__init__(space, seed=seed, **options)
        self.plan_size: int = self.options["plan_size"]
        self.eps_greedy: float = self.options["eps_greedy"]
        self._plan: tuple[Any, np.ndarray] | None = None

    def plan(self, history: History) -> np.ndarray | None:
        epoch = len(history.trials) // self.plan_size
        if epoch == 0 and not history.prior:
            return None
        trained_on = history.trials[: epoch * self.plan_size]
        fp = prior_fingerprint(history.prior) if history.prior else None
        key = (epoch, tuple((t.index, t.status, t.median_us) for t in trained_on), fp)
        if self._plan is not None and self._plan[0] == key:
            return self._plan[1]
        table = self.score_table(trained_on, history.prior, fp)
        if table is None:
            plan = None
        else:
            # AutoTVM excludes what it had visited when it made the plan.
            exclude = np.zeros(self.space.size, dtype=bool)
            if trained_on:
                exclude[np.array([t.index for t in trained_on], dtype=np.int64)] = True
            rng = np.random.default_rng([self.seed, 7919, epoch])
            plan = anneal(table, self.moves, exclude, self.plan_size, rng, self.anneal_cfg)
        self._plan = (key, plan)
        return plan

    def propose(self, history: History, n: int) -> list[int]:
        rng = self.rng(history)
        plan = self.plan(history)
        picks: list[int] = []
        if plan is not None:
            seen = self.seen_mask(history)
            # Positions past this are AutoTVM's epsilon-greedy tail: random instead.
            greedy_end = len(plan) - int(self.eps_greedy * self.plan_size)
            for i in plan[:greedy_end]:
                if len(picks) >= n:
                    break
                if not seen[i]:
                    picks.append(int(i))
        return self.fill_random(picks, history, n, rng)
