"""Every mutant of bench/mutation_check.py still finds the code it breaks: a refactor that
moves a guarded line must move its mutant too, or the mutation check stops checking it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mutation_check import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutants_edit_applies_once(mutant: Mutant) -> None:
    for path, old, _new in mutant.edits:
        assert (ROOT / path).read_text().count(old) == 1, f"{mutant.name}: {path}"
