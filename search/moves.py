"""Vectorized moves in a schedule space's mixed-radix index (what annealing walkers do).

`ScheduleSpace.mutate_index` moves one schedule at a time; annealing moves 128-256 walkers
for up to 500 steps per proposal, so the same move is done here on whole arrays.
"""

from __future__ import annotations

import numpy as np

from kernels.space import ScheduleSpace


class Moves:
    def __init__(self, space: ScheduleSpace) -> None:
        self.radices = np.asarray(space.radices, dtype=np.int64)
        # Place values as in ScheduleSpace: the first knob varies slowest.
        self.place = np.ones(len(self.radices), dtype=np.int64)
        for i in range(len(self.radices) - 2, -1, -1):
            self.place[i] = self.place[i + 1] * self.radices[i + 1]
        self.movable = np.flatnonzero(self.radices > 1)
        self.valid = np.zeros(space.size, dtype=bool)
        self.valid[space.valid_indices] = True

    def digits(self, idx: np.ndarray) -> np.ndarray:
        return (np.asarray(idx, dtype=np.int64)[:, None] // self.place) % self.radices

    def _step(self, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        knob = self.movable[rng.integers(0, len(self.movable), len(idx))]
        rad = self.radices[knob]
        old = (idx // self.place[knob]) % rad
        new = (old + 1 + (rng.random(len(idx)) * (rad - 1)).astype(np.int64)) % rad
        return idx + (new - old) * self.place[knob]

    def mutate(self, idx: np.ndarray, rng: np.random.Generator, tries: int = 8) -> np.ndarray:
        """Each point with one random knob changed to another value, retried (up to `tries`)
        until valid; a point with no valid neighbour found stays where it is."""
        idx = np.asarray(idx, dtype=np.int64)
        out = idx.copy()
        todo = np.arange(len(idx))
        for _ in range(tries):
            if len(todo) == 0:
                break
            cand = self._step(idx[todo], rng)
            ok = self.valid[cand]
            out[todo[ok]] = cand[ok]
            todo = todo[~ok]
        return out
