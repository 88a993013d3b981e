"""GET /workers: the fleet, its GPUs, heartbeats and throughput."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter

from api.auth import Reader
from api.deps import DB
from api.errors import READ_ERRORS
from api.schemas import WorkerOut
from store import repository as repo
from store.models import utcnow

router = APIRouter(tags=["workers"])

# A worker silent for longer than this is shown as lost (its leases expire on their own).
LOST_AFTER_S = 60.0
RATE_WINDOW_MIN = 5


@router.get("/workers", response_model=list[WorkerOut], responses=READ_ERRORS)
def list_workers(session: DB, _: Reader) -> list[WorkerOut]:
    now = utcnow()
    counts = repo.measurements_per_worker(session, now - timedelta(minutes=RATE_WINDOW_MIN))
    out = []
    for w in repo.all_workers(session):
        age = (now - repo.as_utc(w.last_heartbeat)).total_seconds()  # type: ignore[operator]
        state = w.state if age <= LOST_AFTER_S or w.state == "stopped" else "lost"
        # Embedded workers are named per target ('embedded@host/h100'); measurements carry
        # the process name without the suffix.
        rate = counts.get(w.name, counts.get(w.name.split("/")[0], 0)) / RATE_WINDOW_MIN
        out.append(WorkerOut(name=w.name, gpu_model=w.gpu_model, sm=w.sm, target=w.target,
                             backend=w.backend, state=state, heartbeat_age_s=round(age, 1),
                             measurements_per_min=round(rate, 2), started_at=w.started_at))
    return out
