"""Retry with backoff, one policy for both transports.

A step that fails because the database is briefly unavailable (`store.errors.UNAVAILABLE`:
a server restarting, a dropped connection, SQLite locked past its timeout) or the broker
connection dropped succeeds once it is back, so it is tried again after a pause that
doubles with each failure in a row: 1, 2, 4, ... seconds, at most `MAX_DELAY_S`. The fleet's
tasks retry through Celery's own autoretry, configured from these numbers
(`celery_retry_options`; Celery's `retry_backoff` is the same doubling, with jitter so that
a fleet does not retry in step); the embedded dispatcher keeps a `Backoff` per job.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

from store.errors import UNAVAILABLE

# What is worth retrying: the database or the broker away, not a bug.
RETRY_ON: tuple[type[BaseException], ...] = (*UNAVAILABLE, ConnectionError)
MAX_DELAY_S = 60.0
# A fleet task gives up after this many retries; its candidates are open in the database,
# and the sweeper sends them again (workers/protocol.py).
MAX_RETRIES = 20


def delay_s(failures: int) -> float:
    """The pause after `failures` failures in a row (1 or more)."""
    return min(MAX_DELAY_S, 2.0 ** max(0, failures - 1))


def celery_retry_options() -> dict[str, Any]:
    """The task options that give a Celery task this policy."""
    return {"autoretry_for": RETRY_ON, "retry_backoff": True,
            "retry_backoff_max": int(MAX_DELAY_S), "max_retries": MAX_RETRIES}


class Backoff:
    """Pauses per key (a job): `failed` starts or doubles one, `succeeded` ends it."""

    def __init__(self) -> None:
        self._until: dict[Hashable, tuple[float, int]] = {}  # key -> (monotonic, failures)

    def failed(self, key: Hashable) -> float:
        """Record a failure; returns the pause it starts."""
        failures = self._until.get(key, (0.0, 0))[1] + 1
        pause = delay_s(failures)
        self._until[key] = (time.monotonic() + pause, failures)
        return pause

    def succeeded(self, key: Hashable) -> None:
        self._until.pop(key, None)

    def ready(self, key: Hashable) -> bool:
        """Not paused (never failed, or its pause is over)."""
        return self._until.get(key, (0.0, 0))[0] <= time.monotonic()
