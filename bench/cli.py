"""What the benchmark scripts share on the command line."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from typing import Any


def log(*a: Any) -> None:
    """A progress line stamped with the time of day, on stderr (stdout keeps the results)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def geomean(xs: Iterable[float]) -> float | None:
    """The geometric mean of positive values; None for none."""
    v = list(xs)
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None
