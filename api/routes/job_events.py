"""GET /jobs/{id}/events: a job's progress as a stream of server-sent events.

Events, in order:
- `measurement` (one per new measurement, the MeasurementOut JSON; its SSE id is the row id,
  so a client that reconnects with `Last-Event-ID` resumes right after it: nothing missed,
  nothing twice);
- `progress` whenever status, trials_done, best_us or the no-live-worker warning changes;
- `end` once the job has ended (or was deleted), after its last measurement; then the
  stream closes.
The server polls the database every `interval` seconds while the job is active, sends a
comment line when it has been silent for KEEPALIVE_S (proxies drop idle connections), and
closes a stream after `events_max_s` (settings); clients reconnect with Last-Event-ID.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.deps import MAX_ID, Config, FastReader, RowId
from api.errors import READ_ERRORS, problem
from api.routes.jobs import measurements_after
from api.schemas import MeasurementOut
from store import repository as repo
from store.db import session_scope
from store.models import ACTIVE_JOB_STATES

router = APIRouter(tags=["jobs"])

KEEPALIVE_S = 15.0


@dataclass(frozen=True)
class Snapshot:
    progress: dict[str, Any]
    measurements: list[MeasurementOut]

    @property
    def ended(self) -> bool:
        return self.progress["status"] not in ACTIVE_JOB_STATES


def read_snapshot(db_url: str, job_id: int, after: int) -> Snapshot | None:
    with session_scope(db_url) as session:
        job = repo.get_job(session, job_id)
        if job is None:
            return None
        # The status is read before the measurements: a job that has ended had every one of
        # its measurements committed before its status changed, so the list below is whole.
        status = job.status
        task = repo.get_task(session, job.task_id)
        prog = repo.job_progress(session, job_id)
        warning = None
        if status in ACTIVE_JOB_STATES and task is not None \
                and not repo.live_workers(session, task.target):
            warning = f"no live worker for target {task.target}: the job waits for one"
        return Snapshot(
            progress={"status": status, "trials": job.trials, "trials_done": prog.measured,
                      "best_us": prog.best_us, "warning": warning, "error": job.error},
            measurements=measurements_after(session, job_id, after))


def sse(event: str, data: str, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n"


async def stream(request: Request, db_url: str, job_id: int, after: int, first: Snapshot,
                 interval: float, max_s: float) -> AsyncIterator[str]:
    snap: Snapshot | None = first
    deadline = time.monotonic() + max_s
    last_progress: dict[str, Any] | None = None
    last_sent = time.monotonic()
    while True:
        if snap is None:  # deleted while streaming
            yield sse("end", json.dumps({"status": "deleted"}))
            return
        for m in snap.measurements:
            yield sse("measurement", m.model_dump_json(), m.id)
            after = m.id
            last_sent = time.monotonic()
        if snap.progress != last_progress:
            last_progress = snap.progress
            yield sse("progress", json.dumps(snap.progress))
            last_sent = time.monotonic()
        if snap.ended:
            yield sse("end", json.dumps(snap.progress))
            return
        if time.monotonic() >= deadline or await request.is_disconnected():
            return  # (at the deadline the client reconnects with Last-Event-ID)
        await asyncio.sleep(interval)
        if time.monotonic() - last_sent >= KEEPALIVE_S:
            yield ": keep-alive\n\n"
            last_sent = time.monotonic()
        snap = await run_in_threadpool(read_snapshot, db_url, job_id, after)


@router.get("/jobs/{job_id}/events", response_class=StreamingResponse,
            responses={**READ_ERRORS, 404: problem("no job"),
                       200: {"content": {"text/event-stream": {}},
                             "description": "measurement, progress and end events"}})
async def job_events(job_id: RowId, request: Request, cfg: Config, _: FastReader,
                     after: int = Query(0, ge=0, le=MAX_ID,
                                        description="only measurements with id > after"),
                     interval: float = Query(0.5, ge=0.05, le=10.0,
                                             description="seconds between database polls"),
                     last_event_id: str | None = Header(
                         None, description="resume after this measurement id (SSE reconnect)"),
                     ) -> StreamingResponse:
    if last_event_id is not None:
        text = last_event_id.strip()
        # isdigit() alone admits '²' and other digits int() refuses
        if not (text.isascii() and text.isdigit()) or int(text) > MAX_ID:
            raise HTTPException(422, detail=[{
                "loc": ["header", "last-event-id"], "type": "value_error",
                "msg": f"must be a measurement id (an integer 0..{MAX_ID}), got {text[:40]!r}"}])
        after = max(after, int(text))
    first = await run_in_threadpool(read_snapshot, cfg.db_url, job_id, after)
    if first is None:
        raise HTTPException(404, detail=f"no job {job_id}")
    return StreamingResponse(
        stream(request, cfg.db_url, job_id, after, first, interval, cfg.events_max_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
