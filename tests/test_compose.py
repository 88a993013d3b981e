"""docker-compose.yml validates and describes the whole fleet."""

from __future__ import annotations

import json

import jsonschema
import yaml

from tests.conftest import REPO

COMPOSE = REPO / "docker-compose.yml"


def test_compose_file_matches_the_compose_specification() -> None:
    """Validated against the Compose Specification's JSON schema, vendored in tests/data
    (no docker client needed)."""
    schema = json.loads((REPO / "tests" / "data" / "compose-spec.json").read_text())
    spec = yaml.safe_load(COMPOSE.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(spec)]
    assert not errors, errors
    assert "version" not in spec  # obsolete in the specification


def test_cpu_services_build_and_run_the_cpu_stage() -> None:
    """Only the GPU worker runs the CUDA stage; a build without a target would build the
    Dockerfile's last stage, the CUDA one."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    stages = {}
    for name, svc in services.items():
        if "build" in svc:
            build = svc["build"]
            assert isinstance(build, dict) and "target" in build, f"{name}: no build target"
            stages[svc["image"]] = build["target"]
    assert stages == {"tctune": "base", "tctune-gpu": "gpu"}
    for name in ("migrate", "api", "explorer", "builder", "worker-sim"):
        assert stages[services[name]["image"]] == "base", name
    assert services["worker-gpu"]["image"] == "tctune-gpu"


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
