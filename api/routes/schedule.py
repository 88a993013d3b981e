"""GET /schedule: the best verified schedule of a layer, at deploy time.

This is the service's hot path (every deploy of every model asks it), so the handler is
async and, for a schedule it has served before, touches neither a thread nor the database:
found schedules are kept per process as their response bytes (api/schedule_cache.py says
how they stay current). Misses and 404s read the database in the thread pool.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.deps import read_access
from api.direct_route import DirectRoute
from api.errors import READ_ERRORS, unprocessable
from api.schedule_cache import schedule_cache
from api.schemas import ScheduleMissing, ScheduleOut, ScheduleQuery, simulated_note
from kernels.spec import TARGETS, ConvShape, Precision, task_key
from store import repository as repo
from store.baselines import baseline_name, speedup
from store.db import get_engine, session_scope

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
                      pad=_pair("pad", q.pad), dilation=_pair("dilation", q.dilation),
                      concat=q.concat, residual=q.residual, b2b=q.b2b)
    precision = Precision(q.precision)
    problems = shape.problems(precision, tgt)
    if problems:
        raise unprocessable((("query", f), msg) for f, msg in problems)
    return task_key(shape, precision, tgt)


def _body(row: repo.BestRow) -> bytes:
    return ScheduleOut(
        schedule=row.schedule, latency_us=row.median_us or 0.0, iqr_us=row.iqr_us,
        simulated=row.backend == "simulated", backend=row.backend, job_id=row.job_id,
        simulated_note=simulated_note(row.backend == "simulated", row.target),
        measured_at=row.measured_at, task_key=row.task_key,
        baseline=baseline_name(row.precision), baseline_us=row.baseline_us,
        baseline_backend=row.baseline_backend, speedup=speedup(row.baseline_us, row.median_us),
    ).model_dump_json().encode()


def _missing(db_url: str, key: str) -> ScheduleMissing:
    with session_scope(db_url) as session:
        task = repo.find_task(session, key)
        job = repo.latest_job_for_task(session, task.id) if task else None
        running = job is not None and job.status in ("queued", "running")
        batches = repo.verified_batches(session, key)
        return ScheduleMissing(
            detail="no verified schedule yet" + (": a job is tuning it" if running else "")
            + (f" (verified at batch {', '.join(map(str, batches))})" if batches else ""),
            task_key=key, known=task is not None, running=running, batches=batches,
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
    cache = schedule_cache(request)
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
