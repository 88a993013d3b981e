"""Shared request dependencies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.auth import Caller, require_read
from store.db import session_scope
from store.settings import Settings


def settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def db(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.settings.db_url) as session:
        yield session


# Row ids are INTEGER columns (int4 on PostgreSQL): a larger id names nothing and would
# overflow SQLite's driver (a 500), so it is refused as a 422 before any query.
MAX_ID = 2**31 - 1
RowId = Annotated[int, Path(ge=1, le=MAX_ID)]

DB = Annotated[Session, Depends(db)]
Config = Annotated[Settings, Depends(settings)]


async def read_access(request: Request) -> Caller:
    """`require_read` for async routes: it does no I/O when reads are open (the default), so
    it then runs inline; a token lookup (read_auth) goes to the thread pool."""
    cfg: Settings = request.app.state.settings
    if cfg.auth == "off" or not cfg.read_auth:
        return require_read(request)
    return await run_in_threadpool(require_read, request)


FastReader = Annotated[Caller, Depends(read_access)]
