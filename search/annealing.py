"""Simulated annealing on the cost model's score (AutoTVM's SimulatedAnnealingOptimizer).

Walkers take one random knob step per iteration and accept it with probability
exp(min((new - old) / T, 1)); T cools linearly from 1 to 0 over the iterations; every scored
point enters a bounded set of the best unseen points, and the walk stops early once that set
has not changed for `early_stop` iterations. The model's scores are looked up in a table
over the whole space (the space is enumerable), so a step costs array lookups, not calls
into XGBoost.

A `Selector` turns this into the paper's diversity-aware variant: each walker makes several
mutants, the selector keeps as many as there are walkers, and only those compete with the
walkers (and enter the candidate set).

The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from search.moves import Moves


class Scores(Protocol):
    """The model's score by space index (search.model_based.ScoreTable): array lookups."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...


# (walkers, their scores, mutants (m * walkers, grouped by round), mutant scores, rng)
# -> for each walker slot, the position in `mutants` of the mutant that competes for it.
Selector = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.random.Generator],
                    np.ndarray]


@dataclass(frozen=True)
class AnnealConfig:
    walkers: int = 128
    iters: int = 500
    early_stop: int = 50
    temp: tuple[float, float] = (1.0, 0.0)
    mutants: int = 1  # per walker per iteration; > 1 needs a selector


class TopSet:
    """The best `num` distinct points seen so far that are not excluded."""

    def __init__(self, num: int, size: int, exclude: np.ndarray) -> None:
        self.num = num
        self.idx = np.zeros(0, dtype=np.int64)
        self.score = np.zeros(0)
        self.member = np.zeros(size, dtype=bool)
        self.exclude = exclude

    def offer(self, idx: np.ndarray, score: np.ndarray) -> bool:
        """Add what beats the current set; True if the set changed."""
        keep = ~self.exclude[idx] & ~self.member[idx] & np.isfinite(score)
        if len(self.idx) >= self.num:
            keep &= score > self.score.min()
        if not keep.any():
            return False
        idx, pos = np.unique(idx[keep], return_index=True)
        score = score[keep][pos]
        all_idx = np.concatenate([self.idx, idx])
        all_score = np.concatenate([self.score, score])
        # Stable ordering: score descending, then index, so ties resolve deterministically.
        order = np.lexsort((all_idx, -all_score))[: self.num]
        self.member[self.idx] = False
        self.idx, self.score = all_idx[order], all_score[order]
        self.member[self.idx] = True
        return True


def anneal(table: Scores, moves: Moves, exclude: np.ndarray, num: int,
           rng: np.random.Generator, cfg: AnnealConfig = AnnealConfig(),
           selector: Selector | None = None,
           start: np.ndarray | None = None) -> np.ndarray:
    """Up to `num` unexcluded valid indices with the highest scores found, best first.

    `table` holds the model's score for every index of the space (-inf where invalid);
    `exclude` marks measured and pending schedules.
    """
    valid = np.flatnonzero(moves.valid)
    if start is None or len(start) == 0:
        start = rng.choice(valid, size=cfg.walkers, replace=len(valid) < cfg.walkers)
    points = np.asarray(start, dtype=np.int64).copy()
    scores = table[points]
    top = TopSet(num, len(table), exclude)
    top.offer(points, scores)
    t = cfg.temp[0]
    cool = (cfg.temp[0] - cfg.temp[1]) / (cfg.iters + 1)
    last_change = 0
    k = 0
    while k < cfg.iters and k < last_change + cfg.early_stop:
        if selector is None or cfg.mutants <= 1:
            new = moves.mutate(points, rng)
            new_scores = table[new]
        else:
            mutants = np.concatenate([moves.mutate(points, rng) for _ in range(cfg.mutants)])
            mutant_scores = table[mutants]
            pick = selector(points, scores, mutants, mutant_scores, rng)
            new, new_scores = mutants[pick], mutant_scores[pick]
        with np.errstate(invalid="ignore", over="ignore"):
            prob = np.exp(np.minimum((new_scores - scores) / (t + 1e-5), 1.0))
        accept = rng.random(len(points)) < np.nan_to_num(prob, nan=0.0)
        points = np.where(accept, new, points)
        scores = np.where(accept, new_scores, scores)
        if top.offer(new, new_scores):
            last_change = k
        k += 1
        t -= cool
    return top.idx
