"""A bounded map that forgets its least recently used entry, safe to share between threads:
the explorer's in-process caches (spaces, strategies, trials, seeds' rankings), which the
threads of `tctune explorer --threads` share."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most `size` entries; with `weigh` (an entry's bytes) also at most `budget` bytes
    in all, each entry weighed whenever it is used (an entry grows while it is used: a
    strategy's arrays appear in its proposals), the newest kept whatever it weighs."""

    def __init__(self, size: int, weigh: Callable[[V], int] | None = None,
                 budget: int = 0) -> None:
        self.size = size
        self.weigh = weigh
        self.budget = budget
        self._items: OrderedDict[K, V] = OrderedDict()
        self._weights: dict[K, int] = {}  # each entry's weight when last used
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The entry (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._touch(key)
            return value

    def put(self, key: K, value: V) -> V:
        """Store `value` under `key` (the most recently used); returns it."""
        with self._lock:
            self._items[key] = value
            return self._touch(key)

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The entry under `key`, or `make()` stored there (made outside the lock: of two
        threads that make one at once, both get the one stored first)."""
        value = self.get(key)
        if value is not None:
            return value
        value = make()
        with self._lock:
            if self._items.get(key) is None:
                self._items[key] = value
            return self._touch(key)

    def _touch(self, key: K) -> V:
        self._items.move_to_end(key)
        value = self._items[key]
        if self.weigh is not None:  # only the entry used now: the others weigh what they did
            w = self.weigh(value)
            self._total += w - self._weights.get(key, 0)
            self._weights[key] = w
        while len(self._items) > self.size or (
                0 < self.budget < self._total and len(self._items) > 1):
            old, _ = self._items.popitem(last=False)
            self._total -= self._weights.pop(old, 0)
        return value

    def items(self) -> list[tuple[K, V]]:
        """The (key, entry) pairs now, least recently used first."""
        with self._lock:
            return list(self._items.items())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weights.clear()
            self._total = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
