"""Bearer tokens with nested scopes (admin > tune > read), and per-token limits.

Mutating endpoints depend on `require("tune")` / `require("admin")`; reads on
`require_read`, which lets everyone in unless the service is configured with read_auth.
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
# A token's scope is looked up at most this often (reads may need it on every request).
TOKEN_CACHE_S = 10.0


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


def _lookup(settings: Settings, token: str) -> Caller | None:
    now = time.monotonic()
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


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.query_params.get("token") or None


ANYONE = Caller(None, "read")


def _authenticate(request: Request, scope: str, needed: bool) -> Caller:
    settings: Settings = request.app.state.settings
    if settings.auth == "off":
        return OPEN
    if not needed:
        return ANYONE
    token = _bearer(request)
    if token is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a bearer token is required",
                            headers={"WWW-Authenticate": "Bearer"})
    caller = _lookup(settings, token)
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


class RateLimiter:
    """Token bucket per caller: `per_minute` requests, refilled continuously."""

    def __init__(self, per_minute: int) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self._buckets: dict[int | None, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: int | None) -> float:
        """0 if allowed, else the seconds until the next request would be."""
        now = time.monotonic()
        with self._lock:
            level, last = self._buckets.get(key, (self.capacity, now))
            level = min(self.capacity, level + (now - last) * self.rate)
            if level >= 1.0:
                self._buckets[key] = (level - 1.0, now)
                return 0.0
            self._buckets[key] = (level, now)
            return (1.0 - level) / self.rate
