"""GET /schedules: every task's best verified schedule, as JSON or JSON lines."""

from __future__ import annotations

import json

from fastapi import APIRouter, Query
from fastapi.responses import Response

from api.auth import Reader
from api.deps import DB
from api.errors import READ_ERRORS
from api.inputs import PrecisionFilter, TargetFilter
from api.routes.jobs import task_out
from api.schemas import BestOut, simulated_note
from store import repository as repo
from store.baselines import speedup

router = APIRouter(tags=["schedules"])


@router.get("/schedules", response_model=list[BestOut],
            responses={**READ_ERRORS, 200: {"content": {"application/x-ndjson": {}}}})
def list_schedules(session: DB, _: Reader, target: TargetFilter, precision: PrecisionFilter,
                   format: str = Query("json", pattern="^(json|jsonl)$"),
                   limit: int = Query(1000, ge=1, le=100_000)) -> list[BestOut] | Response:
    rows = [BestOut(task=task_out(t), schedule=m.schedule, latency_us=m.median_us,
                    simulated=m.backend == "simulated", job_id=m.job_id, measured_at=m.created_at,
                    simulated_note=simulated_note(m.backend == "simulated", t.target),
                    speedup=speedup(t.baseline_us, m.median_us))
            for t, m in repo.best_schedules(session, target, precision, limit)]
    if format == "jsonl":
        body = "".join(json.dumps(r.model_dump(mode="json")) + "\n" for r in rows)
        return Response(body, media_type="application/x-ndjson",
                        headers={"Content-Disposition": 'attachment; filename="schedules.jsonl"'})
    return rows
