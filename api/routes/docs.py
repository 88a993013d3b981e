"""GET /docs (Swagger UI) and /redoc from assets installed with the service (the
`fastapi-offline` package's copies): FastAPI's own pages load them from a CDN, and show a
blank page without internet."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from api.routes.dashboard import serve_file

router = APIRouter(include_in_schema=False)

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
SERVED = {"swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js", "favicon.png"}
PREFIX = "/docs/assets"


@router.get("/docs", response_class=HTMLResponse)
def swagger(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="tctune API",
                               swagger_js_url=f"{root}{PREFIX}/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}{PREFIX}/swagger-ui.css",
                               swagger_favicon_url=f"{root}/favicon.ico",
                               # no badge fetched from validator.swagger.io
                               swagger_ui_parameters={"validatorUrl": None})


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_redoc_html(openapi_url=f"{root}/openapi.json", title="tctune API",
                          redoc_js_url=f"{root}{PREFIX}/redoc.standalone.js",
                          redoc_favicon_url=f"{root}/favicon.ico", with_google_fonts=False)


@router.get(PREFIX + "/{name}")
def asset(name: str, request: Request) -> Response:
    if name not in SERVED:
        raise HTTPException(404, detail="no such asset")
    return serve_file(ASSETS / name, request, max_age=86400)
