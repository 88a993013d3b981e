"""The explorer's work per proposal, for GET /metrics: wall seconds, candidates proposed and
cost-model boosters trained (search/cost_model.py counts those in `FITS`).

Each explorer process adds up what it did in memory and writes it to its own row of
`explorer_stat` (name host:pid), at most every FLUSH_EVERY_S: a proposal takes 10 ms to
seconds, and a write per proposal would add a transaction to each. The API sums every row
at scrape time, so every API process reports the same fleet-wide numbers. A write adds the
counts since the last one to the row (never sets them), so a restarted process that gets an
old pid back continues that row's counts instead of lowering them, and rows are never
deleted: counters only grow. A failed write keeps its counts for the next one and never
fails a proposal.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from search import cost_model
from store import repository as repo
from store.db import get_engine

log = logging.getLogger(__name__)

# Upper bounds of the histogram of proposal seconds (and +Inf): from a random pick to a
# diversity proposal that trains a base model on a large prior.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
FLUSH_EVERY_S = 2.0
# On SQLite the explorer's own transaction may hold the write lock when it records (it has
# re-marked open candidates as sent): waiting the usual 30 s for it would wait on itself.
SQLITE_WAIT_MS = 200


def bucket_key(bound: float) -> str:
    """The bound as stored in `explorer_stat.buckets` and as Prometheus' `le` writes it."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


@dataclass
class _Counts:
    proposals: int = 0
    seconds_sum: float = 0.0
    buckets: dict[str, int] = field(default_factory=dict)
    fits_scratch: int = 0
    fits_extend: int = 0
    proposed: int = 0

    def __bool__(self) -> bool:
        return bool(self.proposals or self.fits_scratch or self.fits_extend)

    def add(self, other: _Counts) -> None:
        self.proposals += other.proposals
        self.seconds_sum += other.seconds_sum
        for k, n in other.buckets.items():
            self.buckets[k] = self.buckets.get(k, 0) + n
        self.fits_scratch += other.fits_scratch
        self.fits_extend += other.fits_extend
        self.proposed += other.proposed


_lock = threading.Lock()  # the state below (the embedded explorer is a thread of the API)
_write_lock = threading.Lock()  # one write at a time
_pending = _Counts()  # recorded, not written yet
_fits_seen: dict[str, int] = {}  # cost_model.FITS at the last record
_written_at = -1e18  # monotonic time of the last write (or failed try)
_db_url: str | None = None  # where the deferred write goes: the last flush's database
_timer: threading.Timer | None = None


def reset() -> None:
    """Forget what is not written and count fits from now on (tests start from nothing)."""
    global _pending, _fits_seen, _written_at, _timer
    with _lock:
        if _timer is not None:
            _timer.cancel()
        _pending, _fits_seen, _written_at, _timer = _Counts(), dict(cost_model.FITS), -1e18, None


def _after_fork() -> None:
    # A child's unwritten counts are its parent's; the locks may have been held by a
    # thread that does not exist here, and the timer's thread is gone.
    global _lock, _write_lock, _pending, _fits_seen, _written_at, _timer
    _lock, _write_lock = threading.Lock(), threading.Lock()
    _pending, _fits_seen, _written_at, _timer = _Counts(), dict(cost_model.FITS), -1e18, None


reset()
os.register_at_fork(after_in_child=_after_fork)


def record_proposal(seconds: float, proposed: int) -> None:
    """One proposal of `seconds` that proposed `proposed` candidates, and the boosters
    trained in this process since the last record."""
    key = bucket_key(next((b for b in BUCKETS if seconds <= b), float("inf")))
    with _lock:
        fits = dict(cost_model.FITS)
        _pending.proposals += 1
        _pending.seconds_sum += seconds
        _pending.buckets[key] = _pending.buckets.get(key, 0) + 1
        _pending.proposed += proposed
        _pending.fits_scratch += fits.get("scratch", 0) - _fits_seen.get("scratch", 0)
        _pending.fits_extend += fits.get("extend", 0) - _fits_seen.get("extend", 0)
        _fits_seen.update(fits)


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:128]


def flush(db_url: str, force: bool = False) -> None:
    """Add the counts recorded since the last write to this process's row, unless the last
    write was less than FLUSH_EVERY_S ago (`force`: now); then a timer writes them once it
    is due, so that the last proposals before the explorer goes idle are not left out.
    Never raises."""
    global _pending, _written_at, _db_url
    with _lock:
        _db_url = db_url
        if not _pending:
            return
        wait = FLUSH_EVERY_S - (time.monotonic() - _written_at)
        if wait > 0 and not force:
            _schedule(wait)
            return
        _written_at = time.monotonic()
        counts, _pending = _pending, _Counts()
    if not _write_lock.acquire(blocking=force):
        _keep(counts)  # another thread is writing: these go with the next write
        return
    try:
        _write(db_url, process_name(), counts)
    except Exception:  # a metric must never fail a proposal
        log.warning("explorer stats not written, kept for the next write", exc_info=True)
        _keep(counts)
    finally:
        _write_lock.release()


def _keep(counts: _Counts) -> None:
    with _lock:
        _pending.add(counts)
        _schedule(FLUSH_EVERY_S)


def _schedule(wait: float) -> None:
    """A deferred write in `wait` seconds unless one is due already (caller holds _lock)."""
    global _timer
    if _timer is not None and _timer.is_alive():
        return
    _timer = threading.Timer(wait, _deferred)
    _timer.daemon = True
    _timer.start()


def _deferred() -> None:
    global _timer
    with _lock:
        _timer, url = None, _db_url
    if url is not None:
        flush(url)


def _write(db_url: str, name: str, c: _Counts) -> None:
    engine = get_engine(db_url)
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        if sqlite:
            wait_ms = int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0)
            conn.exec_driver_sql(f"PRAGMA busy_timeout={SQLITE_WAIT_MS}")
            conn.commit()
        try:
            with Session(bind=conn) as s, s.begin():
                repo.add_explorer_stat(s, name, c.proposals, c.seconds_sum, c.buckets,
                                       c.fits_scratch, c.fits_extend, c.proposed)
        finally:
            if sqlite:  # the connection goes back to the pool with its usual wait
                conn.exec_driver_sql(f"PRAGMA busy_timeout={wait_ms}")
                conn.commit()
