"""The runtime's recorded default schedules are data: kernels/runtime_defaults.json."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

from kernels.runtime import DEFAULTS_FILE, RECORDED_BESTS, WGMMA_BESTS
from kernels.space import ScheduleSpace
from kernels.spec import RESNET50_3X3, Precision, get_target


def test_recorded_bests_are_package_data_and_valid_schedules() -> None:
    """The defaults' starting points live in kernels/runtime_defaults.json, which a wheel
    must carry: every recorded best names each knob of its path with an allowed value."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml")
                              .read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["kernels"]
    assert any(fnmatch(DEFAULTS_FILE.name, pat) for pat in patterns)
    for path, bests in (("mma.sync", RECORDED_BESTS), ("wgmma", WGMMA_BESTS)):
        assert set(bests) == {"int8", "fp16"}
        for precision, rows in bests.items():
            assert [name for name, _, _ in rows] == ["stage2", "stage3", "stage4", "stage5"]
            for name, shape, sched in rows:
                assert shape == RESNET50_3X3[name]
                assert sched.get("MMA", "sync") == ("wgmma" if path == "wgmma" else "sync")
                space = ScheduleSpace(shape, Precision(precision), get_target("h100"))
                assert set(sched) <= set(space.knobs), (path, precision, name)
                assert all(sched[k] in space.knobs[k] for k in sched), (path, precision, name)

