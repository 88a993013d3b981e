"""The whole HTTP API fuzzed against its own OpenAPI document (schemathesis).

Every operation the app publishes gets generated requests, schema-valid and schema-invalid,
from an admin token, from nobody, and from nobody on a service that requires tokens for
reads. Whatever arrives, the service must never answer 5xx, must answer only status codes
it declares for the operation, and every body, header and content type must match what it
declares. Invalid input must be refused (4xx). The database is seeded with tasks, jobs in
every state, measurements, best schedules and a worker, so that the answers carry real rows.

Generation is derandomized (a fixed seed per run), so a failure reproduces.
"""

from __future__ import annotations

import os
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis

# schemathesis imports its OpenAPI loader at the first `from_asgi`, deep in a test's stack,
# where pytest's assertion rewriting parses it, and CPython 3.11's AST constructor can fail
# there with "recursion depth mismatch" (python/cpython#106905): load it at collection.
import schemathesis.specs.openapi.schemas  # noqa: F401
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from kernels.space import knobs_for, schedule_hash
from kernels.spec import TARGETS, ConvShape, Precision, task_key
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.models import BestSchedule, Job, Measurement, Task, Worker, utcnow
from store.settings import Settings

# Examples per (operation, generation mode, caller); the total must reach MIN_CASES.
# TCTUNE_FUZZ_EXAMPLES raises it for a long run (bench/RESULTS.md records one).
EXAMPLES = int(os.environ.get("TCTUNE_FUZZ_EXAMPLES", "32"))
EXAMPLES_READ_AUTH = 8
MIN_CASES = 1000

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance, negative_data_rejection]
# Not checked: positive_data_acceptance. The schema cannot say that a layer must fit in the
# GPU's memory or its filter in the padded input, so schema-valid layers get a 422 by design.

STAGE2 = ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 1))

# POST /import takes JSON lines (declared as a string): sent as the text it is.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")


@dataclass
class Seeded:
    admin: str
    tune: str
    open_app: FastAPI
    read_auth_app: FastAPI
    active_job: int
    idle_task: int
    stored_query: dict[str, Any]


@dataclass
class Tally:
    cases: int = 0
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    failures: list[str] = field(default_factory=list)


def _seed(db_url: str) -> tuple[int, int]:
    """Tasks with jobs in every state, measurements (ok and not), best schedules, a baseline,
    cost-model insight and a live worker, written as rows (no tuner involved). Returns (an
    active job, a task with no active job)."""
    rng = random.Random(7)
    shapes = [STAGE2, ConvShape(1, 14, 14, 256, 256, 3, 3, pad=(1, 1)),
              ConvShape(8, 28, 28, 128, 512, 1, 1),
              ConvShape(4, 56, 56, 64, 128, 3, 3, stride=(2, 2), pad=(1, 1))]
    states = ["queued", "running", "done", "failed", "cancelled"]
    layers = [(sh, p, t) for sh in shapes for p in (Precision.INT8, Precision.FP16)
              for t in ("h200", "t4")]
    active_job = idle_task = 0
    now = utcnow()
    with session_scope(db_url) as s:
        for i, (shape, precision, target) in enumerate(layers):
            state = states[i % len(states)]
            task = Task(key=task_key(shape, precision, TARGETS[target]), shape=shape.to_dict(),
                        shape_key=shape.key(), precision=precision.value, target=target,
                        created_at=now, baseline_us=42.0 if i % 3 == 0 else None,
                        baseline_backend="simulated" if i % 3 == 0 else None)
            s.add(task)
            s.flush()
            job = Job(task_id=task.id, trials=16, strategy="diversity", seed=i, status=state,
                      created_at=now, started_at=None if state == "queued" else now,
                      finished_at=now if state in ("done", "failed", "cancelled") else None,
                      error="planted" if state == "failed" else None,
                      insight={"round": 2, "importance": {"CHUNK": 0.4}} if i % 4 else None)
            s.add(job)
            s.flush()
            knobs = knobs_for(precision)
            best = None
            for status in ("ok", "ok", "wrong", "runtime_error"):
                sched = {k: rng.choice(v) for k, v in knobs.items()}
                ok = status == "ok"
                m = Measurement(task_id=task.id, job_id=job.id, schedule=sched,
                                schedule_hash=schedule_hash(sched), status=status,
                                median_us=rng.uniform(5, 50) if ok else None,
                                iqr_us=rng.uniform(0, 1) if ok else None, backend="simulated",
                                worker="fuzz-worker", error=None if ok else "planted",
                                created_at=now, predicted_us=rng.uniform(5, 50))
                s.add(m)
                s.flush()
                if ok and (best is None or m.median_us < best.median_us):  # type: ignore[operator]
                    best = m
            assert best is not None
            s.add(BestSchedule(task_id=task.id, measurement_id=best.id, updated_at=now))
            if state == "queued":
                active_job = job.id
            elif state == "done":
                idle_task = task.id
        s.add(Worker(name="fuzz-worker", gpu_model="NVIDIA H200", sm=90, target="h200",
                     backend="simulated", state="idle", started_at=now, last_heartbeat=now))
    return active_job, idle_task


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[Seeded]:
    data = tmp_path
    # Limits high enough that generated POST /tune requests reach the code behind them;
    # the limits themselves are tested in test_auth_limits.py.
    # Event streams of the seeded active job close after events_max_s.
    base = dict(data_dir=Path(data), backend="simulated", tune_per_minute=1_000_000,
                active_jobs_per_token=1_000_000, events_max_s=0.3)
    cfg = Settings(**base)
    migrate.upgrade(cfg.db_url)
    with session_scope(cfg.db_url) as s:
        admin = repo.create_token(s, "fuzz", "admin")
        tune = repo.create_token(s, "fuzz-tune", "tune")
    active_job, idle_task = _seed(cfg.db_url)
    d = STAGE2.to_dict()
    stored = {**{k: d[k] for k in "nhwckrs"}, "stride": "1", "pad": "1,1",
              "dilation": "1", "precision": "int8", "target": "H200"}
    yield Seeded(admin, tune, create_app(cfg, dispatcher=False),
                 create_app(Settings(**base, read_auth=True), dispatcher=False),
                 active_job, idle_task, stored)


def _has_inputs(op: Any) -> bool:
    return bool(op.path_parameters or op.query or op.headers or op.body)


def _fuzz(op: Any, mode: GenerationMode, examples: int, headers: dict[str, str],
          tally: Tally, label: str) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate, Phase.shrink])
    def run(case: Any) -> None:
        tally.cases += 1
        response = case.call(headers=headers)
        tally.statuses[op.label][response.status_code] += 1
        case.validate_response(response, checks=CHECKS, headers=headers)

    try:
        run()
    except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup is Base-
        tally.failures.append(f"{op.label} [{mode.value}, {label}]:\n{exc}")


def test_every_operation_conforms_to_the_openapi_document(seeded: Seeded) -> None:
    tally = Tally()
    admin = {"Authorization": f"Bearer {seeded.admin}"}
    callers: list[tuple[str, FastAPI, dict[str, str], int]] = [
        ("admin token", seeded.open_app, admin, EXAMPLES),
        ("tune token", seeded.open_app, {"Authorization": f"Bearer {seeded.tune}"}, EXAMPLES),
        ("no token", seeded.open_app, {}, EXAMPLES),
        ("no token, read_auth", seeded.read_auth_app, {}, EXAMPLES_READ_AUTH),
    ]
    labels: set[str] = set()
    for label, app, headers, examples in callers:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        for result in schema.get_all_operations():
            op = result.ok()
            labels.add(op.label)
            modes = [GenerationMode.POSITIVE]
            if _has_inputs(op):  # nothing to make invalid otherwise
                modes.append(GenerationMode.NEGATIVE)
            for mode in modes:
                _fuzz(op, mode, examples, headers, tally, label)
    assert not tally.failures, f"{len(tally.failures)} failing operation(s):\n\n" + \
        "\n\n".join(tally.failures)
    assert tally.cases >= MIN_CASES, f"only {tally.cases} generated cases"
    assert set(tally.statuses) == labels, "an operation was never called"
    # The refusals were all seen, so the declared error paths were checked too.
    seen = Counter[int]()
    for counts in tally.statuses.values():
        seen.update(counts)
    assert {401, 403, 404, 422} <= set(seen), dict(seen)
    print(f"schemathesis: {tally.cases} cases over {len(labels)} operations, "
          f"statuses {dict(sorted(seen.items()))}")


def _anchor(schema: Any, method: str, path: str, headers: dict[str, str], **parts: Any
            ) -> int:
    """One hand-made request validated with the same checks; returns its status."""
    case = schema[path][method].Case(**parts)
    response = case.call(headers=headers)
    case.validate_response(response, checks=CHECKS, headers=headers)
    return int(response.status_code)


def test_success_paths_conform_too(seeded: Seeded) -> None:
    """Generated data rarely names a stored layer or a live job: these requests do, so the
    2xx bodies of the reads and of every mutating path are checked against the schema."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", seeded.open_app)
    admin = {"Authorization": f"Bearer {seeded.admin}"}
    tune_body = {"shape": {**STAGE2.to_dict(), "k": 32}, "precision": "int8",
                 "target": "a100", "trials": 8}
    assert _anchor(schema, "GET", "/schedule", {}, query=seeded.stored_query) == 200
    assert _anchor(schema, "POST", "/tune", admin, body=tune_body,
                   media_type="application/json") == 202
    assert _anchor(schema, "POST", "/tune", admin, body=tune_body,
                   media_type="application/json") == 200  # the same active task
    assert _anchor(schema, "GET", "/jobs/{job_id}", {},
                   path_parameters={"job_id": seeded.active_job}) == 200
    assert _anchor(schema, "GET", "/jobs", {}, query={"limit": 50}) == 200
    assert _anchor(schema, "GET", "/schedules", {}, query={"format": "jsonl"}) == 200
    assert _anchor(schema, "GET", "/workers", {}) == 200
    assert _anchor(schema, "POST", "/jobs/{job_id}/cancel", admin,
                   path_parameters={"job_id": seeded.active_job}) == 200
    assert _anchor(schema, "POST", "/jobs/{job_id}/cancel", admin,
                   path_parameters={"job_id": seeded.active_job}) == 409
    assert _anchor(schema, "DELETE", "/tasks/{task_id}", admin,
                   path_parameters={"task_id": seeded.idle_task}) == 204
    assert _anchor(schema, "DELETE", "/tasks/{task_id}", admin,
                   path_parameters={"task_id": seeded.idle_task}) == 404
