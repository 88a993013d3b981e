"""What the benchmark scripts share on the command line."""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def log(*a: Any) -> None:
    """A progress line stamped with the time of day, on stderr (stdout keeps the results)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def read_json(path: str | Path) -> Any:
    """A recorded result, plain or gzip-compressed (large raw files are kept as .json.gz)."""
    p = Path(path)
    with (gzip.open(p, "rt") if p.suffix == ".gz" else p.open()) as f:
        return json.load(f)


def records_on(path: str | Path, target: str, measured_on: str | None = None) -> dict[str, Any]:
    """A records file (`bench.model_e2e records`: task key -> record) for `target`. With
    `measured_on` another GPU model, that GPU's records keyed as `target`'s: its schedules
    become the records timed on this one."""
    records: dict[str, Any] = json.loads(Path(path).read_text())
    if not measured_on or measured_on == target:
        return records
    return {k.removesuffix(f"|{measured_on}") + f"|{target}": v for k, v in records.items()
            if k.endswith(f"|{measured_on}")}


def add_records_target(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records-target", default=None,
                   help="the GPU model the records were measured on, if not the target's "
                        "(its schedules are then the records timed on the target)")


def geomean(xs: Iterable[float]) -> float | None:
    """The geometric mean of positive values; None for none."""
    v = list(xs)
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None


def commands(prog: str, doc: str | None) -> tuple[argparse.ArgumentParser, Any]:
    """A benchmark's parser with subcommands, its module docstring as the help."""
    ap = argparse.ArgumentParser(prog=prog, description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    return ap, ap.add_subparsers(dest="cmd", required=True)


def add_table(sub: Any, help_text: str = "the Markdown tables of a run") -> None:
    sub.add_parser("table", help=help_text).add_argument("file")


def print_table(a: argparse.Namespace, render: Callable[[dict[str, Any]], str]) -> bool:
    """`table FILE`: print the rendered tables of a result file; False for other commands."""
    if a.cmd != "table":
        return False
    print(render(read_json(a.file)))
    return True
