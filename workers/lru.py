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
    """At most `size` entries; with `weigh` (an entry's bytes, which may grow while it is
    kept) also at most `budget` bytes in all, checked whenever an entry is used, the newest
    entry kept whatever it weighs."""

    def __init__(self, size: int, weigh: Callable[[V], int] | None = None,
                 budget: int = 0) -> None:
        self.size = size
        self.weigh = weigh
        self.budget = budget
        self._items: OrderedDict[K, V] = OrderedDict()
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
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        if self.weigh is not None and self.budget > 0:
            weights = [self.weigh(v) for v in self._items.values()]
            total, i = sum(weights), 0
            while total > self.budget and len(self._items) > 1:
                self._items.popitem(last=False)
                total -= weights[i]
                i += 1
        return value

    def items(self) -> list[tuple[K, V]]:
        """The (key, entry) pairs now, least recently used first."""
        with self._lock:
            return list(self._items.items())

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
