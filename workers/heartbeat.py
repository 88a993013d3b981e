"""Workers announce themselves: one heartbeat for the embedded dispatcher and the fleet.

Every `heartbeat_s` a measuring process writes a row per worker it hosts (the workers
table: GET /workers, the fleet page, the explorer's count of idle GPUs), busy or idle. A
worker `DEAD_AFTER_BEATS` beats late is dead: the fleet's sweeper frees its leases
(workers/protocol.py). The first beat of a process restarts the worker's start time (a
restarted worker keeps its name); a fleet worker's last says it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from store import repository as repo
from store.db import session_scope
from store.settings import Settings

# A worker this many heartbeat periods late is dead, not slow (a beat is one statement).
DEAD_AFTER_BEATS = 4


def dead_after_s(settings: Settings) -> float:
    return DEAD_AFTER_BEATS * settings.heartbeat_s


@dataclass(frozen=True)
class Workers:
    """Workers of one kind in this process: their names and the GPU they measure on."""

    names: tuple[str, ...]
    model: str
    sm: int
    target: str
    backend: str


class Heartbeat:
    """Writes the rows of `workers` every `period_s`; `busy(session)` names those at work."""

    def __init__(self, db_url: str, period_s: float, workers: Sequence[Workers],
                 busy: Callable[[Session], Collection[str]]) -> None:
        self.db_url, self.period_s = db_url, period_s
        self.workers = list(workers)
        self.busy = busy
        self._last = -1e18
        self._started = True  # the next beat is this process's first

    def beat(self) -> None:
        self._last = time.monotonic()  # a failed beat waits for the next period too
        with session_scope(self.db_url) as s:
            busy = set(self.busy(s))
            for w in self.workers:
                repo.heartbeat_many(s, {n: "busy" if n in busy else "idle" for n in w.names},
                                    w.model, w.sm, w.target, w.backend, started=self._started)
        self._started = False

    def beat_if_due(self) -> None:
        """For a loop that runs more often than the period."""
        if time.monotonic() - self._last >= self.period_s:
            self.beat()

    def stopped(self) -> None:
        """The process is leaving: its workers are dead at once, not 4 beats later."""
        with session_scope(self.db_url) as s:
            for w in self.workers:
                repo.heartbeat_many(s, dict.fromkeys(w.names, "stopped"), w.model, w.sm,
                                    w.target, w.backend)
