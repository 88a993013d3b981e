"""GET /metrics in the Prometheus text format."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import FastReader
from api.errors import READ_ERRORS

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={**READ_ERRORS, 200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request, _: FastReader) -> Response:
    """Behind the same read access as every other read (TCTUNE_READ_AUTH)."""
    return Response(generate_latest(request.app.state.metrics.registry),
                    media_type=CONTENT_TYPE_LATEST)
