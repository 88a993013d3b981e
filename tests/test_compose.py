"""docker-compose.yml validates and describes the whole fleet."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO

COMPOSE = REPO / "docker-compose.yml"


def _compose_cmd() -> list[str] | None:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                 capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_config_validates() -> None:
    cmd = _compose_cmd()
    if cmd is None:
        pytest.fail("no docker compose client: .ci/run installs Debian's docker-compose")
    res = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True,
                         text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr


def test_compose_has_every_service_and_a_gpu_reservation() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert {"postgres", "redis", "api", "explorer", "builder", "worker-gpu"} <= set(services)
    devices = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    for name in ("postgres", "redis", "api"):
        assert "healthcheck" in services[name], name
    # Migrations run before the processes that use the database.
    for name in ("api", "explorer", "builder", "worker-gpu"):
        dep = services[name]["depends_on"]["migrate"]
        assert dep["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["tctune", "db", "upgrade"]
    assert "pgdata" in spec["volumes"]
