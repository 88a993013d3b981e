"""A measuring worker's lease keeper: renews the lease on its chunk from a thread.

The measure loop renews the chunk's lease between steps (workers/tasks.py); one step can
outlast the whole lease (a first measurement on a loaded host, a long build or baseline),
and then another worker would take a candidate this live worker is measuring. The keeper
renews every third of the lease while the chunk is in hand, so only a dead or frozen
worker loses its lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import TracebackType

from store import hotpath as hp
from store.db import statement_scope

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Context manager: while inside, `owner`'s lease on `ids` is renewed in the background
    every `lease_s / 3` seconds (none for an empty chunk or a lease of 0)."""

    def __init__(self, db_url: str, ids: Sequence[int], owner: str, lease_s: float) -> None:
        self.db_url, self.ids, self.owner, self.lease_s = db_url, list(ids), owner, lease_s
        self.renewals = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LeaseKeeper:
        if self.ids and self.lease_s > 0:
            self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                with statement_scope(self.db_url) as s:
                    hp.renew_leases(s, self.ids, self.owner, self.lease_s)
                self.renewals += 1
            except Exception:  # a failed renewal leaves the lease to the next one
                log.warning("lease renewal failed for %s", self.owner, exc_info=True)
