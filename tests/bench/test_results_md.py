"""bench/RESULTS.md and docs/decisions.md cite data that exists, and bench/ZOO.md is what
`python -m bench.zoo table bench/data/zoo_h100.json --out bench/ZOO.md` writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import zoo

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data"
DOCS = [ROOT / "bench" / "RESULTS.md", ROOT / "docs" / "decisions.md"]
DATA_FILE = r"[\w.*{},/-]+\.(?:jsonl\.gz|json\.gz|jsonl|json|png|txt)"


def expand(pattern: str) -> list[str]:
    """`a_{x,y}.json` -> a_x.json, a_y.json (one brace group)."""
    m = re.search(r"\{([^}]*)\}", pattern)
    if not m:
        return [pattern]
    return [pattern[:m.start()] + alt + pattern[m.end():] for alt in m.group(1).split(",")]


def cited(text: str) -> set[str]:
    """Paths under bench/data/ anywhere, and data files named alone in backticks (a path from
    the repository's root where one exists there, else under bench/data/)."""
    paths = set(re.findall(r"bench/data/" + DATA_FILE, text))
    paths |= {n if (ROOT / n).exists() else f"bench/data/{n}"
              for n in re.findall(r"`(" + DATA_FILE + r")`", text)
              if not n.startswith("bench/data/")}
    return paths


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_data_file_exists(doc: Path) -> None:
    text = doc.read_text()
    paths = cited(text)
    assert paths
    missing = []
    for p in sorted(paths):
        for q in expand(p):
            if not q.startswith("bench/data/"):
                continue  # found at the root by cited()
            rel = q.removeprefix("bench/data/")
            if not (list(DATA.glob(rel)) or list(DATA.glob("**/" + rel))):
                missing.append(q)
    assert missing == []


def test_results_links_exist() -> None:
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert "ZOO.md" in links
    assert [x for x in links if not (ROOT / "bench" / x).exists()] == []


def test_zoo_md_is_generated_from_the_data() -> None:
    doc = json.loads((DATA / "zoo_h100.json").read_text())
    assert (ROOT / "bench" / "ZOO.md").read_text() == \
        zoo.render_zoo_md(doc, "bench/data/zoo_h100.json")
