"""Group commit of measuring results: one transaction for the chunks that several GPU slots
of one process finish at about the same time.

A simulated node hosts dozens of GPUs as threads of one process (`tctune worker --slots`),
and so could a multi-GPU host; each slot used to write its chunk in transactions of its
own. Here a slot hands its group of results to the process's batcher and waits; the
batcher's thread writes every group waiting at that moment in one transaction (and asks
once which of their rounds closed), then wakes each slot with its own answer. Nothing
waits on a timer: a group waits at most for the transaction before it, and the busier the
database, the more groups each transaction carries.

Nothing is lost or counted twice: a slot returns (and its message is acknowledged) only
after its group is committed; a failed transaction fails every group in it, and each
slot's task retries its message as it would after its own failed write (the writes are
idempotent: unique (task, schedule hash), leases of its own).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from workers import tasks
from workers.tasks import WriteGroup

log = logging.getLogger(__name__)

# Groups written per transaction at most: bounds one transaction's size and lock time.
MAX_GROUPS = 64


@dataclass
class _Waiting:
    group: WriteGroup
    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[int, set[int]] | None = None
    error: BaseException | None = None


class WriteBatcher:
    """One per process and database: `write` is called by many threads at once."""

    def __init__(self, db_url: str,
                 write_groups: Callable[[str, Sequence[WriteGroup]],
                                        list[tuple[int, set[int]]]] | None = None) -> None:
        self.db_url = db_url
        self.pid = os.getpid()
        self._write_groups = write_groups or tasks.write_groups
        self._cond = threading.Condition()
        self._queue: list[_Waiting] = []
        self.transactions = 0  # for tests and logs: how many it took
        self.groups = 0
        self._thread = threading.Thread(target=self._run, name="write-batcher", daemon=True)
        self._thread.start()

    def write(self, group: WriteGroup) -> tuple[int, set[int]]:
        waiting = _Waiting(group)
        with self._cond:
            self._queue.append(waiting)
            self._cond.notify()
        waiting.done.wait()
        if waiting.error is not None:
            raise waiting.error
        assert waiting.result is not None
        return waiting.result

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                batch, self._queue = self._queue[:MAX_GROUPS], self._queue[MAX_GROUPS:]
            try:
                results = self._write_groups(self.db_url, [w.group for w in batch])
            except BaseException as exc:  # every slot in the batch retries its own message
                for w in batch:
                    w.error = exc
                    w.done.set()
                continue
            self.transactions += 1
            self.groups += len(batch)
            if self.transactions % 1000 == 0:  # how much it merges, for whoever tunes it
                log.info("write batcher: %d groups in %d transactions", self.groups,
                         self.transactions)
            for w, res in zip(batch, results, strict=True):
                w.result = res
                w.done.set()


_batchers: dict[str, WriteBatcher] = {}
_lock = threading.Lock()


def batcher_for(db_url: str) -> WriteBatcher:
    """The process's batcher for this database (started on first use)."""
    with _lock:
        b = _batchers.get(db_url)
        if b is None or b.pid != os.getpid():  # a forked child has no batcher thread
            b = _batchers[db_url] = WriteBatcher(db_url)
        return b
