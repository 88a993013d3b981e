"""Request and response bodies of the HTTP API (pydantic v2)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

from kernels.spec import (
    MAX_BATCH,
    MAX_CHANNELS,
    MAX_FILTER,
    MAX_SPATIAL,
)
from search.registry import STRATEGIES
from store.layer import (
    B2B_DOC,
    RESIDUAL_DOC,
    PrecisionName,
    ShapeIn,
    TargetName,
    documented,
)
from store.repository import as_utc
from workers.backends.simulated import prediction_note

MAX_TRIALS = 20_000

# Every time the API returns is UTC with its offset (SQLite hands back naive values).
UTC = Annotated[datetime, AfterValidator(as_utc)]


BASELINE_BACKEND_DOC = "'cuda' (timed on the GPU) or 'simulated' (modelled)"
SIMULATED_NOTE_DOC = ("for a simulated result on a GPU model the analytical model was never "
                      "checked against (t4, a100, a10, l4): that it is a prediction; null "
                      "otherwise")


def simulated_note(simulated: bool | None, target: str) -> str | None:
    """A simulated result's note (SIMULATED_NOTE_DOC); None for a GPU's."""
    return prediction_note(target) if simulated else None


class TuneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: ShapeIn
    precision: PrecisionName
    target: TargetName
    trials: StrictInt = Field(500, ge=1, le=MAX_TRIALS)
    strategy: str | None = Field(None, description="search strategy; default: the service's")
    strategy_options: dict[str, StrictInt | StrictFloat | StrictStr] | None = Field(
        None, description="options of the strategy, as it declares them (`tctune bench search "
                          "--help` lists them); an unknown one is refused. Default: none")
    seed: StrictInt = Field(0, ge=0, le=2**31 - 1)

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, v: str | None) -> str | None:
        if v is not None and v not in STRATEGIES:
            raise ValueError(f"unknown strategy {v!r}; known: {', '.join(STRATEGIES)}")
        return v


class TuneResponse(BaseModel):
    job_id: int
    task_id: int
    task_key: str
    status: str
    created: bool = Field(description="false when an active job of the same task was returned")


class TaskOut(BaseModel):
    id: int
    key: str
    shape: dict[str, Any]
    precision: str
    target: str
    baseline: str = Field(description="what baseline_us and every speedup of this task are "
                                      "measured against: 'cuDNN fp32' (TF32 off) for fp32_tc, "
                                      "'cuDNN fp16' for the other precisions")
    baseline_us: float | None = Field(None, description="the baseline on the target, if timed")
    baseline_backend: str | None = Field(None, description=BASELINE_BACKEND_DOC)


class MeasurementOut(BaseModel):
    id: int
    trial: int = Field(description="1-based position of this measurement in its job")
    schedule: dict[str, Any]
    schedule_hash: str
    status: str
    median_us: float | None
    iqr_us: float | None
    backend: str
    simulated: bool
    worker: str | None
    error: str | None
    created_at: UTC
    predicted_us: float | None = Field(None, description="the cost model's prediction")


class JobOut(BaseModel):
    id: int
    status: str
    strategy: str
    strategy_options: dict[str, Any] | None = Field(
        None, description="the options given to the strategy (None: its defaults)")
    seed: int
    trials: int = Field(description="trial budget")
    trials_done: int
    best_us: float | None
    simulated: bool | None = Field(description="results come from the analytical model")
    simulated_note: str | None = Field(None, description=SIMULATED_NOTE_DOC)
    task: TaskOut
    created_at: UTC
    started_at: UTC | None
    finished_at: UTC | None
    error: str | None
    speedup: float | None = Field(None, description="task.baseline_us / best_us (against "
                                                    "task.baseline)")
    insight: dict[str, Any] | None = Field(None, description="the cost model's last round")
    live_workers: int = Field(description="workers with a recent heartbeat for the target")
    warning: str | None = None
    measurements: list[MeasurementOut]
    next_after: int = Field(description="pass as ?after= to get only newer measurements")


class JobSummary(BaseModel):
    id: int
    status: str
    strategy: str
    trials: int
    trials_done: int
    best_us: float | None
    simulated: bool | None
    simulated_note: str | None = Field(None, description=SIMULATED_NOTE_DOC)
    speedup: float | None = None
    task: TaskOut
    created_at: UTC


# Pairs in a query string: '1' (both axes) or '1,2' (vertical, horizontal).
PAIR_PATTERN = "^ *[0-9]+ *(, *[0-9]+ *)?$"


def _pair_query(default: str) -> Any:
    return Field(default, description="'1' or '1,2' (vertical, horizontal)",
                 json_schema_extra={"pattern": PAIR_PATTERN})


class ScheduleQuery(BaseModel):
    """The query of GET /schedule: a layer, its precision and the target GPU."""

    model_config = ConfigDict(extra="forbid")  # (?token= is taken out before)
    n: Annotated[int, documented(1, MAX_BATCH)]
    h: Annotated[int, documented(1, MAX_SPATIAL)]
    w: Annotated[int, documented(1, MAX_SPATIAL)]
    c: Annotated[int, documented(1, MAX_CHANNELS)]
    k: Annotated[int, documented(1, MAX_CHANNELS)]
    r: Annotated[int, documented(1, MAX_FILTER)]
    s: Annotated[int, documented(1, MAX_FILTER)]
    stride: str = _pair_query("1")
    pad: str = _pair_query("0")
    dilation: str = _pair_query("1")
    concat: Annotated[int, documented(0, MAX_CHANNELS)] = 0
    residual: Annotated[bool, Field(description=RESIDUAL_DOC)] = False
    b2b: Annotated[int, Field(description=B2B_DOC), documented(0, MAX_CHANNELS)] = 0
    precision: PrecisionName
    target: TargetName


BASELINE_DOC = ("what baseline_us and speedup are measured against: 'cuDNN fp32' (TF32 off) "
                "for fp32_tc, 'cuDNN fp16' for the other precisions")
BASELINE_US_DOC = "the baseline's latency on the target (null until timed)"
SPEEDUP_DOC = "baseline_us / latency_us (null until the baseline is timed)"


class ScheduleOut(BaseModel):
    schedule: dict[str, Any]
    latency_us: float
    iqr_us: float | None
    simulated: bool
    simulated_note: str | None = Field(None, description=SIMULATED_NOTE_DOC)
    backend: str
    job_id: int
    measured_at: UTC
    task_key: str
    baseline: str = Field(description=BASELINE_DOC)
    baseline_us: float | None = Field(None, description=BASELINE_US_DOC)
    baseline_backend: str | None = Field(None, description=BASELINE_BACKEND_DOC)
    speedup: float | None = Field(None, description=SPEEDUP_DOC)


class ScheduleMissing(BaseModel):
    detail: str
    task_key: str
    known: bool = Field(description="the task exists (a job was submitted for it)")
    running: bool = Field(description="a job for it is queued or running")
    job: dict[str, Any] | None = None
    batches: list[int] = Field(
        default_factory=list,
        description="the batches at which the same layer (precision, target) has a verified "
                    "schedule; deploy runs a layer on its record at the nearest larger batch")


class WorkerOut(BaseModel):
    name: str
    gpu_model: str
    sm: int
    target: str = Field(description="'*' for a simulated worker that serves every target")
    backend: str
    state: str = Field(description="busy / idle / stopped, or 'lost' without a heartbeat")
    heartbeat_age_s: float
    measurements_per_min: float
    started_at: UTC


class BestOut(BaseModel):
    task: TaskOut
    schedule: dict[str, Any]
    latency_us: float | None
    simulated: bool
    simulated_note: str | None = Field(None, description=SIMULATED_NOTE_DOC)
    job_id: int
    measured_at: UTC
    speedup: float | None = Field(None, description="task.baseline_us / latency_us (against "
                                                    "task.baseline; null until it is timed)")


class InputProblem(BaseModel):
    loc: list[str | int] = Field(description="where: ['query', name], ['path'], ['body', ...]")
    msg: str
    type: str


class InputProblems(BaseModel):
    """A 422 of the input rules (api/inputs.py), in FastAPI's validation-error format."""

    detail: list[InputProblem]


class Problem(BaseModel):
    """The body of an error other than a validation error."""

    detail: str


class Health(BaseModel):
    status: Literal["ok"]
    database: str
    mode: Literal["embedded", "distributed"]
    version: str
