"""bench/zoo.py on the CPU: the committed shapes file (well-formed, the networks' known conv
counts, and bench/nets.py's ResNet-50 and U-Net traced again to the same entries), the plan
(shared shapes measured once), the candidates of the short search, network sums, the
markdown table and its goals, and the resumable run with a fake measurement backend."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bench import zoo
from bench.nets import Bottleneck, DenseNet, ResNet, UNet
from kernels.space import ScheduleSpace, schedule_hash, with_defaults
from kernels.spec import ConvShape, Precision, get_target

SHAPES = zoo.load_shapes()
H100 = get_target("h100")


def geoms(model: str) -> set[tuple[Any, ...]]:
    return {zoo.geometry_key(e["shape"]) for e in SHAPES["models"][model]["shapes"]}


# ---- the shapes file ---------------------------------------------------------------------
def test_shapes_file_is_well_formed() -> None:
    assert SHAPES["torchvision"] and isinstance(SHAPES["torchvision"], str)
    assert list(SHAPES["models"]) == list(zoo.MODELS)
    for name, m in SHAPES["models"].items():
        hw = 256 if name == "unet" else 224
        assert m["input"] == [3, hw, hw]
        assert m["convs"] == sum(e["count"] for e in m["shapes"])
        assert m["distinct"] == len(m["shapes"]) == len(geoms(name))
        names = [n for e in m["shapes"] for n in e["layers"]]
        assert len(names) == len(set(names)) == m["convs"], name
        for e in m["shapes"]:
            g = e["shape"]
            assert set(g) == {"c", "k", "h", "w", "r", "s", "stride", "pad", "dilation"}
            assert e["count"] == len(e["layers"]) >= 1
            shape = zoo.with_batch(g, 8)
            assert shape.problems(Precision.INT8) == [], (name, g)
            assert shape.p >= 1 and shape.q >= 1


def test_shapes_known_facts() -> None:
    m = SHAPES["models"]
    assert (m["resnet50"]["convs"], m["resnet50"]["distinct"]) == (53, 23)
    stems = [e for e in m["resnet50"]["shapes"] if e["shape"]["c"] == 3]
    assert len(stems) == 1 and stems[0]["count"] == 1 and stems[0]["layers"] == ["conv1"]
    assert (stems[0]["shape"]["r"], stems[0]["shape"]["stride"]) == (7, [2, 2])
    assert m["resnet18"]["convs"] == 20
    # DenseNet-121: stem, two convs in each of 6+12+24+16 dense layers, three transitions.
    assert m["densenet121"]["convs"] == 1 + 2 * (6 + 12 + 24 + 16) + 3 == 120
    # MobileNetV2: 17 depthwise 3x3 left out; stem, 16 expansions, 17 projections, last 1x1.
    assert m["mobilenet_v2"]["excluded"] == {"grouped (groups > 1)": 17}
    assert m["mobilenet_v2"]["convs"] == 1 + 16 + 17 + 1
    # EfficientNet-B0: 16 MBConv blocks, each with a depthwise conv (left out) and two
    # squeeze-excitation 1x1 convs on a 1x1 input (kept).
    eff = m["efficientnet_b0"]
    assert eff["excluded"] == {"grouped (groups > 1)": 16}
    se = [e for e in eff["shapes"] if (e["shape"]["h"], e["shape"]["w"]) == (1, 1)]
    assert sum(e["count"] for e in se) == 32
    assert all(n.endswith((".fc1", ".fc2")) for e in se for n in e["layers"])
    assert eff["convs"] == 1 + 15 + 16 + 32 + 1
    # U-Net: 5 double convs down, 4 up, a 1x1 head; 4 transposed convs left out. The up
    # path's second convs repeat the down path's (same channels and size): 15 distinct.
    u = m["unet"]
    assert (u["convs"], u["distinct"], u["excluded"]) == (19, 15, {"ConvTranspose2d": 4})
    assert [e["shape"]["k"] for e in u["shapes"] if e["shape"]["r"] == 1] == [2]
    assert {e["shape"]["c"] for e in u["shapes"]} >= {3, 64, 128, 256, 512, 1024}


@pytest.mark.parametrize("model", ["resnet50", "densenet121", "unet"])
def test_shapes_match_a_trace_of_bench_nets(model: str) -> None:
    """bench/nets.py's ResNet-50 and DenseNet-121 mirror torchvision's module names: tracing
    them gives the file's (torchvision-traced) entries exactly; the U-Net is bench/nets.py's
    own."""
    with torch.device("meta"):
        net = {"unet": UNet, "densenet121": DenseNet,
               "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3])}[model]().eval()
    got = zoo.conv_shapes(net, 256 if model == "unet" else 224)
    want = SHAPES["models"][model]
    assert got["shapes"] == want["shapes"]
    assert (got["convs"], got["excluded"]) == (want["convs"], want["excluded"])


def test_dump_shapes_round_trips() -> None:
    assert json.loads(zoo.dump_shapes(SHAPES)) == SHAPES


# ---- plan --------------------------------------------------------------------------------
def test_plan_measures_shared_shapes_once() -> None:
    groups = zoo.plan(SHAPES, zoo.MODELS, None, ["int8", "fp16"])
    distinct8 = set().union(*(geoms(m) for m in zoo.MODELS))
    assert len(distinct8) == 153
    assert len(groups) == 2 * (len(distinct8) + 2 * len(geoms("resnet50")))
    assert len({g.key for g in groups}) == len(groups)
    # batch 8 first, then ResNet-50 at 1 and 32
    ns = [g.shape.n for g in groups]
    assert ns == sorted(ns, key=lambda n: (n != 8, n))
    stem = next(g for g in groups if g.shape.c == 3 and g.shape.r == 7 and g.shape.n == 8)
    assert sorted(u.model for u in stem.uses) == ["densenet121", "resnet18", "resnet50"]
    assert {u.model for g in groups if g.shape.n != 8 for u in g.uses} == {"resnet50"}
    one = zoo.plan(SHAPES, ["resnet18"], [8], ["fp16"])
    assert [g.shape.n for g in one] == [8] * 11 and {g.precision for g in one} == {"fp16"}


# ---- candidates --------------------------------------------------------------------------
def space_of(model: str, i: int, prec: str = "int8", n: int = 8) -> ScheduleSpace:
    shape = zoo.with_batch(SHAPES["models"][model]["shapes"][i]["shape"], n)
    return ScheduleSpace(shape, Precision(prec), H100)


def test_start_candidates_transfer_default_random() -> None:
    from kernels.runtime import default_schedule

    space = space_of("resnet50", 3)  # 1x1 64->256 at 56x56
    other = space_of("resnet50", 2)  # 3x3 64->64: a valid schedule there, for transfer
    rng = np.random.default_rng(0)
    donors = zoo.random_candidates(other, 12, rng)
    donors = [s for s in donors if space.is_valid(s)][:5]
    assert len(donors) == 5
    invalid = {**donors[0], "STAGES": 8, "MMA": "sync"}  # mma.sync stops at 3 stages
    assert not space.is_valid(invalid)
    default = default_schedule(space.shape, space.precision, H100)[0]
    out = zoo.start_candidates(space, [invalid, *donors], default, rng, size=10,
                               transfer_max=3)
    origins = [o for o, _ in out]
    assert len(out) == 10
    assert origins[:3] == ["transfer"] * 3 and origins[3] == "default"
    assert [s for _, s in out[:3]] == [with_defaults(space.precision, s) for s in donors[:3]]
    assert all(space.is_valid(s) for _, s in out)
    assert len({schedule_hash(s) for _, s in out}) == 10
    assert {s["MMA"] for o, s in out if o == "random"} == {"sync", "wgmma"}


def test_random_candidates_fold_the_stem() -> None:
    space = space_of("resnet50", 0, "fp16")
    out = zoo.random_candidates(space, 12, np.random.default_rng(3))
    assert len(out) == 12 and all(space.is_valid(s) for s in out)
    assert 0 < sum(s["FOLD_TAPS"] for s in out) < 12  # both halves of the sample
    assert not any(s["FOLD_TAPS"] for s in
                   zoo.random_candidates(space_of("resnet50", 3), 8, np.random.default_rng(3)))


def test_local_candidates_one_knob_away_and_unseen() -> None:
    space = space_of("densenet121", 10, "fp16")
    base = zoo.random_candidates(space, 1, np.random.default_rng(1))[0]
    everything = zoo.local_candidates(space, base, set(), np.random.default_rng(2), 1000)
    assert len(everything) > 8
    seen = {schedule_hash(everything[0])}
    out = zoo.local_candidates(space, base, seen, np.random.default_rng(2), 8)
    assert len(out) == 8 and schedule_hash(everything[0]) not in {schedule_hash(s) for s in out}
    for s in out:
        assert space.is_valid(s) and sum(s[k] != base[k] for k in base) == 1


def test_transfer_order_nearest_shape_first() -> None:
    def sh(c: int, k: int, hw: int, r: int = 1) -> ConvShape:
        return ConvShape(8, hw, hw, c, k, r, r, pad=r // 2)

    me = sh(256, 64, 56)
    near, far, other_filter = sh(256, 128, 56), sh(2048, 512, 7), sh(256, 64, 56, 3)

    def e(shape: ConvShape, tag: int, us: float, prec: str = "int8") -> zoo.PoolEntry:
        return zoo.PoolEntry(shape, prec, {"tag": tag}, us)

    pool = [e(far, 1, 1.0), e(near, 2, 5.0), e(near, 3, 4.0), e(other_filter, 4, 1.0),
            e(near, 5, 9.0, "fp16"), e(me, 6, 1.0)]
    assert zoo.shape_distance(me, near) == 1.0
    assert zoo.shape_distance(me, other_filter) == pytest.approx(1.0 + math.log2(9))
    got = [s["tag"] for s in zoo.transfer_order(pool, me, "int8")]
    # each shape's best (nearest shape first), then the second bests; never fp16, never itself
    assert got == [3, 4, 1, 2]


def test_summarize_picks_the_fastest_checked() -> None:
    def r(tag: int, status: str, us: float | None) -> dict[str, Any]:
        return {"schedule": {"tag": tag}, "status": status, "median_us": us}

    rows = [r(1, "ok", 5.0), r(2, "wrong", 1.0), r(3, "ok", 3.0), r(4, "compile_error", None),
            r(5, "ok", 4.0), r(6, "ok", 7.0)]
    origin = {schedule_hash({"tag": 3}): "local", schedule_hash({"tag": 1}): "default"}
    s = zoo.summarize(rows, origin, {"tag": 1})
    assert (s["ours_us"], s["schedule"], s["best_from"], s["checked"]) == \
        (3.0, {"tag": 3}, "local", True)
    assert (s["default_us"], s["measured"], s["wrong"], s["failed"]) == (5.0, 6, 1, 1)
    assert [t["us"] for t in s["top"]] == [3.0, 4.0, 5.0]
    none = zoo.summarize([r(2, "wrong", 1.0)], {}, None)
    assert (none["ours_us"], none["checked"], none["schedule"], none["top"]) == \
        (None, False, None, [])


# ---- network sums, floors, the table -------------------------------------------------------
def row(model: str, c: int, count: int, prec: str, ours: float | None, cudnn: float | None,
        n: int = 8) -> dict[str, Any]:
    shape = ConvShape(n, 14, 14, c, 64, 1, 1)
    return {"model": model, "layer": f"l{c}", "layers": [f"l{c}"] * count,
            "shape": shape.to_dict(), "n": n, "precision": prec, "count": count,
            "ours_us": ours, "cudnn_fp16_us": cudnn, "cutlass_us": None}


def test_network_rows_weight_by_count() -> None:
    doc = {"models": {"m": {"shapes": [{}, {}, {}]}}}
    rows = [row("m", 64, 3, "int8", 2.0, 4.0), row("m", 128, 1, "int8", 5.0, 6.0),
            row("m", 256, 2, "int8", 1.5, 2.5),
            row("m", 64, 3, "fp16", 2.0, 4.0), row("m", 128, 1, "fp16", None, 6.0),
            row("m", 256, 2, "fp16", 1.0, 1.0), row("m", 64, 3, "fp16", 1.0, 1.0, n=32)]
    nets = {(x["n"], x["precision"]): x for x in zoo.network_rows(rows, doc)}
    i8 = nets[(8, "int8")]
    assert (i8["ours_us"], i8["cudnn_fp16_us"]) == (3 * 2.0 + 5.0 + 2 * 1.5, 3 * 4 + 6 + 2 * 2.5)
    assert (i8["convs"], i8["layers"], i8["complete"]) == (6, 3, True)
    assert i8["cutlass_us"] is None  # no layer has it
    f16 = nets[(8, "fp16")]
    assert f16["ours_us"] is None and f16["cudnn_fp16_us"] == 3 * 4 + 6 + 2
    part = nets[(32, "fp16")]  # one layer of three so far: no sum yet
    assert (part["complete"], part["ours_us"], part["cudnn_fp16_us"]) == (False, None, None)


def test_roofline_floor() -> None:
    se = ConvShape(8, 1, 1, 480, 20, 1, 1)  # a squeeze-excitation 1x1: memory bound
    nbytes = 8 * 480 + 20 * 480 + 8 * 20 + 2 * 4 * 20  # x, w, y as int8, scale and bias
    assert zoo.roofline_us(se, "int8", H100) == pytest.approx(nbytes / 3350e9 * 1e6)
    wide = ConvShape(8, 28, 28, 512, 512, 3, 3, pad=1)  # compute bound
    macs = 8 * 28 * 28 * 512 * 512 * 9
    assert zoo.roofline_us(wide, "fp16", H100) == pytest.approx(2 * macs / 989e12 * 1e6)
    assert zoo.roofline_us(wide, "int8", H100) == pytest.approx(2 * macs / 1979e12 * 1e6)


def table_doc() -> dict[str, Any]:
    rows = [row("resnet50", 64, 3, "int8", 0.5, 1.0), row("resnet50", 128, 1, "int8", 1.6, 2.0),
            row("resnet50", 64, 3, "fp16", 0.8, 1.0), row("resnet50", 128, 1, "fp16", 1.6, 2.0),
            row("unet", 64, 1, "int8", 0.5, 1.0)]
    rows[2]["cutlass_us"] = 0.9
    shapes = {"models": {"resnet50": {"shapes": [{}, {}]}, "unet": {"shapes": [{}]}}}
    return {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-01-01", "rows": rows,
            "networks": zoo.network_rows(rows, shapes)}


def test_table_renders_rows_sums_and_goals() -> None:
    doc = table_doc()
    md = zoo.render(doc)
    lines = md.splitlines()
    assert "### resnet50" in lines and "### unet" in lines
    # one row per layer, int8 and fp16 side by side, in the layers' order
    floors = [zoo.roofline_us(ConvShape.from_dict(doc["rows"][0]["shape"]), p, H100)
              for p in ("int8", "fp16")]
    assert (f"| l64 (+2) | 14x14x64->64, 1x1/1 | 8 | 3 | 0.50 | 0.80 | 1.00 | - / 0.90 | 0.50x | "
            f"0.80x | {floors[0]:.3g} / {floors[1]:.3g} |") in lines
    body = [x for x in lines if x.startswith(("| l64", "| l128"))]
    assert [x.split(" | ")[0] for x in body] == ["| l64 (+2)", "| l128", "| l64"]
    assert body[2].split(" | ")[4:6] == ["0.50", "-"]  # unet: int8 only
    # fp16: layers 0.8 and 0.8 <= 1.0, geomean 0.8 <= 0.85, summed (3*0.8+1.6)/(3+2) = 0.8
    fp16 = next(x for x in lines if x.startswith("| resnet50 | 8 | fp16 | 2 (4) |"))
    assert "| 4.00 | 5.00 | - | 0.80x | 0.80x |" in fp16
    assert "layers <= 1.00x: 2/2" in fp16 and "(all met)" in fp16
    assert "summed <= 0.85x: met" in fp16
    # int8: 0.5 and 0.8 (over 0.7); geomean sqrt(0.4) = 0.63 > 0.55; summed 3.1/5 = 0.62
    int8 = next(x for x in lines if x.startswith("| resnet50 | 8 | int8 | 2 (4) |"))
    assert "layers <= 0.70x: 1/2" in int8 and f"| {math.sqrt(0.4):.2f}x |" in int8
    assert "(not all met)" in int8 and "summed <= 0.50x: not met" in int8
    # int8 before fp16 in the sums, models in the rows' order
    nets = [x.split(" | ")[:3] for x in lines if x.startswith(("| resnet50 |", "| unet |"))]
    assert nets == [["| resnet50", "8", "int8"], ["| resnet50", "8", "fp16"],
                    ["| unet", "8", "int8"]]
    # the zoo: each distinct measurement once (unet's int8 shape is resnet50's l64)
    zoo_int8 = next(x for x in lines if x.startswith("| int8 | 2 |"))
    assert f"| {math.sqrt(0.4):.2f}x | 0.80x |" in zoo_int8


def test_layer_row_joins_the_precisions_of_one_layer() -> None:
    i8 = row("m", 64, 1, "int8", 0.5, 1.0)
    f16 = row("m", 64, 1, "fp16", None, 1.0)  # nothing ran
    i8["cutlass_us"] = 0.75
    other_batch = row("m", 64, 1, "int8", 2.0, 4.0, n=32)
    other_batch["shape"]["n"] = 32
    joined = zoo.layer_rows([other_batch, i8, f16])
    assert [sorted(x) for x in joined] == [["fp16", "int8"], ["int8"]]  # batch 8 first
    assert joined[0]["int8"] is i8 and joined[0]["fp16"] is f16
    cells = zoo.layer_line(joined[0], H100).split(" | ")
    assert cells[1:] == ["14x14x64->64, 1x1/1", "8", "1", "0.50", "-", "1.00", "0.75 / -",
                         "0.50x", "-", cells[-1]]
    assert cells[-1].count(" / ") == 1 and cells[-1].endswith(" |")
    # cuDNN timed apart by the two precisions' runs: both figures
    f16["cudnn_fp16_us"] = 1.2
    assert "| 1.00 / 1.20 |" in zoo.layer_line(joined[0], H100)
    assert zoo.layer_line({"fp16": f16}, H100).split(" | ")[4:7] == ["-", "-", "1.20"]


def test_table_out_writes_the_layers_and_prints_the_summary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data, out = tmp_path / "zoo.json", tmp_path / "ZOO.md"
    data.write_text(json.dumps(table_doc()))
    assert zoo.main(["table", str(data), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    written = out.read_text().splitlines()
    assert written[0] == zoo.ZOO_MD_TITLE and "### resnet50" in written
    assert any(x.startswith("| l64 (+2) |") for x in written)
    assert not any(x.startswith(("| l64", "### resnet50")) for x in printed)
    summary = [x for x in printed if x.startswith("| resnet50 | 8 |")]
    assert len(summary) == 2 and all(x in written for x in summary)
    assert zoo.main(["table", str(data)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == zoo.render(table_doc())


# ---- the resumable run ---------------------------------------------------------------------
class Killed(Exception):
    pass


class FakeBackend:
    """Times from the shape (so a resumed run must give the same rows), call logs, and an
    optional kill after a number of tune calls (a run stopped at its time limit)."""

    gpu = "NVIDIA H100 80GB HBM3"

    def __init__(self, kill_after: int | None = None) -> None:
        self.tuned: list[tuple[str, str]] = []
        self.tune_args: list[tuple[Any, ...]] = []
        self.cutlassed: list[tuple[str, str]] = []
        self.transfers: list[list[dict[str, Any]]] = []
        self.cudnn: list[str] = []
        self.prefetched: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.kill_after = kill_after

    def prefetch(self, shape: ConvShape, precision: str, transfer: Sequence[dict[str, Any]],
                 budget: int, transfer_max: int, seed: int) -> None:
        self.prefetched[(shape.key(), precision)] = (list(transfer), budget, transfer_max,
                                                     seed)

    def tune(self, shape: ConvShape, precision: str, transfer: Sequence[dict[str, Any]],
             budget: int, transfer_max: int, seed: int) -> dict[str, Any]:
        if self.kill_after is not None and len(self.tuned) >= self.kill_after:
            raise Killed
        self.tuned.append((shape.key(), precision))
        self.transfers.append(list(transfer))
        self.tune_args.append((list(transfer), budget, transfer_max, seed))
        us = shape.gemm_m * shape.gemm_n * shape.gemm_k / 1e9 + 1.0
        sched = {"tag": f"{shape.key()}|{precision}"}
        return {"ours_us": us, "checked": True, "schedule": sched, "best_from": "random",
                "default_us": 2 * us, "measured": budget, "wrong": 0, "failed": 0,
                "top": [{"schedule": sched, "us": us}]}

    def cudnn_fp16_us(self, shape: ConvShape) -> float | None:
        self.cudnn.append(shape.key())
        return shape.gemm_m * shape.gemm_n * shape.gemm_k / 5e8 + 2.0

    def cutlass(self, shape: ConvShape, precision: str) -> tuple[float | None, str | None]:
        self.cutlassed.append((shape.key(), precision))
        if shape.c == 3:
            return None, "fake: no kernel for C=3"
        return shape.gemm_m * shape.gemm_n * shape.gemm_k / 7e8 + 1.5, None

    def info(self) -> dict[str, Any]:
        return {"gpu": self.gpu}


def run(tmp: Path, backend: FakeBackend, models: Sequence[str], **kw: Any) -> int:
    out = tmp / "zoo.json"
    doc = json.loads(out.read_text()) if out.exists() else {"gpu": backend.gpu, "rows": []}
    groups = zoo.plan(SHAPES, models, kw.pop("batches", [8]), ["int8", "fp16"])
    return zoo.run_zoo(groups, doc, SHAPES, backend, out, budget=8, **kw)


def test_run_resumes_after_a_kill_and_skips_done_rows(tmp_path: Path) -> None:
    first = FakeBackend(kill_after=7)
    with pytest.raises(Killed):
        run(tmp_path, first, ["resnet18"])
    doc = json.loads((tmp_path / "zoo.json").read_text())  # complete JSON after the kill
    assert len(doc["rows"]) == 7 and len(first.tuned) == 7
    assert all(r["checked"] and r["cutlass_us"] is None and r["cutlass_note"] == zoo.NO_CUTLASS
               for r in doc["rows"])
    assert first.cutlassed == []  # not without use_cutlass
    # transfer: every later group of a precision got the earlier ones' bests
    int8_seen = [i for i, (_, p) in enumerate(first.tuned) if p == "int8"]
    assert first.transfers[int8_seen[0]] == []
    assert all(t["tag"].endswith("|int8") for t in first.transfers[int8_seen[1]])
    assert len(first.transfers[int8_seen[2]]) == 2

    second = FakeBackend()
    assert run(tmp_path, second, ["resnet18"]) == 0
    assert len(second.tuned) == 22 - 7
    # Each group but the first was prefetched (its builds overlap the group before) with the
    # arguments it was then tuned with: precisions alternate, so its transfer was final.
    assert second.tuned[0] not in second.prefetched
    for key, args in zip(second.tuned[1:], second.tune_args[1:], strict=True):
        assert second.prefetched[key] == args
    assert len({a[3] for a in second.tune_args}) == len(second.tuned)  # a seed per group
    assert not set(first.tuned) & set(second.tuned)
    assert len(set(first.cudnn + second.cudnn)) == len(first.cudnn + second.cudnn) == 11
    doc = json.loads((tmp_path / "zoo.json").read_text())
    assert len(doc["rows"]) == 22
    nets = {x["precision"]: x for x in doc["networks"]}
    assert nets["int8"]["complete"] and nets["int8"]["convs"] == 20
    want = sum(r["ours_us"] * r["count"] for r in doc["rows"] if r["precision"] == "int8")
    assert nets["int8"]["ours_us"] == pytest.approx(want)

    # Nothing left: no measurement at all.
    third = FakeBackend(kill_after=0)
    assert run(tmp_path, third, ["resnet18"]) == 0 and third.tuned == []

    # ResNet-50 after ResNet-18: the shapes they share are copied, not measured again.
    fourth = FakeBackend()
    assert run(tmp_path, fourth, ["resnet18", "resnet50"]) == 0
    shared = geoms("resnet18") & geoms("resnet50")
    assert len(shared) >= 2  # the stem and the stride-1 3x3s
    assert len(fourth.tuned) == 2 * (23 - len(shared))
    doc = json.loads((tmp_path / "zoo.json").read_text())
    r50 = [r for r in doc["rows"] if r["model"] == "resnet50"]
    assert len(r50) == 46 and sum(r["count"] for r in r50) == 2 * 53
    stem50 = next(r for r in r50 if r["layer"] == "conv1" and r["precision"] == "fp16")
    stem18 = next(r for r in doc["rows"] if r["model"] == "resnet18" and r["layer"] == "conv1"
                  and r["precision"] == "fp16")
    assert stem50["ours_us"] == stem18["ours_us"] and stem50["schedule"] == stem18["schedule"]


def test_run_stops_after_its_time_and_goes_on(tmp_path: Path) -> None:
    ticks = iter(range(0, 10_000, 10))  # every clock() call: 10 s later
    backend = FakeBackend()
    left = run(tmp_path, backend, ["unet"], stop_after_s=35, clock=lambda: next(ticks))
    assert 0 < left < 30 and len(backend.tuned) == 30 - left
    again = FakeBackend()
    assert run(tmp_path, again, ["unet"]) == 0 and len(again.tuned) == left


def test_run_with_cutlass_fills_in_rows_measured_without_it(tmp_path: Path) -> None:
    with pytest.raises(Killed):
        run(tmp_path, FakeBackend(kill_after=6), ["resnet18"])
    second = FakeBackend()
    assert run(tmp_path, second, ["resnet18"], use_cutlass=True) == 0
    # the 6 measured without CUTLASS get its time only; the 16 others are measured with it
    assert len(second.tuned) == 16 and len(second.cutlassed) == 22
    assert len(set(second.cutlassed)) == 22
    doc = json.loads((tmp_path / "zoo.json").read_text())
    assert all(r["cutlass_note"] != zoo.NO_CUTLASS for r in doc["rows"])
    stem = [r for r in doc["rows"] if r["shape"]["c"] == 3]
    assert [r["cutlass_us"] for r in stem] == [None, None]
    assert all(r["cutlass_note"].startswith("fake") for r in stem)
    others = [r for r in doc["rows"] if r["shape"]["c"] != 3]
    assert all(r["cutlass_us"] > 1.5 and r["cutlass_note"] is None for r in others)
    nets = {x["precision"]: x for x in doc["networks"]}
    assert nets["int8"]["cutlass_us"] is None  # the stem has none: no network sum
    third = FakeBackend(kill_after=0)
    assert run(tmp_path, third, ["resnet18"], use_cutlass=True) == 0
    assert third.cutlassed == []  # a note from CUTLASS itself is final


def test_run_command_copies_rows_without_a_gpu(tmp_path: Path) -> None:
    """When every measurement a model needs is in the file (here measured for ResNet-50),
    `run` only adds that model's rows: no backend is made (making one would import CuPy and
    start the runner)."""
    run(tmp_path, FakeBackend(), ["resnet18", "resnet50"])
    out = tmp_path / "zoo.json"
    doc = json.loads(out.read_text())
    shared = geoms("resnet18") & geoms("resnet50")
    doc["rows"] = [r for r in doc["rows"] if r["model"] != "resnet18"
                   or zoo.geometry_key(r["shape"]) not in shared]
    kept = len(doc["rows"])
    out.write_text(json.dumps(doc))
    rc = zoo.main(["run", "--out", str(out), "--models", "resnet18", "--batches", "8"])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == kept + 2 * len(shared)
    assert len([r for r in doc["rows"] if r["model"] == "resnet18"]) == 22
    assert doc["gpu"] == FakeBackend.gpu and doc["runs"][-1]["budget"] == zoo.DEFAULT_BUDGET


class FakeRunner:
    """kernels.runner.Runner's measure(): every build checks out, a time from its key."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def measure(self, cache: str, key: str, samples: int | None = None) -> dict[str, Any]:
        assert (Path(cache) / f"{key}.cubin").exists()  # built before it is measured
        self.keys.append(key)
        return {"status": "ok", "median_us": 1.0 + int(key[:6], 16) / 2**24, "iqr_us": 0.0}

    def close(self) -> None:
        pass


def test_gpu_backend_search_with_real_builds_and_a_fake_runner(tmp_path: Path) -> None:
    """GpuBackend's search on the CPU (NVRTC builds need no GPU): the start set prefetched,
    the same start set tuned (its builds found in the cache), then the local round."""
    from concurrent.futures import ProcessPoolExecutor

    b = object.__new__(zoo.GpuBackend)  # without __init__: no CuPy, no runner child
    b.cache, b.target, b.sm = str(tmp_path), H100, 90
    b.runner, b._prefetched = FakeRunner(), {}
    b._pool = ProcessPoolExecutor(max_workers=2)
    shape, prec = ConvShape(8, 14, 14, 256, 256, 1, 1), "int8"
    try:
        b.prefetch(shape, prec, [], 6, 1, seed=5)
        futures = b._prefetched[zoo.measure_key(shape, prec)]
        prebuilt = [f.result().key for f in futures]
        assert len(prebuilt) == 3 and all(f.result().status == "ok" for f in futures)
        res = b.tune(shape, prec, [], 6, 1, seed=5)
    finally:
        b.close()
    assert b.runner.keys[:3] == prebuilt  # the start set is the prefetched one
    assert len(b.runner.keys) == res["measured"] == 6 and res["checked"]
    times = [1.0 + int(k[:6], 16) / 2**24 for k in b.runner.keys]
    assert res["ours_us"] == round(min(times), 4)
    assert res["best_from"] in ("default", "random", "local")
    space = ScheduleSpace(shape, Precision(prec), H100)
    assert all(space.is_valid(t["schedule"]) for t in res["top"])
