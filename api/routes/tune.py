"""POST /tune: queue a tuning job for a layer (or return the one already running)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from api.deps import DB
from api.errors import unprocessable
from api.schemas import TuneRequest, TuneResponse
from kernels.spec import get_target
from search.registry import DEFAULT_STRATEGY
from store import repository as repo

router = APIRouter(tags=["tune"])


@router.post("/tune", status_code=status.HTTP_202_ACCEPTED, response_model=TuneResponse,
             responses={200: {"model": TuneResponse,
                              "description": "an active job of the same task"},
                        422: {"description": "invalid layer, precision, target or strategy"}})
def tune(req: TuneRequest, request: Request, response: Response, session: DB) -> TuneResponse:
    target = get_target(req.target)
    shape = req.shape.to_shape()
    problems = shape.problems(req.precision, target)
    if problems:
        raise unprocessable(((("body", "shape", f) if f in type(req.shape).model_fields
                              else ("body", "shape")), msg) for f, msg in problems)
    task = repo.get_or_create_task(session, shape, req.precision, target)
    job = repo.active_job_for_task(session, task.id)
    created = job is None
    if job is None:
        job = repo.create_job(session, task, req.trials, req.strategy or DEFAULT_STRATEGY,
                              req.seed)
        session.commit()  # the explorer must find the job when the message arrives
        request.app.state.on_new_job(job.id)
    else:
        response.status_code = status.HTTP_200_OK
    return TuneResponse(job_id=job.id, task_id=task.id, task_key=task.key, status=job.status,
                        created=created)
