"""A route class for hot paths whose endpoint parses its own request (GET /schedule)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute


class DirectRoute(APIRoute):
    """A route documented like any other whose endpoint takes only the Request and is
    awaited directly: FastAPI's per-request dependency solving (which parses the query,
    headers and cookies for parameters this endpoint does not declare) is skipped. Errors
    still go through the app's exception handlers."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        endpoint = self.endpoint

        async def handler(request: Request) -> Response:
            response: Response = await endpoint(request)
            return response

        return handler
