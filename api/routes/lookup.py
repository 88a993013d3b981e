"""POST /schedules/lookup: the best schedules of many layers in one round trip (a model's
conv layers at deploy time)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.auth import Reader
from api.deps import DB
from api.errors import READ_ERRORS, JsonBodyRoute, unprocessable
from api.schemas import (
    BASELINE_BACKEND_DOC,
    BASELINE_DOC,
    BASELINE_US_DOC,
    SIMULATED_NOTE_DOC,
    SPEEDUP_DOC,
    simulated_note,
)
from kernels.spec import TARGETS, task_key
from store import repository as repo
from store.baselines import baseline_name, speedup
from store.layer import LayerIn

router = APIRouter(tags=["schedule"], route_class=JsonBodyRoute)


MAX_RUNNERS_UP = 16


class LookupIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    layers: list[LayerIn] = Field(min_length=1, max_length=1000)
    runners_up: int = Field(0, ge=0, le=MAX_RUNNERS_UP, description=(
        "also answer each found layer's next fastest right schedules after its best, up to "
        "this many (what `deploy.model_select` times in the whole model)"))


class RunnerUp(BaseModel):
    schedule: dict[str, Any]
    latency_us: float


class LookupItem(BaseModel):
    task_key: str
    found: bool
    schedule: dict[str, Any] | None = None
    latency_us: float | None = None
    simulated: bool | None = None
    simulated_note: str | None = Field(None, description=SIMULATED_NOTE_DOC)
    job_id: int | None = None
    baseline: str = Field(description=BASELINE_DOC)
    baseline_us: float | None = Field(None, description=BASELINE_US_DOC)
    baseline_backend: str | None = Field(None, description=BASELINE_BACKEND_DOC)
    speedup: float | None = Field(None, description=SPEEDUP_DOC)
    runners_up: list[RunnerUp] | None = Field(
        None, description="the next fastest schedules, fastest first (asked with runners_up)")


class LookupOut(BaseModel):
    results: list[LookupItem]
    found: int
    missing: int


@router.post("/schedules/lookup", response_model=LookupOut,
             responses={**READ_ERRORS,
                        422: {"description": "a layer is invalid (its index is named)"}})
def lookup(req: LookupIn, session: DB, _: Reader) -> LookupOut:
    problems = []
    for i, layer in enumerate(req.layers):
        for f, msg in layer.problems():
            problems.append((("body", "layers", i, "shape", f), msg))
    if problems:
        raise unprocessable(problems)
    results = []
    for layer in req.layers:
        key = task_key(layer.shape.to_shape(), layer.precision, TARGETS[layer.target])
        name = baseline_name(layer.precision)
        found = repo.best_for_key(session, key)
        if found is None:
            results.append(LookupItem(task_key=key, found=False, baseline=name))
        else:
            m, task = found
            results.append(LookupItem(
                task_key=key, found=True, schedule=m.schedule, latency_us=m.median_us,
                simulated=m.backend == "simulated", job_id=m.job_id, baseline=name,
                simulated_note=simulated_note(m.backend == "simulated", layer.target),
                baseline_us=task.baseline_us, baseline_backend=task.baseline_backend,
                speedup=speedup(task.baseline_us, m.median_us),
                runners_up=[RunnerUp(schedule=r.schedule, latency_us=r.median_us)
                            for r in repo.runners_up(session, m, req.runners_up)
                            if r.median_us is not None] if req.runners_up else None))
    hits = sum(r.found for r in results)
    return LookupOut(results=results, found=hits, missing=len(results) - hits)
