"""GET /schedule's per-process cache of found schedules (their response bytes), and how it
stays current: see BestCache."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from store import repository as repo
from store.db import get_engine
from store.settings import Settings


class BestCache:
    """Response bodies of found schedules, by task key, for one API process.

    Staleness bound: a request is answered from the cache only if the cache was checked
    against the database at most `max_age_s` before; otherwise the request first waits for
    a check. A check reads a fingerprint of best_schedule (row count, sum of measurement ids,
    latest updated_at: a better schedule, a refresh, a deletion or the task's baseline moves
    it) and, only when it
    moved, every task's (best measurement id, updated_at) to drop the entries that changed.
    So an answer is never older than the database `max_age_s` before the request arrived.
    Absent schedules (404) are not cached: their body reports live job progress.
    """

    MAX_ENTRIES = 200_000

    def __init__(self, db_url: str, max_age_s: float) -> None:
        self.db_url = db_url
        self.max_age_s = max_age_s
        self.entries: dict[str, tuple[int, tuple[int, Any], bytes]] = {}
        # Raw query string -> task key: a pure function of the string, never stale.
        self.keys: dict[bytes, str] = {}
        self.checked_at = -1e18  # monotonic start time of the last completed check
        self.fingerprint: tuple[Any, ...] | None = None
        # Bumped when a check drops entries: a miss read before a check that then fills
        # the cache after it might hold what the check has just dropped.
        self.generation = 0
        self._check: asyncio.Future[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.max_age_s > 0

    async def current(self) -> None:
        """Return once the cache was checked at most max_age_s before this call (a check
        that started after the call also ends the wait, however long it took). Checks start
        at half that age, in the background: under steady traffic no request waits."""
        now = time.monotonic()
        if now - self.checked_at > self.max_age_s / 2:
            self._start_check()
        oldest_ok = now - self.max_age_s
        while self.checked_at < oldest_ok:
            await asyncio.shield(self._start_check())

    def _start_check(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        # (A check left behind by another event loop, as test clients make, is not awaited.)
        if self._check is None or self._check.done() or self._check.get_loop() is not loop:
            self._check = loop.create_task(self._run_check())
            # A background check's failure is retrieved here; waiting requests get it raised.
            self._check.add_done_callback(lambda t: t.cancelled() or t.exception())
        return self._check

    async def _run_check(self) -> None:
        started = time.monotonic()
        fingerprint, versions = await run_in_threadpool(self._read, self.fingerprint)
        if versions is not None:
            for key, (task_id, version, _) in list(self.entries.items()):
                if versions.get(task_id) != version:
                    del self.entries[key]
            self.generation += 1
        self.fingerprint = fingerprint
        self.checked_at = started

    def _read(self, known: tuple[Any, ...] | None
              ) -> tuple[tuple[Any, ...], dict[int, tuple[int, Any]] | None]:
        with get_engine(self.db_url).connect() as conn:
            fingerprint = repo.best_fingerprint(conn)
            if fingerprint == known:
                return fingerprint, None
            return fingerprint, repo.best_versions(conn)

    def remember(self, raw: bytes, key: str) -> None:
        if len(self.keys) >= self.MAX_ENTRIES:
            self.keys.clear()
        self.keys[raw] = key

    def put(self, key: str, row: repo.BestRow, body: bytes, generation: int) -> None:
        if generation != self.generation:
            return
        if len(self.entries) >= self.MAX_ENTRIES:
            self.entries.clear()
        self.entries[key] = (row.task_id, (row.measurement_id, row.updated_at), body)


def schedule_cache(request: Request) -> BestCache:
    """This API process's cache (made at its first request, from the app's settings)."""
    state = request.app.state
    cache: BestCache | None = getattr(state, "schedule_cache", None)
    if cache is None:
        cfg: Settings = state.settings
        cache = state.schedule_cache = BestCache(cfg.db_url, cfg.schedule_cache_s)
    return cache
