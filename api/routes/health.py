"""GET /healthz: liveness with a real database round trip."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import DB, Config
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(session: DB, cfg: Config) -> Health:
    session.execute(text("SELECT 1"))
    return Health(status="ok", database=session.get_bind().dialect.name,
                  mode="embedded" if cfg.embedded else "distributed", version="0.1.0")
