"""GET /schedule: the best verified schedule of a layer, at deploy time."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from api.auth import Reader
from api.deps import DB
from api.errors import unprocessable
from api.schemas import ScheduleMissing, ScheduleOut
from kernels.spec import TARGETS, ConvShape, Precision, task_key
from store import repository as repo

router = APIRouter(tags=["schedule"])


def _pair(name: str, raw: str) -> tuple[int, int]:
    parts = raw.split(",")
    if len(parts) not in (1, 2) or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise unprocessable([(("query", name), "must be one integer or two separated by a comma, "
                                               f"got {raw!r}")])
    vals = [int(p) for p in parts]
    return (vals[0], vals[-1])


@router.get("/schedule", response_model=ScheduleOut,
            responses={404: {"model": ScheduleMissing, "description": "nothing verified yet"}})
def get_schedule(
    session: DB,
    _: Reader,
    n: int = Query(...), h: int = Query(...), w: int = Query(...), c: int = Query(...),
    k: int = Query(...), r: int = Query(...), s: int = Query(...),
    stride: str = Query("1", description="'1' or '1,2'"),
    pad: str = Query("0", description="'1' or '1,2'"),
    dilation: str = Query("1", description="'1' or '1,2'"),
    precision: Precision = Query(...),
    target: str = Query(..., description=f"one of {', '.join(TARGETS)}"),
) -> ScheduleOut | JSONResponse:
    if target.lower() not in TARGETS:
        raise unprocessable([(("query", "target"),
                              f"unknown target {target!r}; known: {', '.join(TARGETS)}")])
    tgt = TARGETS[target.lower()]
    shape = ConvShape(n, h, w, c, k, r, s, stride=_pair("stride", stride),
                      pad=_pair("pad", pad), dilation=_pair("dilation", dilation))
    problems = shape.problems(precision, tgt)
    if problems:
        raise unprocessable((("query", f), msg) for f, msg in problems)
    key = task_key(shape, precision, tgt)
    found = repo.best_for_key(session, key)
    if found is None:
        task = repo.find_task(session, key)
        job = repo.latest_job_for_task(session, task.id) if task else None
        running = job is not None and job.status in ("queued", "running")
        body = ScheduleMissing(
            detail="no verified schedule yet" + (": a job is tuning it" if running else ""),
            task_key=key, known=task is not None, running=running,
            job=None if job is None else {
                "id": job.id, "status": job.status, "trials": job.trials,
                "trials_done": repo.job_progress(session, job.id).measured},
        )
        return JSONResponse(status_code=404, content=body.model_dump())
    m, task = found
    return ScheduleOut(schedule=m.schedule, latency_us=m.median_us or 0.0, iqr_us=m.iqr_us,
                       simulated=m.backend == "simulated", backend=m.backend, job_id=m.job_id,
                       measured_at=m.created_at, task_key=task.key)
