"""Shared request dependencies."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from store.db import session_scope
from store.settings import Settings


def settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def db(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.settings.db_url) as session:
        yield session


DB = Annotated[Session, Depends(db)]
Config = Annotated[Settings, Depends(settings)]
