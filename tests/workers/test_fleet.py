"""The distributed fleet for real: Celery processes, a Redis broker and PostgreSQL.

Each test runs the API, the central explorer, a builder and simulated GPU workers as
separate processes, then breaks something mid-job (a worker SIGKILLed, the explorer or
the broker restarted, a measuring child that crashes) and checks that the job still ends
with exactly its budget measured and no schedule measured twice.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from store import migrate
from store.db import session_scope
from store.models import Measurement
from tests.conftest import REPO, free_port

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs redis-server (installed by .ci/run's machine)")

STAGE2 = {"n": 8, "h": 56, "w": 56, "c": 64, "k": 64, "r": 3, "s": 3, "pad": [1, 1]}


@dataclass
class Proc:
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        out = open(self.log, "ab")  # noqa: SIM115 (kept open for the child)
        self.popen = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.popen is not None
            os.killpg(self.popen.pid, sig)
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)


@dataclass
class Fleet:
    tmp: Path
    db_url: str
    redis_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    procs: list[Proc] = field(default_factory=list)
    redis: Proc | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
        return {**base, "PYTHONUNBUFFERED": "1",
                "TCTUNE_DATABASE_URL": self.db_url,
                "TCTUNE_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                "TCTUNE_BACKEND": "simulated", "TCTUNE_SIM_DELAY_S": "0.03",
                "TCTUNE_BATCH_SIZE": "16", "TCTUNE_LEASE_S": "4", "TCTUNE_REDISPATCH_S": "3",
                "TCTUNE_SWEEP_S": "0.5", "TCTUNE_HEARTBEAT_S": "1",
                # No `allow` file: never held; every simulated measurement is logged there.
                "TCTUNE_SIM_GATE_DIR": str(self.gate)}

    @property
    def gate(self) -> Path:
        path = self.tmp / "gate"
        path.mkdir(exist_ok=True)
        return path

    def measured(self) -> list[tuple[int, str]]:
        """(pid, task|schedule) of every measurement a simulated GPU made, in order."""
        log = self.gate / "measured.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [(int(pid), key) for pid, key in (line.split(" ", 1) for line in lines)]

    def assert_measured_once(self, crashed: frozenset[int] | set[int] = frozenset()) -> None:
        """Each candidate ran on a (simulated) GPU once; a second run only of one whose
        first run was in a process that was SIGKILLed (`crashed`) before it wrote."""
        runs: dict[str, list[int]] = {}
        for pid, key in self.measured():
            runs.setdefault(key, []).append(pid)
        assert runs, "no measurement was logged at the gate"
        twice = {k: p for k, p in runs.items() if len(p) > 1}
        bad = {k: p for k, p in twice.items() if len(p) > 2 or p[0] not in crashed}
        assert not bad, f"measured more than once on a GPU: {bad}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start_redis(self) -> None:
        self.redis = Proc(["redis-server", "--port", str(self.redis_port), "--bind",
                           "127.0.0.1", "--save", "", "--appendonly", "no"],
                          self.env, self.tmp / "redis.log").start()
        _until(lambda: subprocess.run(["redis-cli", "-p", str(self.redis_port), "ping"],
                                      capture_output=True).stdout.strip() == b"PONG", 20)

    def run(self, name: str, *args: str, **env: str) -> Proc:
        proc = Proc([sys.executable, "-m", "api.cli", *args], {**self.env, **env},
                    self.tmp / f"{name}.log").start()
        self.procs.append(proc)
        return proc

    def start(self, workers: int = 1, **worker_env: str) -> Fleet:
        token = subprocess.run([sys.executable, "-m", "api.cli", "token", "create", "--scope",
                                "admin"], cwd=REPO, env=self.env, capture_output=True,
                               text=True, check=True).stdout.strip()
        self.headers = {"Authorization": f"Bearer {token}"}
        self.start_redis()
        self.api = self.run("api", "serve", "--port", str(self.api_port))
        self.explorer = self.run("explorer", "explorer")
        self.builder = self.run("builder", "builder", "-c", "2")
        self.workers = [self.worker(f"worker{i}", **worker_env) for i in range(workers)]
        _until(lambda: _get(f"{self.url}/healthz") is not None, 60)
        return self

    def worker(self, name: str, **env: str) -> Proc:
        return self.run(name, "worker", "--simulate", "h200", **env)

    def submit(self, trials: int, **body: Any) -> int:
        resp = httpx.post(f"{self.url}/tune", json={"shape": STAGE2, "precision": "int8",
                                                    "target": "h200", "trials": trials, **body},
                          headers=self.headers)
        assert resp.status_code == 202, resp.text
        return int(resp.json()["job_id"])

    def job(self, job_id: int) -> dict[str, Any]:
        state = _get(f"{self.url}/jobs/{job_id}")
        assert state is not None
        return state

    def wait(self, job_id: int, until: Callable[[dict[str, Any]], bool],
             timeout: float = 180) -> dict[str, Any]:
        box: dict[str, Any] = {}

        def check() -> bool:
            box["state"] = self.job(job_id)
            return until(box["state"])

        _until(check, timeout, lambda: f"job state: {box.get('state', {}).get('status')} "
                                       f"{box.get('state', {}).get('trials_done')}\n"
                                       + self.logs())
        return box["state"]

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.tmp.glob("*.log")))

    def assert_exact(self, job_id: int, budget: int) -> list[Measurement]:
        with session_scope(self.db_url) as s:
            rows = list(s.scalars(select(Measurement).where(Measurement.job_id == job_id)))
            per_task = s.scalar(select(func.count(func.distinct(Measurement.schedule_hash))))
        assert len(rows) == budget, "the budget is measured exactly"
        assert len({m.schedule_hash for m in rows}) == budget, "no schedule measured twice"
        assert per_task == len(rows)
        return rows

    def stop(self) -> None:
        for p in self.procs:
            p.kill(signal.SIGTERM)
        if self.redis:
            self.redis.kill()


def _in_group(pid: int, pgid: int) -> bool:
    """The process `pid` is alive and in process group `pgid` (a worker's pool child)."""
    try:
        return os.getpgid(pid) == pgid
    except ProcessLookupError:
        return False


def _get(url: str) -> Any:
    try:
        resp = httpx.get(url, timeout=5)
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


def _until(cond: Callable[[], bool], timeout: float,
           why: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s\n{why()}")


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Fleet]:
    migrate.upgrade(pg_url)
    f = Fleet(tmp_path, pg_url)
    try:
        yield f
    finally:
        f.stop()


def test_job_runs_through_celery_workers(fleet: Fleet) -> None:
    fleet.start(workers=2)
    job_id = fleet.submit(48)
    state = fleet.wait(job_id, lambda s: s["status"] == "done")
    assert state["trials_done"] == 48 and state["simulated"] is True
    rows = fleet.assert_exact(job_id, 48)
    fleet.assert_measured_once()
    assert {m.worker for m in rows} <= {w["name"] for w in httpx.get(f"{fleet.url}/workers").json()}
    workers = httpx.get(f"{fleet.url}/workers").json()
    assert len(workers) == 2
    assert all(w["gpu_model"] == "NVIDIA H200 (simulated)" and w["target"] == "h200"
               for w in workers)
    # Heartbeats every second: each worker's turns fresh (polled, not a wall-clock bound
    # on one reading, which a loaded machine can miss).
    _until(lambda: all(w["heartbeat_age_s"] < 5
                       for w in httpx.get(f"{fleet.url}/workers").json()), 60,
           lambda: f"workers: {httpx.get(f'{fleet.url}/workers').json()}")
    best = httpx.get(f"{fleet.url}/schedule", params=dict(
        n=8, h=56, w=56, c=64, k=64, r=3, s=3, pad=1, precision="int8", target="h200"))
    assert best.status_code == 200
    assert best.json()["latency_us"] == min(m.median_us for m in rows if m.status == "ok")


@pytest.mark.guarantee
def test_sigkill_measure_worker_mid_batch(fleet: Fleet) -> None:
    fleet.start(workers=1, TCTUNE_SIM_DELAY_S="0.15")
    job_id = fleet.submit(40)
    fleet.wait(job_id, lambda s: s["trials_done"] >= 6)
    victim = fleet.workers[0]
    assert victim.popen is not None
    crashed = {pid for pid, _ in fleet.measured() if _in_group(pid, victim.popen.pid)}
    fleet.workers[0].kill()  # SIGKILL: its leased candidate and prefetched message are lost
    assert fleet.job(job_id)["status"] == "running"
    fleet.worker("replacement")
    fleet.wait(job_id, lambda s: s["status"] == "done")
    fleet.assert_exact(job_id, 40)
    assert crashed, "the killed worker had measured"
    fleet.assert_measured_once(crashed)


def test_restart_explorer_mid_job(fleet: Fleet) -> None:
    fleet.start(workers=1, TCTUNE_SIM_DELAY_S="0.1")
    job_id = fleet.submit(48)
    fleet.wait(job_id, lambda s: s["trials_done"] >= 10)
    fleet.explorer.kill()
    time.sleep(2)
    fleet.explorer = fleet.run("explorer2", "explorer")
    fleet.wait(job_id, lambda s: s["status"] == "done")
    fleet.assert_exact(job_id, 48)
    fleet.assert_measured_once()


@pytest.mark.guarantee
def test_restart_redis_mid_job(fleet: Fleet) -> None:
    fleet.start(workers=1, TCTUNE_SIM_DELAY_S="0.1")
    job_id = fleet.submit(48)
    fleet.wait(job_id, lambda s: s["trials_done"] >= 10)
    assert fleet.redis is not None
    fleet.redis.kill()  # keeps nothing on disk: every queued message is gone
    time.sleep(3)
    fleet.start_redis()
    state = fleet.wait(job_id, lambda s: s["status"] == "done", timeout=240)
    assert state["trials_done"] == 48
    fleet.assert_exact(job_id, 48)
    fleet.assert_measured_once()  # the sweeper's re-sends measured nothing twice


def test_crashing_measurement_is_a_runtime_error_and_the_worker_goes_on(fleet: Fleet) -> None:
    fleet.start(workers=1, TCTUNE_SIM_CRASH_RATE="0.25")
    job_id = fleet.submit(40)
    fleet.wait(job_id, lambda s: s["status"] == "done")
    rows = fleet.assert_exact(job_id, 40)
    crashed = [m for m in rows if m.status == "runtime_error"]
    assert crashed and all("died" in (m.error or "") for m in crashed)
    assert any(m.status == "ok" for m in rows)
    assert fleet.workers[0].alive(), "the worker survived its children's crashes"


def test_job_without_a_live_worker_says_so(fleet: Fleet) -> None:
    fleet.start(workers=1)
    resp = httpx.post(f"{fleet.url}/tune", json={"shape": STAGE2, "precision": "int8",
                                                 "target": "t4", "trials": 8},
                      headers=fleet.headers)
    job_id = resp.json()["job_id"]
    state = fleet.wait(job_id, lambda s: "no live worker" in (s["warning"] or ""), timeout=60)
    assert state["live_workers"] == 0
    assert "no live worker for target t4" in state["warning"]
