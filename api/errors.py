"""422 errors in FastAPI's own format, for checks that need more than a field's type."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi.exceptions import RequestValidationError


def unprocessable(problems: Iterable[tuple[tuple[str | int, ...], str]]) -> RequestValidationError:
    """Build a 422 whose `detail` names each field (`loc`) with its reason (`msg`)."""
    return RequestValidationError([
        {"type": "value_error", "loc": list(loc), "msg": msg, "input": None}
        for loc, msg in problems
    ])
