"""bench/model_e2e.py on a CPU: records from the layer-class and zoo benchmarks' files (the
schedules a whole-model run uses) and the table, with each row's launch mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import model_e2e
from kernels.spec import ConvShape, Precision, get_target, task_key

SHAPE = ConvShape(8, 56, 56, 64, 256, 1, 1)
OTHER = ConvShape(8, 28, 28, 128, 128, 3, 3, pad=(1, 1))
SCHED = {"BLK_ROW_WARPS": 2, "MMA": "wgmma"}


def _records(tmp_path: Path, docs: dict[str, dict], order: slice = slice(None)) -> dict:
    """`model_e2e records` over the named documents (written to tmp_path), in that order."""
    files = []
    for name, doc in docs.items():
        (tmp_path / name).write_text(json.dumps(doc))
        files.append(str(tmp_path / name))
    out = tmp_path / "records.json"
    assert model_e2e.main(["records", *files[order], "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_records_come_from_layer_classes_groups_and_checked_zoo_rows(tmp_path: Path) -> None:
    classes = {"target": "h100", "groups": [
        {"layer": "expand", "shape": SHAPE.to_dict(), "precision": "int8",
         "best_schedule": SCHED, "best_us": 5.0, "cudnn_fp16_us": 10.0},
        {"layer": "untuned", "shape": OTHER.to_dict(), "precision": "int8",
         "best_schedule": None, "best_us": None, "cudnn_fp16_us": 9.0}]}
    zoo = {"target": "h100", "rows": [
        {"model": "resnet50", "layer": "l2", "shape": OTHER.to_dict(), "precision": "fp16",
         "schedule": SCHED, "checked": True, "ours_us": 12.0, "cudnn_fp16_us": 9.0},
        {"model": "resnet50", "layer": "bad", "shape": SHAPE.to_dict(), "precision": "fp16",
         "schedule": SCHED, "checked": False, "ours_us": 1.0, "cudnn_fp16_us": 9.0}]}
    recs = _records(tmp_path, {"classes.json": classes, "zoo.json": zoo})
    h100 = get_target("h100")
    assert set(recs) == {task_key(SHAPE, Precision.INT8, h100),
                         task_key(OTHER, Precision.FP16, h100)}
    r = recs[task_key(OTHER, Precision.FP16, h100)]
    assert r["schedule"] == SCHED and r["speedup"] == 9.0 / 12.0
    assert r["source"] == "zoo.json: resnet50 l2"
    assert recs[task_key(SHAPE, Precision.INT8, h100)]["speedup"] == 2.0


def test_records_improve_on_a_base_only_where_faster(tmp_path: Path) -> None:
    h100 = get_target("h100")
    fast, slow = {**SCHED, "STAGES": 4}, {**SCHED, "STAGES": 8}
    base = _records(tmp_path, {"zoo.json": {"target": "h100", "rows": [
        {"model": "m", "layer": "a", "shape": SHAPE.to_dict(), "precision": "fp16",
         "schedule": SCHED, "status": "ok", "ours_us": 5.0, "cudnn_fp16_us": 9.0},
        {"model": "m", "layer": "b", "shape": OTHER.to_dict(), "precision": "fp16",
         "schedule": SCHED, "status": "ok", "ours_us": 5.0, "cudnn_fp16_us": 9.0}]}})
    (tmp_path / "base.json").write_text(json.dumps(base))
    new = {"target": "h100", "rows": [
        {"model": "m", "layer": "a", "shape": SHAPE.to_dict(), "precision": "fp16",
         "schedule": fast, "status": "ok", "ours_us": 4.0, "cudnn_fp16_us": 9.0},
        {"model": "m", "layer": "b", "shape": OTHER.to_dict(), "precision": "fp16",
         "schedule": slow, "status": "ok", "ours_us": 6.0, "cudnn_fp16_us": 9.0}]}
    (tmp_path / "new.json").write_text(json.dumps(new))
    out = tmp_path / "r.json"
    assert model_e2e.main(["records", "--base", str(tmp_path / "base.json"),
                           str(tmp_path / "new.json"), "--out", str(out)]) == 0
    recs = json.loads(out.read_text())
    assert recs[task_key(SHAPE, Precision.FP16, h100)]["schedule"] == fast
    assert recs[task_key(OTHER, Precision.FP16, h100)] == \
        base[task_key(OTHER, Precision.FP16, h100)]


def test_a_margin_keeps_records_that_a_schedule_beats_by_less(tmp_path: Path) -> None:
    """--margin 0.03: 2% faster (run-to-run noise) keeps the record, 5% faster replaces it."""
    h100 = get_target("h100")
    near, far = {**SCHED, "STAGES": 4}, {**SCHED, "STAGES": 8}
    rows = [{"model": "m", "layer": "a", "shape": SHAPE.to_dict(), "precision": "fp16",
             "schedule": SCHED, "status": "ok", "ours_us": 10.0, "cudnn_fp16_us": 9.0},
            {"model": "m", "layer": "b", "shape": OTHER.to_dict(), "precision": "fp16",
             "schedule": SCHED, "status": "ok", "ours_us": 10.0, "cudnn_fp16_us": 9.0}]
    (tmp_path / "base.json").write_text(json.dumps(_records(tmp_path, {"zoo.json": {
        "target": "h100", "rows": rows}})))
    new = {"target": "h100", "rows": [{**rows[0], "schedule": near, "ours_us": 9.8},
                                      {**rows[1], "schedule": far, "ours_us": 9.5}]}
    (tmp_path / "new.json").write_text(json.dumps(new))
    out = tmp_path / "r.json"
    for margin, want in (("0.03", (SCHED, far)), ("0", (near, far))):
        assert model_e2e.main(["records", "--base", str(tmp_path / "base.json"),
                               str(tmp_path / "new.json"), "--margin", margin,
                               "--out", str(out)]) == 0
        recs = json.loads(out.read_text())
        assert (recs[task_key(SHAPE, Precision.FP16, h100)]["schedule"],
                recs[task_key(OTHER, Precision.FP16, h100)]["schedule"]) == want


def test_table_shows_how_each_row_ran(tmp_path: Path) -> None:
    row = {"model": "resnet50", "n": 8, "precision": "int8", "replaced": 53, "convs": 53,
           "tuned": 50, "ours_ms": 0.4, "eager_fp16_ms": 1.2, "compiled_fp16_ms": 0.6,
           "rel_err": 0.02, "cosine": 0.9998}
    doc = {"gpu": "g", "date": "d", "torch": "t", "cudnn": 1, "schedules": "R",
           "rows": [{**row, "pdl": True}, {**row, "pdl": False, "ours_ms": 0.5}, row,
                    {**row, "pdl": True, "compiled": True, "ours_ms": 0.3},
                    {**row, "pdl": True, "compiled": True, "kernel_head": True}]}
    (tmp_path / "e2e.json").write_text(json.dumps(doc))
    lines = model_e2e.render(str(tmp_path / "e2e.json")).splitlines()
    body = [ln for ln in lines if ln.startswith("| resnet50")]
    assert [ln.split(" | ")[3] for ln in body] == ["PDL", "plain", "-", "compiled, PDL",
                                                   "compiled, PDL, kernel head"]
    assert "| 1.50x |" in body[0] and "| 1.20x |" in body[1] and "| 2.00x |" in body[3]


def test_records_keep_the_fastest_over_zoo_and_layer_search(tmp_path: Path) -> None:
    faster = {"BLK_ROW_WARPS": 1, "MMA": "wgmma"}
    zoo = {"target": "h100", "rows": [
        {"model": "resnet50", "layer": "l2", "shape": OTHER.to_dict(), "precision": "fp16",
         "schedule": SCHED, "checked": True, "ours_us": 12.0, "cudnn_fp16_us": 9.0}]}
    # The long search's run timed cuDNN faster: latencies decide, not the ratios.
    search = {"target": "h100", "rows": [
        {"key": "k", "layers": ["resnet50 l2"], "shape": OTHER.to_dict(), "precision": "fp16",
         "best_schedule": faster, "best_us": 11.5, "cudnn_fp16_us": 8.0,
         "trials": [{}] * 500},
        {"key": "k2", "layers": ["resnet50 l1"], "shape": SHAPE.to_dict(), "precision": "fp16",
         "best_schedule": faster, "best_us": 20.0, "cudnn_fp16_us": 10.0,
         "trials": [{}] * 64}]}
    for order in (slice(None), slice(None, None, -1)):
        recs = _records(tmp_path, {"zoo.json": zoo, "search.json": search}, order)
        h100 = get_target("h100")
        r = recs[task_key(OTHER, Precision.FP16, h100)]
        assert r["schedule"] == faster and r["source"] == "search.json: resnet50 l2, 500 trials"
        assert recs[task_key(SHAPE, Precision.FP16, h100)]["speedup"] == 0.5


def test_records_take_a_retime_of_changed_kernels(tmp_path: Path) -> None:
    """bench/retime.py's rows: a recorded schedule measured again on changed kernels beats its
    own older record; a row that failed its check is no record."""
    zoo = {"target": "h100", "rows": [
        {"model": "resnet50", "layer": "l1", "shape": SHAPE.to_dict(), "precision": "int8",
         "schedule": SCHED, "checked": True, "ours_us": 9.0, "cudnn_fp16_us": 8.0}]}
    retime = {"rows": [
        {"layer": "l1", "shape": SHAPE.to_dict(), "precision": "int8", "uses": [["resnet50", 4]],
         "schedule": SCHED, "status": "ok", "ours_us": 7.5, "cudnn_fp16_us": 8.0},
        {"layer": "l2", "shape": OTHER.to_dict(), "precision": "int8", "uses": [["resnet50", 1]],
         "schedule": SCHED, "status": "wrong", "ours_us": None, "cudnn_fp16_us": 9.0}]}
    recs = _records(tmp_path, {"zoo.json": zoo, "retime.json": retime})
    h100 = get_target("h100")
    assert set(recs) == {task_key(SHAPE, Precision.INT8, h100)}
    r = recs[task_key(SHAPE, Precision.INT8, h100)]
    assert r["latency_us"] == 7.5 and r["source"] == "retime.json: resnet50 l1"


def test_records_of_a_retime_on_another_gpu_are_that_gpus(tmp_path: Path) -> None:
    """A retime run names its target (bench/retime.py): an H200's times make H200 records, and
    do not compete with the H100's."""
    row = {"layer": "l1", "shape": SHAPE.to_dict(), "precision": "int8",
           "uses": [["resnet50", 4]], "schedule": SCHED, "status": "ok", "ours_us": 7.5,
           "cudnn_fp16_us": 8.0}
    h100 = {"target": "h100", "rows": [{**row, "ours_us": 9.0}]}
    h200 = {"gpu": "NVIDIA H200", "target": "h200", "rows": [row]}
    recs = _records(tmp_path, {"a.json": h100, "b.json": h200})
    assert recs[task_key(SHAPE, Precision.INT8, get_target("h200"))]["latency_us"] == 7.5
    assert recs[task_key(SHAPE, Precision.INT8, get_target("h100"))]["latency_us"] == 9.0


def test_the_critical_path_is_each_kernels_end_after_the_one_before() -> None:
    """`profile --per-kernel`: per kernel of a forward, what it adds end to end (with PDL it
    starts before the one before it ends) and its own duration, medians over forwards; the
    conv kernels named by the model's fused layers in order."""
    def forward(t0: float, a_dur: float) -> list[dict]:
        # quantize 0-2, conv A 1-(1+a_dur) (started early: PDL), conv B after A by 3
        return [{"cat": "kernel", "name": "tc_quantize", "ts": t0, "dur": 2.0},
                {"cat": "kernel", "name": "tc_conv", "ts": t0 + 1, "dur": a_dur},
                {"cat": "cpu_op", "name": "aten::empty", "ts": t0, "dur": 1.0},
                {"cat": "kernel", "name": "tc_conv", "ts": t0 + a_dur, "dur": 4.0}]
    trace = {"traceEvents": forward(100, 5.0) + forward(0, 5.0) + forward(200, 9.0)}
    path = model_e2e.critical_path(trace, 3)
    # A ends at 6 (medians), 4 after the quantize's end; B ends at 9, 3 after A's
    assert path == [("tc_quantize", 2.0, 2.0), ("tc_conv", 4.0, 5.0), ("tc_conv", 3.0, 4.0)]
    text = model_e2e.per_kernel_table(path, ["conv1", "layer1.0.conv1"])
    assert text.splitlines()[1:4] == ["     2.00     2.00  tc_quantize",
                                      "     4.00     5.00  conv1",
                                      "     3.00     4.00  layer1.0.conv1"]
    assert text.splitlines()[-1].strip().startswith("9.00")
    # names only where the counts agree
    assert "tc_conv" in model_e2e.per_kernel_table(path, ["conv1"])
    with pytest.raises(ValueError, match="whole number"):
        model_e2e.critical_path(trace, 2)
