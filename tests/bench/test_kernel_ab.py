"""bench/kernel_ab.py: builds from another kernel tree, and its table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import kernel_ab

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "bench" / "data" / "model_e2e_records_h100.json"
LAYERS = ["--records", str(RECORDS), "--models", "resnet18", "--precisions", "int8"]


def _builds(cache: Path, label: str) -> dict:
    return json.loads((cache / f"ab_{label}.json").read_text())


@pytest.mark.slow
def test_build_uses_the_sources_tree(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "kernels", tree / "kernels",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    argv = ["build", "--cache", str(cache), *LAYERS]
    assert kernel_ab.main([*argv, "--label", "here"]) == 0
    assert kernel_ab.main([*argv, "--label", "copy", "--sources", str(tree)]) == 0
    here, copy = _builds(cache, "here"), _builds(cache, "copy")
    assert copy["sources"] == str(tree / "kernels")
    assert here["sources"] == str(ROOT / "kernels")
    assert here["builds"] and all(b["status"] == "ok" for b in here["builds"].values())
    # The same sources build the same kernels; a changed tree builds others.
    assert {k: b["key"] for k, b in copy["builds"].items()} == \
        {k: b["key"] for k, b in here["builds"].items()}
    with (tree / "kernels" / "conv.cu").open("a") as f:
        f.write("\n// another version\n")
    assert kernel_ab.main([*argv, "--label", "changed", "--sources", str(tree)]) == 0
    changed = _builds(cache, "changed")
    assert changed["builds"].keys() == here["builds"].keys()
    assert all(changed["builds"][k]["key"] != b["key"] for k, b in here["builds"].items())


def test_table_compares_each_label_with_the_first() -> None:
    def row(r: int, base: float, new: float) -> dict:
        return {"layer": f"l{r}{base}", "precision": "int8",
                "shape": {"r": r, "s": r}, "us": {"base": base, "new": new},
                "status": {"base": "ok", "new": "ok"}}

    doc = {"gpu": "G", "date": "D", "labels": ["base", "new"],
           "rows": [row(1, 10.0, 9.0), row(1, 10.0, 10.0), row(3, 20.0, 22.0)]}
    text = kernel_ab.render(doc)
    assert "| int8 | 1x1 | 2 | 0.949 (0.900, 1.000) |" in text
    assert "| int8 | others | 1 | 1.100 (1.100, 1.100) |" in text
    assert "3 layers, 0 with a build not ok" in text
