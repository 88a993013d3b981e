"""The dashboard in a real headless Chromium, against a real `tctune serve`.

Set TCTUNE_DASHBOARD_SCREENSHOT=1 to also write the job page's screenshot to
bench/data/dashboard_job.png (it always goes to the test's tmp dir).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
from collections.abc import Callable, Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from store.db import session_scope
from store.models import Job, Measurement
from tests.conftest import REPO, Service

# Found as .ci/run finds them (`command -v`); it installs them where missing, so a
# missing browser fails these tests instead of skipping them.
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}
STAGE3 = {"n": 8, "h": 28, "w": 28, "c": 128, "k": 128, "r": 3, "s": 3, "pad": [1, 1]}
WIDTH, HEIGHT = 1440, 900  # a laptop screen


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    assert CHROMIUM and CHROMEDRIVER, (
        "chromium/chromedriver not on PATH: .ci/run installs them "
        "(apt-get install chromium chromium-driver)")

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # WebGL (the parallel coordinates) from SwiftShader, Chromium's software renderer.
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
                f"--user-data-dir={tmp_path / 'chromium-profile'}",
                f"--window-size={WIDTH},{HEIGHT}"):
        opts.add_argument(arg)
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    # Console messages, and network events to see the headers the pages send.
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=opts, service=DriverService(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """Errors the page logged since the last call (uncaught exceptions, failed loads)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def wait_for(fn: Callable[[], Any], timeout: float = 60, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fn()
        except Exception as err:  # the element may not exist yet
            last = err
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or fn}: last {last!r}")


def drawn_points(driver: Any) -> int:
    """Markers Plotly actually rendered in the latency chart (one per measurement)."""
    return int(driver.execute_script(
        "return document.querySelectorAll('#chart-latency .scatterlayer path.point').length"))


def js_fixed(v: float, places: int) -> str:
    """JavaScript's `v.toFixed(places)`: the exact binary value rounded half up (Python's
    format rounds an exact tie such as 1.625 to even)."""
    return str(Decimal(v).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))


def axis_labels(driver: Any) -> list[tuple[str, list[tuple[float, float]]]]:
    """(text, corners in page coordinates) of each axis title of the parallel coordinates:
    the text's own box through its transform, so slanted labels are quads, not bounds."""
    return [(t, [(float(x), float(y)) for x, y in quad]) for t, quad in driver.execute_script("""
        return [...document.querySelectorAll('#chart-parcoords .axis-title')].map(e => {
          const b = e.getBBox(), m = e.getScreenCTM();
          const pts = [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height],
                       [b.x, b.y + b.height]];
          return [e.textContent, pts.map(([x, y]) => [m.a * x + m.c * y + m.e + scrollX,
                                                      m.b * x + m.d * y + m.f + scrollY])];
        });""")]


def overlapping(labels: list[tuple[str, list[tuple[float, float]]]]) -> list[tuple[str, str]]:
    """Pairs of labels whose quads intersect (separating-axis test on convex quads)."""
    def separated(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
        for quad in (a, b):
            for i in range(4):
                (x0, y0), (x1, y1) = quad[i], quad[(i + 1) % 4]
                nx, ny = y0 - y1, x1 - x0  # the edge's normal
                pa = [nx * x + ny * y for x, y in a]
                pb = [nx * x + ny * y for x, y in b]
                if max(pa) <= min(pb) or max(pb) <= min(pa):
                    return True
        return False

    return [(ta, tb) for i, (ta, qa) in enumerate(labels) for tb, qb in labels[i + 1:]
            if not separated(qa, qb)]


def job_state(svc: Service, job_id: int) -> dict[str, Any]:
    return httpx.get(f"{svc.url}/jobs/{job_id}", timeout=10).json()  # type: ignore[no-any-return]


def admin_token(svc: Service) -> str | None:
    """The admin token the embedded default writes at its first start (None before auth)."""
    path = svc.data_dir / "token"
    return path.read_text().strip() if path.exists() else None


def submit(svc: Service, shape: dict[str, Any], precision: str, target: str,
           trials: int) -> int:
    token = admin_token(svc)
    resp = httpx.post(f"{svc.url}/tune", json={"shape": shape, "precision": precision,
                                               "target": target, "trials": trials},
                      headers={"Authorization": f"Bearer {token}"} if token else {})
    assert resp.status_code == 202, resp.text
    return int(resp.json()["job_id"])


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def full_page_screenshot(driver: Any, path: Path) -> None:
    """Grow the window until the viewport holds the whole page, then save it as a PNG."""
    for _ in range(5):
        inner, full, chrome = driver.execute_script(
            "return [window.innerHeight, document.documentElement.scrollHeight,"
            " window.outerHeight - window.innerHeight]")
        if inner >= full:
            break
        driver.set_window_size(WIDTH, full + chrome)
        time.sleep(0.5)  # Plotly's responsive relayout
    assert driver.save_screenshot(str(path))


def test_job_page_updates_live_and_shows_the_best_schedule(
        make_service: Callable[..., Service], browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    # The simulated GPU measures only as many candidates as the gate allows: the job is
    # held at 16, then at 40 measurements while the page watches it, whatever the load.
    gate = tmp_path / "gate"
    gate.mkdir()
    allow = gate / "allow"

    def let(n: int) -> None:  # atomically: the backend never reads a half-written count
        (gate / "allow.tmp").write_text(str(n))
        os.replace(gate / "allow.tmp", allow)

    let(16)
    svc = make_service(TCTUNE_SIM_GATE_DIR=str(gate), TCTUNE_BATCH_SIZE="16").start()
    job_id = submit(svc, STAGE2, "int8", "h200", 64)
    browser.get(f"{svc.url}/ui/jobs/{job_id}")
    # Survives only if the page is never reloaded.
    browser.execute_script("window.__sameDocument = true;")

    wait_for(lambda: drawn_points(browser) == 16, what="the first 16 points")
    assert job_state(svc, job_id)["status"] == "running"
    let(40)
    wait_for(lambda: drawn_points(browser) == 40, what="24 more points, on the same page")
    assert job_state(svc, job_id)["status"] == "running"
    allow.unlink()  # no gate: the job runs to its end

    # Finished: every measurement drawn, status and best schedule shown, no reload.
    wait_for(lambda: browser.find_element(By.ID, "job-status").text == "done", timeout=120,
             what="status done")
    wait_for(lambda: drawn_points(browser) == 64, what="all 64 points")
    assert browser.execute_script("return window.__sameDocument === true")
    assert browser.find_element(By.ID, "job-trials").text == "64 / 64 trials"
    assert browser.find_element(By.ID, "job-sim").is_displayed(), "the simulated label shows"

    best = httpx.get(f"{svc.url}/schedule", params=dict(
        n=8, h=56, w=56, c=64, k=64, r=3, s=3, pad=1, precision="int8", target="h200")).json()
    shown = json.loads(browser.find_element(By.ID, "best-schedule").text)
    assert shown == best["schedule"]
    assert f"{best['latency_us']:.3f} µs" in browser.find_element(By.ID, "best-meta").text
    assert "--precision int8 --target h200" in browser.find_element(By.ID, "best-cli").text

    # The other panels: baselines drawn, one importance bar per knob, parallel coordinates.
    names = browser.execute_script(
        "return document.getElementById('chart-latency').data.map(t => t.name)")
    assert "best so far" in names and any(n.startswith("cuDNN fp16") for n in names)
    cards = browser.find_element(By.ID, "job-cards").text  # titles upper-cased by CSS
    final = job_state(svc, job_id)
    assert "CUDNN FP16 BASELINE" in cards.upper() and "cuDNN fp16 / best" in cards
    base = final["task"]["baseline_us"]
    assert f"{base:.{3 if base < 10 else 2}f} µs\nsimulated" in cards
    assert f"{js_fixed(final['speedup'], 2)}×" in cards
    bars = browser.execute_script(
        "return document.querySelectorAll('#chart-importance .bars path').length")
    assert bars == len(best["schedule"])
    assert browser.execute_script(
        "return document.getElementById('chart-parcoords').data[0].type") == "parcoords"
    assert browser.find_element(By.ID, "chart-pred").text  # predictions or why there are none

    # Screenshot of the whole page at laptop width.
    shot = tmp_path / "dashboard_job.png"
    full_page_screenshot(browser, shot)
    width, height = png_size(shot)
    assert width == WIDTH and height > HEIGHT and shot.stat().st_size > 50_000
    if os.environ.get("TCTUNE_DASHBOARD_SCREENSHOT"):
        dest = REPO / "bench" / "data" / "dashboard_job.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, dest)

    copy = browser.find_element(By.ID, "copy-best")
    assert copy.is_enabled()
    copy.click()
    wait_for(lambda: copy.text == "Copied", timeout=5, what="copy confirmation")
    assert console_errors(browser) == []

    # The parallel coordinates, redrawn as the job ran (WebGL: SwiftShader here, and eval
    # allowed for regl by the page's CSP), have an axis per varied knob and the latency's,
    # each label inside the panel and clear of every other label.
    labels = wait_for(lambda: (lambda q: len(q) >= 4 and q)(axis_labels(browser)),
                      what="the parallel coordinates' axis labels")
    assert not overlapping(labels), overlapping(labels)
    panel = browser.execute_script(
        "const r = document.getElementById('chart-parcoords').getBoundingClientRect();"
        "return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]")
    outside = [t for t, quad in labels for x, y in quad
               if not (panel[0] - 1 <= x <= panel[2] + 1 and panel[1] - 1 <= y <= panel[3] + 1)]
    assert not outside, f"labels cut off by the panel: {outside}"


def test_jobs_fleet_and_schedules_pages(make_service: Callable[..., Service], browser: Any,
                                        tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    svc = make_service().start()
    ids = [submit(svc, STAGE2, "int8", "h200", 16), submit(svc, STAGE3, "fp16", "h100", 16)]
    for job_id in ids:
        wait_for(lambda j=job_id: job_state(svc, j)["status"] == "done", what=f"job {job_id}")

    # Jobs page, opened with a token: kept for later fetches and taken out of the address bar.
    token = admin_token(svc) or "s3cret"  # reads are open: any token is only passed along
    browser.get(f"{svc.url}/?token={token}")
    rows = wait_for(lambda: len(r := browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr"))
                    == 2 and r, what="two job rows")
    assert "token" not in browser.current_url
    assert browser.execute_script("return localStorage.getItem('tctune.token')") == token
    sent = [json.loads(e["message"])["message"]["params"]["request"]
            for e in browser.get_log("performance")
            if '"Network.requestWillBeSent"' in e["message"]]
    api_calls = [r for r in sent if r["url"].startswith(f"{svc.url}/jobs")]
    assert api_calls and all(r["headers"].get("Authorization") == f"Bearer {token}"
                             for r in api_calls)
    for row, job_id in zip(rows, sorted(ids, reverse=True), strict=True):
        cells = row.find_elements(By.TAG_NAME, "td")
        assert cells[0].text == f"#{job_id}"
        assert cells[4].text == "done" and cells[5].text == "16 / 16"
        assert "µs" in cells[6].text and "simulated" in cells[6].text
        assert cells[8].text.endswith("×")
        track = row.find_element(By.CSS_SELECTOR, ".progress")
        bar = track.find_element(By.CSS_SELECTOR, ".bar")
        wait_for(lambda b=bar, t=track: abs(b.size["width"] - t.size["width"]) <= 1,
                 timeout=5, what="a full progress bar")  # after its CSS transition
    assert console_errors(browser) == []

    # Give job 1 what a model-based strategy records (no strategy in this tree does yet):
    # a prediction per measurement and the model's knob importances.
    importance = {"SPLIT_K": 0.5, "CHUNK": 0.3, "DUP_AWARE": 0.2}
    with session_scope(svc.db_url) as s:
        for m in s.scalars(select(Measurement).where(Measurement.job_id == ids[0])):
            m.predicted_us = (m.median_us or 10.0) * 1.1
        job = s.get(Job, ids[0])
        assert job is not None
        job.insight = {"knob_importance": importance}

    # A row leads to its job page.
    rows[-1].click()
    wait_for(lambda: browser.current_url.endswith(f"/ui/jobs/{ids[0]}"), what="job page")
    wait_for(lambda: drawn_points(browser) == 16, what="16 points")
    predicted = browser.execute_script(
        "return document.querySelectorAll('#chart-pred .scatterlayer path.point').length")
    assert predicted == len([m for m in job_state(svc, ids[0])["measurements"]
                             if m["median_us"] is not None])
    assert "Spearman ρ = 1.00" in browser.find_element(By.ID, "chart-pred").text
    assert browser.find_element(By.ID, "importance-source").text == "from the cost model"
    assert browser.execute_script("return document.getElementById('chart-importance').data[0].y"
                                  ) == sorted(importance, key=importance.__getitem__)
    assert console_errors(browser) == []

    # Fleet: the embedded simulated worker with its heartbeat and throughput.
    browser.get(f"{svc.url}/ui/fleet")
    cells = wait_for(lambda: browser.find_elements(
        By.CSS_SELECTOR, "#workers-table tbody tr td"), what="a worker row")
    texts = [c.text for c in cells]
    assert texts[1] == "analytical model" and texts[4] == "simulated"
    assert texts[5] in ("idle", "busy")
    assert texts[6].endswith("ago") and texts[7].endswith("/min")
    assert float(texts[7].split()[0]) > 0, "32 measurements in the last 5 minutes"
    assert console_errors(browser) == []

    # Schedules: table, filters, export of what is shown as JSON lines.
    browser.get(f"{svc.url}/ui/schedules")
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#schedules-table tbody tr"))
             == 2, what="two schedules")
    # Each row's baseline (named) and the speedup the API computed.
    bests = {r["task"]["key"]: r for r in httpx.get(f"{svc.url}/schedules").json()}
    for tr in browser.find_elements(By.CSS_SELECTOR, "#schedules-table tbody tr"):
        best = bests[tr.get_attribute("data-task-key")]
        cells = tr.find_elements(By.TAG_NAME, "td")
        assert "µs" in cells[4].text and "cuDNN fp16" in cells[4].text
        assert cells[4].get_attribute("title") == "cuDNN fp16, simulated"
        assert cells[5].text == f"{js_fixed(best['speedup'], 2)}×"
    Select(browser.find_element(By.ID, "f-precision")).select_by_value("int8")
    shown = browser.find_elements(By.CSS_SELECTOR, "#schedules-table tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in shown] == ["int8"]
    browser.find_element(By.ID, "export").click()
    out = tmp_path / "downloads" / "schedules-int8.jsonl"
    wait_for(out.exists, timeout=10, what="the export file")
    expected = httpx.get(f"{svc.url}/schedules",
                         params={"format": "jsonl", "precision": "int8"}).text
    assert out.read_text() == expected and len(expected.splitlines()) == 1
    text_filter = browser.find_element(By.ID, "f-text")
    text_filter.send_keys("c999")
    assert browser.find_elements(By.CSS_SELECTOR, "#schedules-table tbody tr") == []
    assert browser.find_element(By.ID, "schedules-empty").is_displayed()
    assert console_errors(browser) == []

    # An unknown job's page is a 404 that says so.
    browser.get(f"{svc.url}/ui/jobs/9999")
    wait_for(lambda: "Job 9999 not found" in browser.find_element(By.TAG_NAME, "main").text,
             what="the missing-job message")


def test_a_prediction_for_an_unchecked_gpu_is_labelled_so(
        make_service: Callable[..., Service], browser: Any) -> None:
    # An A100 job is simulated on a GPU the model was never checked against: the job page's
    # label, its note and the jobs list say so.
    from selenium.webdriver.common.by import By

    svc = make_service().start()
    job_id = submit(svc, STAGE2, "int8", "a100", 8)
    wait_for(lambda: job_state(svc, job_id)["status"] == "done", timeout=120, what="done")
    note = job_state(svc, job_id)["simulated_note"]
    assert note and "a100" in note
    browser.get(f"{svc.url}/ui/jobs/{job_id}")
    label = wait_for(lambda: (e := browser.find_element(By.ID, "job-sim")).is_displayed() and e,
                     what="the simulated label")
    assert label.text == "simulated, unchecked" and label.get_attribute("title") == note
    assert browser.find_element(By.ID, "job-warning").text == note
    browser.get(f"{svc.url}/ui/jobs")
    badge = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#jobs-table .badge.sim"),
                     what="the jobs list's badge")[0]
    assert badge.text == "simulated, unchecked" and badge.get_attribute("title") == note


def test_pages_ask_for_the_token_when_reads_need_one(
        make_service: Callable[..., Service], browser: Any) -> None:
    from selenium.webdriver.common.by import By

    svc = make_service(TCTUNE_READ_AUTH="true").start()
    token = admin_token(svc)
    assert token, "the embedded default wrote its admin token"
    job_id = submit(svc, STAGE2, "int8", "h200", 8)
    auth = {"Authorization": f"Bearer {token}"}
    wait_for(lambda: httpx.get(f"{svc.url}/jobs/{job_id}", headers=auth).json()["status"]
             == "done", what="the job")

    # Without a token: the page itself loads, its data does not, and it asks for a token.
    browser.get(f"{svc.url}/")
    form = wait_for(lambda: (f := browser.find_element(By.ID, "token-form")).is_displayed()
                    and f, what="the token form")
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr") == []
    browser.get_log("browser")  # the refused requests are logged as errors: expected here
    form.find_element(By.ID, "token-input").send_keys(token)
    form.find_element(By.TAG_NAME, "button").click()

    # With it: kept in localStorage and sent on every read, on every page.
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, "#jobs-table tbody tr")) == 1,
             what="the job row")
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    browser.get(f"{svc.url}/ui/jobs/{job_id}")
    wait_for(lambda: drawn_points(browser) == 8, what="8 points")
    browser.get(f"{svc.url}/ui/fleet")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#workers-table tbody tr"),
             what="a worker row")
    assert console_errors(browser) == []


def test_a_layer_over_two_inputs_or_with_a_residual_is_shown_and_copied_as_itself(
        make_service: Callable[..., Service], browser: Any) -> None:
    """The pages' shape text names two inputs and a residual, and the CLI command a job page
    offers (`tctune schedule --shape ...`) looks up that task, not the plain layer's."""
    from api.cli import _parse_shape
    from kernels.spec import ConvShape

    svc = make_service().start()
    browser.get(f"{svc.url}/ui/schedules")
    wait_for(lambda: browser.execute_script("return typeof TC") == "object", what="TC")
    for sh in (ConvShape(8, 56, 56, 64, 256, 1, 1, residual=True),
               ConvShape(8, 56, 56, 320, 512, 1, 1, stride=2, concat=64), STAGE2):
        d = sh.to_dict() if isinstance(sh, ConvShape) else STAGE2
        text, arg = browser.execute_script(
            "return [TC.shape(arguments[0]), TC.shapeArg(arguments[0])]",
            {**d, "stride": d.get("stride", [1, 1]), "dilation": d.get("dilation", [1, 1])})
        assert _parse_shape(arg) == ConvShape.from_dict(d), arg
        assert ("+residual" in text) == bool(d.get("residual"))
        assert ("two inputs (x1 c64)" in text) == bool(d.get("concat"))
    assert console_errors(browser) == []
