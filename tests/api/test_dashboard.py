"""The dashboard's pages and assets are served by the API itself, without a browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import plotly
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.routes.dashboard import SECURITY_HEADERS, WEBGL_PAGES
from kernels.spec import TARGETS, ConvShape, Precision
from store import migrate
from store import repository as repo
from store.db import session_scope
from store.settings import Settings

PAGES = {"/": "jobs", "/ui/jobs/7": "job", "/ui/fleet": "fleet", "/ui/schedules": "schedules"}
STATIC = Path(__file__).resolve().parents[2] / "api" / "static"
TEMPLATES = STATIC.parent / "templates"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    # No dispatcher; the database holds job 7 only (a job page looks its job up).
    cfg = Settings(data_dir=tmp_path)
    migrate.upgrade(cfg.db_url)
    with session_scope(cfg.db_url) as s:
        task = repo.get_or_create_task(s, ConvShape(1, 8, 8, 16, 16, 1, 1), Precision.FP16,
                                       TARGETS["h100"])
        for _ in range(7):
            job = repo.create_job(s, task, 1, "random", 0)
        s.flush()
        assert job.id == 7
    app = create_app(cfg, dispatcher=False)
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("path,page", PAGES.items())
def test_pages_are_html_and_reference_only_served_assets(client: TestClient, path: str,
                                                        page: str) -> None:
    resp = client.get(path)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    body = resp.text
    assert f'data-page="{page}"' in body
    assert "{{" not in body, "every template placeholder is filled"
    refs = re.findall(r'(?:src|href)="(/[^"]*)"', body)
    assert f"/ui/static/{page}.js" in refs and "/ui/static/dashboard.js" in refs
    for ref in refs:
        assert client.get(ref).status_code == 200, ref
    if page == "job":
        assert 'data-job-id="7"' in body and "/ui/static/plotly.min.js" in refs
    for name, value in SECURITY_HEADERS.items():
        if name != "Content-Security-Policy":
            assert resp.headers[name] == value
    csp = resp.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "'unsafe-inline'" not in csp.split(";")[1]
    # eval only where the WebGL charts need it (regl), never inline or foreign scripts
    script_src = "script-src 'self' 'unsafe-eval'" if page in WEBGL_PAGES else "script-src 'self'"
    assert f"{script_src};" in csp
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["x-content-type-options"] == "nosniff"


def test_plotly_is_served_from_the_pip_package(client: TestClient) -> None:
    resp = client.get("/ui/static/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/javascript")
    packaged = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert resp.content == packaged.read_bytes()
    assert b"plotly.js" in resp.content[:500]

    # Gzipped on request (4.8 MB -> about 1.5 MB), and revalidated by ETag.
    raw = client.get("/ui/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip"
    assert int(raw.headers["content-length"]) < len(resp.content) / 2
    etag = resp.headers["etag"]
    again = client.get("/ui/static/plotly.min.js", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""


@pytest.mark.parametrize("name,media", [("dashboard.js", "text/javascript"),
                                        ("job.js", "text/javascript"),
                                        ("dashboard.css", "text/css"),
                                        ("favicon.svg", "image/svg+xml")])
def test_static_assets(client: TestClient, name: str, media: str) -> None:
    resp = client.get(f"/ui/static/{name}", headers={"Accept-Encoding": "gzip"})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith(media)
    body = resp.content  # httpx decodes gzip itself
    assert body == (STATIC / name).read_bytes()
    if len(body) > 1024:
        assert resp.headers["content-encoding"] == "gzip"


@pytest.mark.parametrize("path", ["/ui/static/nope.js", "/ui/static/..%2Fapp.py",
                                  "/ui/static/%2E%2E%2Froutes%2Fdashboard.py",
                                  "/ui/static/..%2Ftemplates%2Flayout.html"])
def test_no_files_outside_static(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_ui_redirects_and_bad_job_ids(client: TestClient) -> None:
    resp = client.get("/ui", follow_redirects=False)
    assert resp.status_code == 307 and resp.headers["location"] == "/"
    assert client.get("/ui/jobs/abc").status_code == 422
    missing = client.get("/ui/jobs/8")
    assert missing.status_code == 404 and "Job 8 not found" in missing.text
    assert client.get("/ui/jobs/99999999999").status_code == 422
    assert client.get("/favicon.ico").headers["content-type"].startswith("image/svg+xml")


def test_pages_stay_out_of_the_api_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/ui") for p in paths)


def test_nothing_is_loaded_from_the_internet() -> None:
    # The service must work offline: no CDN, no web fonts, no absolute URLs in our assets.
    for path in [*STATIC.iterdir(), *TEMPLATES.iterdir()]:
        text = path.read_text(encoding="utf-8")
        hits = [u for u in re.findall(r"https?://[^\s\"')]+", text)
                if not u.startswith("http://www.w3.org/")]  # the SVG namespace is no fetch
        assert not hits, f"{path.name} refers to {hits}"


DURATION_CASES = {1199.6: "20 min 0 s", 1199.4: "19 min 59 s", 59.7: "1 min 0 s",
                  9.96: "10 s", 3.25: "3.3 s", 7199.9: "2 h 0 min", 3629.9: "1 h 0 min",
                  5399: "1 h 30 min", 90000: "1 d"}


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page script")
def test_durations_never_show_60_seconds_or_minutes() -> None:
    stubs = ("globalThis.window = {location: {href: 'http://x/'}};"
             "globalThis.localStorage = {getItem() { return ''; }};"
             "globalThis.history = {replaceState() {}};"
             "globalThis.document = {addEventListener() {}};")
    script = (stubs + (STATIC / "dashboard.js").read_text()
              + f";console.log(JSON.stringify({list(DURATION_CASES)}.map(TC.duration)));")
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert dict(zip(DURATION_CASES, json.loads(out.stdout), strict=True)) == DURATION_CASES


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_docs_load_only_what_the_service_serves(client: TestClient, page: str) -> None:
    resp = client.get(page)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    refs = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", resp.text)
    assert refs, resp.text
    for ref in refs:
        assert ref.startswith("/"), f"{page} loads {ref} from elsewhere"
        assert client.get(ref).status_code == 200, ref
    assert "cdn." not in resp.text and "fonts.googleapis" not in resp.text
    assert "/openapi.json" in refs
