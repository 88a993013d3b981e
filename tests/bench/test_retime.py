"""bench/retime.py on a CPU: network sums weighted by each model's count of a shape, none
where a layer has no time, and the tables."""

from __future__ import annotations

from bench.retime import network_rows, render


def _row(layer: str, prec: str, ours: float | None, base: float, uses: list) -> dict:
    return {"layer": layer, "shape": {"n": 8, "h": 14, "w": 14, "c": 64, "k": 64, "r": 1,
                                      "s": 1, "stride": [1, 1], "pad": [0, 0],
                                      "dilation": [1, 1]},
            "n": 8, "precision": prec, "uses": uses, "ours_us": ours, "cudnn_fp16_us": base,
            "status": "ok" if ours else "wrong", "source": "zoo.json: resnet50 a"}


def test_network_sums_weight_layers_by_count() -> None:
    rows = [_row("a", "int8", 2.0, 4.0, [["resnet50", 3], ["resnet18", 1]]),
            _row("b", "int8", 1.0, 1.0, [["resnet50", 1]]),
            _row("b", "fp16", None, 1.0, [["resnet50", 1]])]
    nets = {(r["model"], r["precision"]): r for r in network_rows(rows)}
    assert nets["resnet50", "int8"]["ours_us"] == 7.0
    assert nets["resnet50", "int8"]["cudnn_fp16_us"] == 13.0
    assert nets["resnet50", "int8"]["layers"] == 4
    assert nets["resnet18", "int8"]["ratio"] == 0.5
    assert nets["resnet50", "fp16"]["ratio"] is None  # a layer without a time


def test_render_lists_networks_then_layers() -> None:
    rows = [_row("a", "int8", 2.0, 4.0, [["resnet50", 1]])]
    text = render({"gpu": "g", "date": "d", "rows": rows, "networks": network_rows(rows)})
    assert "| resnet50 | 8 | int8 | 1 | 2.0 | 4.0 | 0.50x |" in text
    assert "| a | 14x14x64->64, 1x1/1 | 8 | int8 | 2.0 | 4.0 | 0.50x | zoo.json |" in text
    assert "1 layer measurements: geomean ours/cuDNN 0.50x" in text
