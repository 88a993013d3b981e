"""A body run every `interval` seconds in a daemon thread, through failures."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


def every(interval: float, body: Callable[[], object], name: str,
          stop: threading.Event | None = None) -> threading.Thread:
    """Run `body` now and then every `interval` seconds until `stop` is set. A failure (the
    database or broker away) is logged and the body tried again next time."""
    stop = stop or threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                body()
            except Exception:
                log.exception("%s failed; retrying", name)
            stop.wait(interval)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
