"""Shared fixtures: a real `tctune serve` in a subprocess, and throwaway PostgreSQL databases."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench._procs import PG_ADMIN_URL, free_port, kill, scratch_database, start, stop, wait_http

REPO = Path(__file__).resolve().parent.parent

# PyTorch before CuPy in the test process, as in the measuring child (kernels/runner.py): on a
# fresh GPU machine torch's import failed once CuPy was loaded, failing every GPU test that
# uses torch after one that loaded CuPy first.
with contextlib.suppress(ImportError):  # (the service's tests need no torch)
    import torch  # noqa: F401

__all__ = ["PG_ADMIN_URL", "REPO", "Service", "free_port", "has_gpu"]


def has_gpu() -> bool:
    """CuPy imports and sees a CUDA device (what a `gpu` test needs)."""
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # no CuPy, no driver, no device
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests run where there is a GPU and are skipped, with the reason, elsewhere."""
    if any(item.get_closest_marker("gpu") for item in items) and not has_gpu():
        skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU (marked gpu)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@dataclass
class Service:
    """A `tctune serve` process on a free port with its own data directory."""

    data_dir: Path
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """The admin token the embedded default printed at its first start."""
        return {"Authorization": f"Bearer {(self.data_dir / 'token').read_text().strip()}"}

    def start(self, timeout: float = 60.0) -> Service:
        self.log_path = self.data_dir / f"serve-{time.time_ns()}.log"
        self.proc = start([sys.executable, "-m", "api.cli", "serve", "--port", str(self.port),
                           "--data", str(self.data_dir)], self.env, self.log_path, cwd=REPO)
        wait_http(f"{self.url}/healthz", self.proc, timeout, self.log_path,
                  what="tctune serve")
        return self

    def kill(self) -> None:
        """SIGKILL the whole process group: the API, the dispatcher and its children."""
        if self.proc and self.proc.poll() is None:
            kill(self.proc)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            stop(self.proc, timeout=15)

    @property
    def db_url(self) -> str:
        return f"sqlite:///{(self.data_dir / 'tctune.db').resolve()}"


SASS_MISSING = ("cuobjdump/nvdisasm not found: they come with the dev extra "
                "(pip install -e '.[dev]': nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)")


@pytest.fixture
def sass_tools() -> None:
    """SASS checks need cuobjdump and nvdisasm; .ci/run installs them, so missing is a
    failure, never a silent pass."""
    from kernels.sass import cuobjdump_path, nvdisasm_path

    assert cuobjdump_path() and nvdisasm_path(), SASS_MISSING


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(**env: str) -> Service:
        # Only what the test sets: no TCTUNE_* of the developer's shell leaks in.
        base = {k: v for k, v in os.environ.items() if not k.startswith("TCTUNE_")}
        full = {**base, "TCTUNE_BACKEND": "simulated", "PYTHONUNBUFFERED": "1", **env}
        svc = Service(data_dir=tmp_path / "data", env=full)
        svc.data_dir.mkdir(exist_ok=True)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    with scratch_database("tctune_test") as url:
        try:
            yield url
        finally:
            from store.db import get_engine

            get_engine(url).dispose()


@pytest.fixture(params=["postgresql", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database of each kind the service runs on: a fresh PostgreSQL database and
    a SQLite file."""
    from store import migrate

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'test.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    migrate.upgrade(url)
    yield url


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """An API on a fresh SQLite database (no dispatcher) with a `tune` token: (client, url)."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from store import migrate
    from store import repository as repo
    from store.db import session_scope
    from store.settings import Settings

    settings = Settings(data_dir=tmp_path, backend="simulated")
    migrate.upgrade(settings.db_url)
    with session_scope(settings.db_url) as s:
        token = repo.create_token(s, "test", "tune")
    with TestClient(create_app(settings, dispatcher=False),
                    headers={"Authorization": f"Bearer {token}"}) as client:
        yield client, settings.db_url
