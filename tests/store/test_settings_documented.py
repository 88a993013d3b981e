"""One configuration: every setting a service process reads is a field of the settings object,
and the README's table lists each field (and nothing that is not one, but for the CLI's and
the runtime's own variables)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from store.settings import Settings, get_settings, set_for_processes

ROOT = Path(__file__).resolve().parents[2]
# Read outside the service's settings: the CLI's client options and the runtime's cache.
OUTSIDE = {"TCTUNE_SERVER", "TCTUNE_TOKEN", "TCTUNE_KERNEL_CACHE"}


def _readme_table() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Configuration"):]
    section = section[:section.index("\n## ", 1)]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `TCTUNE_"):
            names |= set(re.findall(r"`(TCTUNE_[A-Z0-9_]+)`", line.split("|")[1]))
    return names


def test_the_readme_lists_every_field_and_only_fields() -> None:
    fields = {f"TCTUNE_{name.upper()}" for name in Settings.model_fields}
    listed = _readme_table()
    assert fields - listed == set(), "settings missing from the README's table"
    assert listed - fields == OUTSIDE


def test_the_service_reads_no_tctune_variable_besides_its_settings() -> None:
    fields = {f"TCTUNE_{name.upper()}" for name in Settings.model_fields}
    for package in ("api", "workers", "store", "search", "deploy"):
        for path in (ROOT / package).rglob("*.py"):
            for name in re.findall(r"TCTUNE_[A-Z0-9_]+", path.read_text()):
                assert name in fields | OUTSIDE, f"{path.relative_to(ROOT)} reads {name}"


def test_set_for_processes_reaches_this_process_and_its_children(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TCTUNE_WORKER_NAME", raising=False)
    monkeypatch.delenv("TCTUNE_WORKER_SLOTS", raising=False)
    get_settings.cache_clear()
    assert get_settings().worker_name == ""  # cached before the change
    try:
        set_for_processes(worker_name="node/gpu3", worker_slots=4)
        assert os.environ["TCTUNE_WORKER_SLOTS"] == "4"  # what started processes read
        assert get_settings().worker_name == "node/gpu3" and get_settings().worker_slots == 4
        with pytest.raises(KeyError, match="no_such_setting"):
            set_for_processes(no_such_setting=1)
    finally:
        monkeypatch.delenv("TCTUNE_WORKER_NAME", raising=False)
        monkeypatch.delenv("TCTUNE_WORKER_SLOTS", raising=False)
        get_settings.cache_clear()


@pytest.mark.parametrize(("cores", "want"), [(None, 2), (1, 2), (2, 2), (6, 3), (16, 8),
                                             (64, 8)])
def test_build_processes_default_to_half_the_cores_from_2_to_8(
        monkeypatch: pytest.MonkeyPatch, cores: int | None, want: int) -> None:
    monkeypatch.delenv("TCTUNE_BUILD_PROCESSES", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert Settings().build_processes == want
    monkeypatch.setenv("TCTUNE_BUILD_PROCESSES", "5")
    assert Settings().build_processes == 5  # the variable still decides
