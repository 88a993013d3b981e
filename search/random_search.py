"""Random search without replacement: the baseline every other strategy must beat."""

from __future__ import annotations

from search.strategy import History, Strategy


class RandomSearch(Strategy):
    """Random search without replacement over the valid schedules."""

    name = "random"

    def propose(self, history: History, n: int) -> list[int]:
        left = self.unseen_valid(history)
        if len(left) == 0:
            return []
        pick = self.rng(history).choice(left, size=min(n, len(left)), replace=False)
        return [int(i) for i in pick]
