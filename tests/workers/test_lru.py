"""The explorer's shared caches: bounded, the least recently used entry out first."""

from __future__ import annotations

from workers.lru import Lru


def test_the_least_recently_used_entry_goes_first() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and len(lru) == 2
    assert lru.get_or_make("a", lambda: 9) == 1  # kept what was there
    assert lru.get_or_make("d", lambda: 4) == 4 and "c" not in lru
