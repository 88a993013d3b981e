"""Grid search: the whole space in index order, skipping what is measured, pending or invalid.

The baseline that needs no model and no randomness; its curve shows how the optimum sits in
the enumeration order, which is why the other strategies must beat it by far.
"""

from __future__ import annotations

from search.strategy import History, Strategy


class GridSearch(Strategy):
    """The whole space in index order, skipping what is measured, pending or invalid."""

    name = "grid"

    def propose(self, history: History, n: int) -> list[int]:
        # unseen_valid is ascending, so this continues the enumeration where it left off.
        return [int(i) for i in self.unseen_valid(history)[:n]]
