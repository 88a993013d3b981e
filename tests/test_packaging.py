"""What a base install pulls in: the CPU-only XGBoost (the `xgboost` wheel brings NVIDIA's
NCCL along), and what .ci/run installs: no docker-compose just to check a YAML file."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import REPO


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_base_install_uses_the_cpu_only_xgboost() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _names(project["dependencies"])
    assert "xgboost-cpu" in base and "xgboost" not in base
    assert "fastapi-offline" in base  # /docs and /redoc without internet
    assert "jsonschema" in _names(project["optional-dependencies"]["dev"])


def test_ci_installs_no_docker_compose() -> None:
    script = (REPO / ".ci" / "run").read_text()
    installs = [line for line in script.splitlines() if "need+=" in line or "install" in line]
    assert not any("docker-compose" in line for line in installs), installs
