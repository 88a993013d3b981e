"""The FastAPI application: routes, and the embedded dispatcher when no broker is set."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.exceptions import RequestValidationError

from api.broker import Broker
from api.errors import storage_unavailable
from api.inputs import InputGuard, known_query_only, validation_error
from api.limits import BodyLimit
from api.metrics import Metrics, MetricsMiddleware
from api.routes import (
    dashboard,
    docs,
    health,
    job_events,
    jobs,
    lookup,
    metrics,
    schedule,
    schedules,
    tasks,
    transfer,
    tune,
    workers,
)
from api.schemas import InputProblems, Problem
from store.errors import UNAVAILABLE
from store.ratelimit import RateLimit
from store.settings import Settings, get_settings


def create_app(settings: Settings | None = None, dispatcher: bool = True) -> FastAPI:
    """`dispatcher`: run the embedded dispatcher inside this process (embedded mode only)."""
    cfg = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner = None
        if dispatcher and cfg.embedded:
            from workers.embedded import EmbeddedDispatcher

            runner = EmbeddedDispatcher(cfg)
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                runner.stop()

    app = FastAPI(title="tctune", version="0.1.0", lifespan=lifespan,
                  dependencies=[Depends(known_query_only)],
                  docs_url=None, redoc_url=None,  # api/routes/docs.py: served offline
                  # Any endpoint may refuse its input (api/inputs.py: an unknown query
                  # parameter, a NUL byte in the path or query), in FastAPI's format.
                  responses={422: {"description": "invalid input: each problem names its "
                                                  "field (loc) and says why (msg)",
                                   "model": InputProblems},
                             # store/errors.py: any endpoint that reads or writes the database
                             503: {"description": "the database is unavailable; Retry-After "
                                                  "says when to try again", "model": Problem}},
                  description="Autotuning of reduced-precision convolution on Tensor Cores")
    app.state.settings = cfg
    app.state.broker = None if cfg.embedded else Broker(cfg.broker_url)
    app.state.on_new_job = _new_job_notifier(cfg, app.state.broker)
    app.state.tune_limit = RateLimit("tune", cfg.tune_per_minute)
    app.add_middleware(BodyLimit, default=cfg.max_body_bytes,
                       overrides={"/import": cfg.max_import_bytes})
    app.add_middleware(InputGuard)
    app.add_exception_handler(RequestValidationError, validation_error)
    for exc in UNAVAILABLE:
        app.add_exception_handler(exc, storage_unavailable)
    app.state.metrics = Metrics(cfg, app.state.broker)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    for module in (tune, jobs, job_events, schedule, lookup, schedules, workers, tasks,
                   transfer, health, metrics, dashboard, docs):
        app.include_router(module.router)
    return app


def _new_job_notifier(cfg: Settings, broker: Broker | None) -> Callable[[int], None]:
    """Distributed mode: tell the explorer at once, from a background thread (its sweeper
    finds the job anyway, so a broker that is down only delays it; api/broker.py).
    Embedded: the dispatcher polls the database."""
    if broker is None:
        return lambda job_id: None

    def send(job_id: int) -> None:
        from workers.app import app
        from workers.queues import CeleryTransport

        CeleryTransport(app, retry=False).send_explore(job_id)

    return lambda job_id: broker.announce(job_id, send)
