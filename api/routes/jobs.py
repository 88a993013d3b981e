"""GET /jobs and GET /jobs/{id}: status, progress and the measurement history."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, status

from api.auth import Reader, Tuner
from api.deps import DB, MAX_ID, RowId
from api.errors import READ_ERRORS, problem, unprocessable
from api.schemas import JobOut, JobSummary, MeasurementOut, TaskOut, simulated_note
from store import repository as repo
from store.baselines import baseline_name, speedup
from store.layer import any_case
from store.models import ACTIVE_JOB_STATES, JOB_STATES, Job, Task

router = APIRouter(tags=["jobs"])


def task_out(task: Task) -> TaskOut:
    return TaskOut(id=task.id, key=task.key, shape=task.shape, precision=task.precision,
                   target=task.target, baseline=baseline_name(task.precision),
                   baseline_us=task.baseline_us,
                   baseline_backend=task.baseline_backend)


def _speedup(task: Task, best_us: float | None) -> float | None:
    return speedup(task.baseline_us, best_us)


def measurements_after(session: DB, job_id: int, after: int) -> list[MeasurementOut]:
    """The job's measurements with id > after, in order, numbered by trial."""
    rows = repo.job_measurements(session, job_id, after_id=after)
    first_trial = repo.count_job_measurements_upto(session, job_id, after) + 1 if after else 1
    return [MeasurementOut(id=m.id, trial=first_trial + i, schedule=m.schedule,
                           schedule_hash=m.schedule_hash, status=m.status,
                           median_us=m.median_us, iqr_us=m.iqr_us, backend=m.backend,
                           simulated=m.backend == "simulated", worker=m.worker, error=m.error,
                           created_at=m.created_at, predicted_us=m.predicted_us)
            for i, m in enumerate(rows)]


STATUS_PATTERN = any_case(JOB_STATES)


@router.post("/jobs/{job_id}/cancel", response_model=JobSummary,
             responses={401: problem("no valid token"),
                        403: problem("neither admin nor the submitter"),
                        404: problem("no job"),
                        409: problem("the job has ended already")})
def cancel_job(job_id: RowId, session: DB, caller: Tuner) -> JobSummary:
    job = repo.get_job(session, job_id, lock=True)
    if job is None:
        raise HTTPException(404, detail=f"no job {job_id}")
    if not (caller.allows("admin") or job.submitted_by == caller.token_id):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            "only an admin token or the token that submitted it may cancel")
    if job.status not in ACTIVE_JOB_STATES:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} is {job.status} already")
    repo.set_job_status(session, job, "cancelled")
    return _summary(session, job)


@router.get("/jobs", response_model=list[JobSummary], responses=READ_ERRORS)
def list_jobs(session: DB, _: Reader,
              status: str | None = Query(None, pattern=STATUS_PATTERN, description=(
                  "only jobs in this state (the `status` field of a job), case-insensitive")),
              state: str | None = Query(None, pattern=STATUS_PATTERN,
                                        description="the same as `status` (its old name)"),
              limit: int = Query(100, ge=1, le=1000)) -> list[JobSummary]:
    wanted = {s.lower() for s in (status, state) if s}
    if len(wanted) > 1:
        raise unprocessable([(("query", "state"), "gives another state than `status`")])
    return [_summary(session, job, task) for job, task in
            repo.list_jobs(session, wanted.pop() if wanted else None, limit)]


def _summary(session: DB, job: Job, task: Task | None = None) -> JobSummary:
    task = task or repo.get_task(session, job.task_id)
    assert task is not None
    prog = repo.job_progress(session, job.id)
    return JobSummary(id=job.id, status=job.status, strategy=job.strategy, trials=job.trials,
                      trials_done=prog.measured, best_us=prog.best_us, simulated=prog.simulated,
                      simulated_note=simulated_note(prog.simulated, task.target),
                      speedup=_speedup(task, prog.best_us), task=task_out(task),
                      created_at=job.created_at)


@router.get("/jobs/{job_id}", response_model=JobOut,
            responses={**READ_ERRORS, 404: problem("no job")})
def get_job(job_id: RowId, session: DB, _: Reader,
            after: int = Query(0, ge=0, le=MAX_ID,
                               description="only measurements with id > after"),
            ) -> JobOut:
    job = repo.get_job(session, job_id)
    if job is None:
        raise HTTPException(404, detail=f"no job {job_id}")
    task = repo.get_task(session, job.task_id)
    assert task is not None
    prog = repo.job_progress(session, job.id)
    measurements = measurements_after(session, job.id, after)
    live = len(repo.live_workers(session, task.target))
    warning = None
    if job.status in ACTIVE_JOB_STATES and not live:
        warning = f"no live worker for target {task.target}: the job waits for one"
    return JobOut(
        id=job.id, status=job.status, strategy=job.strategy,
        strategy_options=job.strategy_options, seed=job.seed, trials=job.trials,
        trials_done=prog.measured, best_us=prog.best_us, simulated=prog.simulated,
        simulated_note=simulated_note(prog.simulated, task.target),
        task=task_out(task), created_at=job.created_at, started_at=job.started_at,
        finished_at=job.finished_at, error=job.error, live_workers=live, warning=warning,
        speedup=_speedup(task, prog.best_us), insight=job.insight,
        measurements=measurements,
        next_after=measurements[-1].id if measurements else after,
    )
