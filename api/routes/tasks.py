"""DELETE /tasks/{id}: forget a task with its jobs and measurements (admin)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from api.auth import Admin
from api.deps import DB, RowId
from api.errors import problem
from store import repository as repo

router = APIRouter(tags=["tasks"])


@router.delete("/tasks/{task_id}", status_code=status.HTTP_204_NO_CONTENT,
               responses={401: problem("no valid token"),
                          403: problem("needs an admin token"),
                          404: problem("no task"),
                          409: problem("a job of the task is still active")})
def delete_task(task_id: RowId, session: DB, _: Admin) -> None:
    task = repo.get_task(session, task_id)
    if task is None:
        raise HTTPException(404, detail=f"no task {task_id}")
    if repo.active_job_for_task(session, task_id) is not None:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            "a job of this task is queued or running: cancel it first")
    session.delete(task)
