"""GET /schedule: the best verified schedule of a layer, at deploy time.

This is the service's hot path (every deploy of every model asks it), so the handler is
async and, for a schedule it has served before, touches neither a thread nor the database:
found schedules are kept per process as their response bytes (BestCache, which says how it
stays current). Misses and 404s read the database in the thread pool.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.deps import read_access
from api.errors import READ_ERRORS, unprocessable
from api.schemas import ScheduleMissing, ScheduleOut, ScheduleQuery
from kernels.spec import TARGETS, ConvShape, Precision, task_key
from store import repository as repo
from store.baselines import baseline_name, speedup
from store.db import get_engine, session_scope
from store.settings import Settings


class DirectRoute(APIRoute):
    """A route documented like any other whose endpoint takes only the Request and is
    awaited directly: FastAPI's per-request dependency solving (which parses the query,
    headers and cookies for parameters this endpoint does not declare) is skipped. Errors
    still go through the app's exception handlers."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request)
            return response

        return handler


router = APIRouter(tags=["schedule"], route_class=DirectRoute)

# ASCII digits only (str.isdigit() would also take other scripts' digits); = PAIR_PATTERN.
_PAIR = re.compile(r" *([0-9]+) *(?:, *([0-9]+) *)?")


def _pair(name: str, raw: str) -> tuple[int, int]:
    m = _PAIR.fullmatch(raw)
    if m is None:
        raise unprocessable([(("query", name), "must be one non-negative integer or two "
                                               f"separated by a comma, got {raw!r}")])
    first = int(m.group(1))
    return (first, int(m.group(2)) if m.group(2) is not None else first)


def _query_parameters() -> list[dict[str, Any]]:
    """ScheduleQuery as OpenAPI query parameters (the handler parses the query itself)."""
    schema = ScheduleQuery.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.get("$defs", {})
    out = []
    for name, prop in schema["properties"].items():
        prop = dict(prop)
        if "$ref" in prop:  # inline the enum (Precision)
            prop = {**defs[prop.pop("$ref").rsplit("/", 1)[1]], **prop}
        description = prop.pop("description", None)
        prop.pop("title", None)
        param = {"name": name, "in": "query", "required": name in schema["required"],
                 "schema": prop}
        if description:
            param["description"] = description
        out.append(param)
    return out


def task_key_of(query: dict[str, str]) -> str:
    """Validate a GET /schedule query (422 naming each bad field) into its task key."""
    query.pop("token", None)  # read_auth's ?token= is not part of the layer
    try:
        q = ScheduleQuery.model_validate(query)
    except ValidationError as exc:
        raise RequestValidationError([
            {**e, "loc": ("query", *e["loc"]),
             # A missing field's `input` is the whole query (a ?token= included): drop it.
             "input": None if e["type"] == "missing" else e.get("input")}
            for e in exc.errors(include_url=False)]) from None
    tgt = TARGETS[q.target]
    shape = ConvShape(q.n, q.h, q.w, q.c, q.k, q.r, q.s, stride=_pair("stride", q.stride),
                      pad=_pair("pad", q.pad), dilation=_pair("dilation", q.dilation))
    precision = Precision(q.precision)
    problems = shape.problems(precision, tgt)
    if problems:
        raise unprocessable((("query", f), msg) for f, msg in problems)
    return task_key(shape, precision, tgt)


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


def _cache(request: Request) -> BestCache:
    state = request.app.state
    cache: BestCache | None = getattr(state, "schedule_cache", None)
    if cache is None:
        cfg: Settings = state.settings
        cache = state.schedule_cache = BestCache(cfg.db_url, cfg.schedule_cache_s)
    return cache


def _body(row: repo.BestRow) -> bytes:
    return ScheduleOut(
        schedule=row.schedule, latency_us=row.median_us or 0.0, iqr_us=row.iqr_us,
        simulated=row.backend == "simulated", backend=row.backend, job_id=row.job_id,
        measured_at=row.measured_at, task_key=row.task_key,
        baseline=baseline_name(row.precision), baseline_us=row.baseline_us,
        baseline_backend=row.baseline_backend, speedup=speedup(row.baseline_us, row.median_us),
    ).model_dump_json().encode()


def _missing(db_url: str, key: str) -> ScheduleMissing:
    with session_scope(db_url) as session:
        task = repo.find_task(session, key)
        job = repo.latest_job_for_task(session, task.id) if task else None
        running = job is not None and job.status in ("queued", "running")
        return ScheduleMissing(
            detail="no verified schedule yet" + (": a job is tuning it" if running else ""),
            task_key=key, known=task is not None, running=running,
            job=None if job is None else {
                "id": job.id, "status": job.status, "trials": job.trials,
                "trials_done": repo.job_progress(session, job.id).measured},
        )


def _lookup(db_url: str, key: str) -> repo.BestRow | ScheduleMissing:
    with get_engine(db_url).connect() as conn:
        row = repo.best_row_for_key(conn, key)
    return row if row is not None else _missing(db_url, key)


@router.get("/schedule", response_model=ScheduleOut,
            responses={**READ_ERRORS,
                       404: {"model": ScheduleMissing, "description": "nothing verified yet"}},
            openapi_extra={"parameters": _query_parameters()})
async def get_schedule(request: Request) -> Response:
    # The query is parsed here rather than by FastAPI (see DirectRoute): a query string
    # seen before maps to its task key without being parsed again.
    await read_access(request)
    cache = _cache(request)
    raw: bytes = request.scope["query_string"]
    key = cache.keys.get(raw)
    if key is None:
        key = task_key_of(dict(request.query_params))
        cache.remember(raw, key)
    if cache.enabled:
        await cache.current()
        hit = cache.entries.get(key)
        if hit is not None:
            return Response(hit[2], media_type="application/json")
    generation = cache.generation
    found = await run_in_threadpool(_lookup, cache.db_url, key)
    if isinstance(found, ScheduleMissing):
        return JSONResponse(status_code=404, content=found.model_dump())
    body = _body(found)
    if cache.enabled:
        cache.put(key, found, body, generation)
    return Response(body, media_type="application/json")
