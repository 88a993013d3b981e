"""`tctune plan MODEL --submit --wait`: a whole model tuned by one command, against a real
embedded service (simulated backend). Every distinct conv layer gets one job (layers of the
same shape share it), the command returns once all have ended, and its summary gives each
layer's best latency and speedup; every failure is one line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from api.plan import SPREAD, Layer, layer_time_us, load_module_model, trial_budgets
from kernels.space import ScheduleSpace
from kernels.spec import TARGETS, ConvShape, Precision, task_key
from tests.api.test_cli_first_hour import assert_one_line, cli
from tests.conftest import REPO, Service

MODULE = ["tests.models:small_resnet", "--input-shape", "2,3,32,32"]
STAGE2 = ConvShape(8, 56, 56, 64, 64, 3, 3, pad=(1, 1))
STAGE3 = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))


def _cli(svc: Service, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**svc.env, "TCTUNE_SERVER": svc.url,
           "TCTUNE_TOKEN": svc.headers["Authorization"].split()[1]}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _jobs(svc: Service) -> list[dict]:
    return httpx.get(f"{svc.url}/jobs", params={"limit": 1000}).json()  # type: ignore


def test_a_torch_module_is_tuned_layer_by_distinct_layer_in_one_command(
        make_service: Callable[..., Service]) -> None:
    svc = make_service().start()
    layers = load_module_model("tests.models:small_resnet", (2, 3, 32, 32), "int8", "h200")
    keys = {task_key(la.shape, Precision.INT8, TARGETS["h200"]) for la in layers}
    assert (len(layers), len(keys)) == (10, 7)
    # The convs before a block's add are tuned with their residual (ConvShape.residual).
    assert {la.name for la in layers if la.shape.residual} == {
        "layer1.0.conv2", "layer1.1.conv2", "layer2.0.conv2", "layer2.1.conv2"}

    res = _cli(svc, "plan", *MODULE, "--precision", "int8", "--target", "h200",
               "--trials", "8", "--allocate", "even", "--strategy", "random", "--submit",
               "--wait")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert {k: out[k] for k in ("layers", "distinct", "tuned", "submitted", "running")} == {
        "layers": 10, "distinct": 7, "tuned": 0, "submitted": 7, "running": 0}
    assert out["jobs"] == {"done": 7}

    # One job per distinct layer, each ended with its budget measured, when the command
    # returned.
    jobs = _jobs(svc)
    assert sorted(j["task"]["key"] for j in jobs) == sorted(keys)
    assert all(j["status"] == "done" and j["trials_done"] == 8 for j in jobs)
    job_of = {j["task"]["key"]: j["id"] for j in jobs}

    # Every layer: its task's job (shared by the layers of one shape), best latency,
    # baseline and speedup.
    results = out["results"]
    assert [r["name"] for r in results] == [la.name for la in layers]
    for r in results:
        assert r["found"] and r["job_id"] == job_of[r["task_key"]]
        assert r["latency_us"] > 0 and r["simulated"] is True
        assert r["baseline"] == "cuDNN fp16" and r["baseline_us"] > 0
        assert r["speedup"] == round(r["baseline_us"] / r["latency_us"], 3)
    # ... and its schedule, one of its task's space (what `bench.service_tuning` retimes).
    shape_of = {r["task_key"]: la.shape for r, la in zip(results, layers, strict=True)}
    for r in results:
        space = ScheduleSpace(shape_of[r["task_key"]], Precision.INT8, TARGETS["h200"])
        assert space.is_valid(r["schedule"]), r
    by_name = {r["name"]: r for r in results}
    for c in (1, 2):
        assert len({by_name[f"layer1.{b}.conv{c}"]["job_id"] for b in (0, 1)}) == 1
    assert by_name["layer1.0.conv1"]["job_id"] != by_name["layer1.0.conv2"]["job_id"]
    assert by_name["layer1.0.conv2"]["task_key"].split("|")[0].endswith("_res")

    # The display: the model's trials and jobs, a row per job, then the per-layer summary.
    err = res.stderr
    assert "model, 7 jobs" in err and "56/56" in err and "7/7 jobs ended (sim)" in err
    assert f"{job_of[by_name['layer1.0.conv1']['task_key']]:>4} layer1.0.conv1 +1" in err
    assert "cuDNN fp16 (us)" in err and "simulated: latencies of the analytical model" in err
    stem = by_name["stem.0"]
    assert f"{stem['latency_us']:.2f}" in err and f"{stem['speedup']:.2f}x" in err
    assert "done: 7/7 distinct layers tuned; jobs: 7 done" in err

    # Again: everything is tuned, nothing is submitted, nothing to wait for.
    again = _cli(svc, "plan", *MODULE, "--precision", "int8", "--target", "h200", "--wait")
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["tuned"], out["submitted"], out["jobs"]) == (7, 0, {})
    assert all(r["found"] and r["job_id"] is None for r in out["results"])
    assert len(_jobs(svc)) == 7


def test_a_model_file_is_submitted_and_waited_for(make_service: Callable[..., Service],
                                                  tmp_path: Path) -> None:
    svc = make_service().start()
    # No precision in the file: --precision fills it in; one layer says its own.
    model = {"target": "h200", "layers": [
        {"name": "a", "shape": STAGE2.to_dict()},
        {"name": "b", "shape": STAGE2.to_dict()},
        {"name": "c", "shape": STAGE3.to_dict()},
        {"name": "d", "shape": STAGE3.to_dict(), "precision": "fp32_tc"},
    ]}
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model))
    res = _cli(svc, "plan", str(path), "--precision", "int8", "--trials", "6",
               "--strategy", "random", "--wait")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["distinct"], out["submitted"], out["jobs"]) == (3, 3, {"done": 3})
    a, b, c, d = out["results"]
    assert a["job_id"] == b["job_id"] and len({a["job_id"], c["job_id"], d["job_id"]}) == 3
    assert (a["baseline"], d["baseline"]) == ("cuDNN fp16", "cuDNN fp32")
    assert all(r["speedup"] and r["latency_us"] for r in out["results"])
    # Two baselines: each row names its own.
    assert "baseline (us)" in res.stderr and "cuDNN fp32" in res.stderr
    assert {j["status"] for j in _jobs(svc)} == {"done"}


def test_a_job_that_does_not_finish_fails_the_command_in_one_line(
        make_service: Callable[..., Service], tmp_path: Path) -> None:
    svc = make_service(TCTUNE_SIM_DELAY_S="0.2").start()
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"precision": "int8", "target": "h200",
                                "layers": [{"name": "a", "shape": STAGE2.to_dict()}]}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "plan", str(path), "--trials", "200", "--wait"],
        cwd=REPO, env={**svc.env, "TCTUNE_SERVER": svc.url,
                       "TCTUNE_TOKEN": svc.headers["Authorization"].split()[1]},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        job_id = None
        for _ in range(300):
            jobs = _jobs(svc)
            if jobs and jobs[0]["trials_done"] > 0:
                job_id = jobs[0]["id"]
                break
            time.sleep(0.1)
        assert job_id is not None
        httpx.post(f"{svc.url}/jobs/{job_id}/cancel", headers=svc.headers).raise_for_status()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert json.loads(stdout)["jobs"] == {"cancelled": 1}
    last = stderr.strip().splitlines()[-1]
    assert last == f"Error: 1 of 1 jobs did not finish (job {job_id} cancelled)"


@pytest.mark.parametrize("args,words", [
    (["nosuch.json"], ["nosuch.json: no such file, nor torchvision:NAME or module.path:factory"]),
    (["nosuch_pkg:net", "--input-shape", "1,3,8,8", "--precision", "int8", "--target", "h200"],
     ["cannot import 'nosuch_pkg'"]),
    (["tests.models:small_resnet", "--precision", "int8"],
     ["a module model needs --input-shape, --target"]),
    ([MODULE[0], "--input-shape", "2,3,32", "--precision", "int8", "--target", "h200"],
     ["is not N,C,H,W"]),
    ([MODULE[0], "--input-shape", "2,4,32,32", "--precision", "int8", "--target", "h200"],
     ["does not run on an input of (2, 4, 32, 32)"]),
    (["tests.models:not_a_model", "--input-shape", "1,3,8,8", "--precision", "int8",
      "--target", "h200"], ["returned a str, not a torch.nn.Module"]),
    (["tests.models:nothing", "--input-shape", "1,3,8,8", "--precision", "int8",
      "--target", "h200"], ["tests.models has no callable 'nothing'"]),
    ([*MODULE, "--precision", "int8", "--target", "h200", "--dry-run", "--wait"],
     ["--wait follows the jobs --submit starts"]),
])
def test_plan_fails_in_one_line(args: list[str], words: list[str], tmp_path: Path) -> None:
    # No service at all: these fail before asking it.
    res = cli("plan", *args, "--server", "http://127.0.0.1:9", TCTUNE_DATA_DIR=str(tmp_path))
    assert_one_line(res, *words)


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                    reason="torchvision is installed: its absence cannot be shown")
def test_torchvision_models_without_torchvision_say_what_to_install(tmp_path: Path) -> None:
    res = cli("plan", "torchvision:resnet50", "--input-shape", "8,3,224,224", "--precision",
              "int8", "--target", "h100", "--server", "http://127.0.0.1:9",
              TCTUNE_DATA_DIR=str(tmp_path))
    assert_one_line(res, "torchvision:resnet50 needs torchvision (pip install torchvision)")


def test_plan_help_explains_models_and_waiting() -> None:
    res = cli("plan", "--help")
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for words in ("torchvision:NAME", "module.path:factory", "--input-shape N,C,H,W",
                  "random weights", "--submit / --dry-run", "--wait",
                  "share a task and its job", "best latency and speedup",
                  "within 5% of the best known schedule", "[default: 128;"):
        assert words in text, words


def test_a_module_plan_holds_the_layers_over_two_inputs_deploy_merges() -> None:
    """A bottleneck's last conv and its projection are also planned as one layer over both
    inputs, under the key deploy.optimize looks its record up by (two_input_shape)."""
    from api.plan import load_module_model
    from kernels.spec import two_input_shape

    layers = load_module_model("tests.deploy_nets:small_resnet", (2, 3, 32, 32), "int8", "h100")
    by_name = {la.name: la.shape for la in layers}
    pairs = [la for la in layers if la.shape.concat]
    assert [la.name for la in pairs] == ["layer2.0.conv3+layer2.0.downsample.0"]
    want = two_input_shape(by_name["layer2.0.conv3"], by_name["layer2.0.downsample.0"])
    assert want is not None
    assert pairs[0].shape == want and want.concat == 32 and want.stride == (2, 2)
    # BasicBlocks (a 3x3 last conv) and identity shortcuts have none
    assert not any(la.shape.concat for la in load_module_model(
        "tests.models:small_resnet", (2, 3, 32, 32), "int8", "h100"))


def test_a_plans_trials_go_to_the_layers_that_take_the_models_time() -> None:
    a = Layer("a", STAGE2, "int8", "h200")
    b = Layer("b", STAGE3, "int8", "h200")
    # STAGE3 does the same multiply-adds as STAGE2 (half the pixels, twice the channels both
    # ways): the same estimate, so four uses of one against one of the other weigh 4:1, and
    # the trials go as the square root, 2:1, with the same total as an even split.
    assert layer_time_us(STAGE2, "int8", "h200") == layer_time_us(STAGE3, "int8", "h200")
    assert trial_budgets([a, a, a, a, b], 30) == {
        (STAGE2, "int8", "h200"): 40, (STAGE3, "int8", "h200"): 20}
    assert trial_budgets([a, a, a, a, b], 30, "even") == {
        (STAGE2, "int8", "h200"): 30, (STAGE3, "int8", "h200"): 30}
    # Another precision or target is another layer; its estimate follows that peak.
    assert layer_time_us(STAGE2, "fp16", "h200") > layer_time_us(STAGE2, "int8", "h200")
    assert layer_time_us(STAGE2, "int8", "t4") > layer_time_us(STAGE2, "int8", "h200")
    assert len(trial_budgets([a, Layer("a", STAGE2, "fp16", "h200")], 10)) == 2
    with pytest.raises(ValueError, match="allocate is one of time, even"):
        trial_budgets([a, b], 10, "flops")

    # A real model: the bigger the layer's share, the more trials, within SPREAD of the
    # average before rounding, and about trials x layers in all.
    layers = load_module_model("tests.models:small_resnet", (8, 3, 224, 224), "fp16", "h100")
    budgets = trial_budgets(layers, 48)
    assert len(budgets) == 7
    uses = {k: sum(1 for la in layers if (la.shape, la.precision, la.target) == k)
            for k in budgets}
    weight = {k: uses[k] * layer_time_us(*k) for k in budgets}
    order = sorted(budgets, key=weight.__getitem__)
    assert [budgets[k] for k in order] == sorted(budgets.values())
    assert budgets[order[-1]] > 48 > budgets[order[0]]
    assert abs(sum(budgets.values()) - 48 * 7) <= 7
    assert max(budgets.values()) / min(budgets.values()) <= SPREAD[1] / SPREAD[0] + 0.1


def test_the_plan_submits_each_layer_with_its_share_of_the_trials(
        make_service: Callable[..., Service]) -> None:
    svc = make_service(TCTUNE_SIM_DELAY_S="0.05").start()
    dry = _cli(svc, "plan", *MODULE, "--precision", "int8", "--target", "h200", "--trials",
               "20", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    layers = load_module_model("tests.models:small_resnet", (2, 3, 32, 32), "int8", "h200")
    want = {task_key(k[0], Precision.INT8, TARGETS["h200"]): n
            for k, n in trial_budgets(layers, 20).items()}
    assert len(set(want.values())) > 1  # the layers' shares differ
    assert "trials" in dry.stderr and _jobs(svc) == []
    res = _cli(svc, "plan", *MODULE, "--precision", "int8", "--target", "h200", "--trials",
               "20", "--strategy", "random")
    assert res.returncode == 0, res.stderr
    assert {j["task"]["key"]: j["trials"] for j in _jobs(svc)} == want


def test_a_plan_over_the_rate_limit_waits_as_the_service_says(
        make_service: Callable[..., Service]) -> None:
    # 6 submissions a minute: the seventh distinct layer waits for the bucket to refill.
    svc = make_service(TCTUNE_TUNE_PER_MINUTE="6").start()
    res = _cli(svc, "plan", *MODULE, "--precision", "int8", "--target", "h200", "--trials",
               "8", "--strategy", "random")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["submitted"] == 7
    assert len(_jobs(svc)) == 7
    assert "the service's limit on submissions: waiting" in res.stderr


def test_a_submission_waits_out_429s_within_its_patience_only() -> None:
    from api.client import TctuneError
    from api.plan import submit_within_limits

    slept: list[float] = []
    answers: list[object] = [TctuneError(429, "slow down", 2.0),
                             TctuneError(429, "slow down", 3.0), {"job_id": 1}]

    def submit() -> dict:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a  # type: ignore[return-value]

    heard: list[float] = []
    assert submit_within_limits(submit, heard.append, sleep=slept.append) == {"job_id": 1}
    assert slept == heard == [2.0, 3.0]
    # Past its patience, or on any other error, the error goes to the caller at once.
    answers[:] = [TctuneError(429, "slow down", 2.0), TctuneError(429, "slow down", 2.0)]
    slept.clear()
    with pytest.raises(TctuneError):
        submit_within_limits(submit, patience_s=3.0, sleep=slept.append)
    assert slept == [2.0]
    answers[:] = [TctuneError(422, "bad shape"), {"job_id": 2}]
    with pytest.raises(TctuneError):
        submit_within_limits(submit, sleep=slept.append)
    answers[:] = [TctuneError(429, "no Retry-After"), {"job_id": 3}]
    with pytest.raises(TctuneError):
        submit_within_limits(submit, sleep=slept.append)


@pytest.mark.parametrize("spec", ["tests.models:small_resnet", "tests.deploy_nets:small_resnet"])
def test_a_module_is_planned_on_the_meta_device_as_on_the_cpu(
        spec: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers come from shapes alone (the meta device: no arithmetic), the same as a
    forward pass on the CPU finds them; a model that does not run on meta is planned on the
    CPU."""
    import torch

    from api import plan
    from api.plan import build_module, conv_layers, fused_layers

    devices: list[str] = []
    built = plan.build_module

    def watched(s: str) -> torch.nn.Module:
        module = built(s)
        module.register_forward_pre_hook(lambda _m, args: devices.append(args[0].device.type))
        return module

    monkeypatch.setattr(plan, "build_module", watched)
    shape = (8, 3, 64, 64)
    layers = load_module_model(spec, shape, "int8", "h100")
    assert set(devices) == {"meta"}

    cpu, x = build_module(spec), torch.randn(*shape)
    found = conv_layers(cpu, x)
    pairs, residual, _ = fused_layers(cpu, x, found)
    assert [(la.name, la.shape) for la in layers] == \
        [(f["name"], replace(ConvShape.from_dict(f["shape"]), residual=f["name"] in residual))
         for f in found] + [(f["name"], ConvShape.from_dict(f["shape"])) for f in pairs]

    devices.clear()
    [layer] = load_module_model("tests.models:reads_a_value", shape, "int8", "h100")
    assert devices == ["meta", "cpu"]
    assert layer.shape == ConvShape(8, 64, 64, 3, 16, 3, 3, pad=(1, 1))


def test_pixel_pairs_add_the_stems_pair_layer() -> None:
    """--pixel-pairs: the stem's pair layer (kernels.spec.pixel_pairs) is planned too."""
    shape = (2, 3, 64, 64)
    plain = load_module_model("tests.deploy_nets:small_resnet", shape, "fp16", "h100")
    pairs = load_module_model("tests.deploy_nets:small_resnet", shape, "fp16", "h100",
                              pixel_pairs=True)
    assert pairs[:len(plain)] == plain
    [extra] = pairs[len(plain):]
    assert extra.name == "conv1 over pixel pairs"
    assert extra.shape == ConvShape(2, 64, 33, 8, 32, 7, 4, stride=(2, 1), pad=(3, 1))


def test_plan_with_b2b_adds_the_back_to_back_layers(make_service: Callable[..., Service]) -> None:
    """--b2b: the layers that may run the next 1x1 conv in their kernel are planned too;
    --pixel-pairs: the stem's pair layer."""
    svc = make_service().start()
    args = ("plan", "tests.deploy_nets:small_resnet", "--input-shape", "2,3,32,32",
            "--precision", "int8", "--target", "h100", "--dry-run")
    plain, b2b = _cli(svc, *args), _cli(svc, *args, "--b2b")
    assert plain.returncode == b2b.returncode == 0, (plain.stderr, b2b.stderr)
    assert json.loads(b2b.stdout)["distinct"] == json.loads(plain.stdout)["distinct"] + 2
    pairs = _cli(svc, *args, "--pixel-pairs")  # and the stem's pair layer
    assert pairs.returncode == 0, pairs.stderr
    assert json.loads(pairs.stdout)["distinct"] == json.loads(plain.stdout)["distinct"] + 1
