"""The diversity-aware explorer around the XGBoost cost model (the paper's section 3.4,
with the changes that the replay showed to help; `pick=top:first=random:first_n=0:loss=rank:
bags=1:refit=1:rank_voices=0:own_voices=0` is the paper's configuration). The paper: Choi,
Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize Reduced-Precision
Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").

No trial and no prior: the first design is 24 uniform random draws over the valid schedules
(`first_n`; the model steers from trial 25 instead of 33: docs/decisions.md "A first design
of 32"; `first=coverage` makes it a space-filling design instead, `coverage_design`: every
value of every knob; better on the simulated spaces, worse on the 16 recorded on GPUs, see
"A space-filling first batch" there); until those are measured, further proposals draw at
random too. A prior and no trial: the prior's best unseen schedules (`prior_pick`). Each
later batch (always full): train the model on every trial (and the prior) as five bagged
regression boosters (from scratch when the trials have grown by half since the last time,
doubled from 256 trials on, else by boosting the last model further: `refit`,
`boost_step`, search/model_based.py), then pick the batch from
their opinions in turn (`bag_pick`): the mean's best unseen schedule, each bag's best not
yet taken, and round again; n/32 random ones (1 of 32) complete it. Opinions with another
inductive bias join the turns (no prior, `rank_voices`: three pairwise-rank boosters on
the same trials; with a prior, `own_voices`: two boosters on the task's trials alone),
so that where the bags agree and are wrong, something else in the batch is not
(docs/decisions.md "Rank and own voices").

The paper's explorer stays as `pick=top`: anneal on the mean score as AutoTVM does, except
that each walker makes two mutants per iteration, the half of all mutants that is most
diverse is kept, and only those compete with the walkers (and become candidates); the batch
is the top unmeasured candidates. Diversity of a mutant: how rare its knob values are in
the pool (walkers and all mutants), averaged over knobs, so the kept half spreads over
values the pool has few of; exact duplicates (of a walker or an earlier mutant) are kept
last. One-shot and vectorized, because it runs 500 times per proposal.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels.space import ScheduleSpace
from search.annealing import anneal
from search.model_based import ModelBasedStrategy, ScoreTable, valid_rows
from search.moves import Moves
from search.options import Option, with_defaults
from search.strategy import History


def rarity(moves: Moves, pool: np.ndarray) -> np.ndarray:
    """Per point of `pool`: mean over knobs of 1 / (how many pool points share its value)."""
    d = moves.digits(pool)
    offsets = np.concatenate([[0], np.cumsum(moves.radices)[:-1]])
    flat = d + offsets
    counts = np.bincount(flat.ravel(), minlength=int(moves.radices.sum()))
    return (1.0 / counts[flat]).mean(axis=1)


def select_diverse(moves: Moves, points: np.ndarray, scores: np.ndarray,
                   mutants: np.ndarray, mutant_scores: np.ndarray) -> np.ndarray:
    """Positions in `mutants` of the most diverse len(points), paired with walker slots.

    `mutants` holds m rounds of one mutant per walker (mutant j belongs to walker j % n).
    A kept mutant competes for its own walker's slot; a walker whose mutants were both
    dropped takes the second kept mutant of another walker.
    """
    n = len(points)
    pool = np.concatenate([points, mutants])
    score = rarity(moves, pool)[n:]
    # Duplicates and mutants that could not move add nothing new.
    _, first = np.unique(pool, return_index=True)
    fresh = np.zeros(len(pool), dtype=bool)
    fresh[first] = True
    score = np.where(fresh[n:] & np.isfinite(mutant_scores), score, -1.0)
    # Most diverse first; ties by model score, then position (deterministic).
    order = np.lexsort((np.arange(len(mutants)), -mutant_scores, -score))
    kept = np.zeros(len(mutants), dtype=bool)
    kept[order[:n]] = True

    m = len(mutants) // n
    owner = np.arange(len(mutants)) % n
    slot = np.full(n, -1, dtype=np.int64)
    spare: list[np.ndarray] = []
    for r in range(m):
        pos = np.arange(r * n, (r + 1) * n)
        k = kept[pos]
        take = k & (slot[owner[pos]] < 0)
        slot[owner[pos][take]] = pos[take]
        spare.append(pos[k & ~take])
    empty = np.flatnonzero(slot < 0)
    slot[empty] = np.concatenate(spare)[: len(empty)]
    return slot


def coverage_pick(moves: Moves, candidates: np.ndarray, n: int) -> np.ndarray:
    """n of the candidates (best first), greedily adding the one that brings the most knob
    values not yet in the pick; ties go to the better-scored (earlier) candidate."""
    if len(candidates) <= n:
        return candidates
    d = moves.digits(candidates)
    offsets = np.concatenate([[0], np.cumsum(moves.radices)[:-1]])
    flat = d + offsets
    covered = np.zeros(int(moves.radices.sum()), dtype=bool)
    free = np.ones(len(candidates), dtype=bool)
    out = []
    for _ in range(n):
        gain = np.where(free, (~covered[flat]).sum(axis=1), -1)
        j = int(np.argmax(gain))  # first maximum: the best-scored among equals
        out.append(j)
        free[j] = False
        covered[flat[j]] = True
    return candidates[np.array(out)]


def coverage_design(moves: Moves, valid: np.ndarray, n: int, rng: np.random.Generator,
                    pool: int = 4096) -> np.ndarray:
    """A space-filling first batch (no model yet): n valid schedules whose knob values are
    as evenly represented as possible, ties broken by the largest Hamming distance (in
    knob values) to what is already picked, then by a seeded random order.

    Why: the first batch is all the model learns from before it steers. Uniform draws over
    the valid schedules under-represent values that are often invalid (large tiles) and
    repeat others; a balanced batch shows the model every value of every knob."""
    cand = rng.permutation(valid)[:pool]
    if len(cand) <= n:
        return cand
    d = moves.digits(cand)[:, moves.movable]
    rad = moves.radices[moves.movable]
    flat = d + np.concatenate([[0], np.cumsum(rad)[:-1]])
    counts = np.zeros(int(rad.sum()))
    min_dist = np.full(len(cand), float(len(rad) + 1))
    free = np.ones(len(cand), dtype=bool)
    out = []
    for _ in range(n):
        balance = (1.0 / (1.0 + counts[flat])).sum(axis=1)
        # Balance first (it is at most the number of knobs; distances add < 1 of it).
        score = np.where(free, balance + min_dist / (len(rad) + 2), -np.inf)
        j = int(np.argmax(score))  # first maximum: the seeded random order breaks ties
        out.append(j)
        free[j] = False
        counts[flat[j]] += 1
        min_dist = np.minimum(min_dist, (d != d[j]).sum(axis=1))
    return cand[np.array(out)]


def best_first(scores: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n highest scores, best first, equal scores in position order.

    Why not argpartition: a tree model gives many schedules the same score, and the order
    argpartition leaves among equals depends on numpy's version (a replay's medians moved by
    up to 15 trials between two installs); here it is fixed."""
    kth = np.partition(scores, len(scores) - n)[len(scores) - n]
    at_least = np.flatnonzero(scores >= kth)
    return at_least[np.argsort(-scores[at_least], kind="stable")][:n]


def voice_pick(voices: np.ndarray, free: np.ndarray, n: int) -> np.ndarray:
    """n distinct rows where `free`, taken round-robin from several opinions (`voices`,
    (V, rows) scores): pick k is voice k % V's best row not picked yet."""
    cand = np.flatnonzero(free)
    n = min(n, len(cand))
    if n == 0:
        return cand
    v = voices[:, cand]
    # Each voice needs at most its n best (the others take fewer than n before it).
    order = np.vstack([best_first(row, n) for row in v])
    # A voice stops where its scores do (-inf: rows it has no opinion on).
    depth = np.isfinite(np.take_along_axis(v, order, axis=1)).sum(axis=1)
    taken = np.zeros(len(cand), dtype=bool)
    ptr = np.zeros(len(voices), dtype=np.int64)
    out: list[int] = []
    k = 0
    while len(out) < n and (ptr < depth).any():
        j = k % len(voices)
        while ptr[j] < depth[j] and taken[order[j, ptr[j]]]:
            ptr[j] += 1
        if ptr[j] < depth[j]:
            taken[order[j, ptr[j]]] = True
            out.append(int(order[j, ptr[j]]))
        k += 1
    return cand[np.array(out, dtype=np.int64)]


class DiversityAware(ModelBasedStrategy):
    """The diversity-aware explorer: batches from several opinions of the cost model."""

    name = "diversity"
    # Defaults chosen on the development sets (docs/decisions.md): regression loss, five
    # bagged boosters, the batch taken from the bags' opinions (simulated development set);
    # a random first design of 24 (the GPU-recorded spaces, then confirmed on 16 recorded
    # afterwards); the task model retrained from scratch only as the trials grow by half
    # (quality equal in the replay, a proposal in between costs 0.6x); the rank and own
    # voices (chosen on the table and a development set, the rank voices under a rule fixed
    # before the full replay, the own voices checked on the development set); from 256
    # trials on three bags, and no own voices (long jobs with a prior found their best as
    # soon at half the explorer's CPU, bench/search_long_jobs.py; the rank voices stay: a
    # whole space without a prior stayed in a trap without them, bench/search_shortlist.py).
    # first_n=0:loss=rank:bags=1:pick=top:refit=1:rank_voices=0:own_voices=0 is the paper's.
    OPTIONS = (
        *with_defaults(ModelBasedStrategy.OPTIONS, loss="reg", bags=5, refit=1.5),
        # Each set of voices costs a cold proposal about 0.25 s, and with a prior there is
        # no room for both in the explorer's budget (bench/RESULTS.md "Proposal time").
        Option("own_voices", int, 2, "with a prior: boosters (the strategy's loss) trained on "
               "the task's trials alone that take turns in the batch pick; 0: none",
               minimum=0, maximum=32),
        Option("rank_voices", int, 3, "without a prior: pairwise-rank boosters trained on the "
               "task's trials that take turns in the batch pick; 0: none", minimum=0,
               maximum=32),
        Option("long_voices", int, 0, "1: the own voices (with a prior) take turns from 256 "
               "trials on too (with `refit` > 1); 0: only before (the rank voices, without a "
               "prior, always do)", minimum=0, maximum=1),
        Option("first", str, "random", "the batch before anything is known (no trial, no "
               "prior): uniform random draws or a space-filling design",
               choices=("random", "coverage")),
        Option("first_n", int, 24, "schedules in that first batch; 0: the whole batch",
               minimum=0),
        Option("pick", str, "bags", "a model-guided batch: the mean's and each voice's best in "
               "turn, or the annealer's top candidates by the mean (the paper's)",
               choices=("bags", "top")),
    )
    # The paper's diversity step: two mutants per walker, the more diverse half kept.
    ANNEAL_MUTANTS = 2

    def __init__(self, space: ScheduleSpace, seed: int = 0, **options: Any) -> None:
        super().__init__(space, seed=seed, **options)
        o = self.options
        self.own_voices = o["own_voices"]
        self.rank_voices = o["rank_voices"]
        self.long_voices = bool(o["long_voices"])
        self.first: str = o["first"]
        self.pick: str = o["pick"]
        self.first_n: int = o["first_n"]

    @property
    def partial_scores(self) -> bool:
        # The bag pick takes each voice's best scored rows; the annealer (also the
        # pick of a single booster) walks the space.
        return self.pick == "bags" and self.bags > 1

    def propose(self, history: History, n: int) -> list[int]:
        rng = self.rng(history)
        table = None
        # Until the first design is measured (no prior), a proposal draws at random too: a
        # fleet proposes its next rounds while the first is measured, and a model of a few
        # trials, retrained at every such proposal, steered nowhere at the cost of a
        # retraining each (the replay proposes at 0 and first_n trials only).
        if history.prior or not self.first_n or len(history.trials) >= self.first_n:
            table = self.score_table(history.trials, history.prior)
        if table is None and not history.trials and self.first_n:
            n = min(n, self.first_n)
        n_random = n // 32
        picks: list[int] = []
        want = n - n_random
        if table is not None and self.pick == "bags" and self.bag_scores is not None:
            picks = self.bag_pick(table, history, want, rng)
        elif table is not None and self.pick == "bags" and self.bags > 1:
            # No trial yet, a prior: its base model scored every valid schedule, so its
            # exact best unseen replace the annealing walk (as the bag pick does).
            picks = self.prior_pick(table, history, want, rng)
        elif table is not None:
            top = self.anneal(table, history, want, rng)
            picks = [int(i) for i in coverage_pick(self.moves, top, want)]
        elif self.first == "coverage" and not history.trials:
            picks = [int(i) for i in coverage_design(self.moves, self.unseen_valid(history),
                                                     n, rng)]
        return self.fill_random(picks, history, n, rng)

    def anneal(self, table: ScoreTable, history: History, num: int,
               rng: np.random.Generator) -> np.ndarray:
        """The paper's explorer: annealing on the score with the diversity-aware step."""
        moves = self.moves

        def selector(points: np.ndarray, scores: np.ndarray, mutants: np.ndarray,
                     mutant_scores: np.ndarray, _rng: np.random.Generator) -> np.ndarray:
            return select_diverse(moves, points, scores, mutants, mutant_scores)

        return anneal(table, moves, self.seen_mask(history), num, rng, self.anneal_cfg,
                      selector=selector)

    def bag_pick(self, table: ScoreTable, history: History, want: int,
                 rng: np.random.Generator) -> list[int]:
        """The batch from several opinions in turn: the bags' mean first, then each bag's
        best schedule not yet taken, and round again.

        Why: with a few dozen trials the top of the mean score is one region, and when the
        model is wrong there the whole batch is (a trap the first batches fell into). The
        bags, trained on different subsets of the trials and feature columns, order the
        candidates differently where the trials do not settle the order, so their bests
        spread the batch over regions the data cannot yet tell apart, while the mean's
        best still comes first."""
        valid = self.space.valid_indices
        free = self.free_rows(table, history, want, rng)
        assert self.bag_scores is not None
        voices = np.vstack([table.scores[None, :], self.bag_scores,
                            *([] if self.own_scores is None else [self.own_scores])])
        # A row no voice scored (outside a large space's candidate sets) is never taken;
        # leaving those out spares sorting the whole space (the same picks).
        free &= np.isfinite(voices).any(axis=0)
        return [int(i) for i in valid[voice_pick(voices, free, want)]]

    def prior_pick(self, table: ScoreTable, history: History, want: int,
                   rng: np.random.Generator) -> list[int]:
        """The batch before the task has a model of its own (no trial measured, a prior):
        the prior's best unseen schedules, best first.

        Why not anneal: the prior's model scores every valid schedule (`prior_scores`), so
        the walk could only find a subset of its best; it cost a fleet's explorer 0.4-0.9 s
        per new job (docs/decisions.md, "The first batch with a prior by annealing")."""
        free = self.free_rows(table, history, want, rng) & np.isfinite(table.scores)
        return [int(i) for i in self.space.valid_indices[voice_pick(table.scores[None, :],
                                                                      free, want)]]

    def free_rows(self, table: ScoreTable, history: History, want: int,
                  rng: np.random.Generator) -> np.ndarray:
        """Which rows of `valid_indices` the bag pick may take: every unseen valid schedule
        (the model's scores are a table over the valid schedules, so no annealing walk has
        to find them first)."""
        valid = self.space.valid_indices
        free = np.ones(len(valid), dtype=bool)
        seen = history.seen
        if seen:
            # By sorted lookup: a mask over the whole index space costs 9-27 MB a call.
            inside, pos = valid_rows(valid, np.fromiter(seen, dtype=np.int64, count=len(seen)))
            free[pos[inside]] = False
        return free
