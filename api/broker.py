"""The API's use of the broker, which must never hold a request up: a new job is announced
to the explorer from a background thread (the explorer's sweeper finds every job in the
database anyway, so an announcement that cannot be sent only delays its first round until
the broker is back), and /metrics reports queue depths only while the broker answers.

Why a probe: the Redis client retries a refused connection for about 6 s before it gives
up. A plain TCP connect with a short timeout says at once whether anyone listens; after a
failed one the broker counts as down for DOWN_FOR_S and is not tried again meanwhile."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 0.25
DOWN_FOR_S = 5.0
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671}


class Broker:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.url = url
        self.address = (parts.hostname or "127.0.0.1",
                        parts.port or DEFAULT_PORTS.get(parts.scheme, 6379))
        self._down_until = 0.0
        self._lock = threading.Lock()
        # One thread: announcements go out in order and never pile up threads.
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="tctune-broker")

    def reachable(self) -> bool:
        """Whether the broker accepts connections (cached as down for DOWN_FOR_S)."""
        now = time.monotonic()
        with self._lock:
            if now < self._down_until:
                return False
        try:
            socket.create_connection(self.address, timeout=CONNECT_TIMEOUT_S).close()
            return True
        except OSError:
            self.mark_down()
            return False

    def mark_down(self) -> None:
        with self._lock:
            self._down_until = time.monotonic() + DOWN_FOR_S

    def announce(self, job_id: int, send: Callable[[int], None]) -> None:
        """Send `send(job_id)` in the background if the broker is up; never raises."""

        def run() -> None:
            if not self.reachable():
                log.warning("broker %s:%s down: job %s starts when the explorer's sweeper "
                            "finds it", *self.address, job_id)
                return
            try:
                send(job_id)
            except Exception as exc:
                self.mark_down()
                log.warning("could not notify the explorer of job %s: %s", job_id, exc)

        self._sender.submit(run)

    def queue_depths(self, names: list[str], read: Callable[[list[str]], dict[str, int]]
                     ) -> dict[str, int] | None:
        """`read(names)` while the broker is up; None (no depths to report) while not."""
        if not self.reachable():
            return None
        try:
            return read(names)
        except Exception:
            self.mark_down()
            return None
