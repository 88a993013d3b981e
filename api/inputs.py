"""What any request must satisfy before a route sees it, each refusal a 422 that names the
field: no NUL byte in the path or query (PostgreSQL refuses NUL in text: a 500), JSON bodies
checked by store/jsoncheck.py (the JSON body routes, api/errors.py), and a validation-error
handler that answers whatever value a client sent."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import Depends, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from store.jsoncheck import NUL_MSG, Loc
from store.layer import (
    PRECISION_PATTERN,
    TARGET_PATTERN,
    known_precision,
    known_target,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _safe(value: Any) -> Any:
    """A JSON-serialisable copy: non-finite floats and unknown objects become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    try:
        return _safe(jsonable_encoder(value))
    except Exception:
        return repr(value)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 body, made serialisable whatever input the errors quote."""
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": _safe(list(exc.errors()))}, status_code=422)


def _refuse(problems: list[tuple[Loc, str]]) -> JSONResponse:
    return JSONResponse({"detail": [{"type": "value_error", "loc": list(loc), "msg": msg}
                                    for loc, msg in problems]}, status_code=422)


class InputGuard:
    """Refuse a NUL byte anywhere in the path or the query string (422 naming it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problems = nul_problems(scope.get("path", ""), scope.get("query_string", b""))
            if problems:
                await _refuse(problems)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def nul_problems(path: str, query: bytes) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    if "\x00" in path:
        problems.append((("path",), NUL_MSG))
    if b"%00" in query or b"\x00" in query:
        text = query.decode("latin-1")
        for key, value in parse_qsl(text, keep_blank_values=True):
            if "\x00" in key or "\x00" in value:
                problems.append((("query", key.replace("\x00", "\\x00")[:64]), NUL_MSG))
        if not problems:  # e.g. a NUL in a malformed pair that parse_qsl drops
            problems.append((("query",), NUL_MSG))
    return problems


def _validated(kind: Callable[[str], Any], name: str, value: str | None) -> Any:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError as exc:
        raise RequestValidationError([{"type": "value_error", "loc": ["query", name],
                                       "msg": str(exc), "input": value}]) from None


# The layer filters of every read (GET /schedules, /export): the same names as everywhere,
# case-insensitive, and an unknown one is a 422 (not an empty answer).
def target_filter(target: Annotated[str | None, Query(
        max_length=32, description="a target (case-insensitive)",
        json_schema_extra={"pattern": TARGET_PATTERN})] = None) -> str | None:
    return _validated(known_target, "target", target)  # type: ignore[no-any-return]


def precision_filter(precision: Annotated[str | None, Query(
        max_length=16, description="a precision (case-insensitive)",
        json_schema_extra={"pattern": PRECISION_PATTERN})] = None) -> str | None:
    found = _validated(known_precision, "precision", precision)
    return None if found is None else str(found.value)


TargetFilter = Annotated[str | None, Depends(target_filter)]
PrecisionFilter = Annotated[str | None, Depends(precision_filter)]


_allowed_by_route: dict[int, frozenset[str]] = {}


def _query_names(dependant: Dependant) -> list[str]:
    names = [p.alias for p in dependant.query_params]
    for sub in dependant.dependencies:
        names += _query_names(sub)
    return names


def known_query_only(request: Request) -> None:
    """An API route's query may hold only the parameters it declares (and ?token=, which
    auth judges): a misspelt filter (`?stat=running`) is a 422, never silently ignored."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not route.include_in_schema:
        return  # dashboard pages and the docs
    allowed = _allowed_by_route.get(id(route))
    if allowed is None:
        allowed = frozenset(_query_names(route.dependant)) | {"token"}
        _allowed_by_route[id(route)] = allowed
    unknown = [k for k in request.query_params if k not in allowed]
    if unknown:
        known = ", ".join(sorted(allowed - {"token"})) or "none"
        raise RequestValidationError([
            {"type": "value_error", "loc": ["query", k[:64]],
             "msg": f"unknown query parameter; this endpoint takes: {known}", "input": None}
            for k in dict.fromkeys(unknown)])
