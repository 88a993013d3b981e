"""deploy's per-layer decisions: tuned schedule or default (with its warning), PyTorch's conv
kept where the record says the fp16 kernel is slower, records from a dict or from the
service's bulk lookup (a real app, its real routes)."""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from torch import nn

from api.app import create_app
from api.client import Client
from deploy import FusedConv, OptimizedModel, optimize
from deploy.plan import (
    POINTWISE_US,
    Record,
    epilogue_pass_us,
    keep_for_record,
    record_from_dict,
)
from kernels.build import Epilogue
from kernels.runtime import DefaultScheduleWarning, default_schedule, schedule_fits
from kernels.space import knobs_for
from kernels.spec import ConvShape, Precision, get_target, task_key
from store import migrate, transfer
from store import repository as repo
from store.db import session_scope
from store.settings import Settings
from tests.deploy_nets import randomize_bn

H100 = get_target("h100")
X = torch.randn(2, 16, 8, 8)
# The two layers of Two at X's shapes.
SHAPE_A = ConvShape(2, 8, 8, 16, 32, 3, 3, pad=(1, 1))
SHAPE_B = ConvShape(2, 8, 8, 32, 32, 1, 1)


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.relu = nn.ReLU()
        self.b = nn.Conv2d(32, 32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.relu(self.bn(self.a(x))))


def two() -> Two:
    torch.manual_seed(0)
    return randomize_bn(Two()).eval()  # type: ignore[return-value]


@functools.cache
def _a_schedule(shape: ConvShape, precision: str, layout: str) -> str:
    default = default_schedule(shape, precision, H100, Epilogue("default", True))[0]
    for knob, values in knobs_for(Precision(precision)).items():
        for v in values:
            s = {**default, knob: v, "LAYOUT": layout}
            if s != default and schedule_fits(shape, Precision(precision), H100, s,
                                              Epilogue("default", True)) is None:
                return json.dumps(s)
    raise AssertionError("no schedule found")


def a_schedule(shape: ConvShape, precision: str = "fp16", layout: str = "nhwc"
               ) -> dict[str, Any]:
    """A valid tuned-looking schedule other than the default (fits a ReLU epilogue)."""
    return dict(json.loads(_a_schedule(shape, precision, layout)))


def run(schedules: Any, precision: str = "fp16") -> tuple[OptimizedModel, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = optimize(two(), X, precision, "h100", schedules, backend="reference")
    return o, [str(w.message) for w in caught if issubclass(w.category, DefaultScheduleWarning)]


def by_name(o: OptimizedModel) -> dict[str, Any]:
    return {lp.name: lp for lp in o.plan}


def rec(shape: ConvShape, speedup: float | None, **kw: Any) -> dict[str, Any]:
    d = {"schedule": a_schedule(shape), "latency_us": 10.0, "simulated": False, "job_id": 7,
         **kw}
    if speedup is not None:
        d.update(baseline_us=10.0 * speedup, speedup=speedup)
    return d


def test_no_schedules_means_defaults_and_one_warning_naming_them() -> None:
    o, warned = run(None)
    assert all(lp.replaced and lp.default_schedule for lp in o.plan)
    assert all(lp.schedule_source.startswith("default: ") for lp in o.plan)
    assert len(warned) == 1 and "a, b" in warned[0]


def test_tuned_schedule_is_used_and_a_missing_one_warns() -> None:
    ra = rec(SHAPE_A, 1.8)
    o, warned = run({"a": ra})
    p = by_name(o)
    assert p["a"].replaced and not p["a"].default_schedule
    assert p["a"].schedule == ra["schedule"] and p["a"].speedup == 1.8
    assert p["a"].schedule_source == "given (a): job 7, 10 us"
    assert {m.layer.name: m.schedule for m in o.modules_of(FusedConv)}["a"] == ra["schedule"]
    assert p["b"].replaced and p["b"].default_schedule
    assert len(warned) == 1 and "(b)" in warned[0]


@pytest.mark.parametrize("key", ["name", "shape", "task"])
def test_records_are_found_by_layer_name_shape_key_or_task_key(key: str) -> None:
    k = {"name": "b", "shape": SHAPE_B.key(),
         "task": task_key(SHAPE_B, Precision.FP16, H100)}[key]
    o, warned = run({k: rec(SHAPE_B, 1.2)})
    assert by_name(o)["b"].schedule_source.startswith(f"given ({k})")
    assert "(a)" in warned[0]


def test_fp16_layer_slower_than_its_baseline_keeps_pytorch_conv() -> None:
    """Slower than cuDNN's conv with the pass PyTorch runs after it (plan.epilogue_pass_us:
    1.8 us and the tiny output's bytes); a record with its speedup alone, than the conv."""
    speedup_only = {**rec(SHAPE_B, None), "latency_us": None, "speedup": 0.9}
    o, _ = run({"a": rec(SHAPE_A, 0.8), "b": speedup_only})
    p = by_name(o)
    assert not p["a"].replaced and "10 us > 8 + 1.8 us" in p["a"].reason
    assert not p["b"].replaced and "0.9x" in p["b"].reason
    # The original modules run, in fp16 (what the records compared with): conv, BN and
    # ReLU of `a`, conv `b`; nothing fused; the model's input and output cast once.
    targets = [n.target for n in o.graph_module.graph.nodes if n.op == "call_module"]
    assert [t for t in targets if "quantize" not in t] == ["a", "bn", "relu", "b"]
    assert o.conversions() == {"quantize": 1, "dequantize": 1}
    with torch.no_grad():
        cl = torch.channels_last
        want = two().half().to(memory_format=cl)(X.half().contiguous(memory_format=cl))
        assert torch.equal(o(X), want.float())
    # 10 us against cuDNN's 9: within the pass, so the kernel runs
    o, _ = run({"a": rec(SHAPE_A, 0.9), "b": rec(SHAPE_B, 1.2)})
    assert by_name(o)["a"].replaced and by_name(o)["a"].reason == ""


def test_int8_layer_slower_than_fp16_baseline_still_runs_the_kernel() -> None:
    r = rec(SHAPE_A, 0.8)
    r["schedule"] = a_schedule(SHAPE_A, "int8")
    o, _ = run({"a": r}, "int8")
    p = by_name(o)["a"]
    assert p.replaced and not p.default_schedule and "slower" in p.notes[0]


def test_blocked_layout_runs_as_nhwc_and_unfit_schedule_falls_back() -> None:
    x8 = torch.randn(8, 16, 8, 8)  # NHWCnc blocks the batch by 8
    a8 = ConvShape(8, 8, 8, 16, 32, 3, 3, pad=(1, 1))
    blocked = {"schedule": a_schedule(a8, layout="nhwcnc"), "latency_us": 5.0}
    broken = {"schedule": {**a_schedule(SHAPE_B), "CHUNK": 3}, "latency_us": 5.0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        o = optimize(two(), x8, "fp16", "h100", {"a": blocked, "b": broken},
                     backend="reference")
    warned = [str(w.message) for w in caught if issubclass(w.category, DefaultScheduleWarning)]
    p = by_name(o)
    assert p["a"].schedule == {**blocked["schedule"], "LAYOUT": "nhwc"}
    assert not p["a"].default_schedule and "nhwcnc run as nhwc" in p["a"].notes[0]
    assert p["b"].default_schedule and "not valid" in p["b"].notes[0]
    assert "(b)" in warned[0]


def test_record_rules() -> None:
    assert record_from_dict({"found": False, "task_key": "k"}, "s") is None
    bare = record_from_dict({"BLK_ROW_WARPS": 1}, "s")
    assert bare is not None and bare.latency_us is None
    with pytest.raises(ValueError, match="schedule"):
        record_from_dict({"latency_us": 3}, "s")
    derived = record_from_dict({"schedule": {}, "latency_us": 4.0, "baseline_us": 2.0}, "s")
    assert derived is not None and derived.speedup == 0.5
    assert keep_for_record(Record({}, "s", speedup=0.99), Precision.FP16)
    assert not keep_for_record(Record({}, "s", speedup=1.0), Precision.FP16)
    assert not keep_for_record(Record({}, "s", latency_us=5.0), Precision.FP16)  # no baseline
    assert "5 us > 4 + 0 us" in keep_for_record(
        Record({}, "s", latency_us=5.0, baseline_us=4.0), Precision.FP16)
    # the pass after cuDNN's conv counts for it
    assert not keep_for_record(Record({}, "s", latency_us=5.0, baseline_us=4.0),
                               Precision.FP16, pass_us=1.5)
    assert "5 us > 4 + 0.5 us" in keep_for_record(
        Record({}, "s", latency_us=5.0, baseline_us=4.0), Precision.FP16, pass_us=0.5)
    # the pass: POINTWISE_US and the fp16 output read and written at the memory's bandwidth
    h200 = get_target("h200")
    out = 8 * 28 * 28 * 128 * 2
    assert epilogue_pass_us(ConvShape(8, 28, 28, 512, 128, 1, 1), h200) == pytest.approx(
        POINTWISE_US + 2 * out / (h200.bandwidth_gbs * 1e3))
    # none for a layer with its residual: its baseline times the add after cuDNN's conv
    assert epilogue_pass_us(ConvShape(8, 28, 28, 512, 128, 1, 1, residual=True), h200) == 0
    assert not keep_for_record(Record({}, "s", speedup=0.5), Precision.INT8)
    assert not keep_for_record(None, Precision.FP16)


# ---- records from the service ------------------------------------------------------------
@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    """The app in process on a migrated SQLite database, and the database's URL."""
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    migrate.upgrade(url)
    cfg = Settings(data_dir=tmp_path, database_url=url, backend="simulated",
                   schedule_cache_s=0)
    with TestClient(create_app(cfg, dispatcher=False)) as c:
        yield c, url


def _store(db: str, shape: ConvShape, schedule: dict[str, Any], us: float,
           baseline_us: float | None) -> None:
    line = json.dumps({"kind": "measurement", "task": {"shape": shape.to_dict(),
                       "precision": "fp16", "target": "h100"}, "schedule": schedule,
                       "status": "ok", "median_us": us, "iqr_us": None, "backend": "cuda"})
    with session_scope(db) as s:
        report = transfer.import_lines(s, [line])
        assert not report.errors, report.errors
        if baseline_us is not None:
            task = repo.get_or_create_task(s, shape, Precision.FP16, H100)
            repo.set_baseline(s, task.id, baseline_us, "cuda")


def test_service_bulk_lookup_gives_schedules_and_baselines(
        service: tuple[TestClient, str]) -> None:
    app, db = service
    sa, sb = a_schedule(SHAPE_A), a_schedule(SHAPE_B)
    _store(db, SHAPE_A, sa, 20.0, 10.0)  # 2x slower than cuDNN: keep PyTorch's conv
    _store(db, SHAPE_B, sb, 4.0, 6.0)
    client = Client("http://testserver")
    client.http.close()
    client.http = app  # the app's real routes, in process
    bulk = client.lookup([(SHAPE_A, "fp16", "h100")])[0]
    assert (bulk["baseline"], bulk["baseline_us"], bulk["speedup"]) == ("cuDNN fp16", 10.0, 0.5)
    o, warned = run(client)
    p = by_name(o)
    assert not p["a"].replaced and "20 us > 10 + 1.8 us" in p["a"].reason
    assert p["b"].replaced and p["b"].schedule == sb and p["b"].speedup == 1.5
    assert p["b"].schedule_source.startswith("service: job ") and "4 us" in \
        p["b"].schedule_source
    assert warned == []
    # int8: nothing tuned for it, every layer on the default.
    o8, warned8 = run(client, "int8")
    assert all(lp.default_schedule for lp in o8.plan) and len(warned8) == 1


@pytest.mark.filterwarnings("ignore::kernels.runtime.DefaultScheduleWarning")
def test_pdl_is_on_for_sm90_targets_off_elsewhere_and_refused_where_unsupported(
        tmp_path: Path) -> None:
    def fused(o: OptimizedModel) -> list[FusedConv]:
        return o.modules_of(FusedConv)  # type: ignore[return-value]

    for target, want in (("h100", True), ("a100", False)):
        o = optimize(two(), X, "int8", target, None, backend="reference")
        assert [m.pdl for m in fused(o)] == [want, want]
    o = optimize(two(), X, "int8", "h100", None, backend="reference", pdl=False)
    assert not any(m.pdl for m in fused(o))
    with pytest.raises(ValueError, match="pdl .* needs an sm_90 target"):
        optimize(two(), X, "int8", "a100", None, backend="reference", pdl=True)
    # the runtime op the kernel path builds (NVRTC, no GPU) carries it to the launch
    m = fused(optimize(two(), X, "fp16", "h100", None, backend="reference",
                       cache_dir=tmp_path))[0]
    assert m.build(X.shape).pdl


# ---- a conv whose epilogue adds a residual -----------------------------------------------
class Block(nn.Module):
    """conv -> BN -> + x -> ReLU: the conv runs with the residual epilogue."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)) + x)


SHAPE_R = ConvShape(2, 8, 8, 16, 16, 3, 3, pad=(1, 1))
SHAPE_R_RES = ConvShape(2, 8, 8, 16, 16, 3, 3, pad=(1, 1), residual=True)


def run_block(schedules: Any) -> Any:
    torch.manual_seed(0)
    model = randomize_bn(Block()).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DefaultScheduleWarning)
        return by_name(optimize(model, X, "fp16", "h100", schedules, backend="reference"))[
            "conv"]


def test_a_conv_with_its_residual_takes_the_record_tuned_with_it() -> None:
    """The record of the layer with its residual (as `tctune plan` tunes it) wins over the
    conv's alone; without it, the conv's alone is used and the plan says what to tune."""
    plain = {**rec(SHAPE_R, 1.5), "latency_us": 9.0}
    fused = {**rec(SHAPE_R_RES, 1.4), "schedule": a_schedule(SHAPE_R_RES), "latency_us": 11.0}
    keys = {s: task_key(s, Precision.FP16, H100) for s in (SHAPE_R, SHAPE_R_RES)}
    lp = run_block({keys[SHAPE_R]: plain, keys[SHAPE_R_RES]: fused})
    assert lp.replaced and lp.residual is not None
    assert lp.schedule == fused["schedule"] and lp.latency_us == 11.0
    assert not any("without its residual" in n for n in lp.notes)

    lp = run_block({keys[SHAPE_R]: plain})
    assert lp.replaced and lp.latency_us == 9.0
    assert any(f"tune {SHAPE_R_RES.key()}" in n for n in lp.notes), lp.notes


def test_the_service_answers_the_residual_layer_by_its_own_key(
        service: tuple[TestClient, str]) -> None:
    app, db = service
    s_res = a_schedule(SHAPE_R_RES)
    _store(db, SHAPE_R, a_schedule(SHAPE_R), 5.0, 10.0)
    _store(db, SHAPE_R_RES, s_res, 6.0, 10.0)
    client = Client("http://testserver")
    client.http.close()
    client.http = app
    lp = run_block(client)
    assert lp.schedule == s_res and lp.latency_us == 6.0 and lp.baseline_us == 10.0


def test_a_layer_without_a_record_at_its_batch_runs_its_record_at_the_nearest_larger_batch(
) -> None:
    """A layer with records at other batches only takes the schedule of the nearest larger
    one, without that batch's times (another batch's: decided as a layer without a record, so
    an fp16 record slower than cuDNN keeps nothing); records at smaller batches, of other
    precisions, targets or layers do not count, and a record at its own batch wins."""
    at = {n: replace(SHAPE_A, n=n) for n in (1, 4, 8, 16)}
    sched = {n: a_schedule(s) for n, s in at.items()}
    slow = {**rec(at[8], 0.5), "schedule": sched[8]}  # 2x slower than cuDNN at batch 8
    o, warned = run({task_key(at[8], Precision.FP16, H100): slow})
    p = by_name(o)["a"]
    assert p.replaced and not p.default_schedule and p.schedule == sched[8]
    assert p.schedule_source.endswith("tuned at batch 8") and p.latency_us is None
    assert p.speedup is None and "(b)" in warned[0] and "(a)" not in warned[0]
    # batch 2: 4 is the nearest larger; 1 is smaller; 8 and 16 (a shape key) further
    recs = {task_key(at[n], Precision.FP16, H100): {**rec(at[n], 1.5), "schedule": sched[n]}
            for n in (1, 4, 8)}
    recs[at[16].key()] = {**rec(at[16], 1.5), "schedule": sched[16]}
    assert by_name(run(recs)[0])["a"].schedule == sched[4]
    del recs[task_key(at[4], Precision.FP16, H100)]
    assert by_name(run(recs)[0])["a"].schedule == sched[8]
    assert by_name(run({task_key(at[1], Precision.FP16, H100): rec(at[1], 1.5)})[0])[
        "a"].default_schedule
    # other precisions and targets do not count; the own batch wins
    other = {task_key(at[4], Precision.INT8, H100): rec(at[4], 1.5),
             task_key(at[4], Precision.FP16, get_target("a100")): rec(at[4], 1.5)}
    assert by_name(run(other)[0])["a"].default_schedule
    own = {**recs, task_key(SHAPE_A, Precision.FP16, H100): rec(SHAPE_A, 1.2)}
    assert by_name(run(own)[0])["a"].speedup == 1.2


def test_a_residual_layer_prefers_its_conv_at_its_batch_to_itself_at_another() -> None:
    """The conv's record at the layer's batch wins over the residual layer's at another
    batch; without it, the residual layer's at another batch, then the conv's."""
    keys = {(s, n): task_key(replace(s, n=n), Precision.FP16, H100)
            for s in (SHAPE_R, SHAPE_R_RES) for n in (2, 8)}
    plain2 = {**rec(SHAPE_R, 1.5), "latency_us": 9.0}
    res8 = {"schedule": a_schedule(replace(SHAPE_R_RES, n=8)), "latency_us": 3.0}
    plain8 = {"schedule": a_schedule(replace(SHAPE_R, n=8)), "latency_us": 2.0}
    lp = run_block({keys[SHAPE_R, 2]: plain2, keys[SHAPE_R_RES, 8]: res8})
    assert lp.latency_us == 9.0
    lp = run_block({keys[SHAPE_R_RES, 8]: res8, keys[SHAPE_R, 8]: plain8})
    assert lp.schedule == res8["schedule"] and lp.schedule_source.endswith("tuned at batch 8")
    lp = run_block({keys[SHAPE_R, 8]: plain8})
    assert lp.schedule == plain8["schedule"] and lp.latency_us is None


def test_the_service_is_asked_for_the_layer_at_other_batches(
        service: tuple[TestClient, str]) -> None:
    app, db = service
    s8 = a_schedule(replace(SHAPE_B, n=8))
    _store(db, replace(SHAPE_B, n=8), s8, 4.0, 6.0)
    client = Client("http://testserver")
    client.http.close()
    client.http = app
    o, warned = run(client)
    p = by_name(o)["b"]
    assert p.schedule == s8 and p.schedule_source.endswith("tuned at batch 8")
    assert p.latency_us is None and "(a)" in warned[0] and "(b)" not in warned[0]
