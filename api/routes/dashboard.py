"""The web dashboard: HTML pages and their static assets, served by the API itself.

The pages hold no data: their scripts read the JSON API (with the same bearer token, when
the service asks for one), so a page can be served to anyone and works in both modes.
Plotly.js comes from the pip `plotly` package: nothing is loaded from the internet.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import plotly
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.deps import DB, RowId
from store.models import Job

router = APIRouter(include_in_schema=False)

HERE = Path(__file__).resolve().parent.parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"

MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".svg": "image/svg+xml", ".png": "image/png"}

# Pages load only the service's own scripts and talk only to the service; no other site may
# frame them (clickjacking) and no browser may guess a type the server did not send.
# 'unsafe-inline' styles: Plotly and the progress bars set style attributes.
CSP = ("default-src 'self'; script-src 'self'; "
       "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# The job page's WebGL charts (parallel coordinates; scattergl past GL_ABOVE points) run
# through regl, which builds its draw calls with `new Function`: without 'unsafe-eval' Plotly
# shows "WebGL is not supported" instead of the chart. Still no inline or foreign scripts.
WEBGL_PAGES = {"job"}
WEBGL_CSP = CSP.replace("script-src 'self'", "script-src 'self' 'unsafe-eval'")

ASSET_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")

# name -> (template, title, nav entry to highlight)
PAGES = {"jobs": ("Jobs", "jobs"), "job": ("Job", "jobs"), "fleet": ("Fleet", "fleet"),
         "schedules": ("Schedules", "schedules"), "missing": ("Not found", "")}


@dataclass(frozen=True)
class Asset:
    body: bytes
    gz: bytes | None
    etag: str
    media_type: str


@lru_cache(maxsize=64)
def _asset(path: Path, mtime_ns: int) -> Asset:
    """Read (and gzip, when it pays) a file once per modification time."""
    body = path.read_bytes()
    # Plotly is 4.8 MB, 1.4 MB gzipped: worth it for a laptop far from the API.
    gz = gzip.compress(body, compresslevel=6, mtime=0) if len(body) > 1024 else None
    etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
    return Asset(body, gz, etag, MEDIA_TYPES.get(path.suffix, "application/octet-stream"))


def serve_file(path: Path, request: Request, max_age: int) -> Response:
    asset = _asset(path, path.stat().st_mtime_ns)
    headers = {"ETag": asset.etag, "Cache-Control": f"public, max-age={max_age}",
               "Vary": "Accept-Encoding", **SECURITY_HEADERS}
    if asset.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    if asset.gz is not None and "gzip" in request.headers.get("accept-encoding", ""):
        return Response(asset.gz, media_type=asset.media_type,
                        headers={**headers, "Content-Encoding": "gzip"})
    return Response(asset.body, media_type=asset.media_type, headers=headers)


@lru_cache(maxsize=16)
def _template(name: str, mtime_ns: int) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def _render(page: str, status_code: int = 200, **values: str) -> HTMLResponse:
    """The layout with the page's fragment and a few escaped values (no template engine)."""
    title, nav = PAGES[page]
    layout_path, page_path = TEMPLATES / "layout.html", TEMPLATES / f"{page}.html"
    text = _template("layout.html", layout_path.stat().st_mtime_ns).replace(
        "{{content}}", _template(f"{page}.html", page_path.stat().st_mtime_ns))
    for key, value in {"title": title, "page": page, **values}.items():
        text = text.replace("{{" + key + "}}", html.escape(value))
    for entry in ("jobs", "fleet", "schedules"):
        text = text.replace("{{nav_" + entry + "}}", "active" if entry == nav else "")
    # The pages revalidate on every load: an upgrade of the service shows at once.
    headers = {"Cache-Control": "no-cache", **SECURITY_HEADERS}
    if page in WEBGL_PAGES:
        headers["Content-Security-Policy"] = WEBGL_CSP
    return HTMLResponse(text, status_code=status_code, headers=headers)


@router.get("/", response_class=HTMLResponse)
def jobs_page() -> HTMLResponse:
    return _render("jobs")


@router.get("/ui", response_class=RedirectResponse)
@router.get("/ui/jobs", response_class=RedirectResponse)
def ui_root() -> RedirectResponse:
    return RedirectResponse("/", status_code=307)


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: RowId, session: DB) -> HTMLResponse:
    # A page for a job that does not exist would poll for it forever: 404 (job ids are
    # sequential, so this tells nobody more than the jobs list does).
    if session.get(Job, job_id) is None:
        return _render("missing", status_code=404, what=f"Job {job_id}",
                       detail="No job has this id (it may have been deleted with its task).")
    return _render("job", job_id=str(job_id))


@router.get("/ui/fleet", response_class=HTMLResponse)
def fleet_page() -> HTMLResponse:
    return _render("fleet")


@router.get("/ui/schedules", response_class=HTMLResponse)
def schedules_page() -> HTMLResponse:
    return _render("schedules")


@router.get("/ui/static/plotly.min.js")
def plotly_js(request: Request) -> Response:
    # Versioned by the package: a day of caching, revalidated by ETag after that.
    return serve_file(PLOTLY_JS, request, max_age=86400)


@router.get("/ui/static/{name}")
def static_file(name: str, request: Request) -> Response:
    # Only plain files directly in api/static: no traversal, no directories; a name no asset
    # has (too long for the file system, odd characters) is not even looked up.
    if not ASSET_NAME.fullmatch(name):
        raise HTTPException(404, detail="no such asset")
    path = (STATIC / name).resolve()
    if path.parent != STATIC or not path.is_file() or path.suffix not in MEDIA_TYPES:
        raise HTTPException(404, detail=f"no asset {name}")
    return serve_file(path, request, max_age=0)


@router.get("/favicon.ico")
def favicon(request: Request) -> Response:
    return serve_file(STATIC / "favicon.svg", request, max_age=86400)
