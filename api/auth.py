"""Bearer tokens with nested scopes (admin > tune > read), and per-token limits.

Mutating endpoints depend on `require("tune")` / `require("admin")`; reads on
`require_read`, which lets everyone in unless the service is configured with read_auth.

A mutation looks its token up in the database on every request, so a revocation stops it
at once in every API process; reads (which may come many a second, e.g. a dashboard) may
use an answer at most TOKEN_CACHE_S old. Mutations take the token from the Authorization
header only: a token in a URL ends up in logs, histories and Referer headers; reads accept
`?token=` as well (a link that opens a protected read).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from store import repository as repo
from store.db import session_scope
from store.settings import Settings

SCOPES = ("read", "tune", "admin")
# How stale a read's token lookup may be (a revoked token keeps reading this long at most).
TOKEN_CACHE_S = 1.0


@dataclass(frozen=True)
class Caller:
    """Who is calling: a token (id, scope), or nobody on an open service."""

    token_id: int | None
    scope: str

    def allows(self, scope: str) -> bool:
        return SCOPES.index(self.scope) >= SCOPES.index(scope)


OPEN = Caller(None, "admin")
_cache: dict[str, tuple[float, Caller | None]] = {}
_cache_lock = threading.Lock()


def _lookup(settings: Settings, token: str, cached: bool) -> Caller | None:
    now = time.monotonic()
    if cached:
        with _cache_lock:
            hit = _cache.get(token)
            if hit and now - hit[0] < TOKEN_CACHE_S:
                return hit[1]
    with session_scope(settings.db_url) as s:
        row = repo.find_token(s, token)
        caller = Caller(row.id, row.scope) if row else None
    with _cache_lock:
        if len(_cache) > 10_000:
            _cache.clear()
        _cache[token] = (now, caller)
    return caller


def _bearer(request: Request, mutation: bool) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    if mutation:
        return None
    return request.query_params.get("token") or None


ANYONE = Caller(None, "read")


def _authenticate(request: Request, scope: str, needed: bool) -> Caller:
    settings: Settings = request.app.state.settings
    if settings.auth == "off":
        return OPEN
    if not needed:
        return ANYONE
    mutation = scope != "read"
    token = _bearer(request, mutation)
    if token is None:
        where = ("in the Authorization header (`Authorization: Bearer <token>`; "
                 "?token= is accepted for reads only)" if mutation else
                 "(Authorization: Bearer <token>)")
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, f"a bearer token is required {where}",
                            headers={"WWW-Authenticate": "Bearer"})
    caller = _lookup(settings, token, cached=not mutation)
    if caller is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown or revoked token",
                            headers={"WWW-Authenticate": "Bearer"})
    if not caller.allows(scope):
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"this needs a token of scope {scope!r}; yours is {caller.scope!r}")
    return caller


def require(scope: str):  # type: ignore[no-untyped-def]
    """Dependency: a caller with at least `scope` (or anyone, if auth is off)."""

    def dep(request: Request) -> Caller:
        return _authenticate(request, scope, needed=True)

    return dep


def require_read(request: Request) -> Caller:
    return _authenticate(request, "read", needed=request.app.state.settings.read_auth)


Reader = Annotated[Caller, Depends(require_read)]
Tuner = Annotated[Caller, Depends(require("tune"))]
Admin = Annotated[Caller, Depends(require("admin"))]
