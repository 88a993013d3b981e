"""POST /tune: queue a tuning job for a layer (or return the one already running)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response, status

from api.auth import Tuner
from api.deps import DB
from api.errors import BODY_ERRORS, JsonBodyRoute, problem, unprocessable
from api.schemas import TuneRequest, TuneResponse
from kernels.spec import Precision, get_target
from search.registry import DEFAULT_STRATEGY, OptionError, check_options
from store import repository as repo

router = APIRouter(tags=["tune"], route_class=JsonBodyRoute)

# When to ask again after the active-jobs limit: jobs take minutes, so a client that
# retries sooner only adds load; one that waits this long often finds a slot.
ACTIVE_JOBS_RETRY_S = 30


@router.post("/tune", status_code=status.HTTP_202_ACCEPTED, response_model=TuneResponse,
             responses={200: {"model": TuneResponse,
                              "description": "an active job of the same task"},
                        401: problem("no valid token"),
                        403: problem("the token's scope is not enough"),
                        422: {"description": "invalid layer, precision, target, strategy or "
                                              "strategy option"},
                        429: problem("rate or active-job limit of the token "
                                     "(Retry-After: seconds to wait)"),
                        **BODY_ERRORS})
def tune(req: TuneRequest, request: Request, response: Response, session: DB,
         caller: Tuner) -> TuneResponse:
    wait_s = request.app.state.tune_limit.take(session, caller.token_id)
    if wait_s > 0:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                            "too many POST /tune for this token; slow down",
                            headers={"Retry-After": str(max(1, round(wait_s)))})
    target = get_target(req.target)
    shape = req.shape.to_shape()
    precision = Precision(req.precision)
    problems = shape.problems(precision, target)
    if problems:
        raise unprocessable(((("body", "shape", f) if f in type(req.shape).model_fields
                              else ("body", "shape")), msg) for f, msg in problems)
    strategy = req.strategy or DEFAULT_STRATEGY
    options = _strategy_options(strategy, req.strategy_options or {})
    task = repo.get_or_create_task(session, shape, precision, target)
    job = repo.active_job_for_task(session, task.id)
    created = job is None
    if job is None:
        limit = request.app.state.settings.active_jobs_per_token
        if caller.token_id is not None and repo.active_jobs_of(session, caller.token_id) >= limit:
            raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS,
                                f"this token has {limit} queued or running jobs already; "
                                "wait for some to finish or cancel them",
                                headers={"Retry-After": str(ACTIVE_JOBS_RETRY_S)})
        job = repo.create_job(session, task, req.trials, strategy, req.seed,
                              submitted_by=caller.token_id, strategy_options=options)
        session.commit()  # the explorer must find the job when the message arrives
        request.app.state.on_new_job(job.id)
    else:
        response.status_code = status.HTTP_200_OK
    return TuneResponse(job_id=job.id, task_id=task.id, task_key=task.key, status=job.status,
                        created=created)


def _strategy_options(strategy: str, given: dict[str, int | float | str]
                      ) -> dict[str, int | float | str]:
    """The options as the strategy declares them; a 422 naming the option otherwise."""
    try:
        return check_options(strategy, given)
    except OptionError as exc:
        raise unprocessable([(("body", "strategy_options", exc.option), exc.reason)]) from None
