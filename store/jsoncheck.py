"""JSON values every input path refuses, each reported with the field it sits in: NaN,
Infinity and numbers beyond the float range (Python's parser accepts them; nothing
downstream can store or serialise them), NUL bytes (PostgreSQL text cannot hold them) and
nesting deeper than MAX_JSON_DEPTH (no input of the service nests deeper than 4 levels; a
deeper one costs recursion). Used by the API's JSON bodies and by the import of JSON lines."""

from __future__ import annotations

import json
import math
from typing import Any

Loc = tuple[str | int, ...]

# No request of the API nests deeper than a few levels (an import line: 4).
MAX_JSON_DEPTH = 32
NUL_MSG = "contains a NUL byte (\\x00), which no field accepts"


def json_problems(value: Any, loc: Loc = ("body",), depth: int = 0) -> list[tuple[Loc, str]]:
    """Every NUL byte, non-finite number and too-deep value in a parsed JSON document."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return [(loc, "is not a finite number (NaN, Infinity or out of the float range)")]
        return []
    if isinstance(value, str):
        return [(loc, NUL_MSG)] if "\x00" in value else []
    if not isinstance(value, dict | list):
        return []
    if depth >= MAX_JSON_DEPTH:
        return [(loc, f"nests deeper than {MAX_JSON_DEPTH} levels")]
    found: list[tuple[Loc, str]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            found.append((loc, "has a key with a NUL byte (\\x00)"))
            continue
        # (a key as long as the body would make the answer as long)
        name = key[:64] if isinstance(key, str) else key
        found.extend(json_problems(item, (*loc, name), depth + 1))
        if len(found) >= 20:  # enough to fix the request; bounds the answer's size
            break
    return found


def parse_json(text: str | bytes, loc: Loc = ("body",)) -> tuple[Any, list[tuple[Loc, str]]]:
    """Parse JSON and check it. A syntax error raises ValueError (json's own message);
    nesting beyond the parser's recursion limit is a problem, never a RecursionError."""
    try:
        value = json.loads(text)
    except RecursionError:
        return None, [(loc, f"nests deeper than {MAX_JSON_DEPTH} levels")]
    return value, json_problems(value, loc)
