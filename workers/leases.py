"""A measuring worker's lease keeper: renews the lease on its chunk from a thread.

The measure loop renews the chunk's lease between steps (workers/tasks.py); one step can
outlast the whole lease (a first measurement on a loaded host, a long build or baseline),
and then another worker would take a candidate this live worker is measuring. The keeper
renews every third of the lease while the chunk is in hand, so only a dead or frozen
worker loses its lease.

One thread per process renews every chunk in hand (a simulated node's slots hold dozens
at once): starting and joining a thread per chunk cost a worker about 0.1 ms of CPU per
chunk, for renewals that almost never come (a chunk takes well under a third of a lease).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from store import hotpath as hp
from store.db import statement_scope

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Context manager: while inside, `owner`'s lease on `ids` is renewed in the background
    every `lease_s / 3` seconds (none for an empty chunk or a lease of 0). Once it has
    left, no renewal of it runs or starts."""

    def __init__(self, db_url: str, ids: Sequence[int], owner: str, lease_s: float) -> None:
        self.db_url, self.ids, self.owner, self.lease_s = db_url, list(ids), owner, lease_s
        self.renewals = 0
        self.due = 0.0  # monotonic time of the next renewal (set by the keeper thread)
        self.renewing = False  # a renewal of it is running now (guarded by the keeper)

    def __enter__(self) -> LeaseKeeper:
        if self.ids and self.lease_s > 0:
            _keeper().add(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.ids and self.lease_s > 0:
            _keeper().remove(self)

    def renew(self) -> None:
        try:
            with statement_scope(self.db_url) as s:
                hp.renew_leases(s, self.ids, self.owner, self.lease_s)
            self.renewals += 1
        except Exception:  # a failed renewal leaves the lease to the next one
            log.warning("lease renewal failed for %s", self.owner, exc_info=True)


class _Keeper:
    """The process's renewing thread and the chunks it keeps."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._cond = threading.Condition()
        self._held: set[LeaseKeeper] = set()
        self._wake_at = float("inf")  # when the thread wakes next unless notified
        self._thread = threading.Thread(target=self._run, name="lease-keeper", daemon=True)
        self._thread.start()

    def add(self, lease: LeaseKeeper) -> None:
        with self._cond:
            lease.due = time.monotonic() + lease.lease_s / 3
            self._held.add(lease)
            if lease.due < self._wake_at:  # else the thread wakes before it is due anyway
                self._cond.notify()

    def remove(self, lease: LeaseKeeper) -> None:
        with self._cond:
            self._held.discard(lease)
            while lease.renewing:  # the chunk is done: no renewal may outlive it
                self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [x for x in self._held if x.due <= now]
                if not due:
                    self._wake_at = min((x.due for x in self._held), default=float("inf"))
                    self._cond.wait(None if self._wake_at == float("inf")
                                    else max(0.0, self._wake_at - now))
                    self._wake_at = float("inf")
                    continue
                for x in due:
                    x.renewing = True
            for x in due:
                try:
                    x.renew()
                finally:
                    with self._cond:
                        x.due = time.monotonic() + x.lease_s / 3
                        x.renewing = False
                        self._cond.notify_all()


_keepers: dict[int, _Keeper] = {}
_lock = threading.Lock()


def _keeper() -> _Keeper:
    """This process's keeper (a forked child starts its own)."""
    pid = os.getpid()
    with _lock:
        k = _keepers.get(pid)
        if k is None:
            k = _keepers[pid] = _Keeper()
        return k
