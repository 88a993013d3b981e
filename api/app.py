"""The FastAPI application: routes, and the embedded dispatcher when no broker is set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.routes import health, jobs, schedule, schedules, tune, workers
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
                  description="Autotuning of reduced-precision convolution on Tensor Cores")
    app.state.settings = cfg
    for module in (tune, jobs, schedule, schedules, workers, health):
        app.include_router(module.router)
    return app
