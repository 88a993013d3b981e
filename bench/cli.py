"""What the benchmark scripts share on the command line."""

from __future__ import annotations

import sys
import time
from typing import Any


def log(*a: Any) -> None:
    """A progress line stamped with the time of day, on stderr (stdout keeps the results)."""
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)
