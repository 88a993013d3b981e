"""Error responses: 422s in FastAPI's own format for checks that need more than a field's
type, and the error responses each route declares so that the OpenAPI document is honest."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from api.schemas import Problem
from store.errors import RETRY_AFTER_S, unavailable_reason
from store.jsoncheck import Loc, parse_json


def unprocessable(problems: Iterable[tuple[tuple[str | int, ...], str]]) -> RequestValidationError:
    """Build a 422 whose `detail` names each field (`loc`) with its reason (`msg`)."""
    return RequestValidationError([
        {"type": "value_error", "loc": list(loc), "msg": msg, "input": None}
        for loc, msg in problems
    ])


def problem(description: str) -> dict[str, Any]:
    """An error response for `responses=`: `{"detail": "..."}` (HTTPException's body)."""
    return {"model": Problem, "description": description}


# Reads need a token only when the service runs with read_auth; any valid token may read.
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    401: problem("no valid token (only when the service requires tokens for reads)")}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    413: problem("request body larger than the service accepts")}


async def storage_unavailable(_request: Request, exc: Exception) -> Response:
    """A database that cannot be reached (store/errors.py): 503 with the driver's reason and
    when to try again, never a 500."""
    return JSONResponse(status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)},
                        content={"detail": f"the database is unavailable, try again: "
                                           f"{unavailable_reason(exc)}"})


class JsonBodyRoute(APIRoute):
    """A route with a JSON body checked by api/inputs.py first; a body that is not even
    UTF-8 gets a 422 naming the body, like any other malformed JSON (FastAPI answers such a
    body with a bare 400)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            problems = await _body_problems(request)
            if problems:
                raise unprocessable(problems)
            try:
                return await handler(request)
            except HTTPException as exc:  # Starlette's: what FastAPI's body parsing raises
                cause = exc.__cause__
                if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
                    raise unprocessable([(("body",), "the body is not JSON: undecodable byte at "
                                                     f"offset {cause.start} (JSON is UTF-8)")]
                                       ) from exc
                raise

        return route


async def _body_problems(request: Request) -> list[tuple[Loc, str]]:
    """NaN/Infinity, NUL bytes and extreme nesting in a JSON body (api/inputs.py); the
    parse is repeated by FastAPI, cheap next to a request, and its syntax errors are left
    to FastAPI's own 422."""
    body = await request.body()
    if not body:
        return []
    try:
        return parse_json(body)[1]
    except ValueError:  # not JSON (or not UTF-8): FastAPI's parsing reports it
        return []
