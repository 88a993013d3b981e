"""bench/gpu/floor_probe.py on a CPU: its copy kernel compiles, and its summary counts the
layers whose 0.55x of cuDNN's time is below the int8 copy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bench.gpu import floor_probe


def test_summary_counts_layers_below_their_copy() -> None:
    rows = [{"cudnn_fp16_us": 4.0, "copy_int8_us": 2.4, "copy_fp16_us": 2.6},   # 0.60: below
            {"cudnn_fp16_us": 4.0, "copy_int8_us": 2.0, "copy_fp16_us": 2.2},   # 0.50
            {"cudnn_fp16_us": 40.0, "copy_int8_us": 4.0, "copy_fp16_us": 8.0}]  # 0.10
    s = floor_probe.summary({"empty_kernel_us": 0.6, "rows": rows})
    assert s["shapes"] == 3 and s["int8_goal_below_copy"] == 1
    assert s["int8_goal_below_copy_under_5us"] == 1
    assert s["copy_int8_over_cudnn_geomean"] == round((0.6 * 0.5 * 0.1) ** (1 / 3), 3)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_copy_kernel_compiles(tmp_path: Path) -> None:
    src = tmp_path / "copy.cu"
    src.write_text(floor_probe._COPY)
    subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-o", str(tmp_path / "copy.cubin"),
                    str(src)], check=True, capture_output=True)
