"""`tctune-deploy` (python -m deploy): a whole model run on the schedules a real embedded
service (simulated backend) tuned for it with `tctune plan --wait`; its per-layer plan
without a GPU (--report-only); every failure is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.api.test_cli_first_hour import assert_one_line
from tests.conftest import REPO, Service

MODULE = ["tests.models:small_resnet", "--input-shape", "2,3,32,32"]


def _run(svc: Service | None, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {} if svc is None else {**svc.env, "TCTUNE_SERVER": svc.url,
                                  "TCTUNE_TOKEN": svc.headers["Authorization"].split()[1]}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env or None,
                          capture_output=True, text=True, timeout=600)


def test_the_plan_of_a_tuned_model_uses_the_services_schedules(
        make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    before = _run(svc, "deploy", *MODULE, "--precision", "int8", "--target", "h200",
                  "--report-only")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["tuned"] == 0  # nothing tuned yet: runtime defaults
    tuned = _run(svc, "api.cli", "plan", *MODULE, "--precision", "int8", "--target", "h200",
                 "--trials", "6", "--strategy", "random", "--submit", "--wait")
    assert tuned.returncode == 0, tuned.stderr
    res = _run(svc, "deploy", *MODULE, "--precision", "int8", "--target", "h200",
               "--report-only")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    # 11 convs: 10 with groups=1, all on tuned kernels, and a grouped one kept in PyTorch
    assert out == {"model": "tests.models:small_resnet", "precision": "int8",
                   "target": "h200", "convs": 11, "replaced": 10, "tuned": 10}
    assert "10 of 11 conv layers replaced" in res.stderr and "service" in res.stderr


@pytest.mark.parametrize("args,words", [
    ([*MODULE, "--precision", "int8", "--target", "h200"], ["needs a CUDA GPU", "--report-only"]),
    ([*MODULE, "--precision", "int8", "--report-only"], ["--target is needed"]),
    (["nosuch.module:f", "--input-shape", "2,3,32,32", "--precision", "fp16", "--target",
      "h100", "--report-only"], ["cannot import 'nosuch.module'"]),
    ([*MODULE[:2], "2,3", "--precision", "fp16", "--target", "h100", "--report-only"],
     ["N,C,H,W"]),
    ([*MODULE, "--precision", "fp16", "--target", "h100", "--report-only", "--server",
      "http://127.0.0.1:1"], ["cannot reach the service at http://127.0.0.1:1"]),
    ([*MODULE, "--precision", "int8", "--target", "h100", "--report-only",
      "--choose-in-model", "4"], ["--choose-in-model times the model on the GPU"]),
])
def test_failures_are_one_line(args: list[str], words: list[str], tmp_path: Path) -> None:
    if "needs a CUDA GPU" in words:
        pytest.importorskip("torch")
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here")
    assert_one_line(_run(None, "deploy", *args), *words)
