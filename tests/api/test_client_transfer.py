"""The Python client and the CLI against running embedded services: tune, wait, lookup,
bulk lookup, export, import into an empty service, plan a model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from api.client import Client, TctuneError
from api.plan import conv_layers
from kernels.space import ScheduleSpace
from kernels.spec import TARGETS, ConvShape, Precision
from tests.conftest import REPO, Service

STAGE2 = ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 1))
STAGE3 = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))


def _client(svc: Service) -> Client:
    return Client(svc.url, token=svc.headers["Authorization"].split()[1])


def _cli(svc: Service, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**svc.env, "TCTUNE_SERVER": svc.url,
           "TCTUNE_TOKEN": svc.headers["Authorization"].split()[1]}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, input=stdin, timeout=300)


def test_tune_wait_lookup_export_import_roundtrip(make_service: Callable[..., Service],
                                                  tmp_path: Path) -> None:
    src = make_service().start()
    client = _client(src)
    seen: list[int] = []
    job = client.tune(STAGE2, "int8", "h200", trials=40, strategy="random")
    final = client.wait(job["job_id"], poll_s=0.2,
                        on_update=lambda s: seen.append(s["trials_done"]))
    assert final["status"] == "done" and final["trials_done"] == 40
    assert seen == sorted(seen) and seen[-1] == 40
    best = client.schedule(STAGE2, "int8", "h200")
    assert best is not None and best["simulated"] is True
    assert best["simulated_note"] is None  # the model is checked against the H200
    assert client.schedule(STAGE3, "int8", "h200") is None
    bulk = client.lookup([(STAGE2, "int8", "h200"), (STAGE3, "int8", "h200")])
    assert [r["found"] for r in bulk] == [True, False]
    assert bulk[0]["schedule"] == best["schedule"]

    out = tmp_path / "export.jsonl"
    res = _cli(src, "export", "--out", str(out))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sum(x["kind"] == "measurement" for x in lines) == 40
    assert sum(x["kind"] == "best" for x in lines) == 1
    src.stop()

    # Another deployment, empty: import, then the same schedule is served.
    dst_env = make_service()
    dst_env.data_dir = tmp_path / "other"
    dst_env.data_dir.mkdir()
    dst = dst_env.start()
    res = _cli(dst, "import", str(out))
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report == {"lines": 41, "imported": 40, "already_present": 0, "tasks": 1}
    again = json.loads(_cli(dst, "import", str(out)).stdout)
    assert again["imported"] == 0 and again["already_present"] == 40  # idempotent
    moved = _client(dst).schedule(STAGE2, "int8", "h200")
    assert moved is not None
    assert (moved["schedule"], moved["latency_us"]) == (best["schedule"], best["latency_us"])


def test_a_simulated_result_for_an_unchecked_gpu_says_it_is_a_prediction(
        make_service: Callable[..., Service]) -> None:
    # The model is fitted to and checked against H100 and H200 measurements; on an A100 it
    # runs on the datasheet's figures: every place that shows such a result says so.
    svc = make_service().start()
    client = _client(svc)
    job = client.tune(STAGE2, "int8", "a100", trials=8, strategy="random")
    final = client.wait(job["job_id"], poll_s=0.2)
    assert final["status"] == "done" and final["simulated"] is True
    note = final["simulated_note"]
    assert note and "a100" in note and "never checked" in note and "h100, h200" in note
    assert client.schedule(STAGE2, "int8", "a100")["simulated_note"] == note
    assert client.lookup([(STAGE2, "int8", "a100")])[0]["simulated_note"] == note
    listed = _client(svc).http.get("/schedules", params={"target": "a100"}).json()
    assert [r["simulated_note"] for r in listed] == [note]
    assert [j["simulated_note"] for j in client.http.get("/jobs").json()] == [note]


def test_invalid_import_imports_nothing(make_service: Callable[..., Service],
                                        tmp_path: Path) -> None:
    svc = make_service().start()
    good = {"kind": "measurement", "task": {"shape": STAGE2.to_dict(), "precision": "int8",
                                            "target": "h200"},
            "schedule": {"BLK_ROW_WARPS": 1}, "status": "ok", "median_us": 3.0,
            "backend": "cuda"}
    full = ScheduleSpace(STAGE2, Precision.INT8, TARGETS["h200"]).schedule_at(0)
    bad = {**good, "schedule": full, "status": "fast"}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + "{not json\n" + json.dumps(bad) + "\n")
    res = _cli(svc, "import", str(path))
    assert res.returncode == 1
    assert "nothing was imported" in res.stderr
    assert "line 1: schedule.BLK_COL_WARPS: missing" in res.stderr
    assert "line 2:" in res.stderr and "line 3: status: Input should be 'ok'" in res.stderr
    assert "Traceback" not in res.stderr
    with pytest.raises(TctuneError) as err:
        Client(svc.url).import_lines(json.dumps(good))  # no token
    assert err.value.status == 401


def test_plan_submits_untuned_layers_and_reports_coverage(
        make_service: Callable[..., Service], tmp_path: Path) -> None:
    svc = make_service(TCTUNE_SIM_DELAY_S="0.05").start()
    model = {"precision": "int8", "target": "h200", "layers": [
        {"name": "a", "shape": STAGE2.to_dict()},
        {"name": "b", "shape": STAGE2.to_dict()},
        {"name": "c", "shape": STAGE3.to_dict()},
    ]}
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model))
    dry = _cli(svc, "plan", str(path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {"layers": 3, "distinct": 2, "tuned": 0, "submitted": 0,
                                      "running": 0}
    res = _cli(svc, "plan", str(path), "--trials", "16")
    assert json.loads(res.stdout)["submitted"] == 2
    assert "coverage: 0/2" in res.stderr
    client = _client(svc)
    for job in client.http.get("/jobs").json():
        client.wait(job["id"], poll_s=0.2)
    done = json.loads(_cli(svc, "plan", str(path), "--dry-run").stdout)
    assert done["tuned"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layers": [{"shape": STAGE2.to_dict()}]}))
    res = _cli(svc, "plan", str(bad))
    assert res.returncode == 1 and "precision and target are needed" in res.stderr


def test_conv_layers_of_a_torch_module() -> None:
    import torch  # installed by the dev extra: missing is a failure, not a skip
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 7, stride=2, padding=3),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1, groups=4),  # grouped: skipped
        torch.nn.Conv2d(16, 32, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    )
    layers = conv_layers(net, torch.zeros(2, 3, 32, 32))
    assert [x["name"] for x in layers] == ["0", "3"]
    first = ConvShape.from_dict(layers[0]["shape"])
    assert (first.n, first.c, first.h, first.k, first.r, first.stride) == (2, 3, 32, 16, 7, (2, 2))
    out = net[0](torch.zeros(2, 3, 32, 32))
    assert (first.p, first.q) == tuple(out.shape[2:])
    last = ConvShape.from_dict(layers[1]["shape"])
    assert last.h == 16 and last.dilation == (1, 2) and last.pad == (1, 2)
