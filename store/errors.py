"""What the storage's failures mean to its callers, decided in one place (as Optuna's RDB
storage maps SQLAlchemy's errors to its own).

A database that cannot be reached or gives up (the server down or restarting, a connection
dropped under a pooled session, the pool exhausted, SQLite locked past its busy timeout) is
*unavailable*: the same request succeeds once it is back. The API answers such a request
503 with Retry-After (api/app.py) instead of a 500 and a stack trace, and the fleet's tasks
retry with backoff (workers/app.py); a write that failed so was rolled back
(store/db.session_scope), so nothing is half-written or counted twice.
"""

from __future__ import annotations

from sqlalchemy import exc as sa

UNAVAILABLE: tuple[type[BaseException], ...] = (
    sa.OperationalError, sa.InterfaceError, sa.DisconnectionError, sa.TimeoutError)
RETRY_AFTER_S = 5


def unavailable_reason(exc: BaseException) -> str:
    """The driver's first line, without the SQL statement and parameters SQLAlchemy appends
    (a response must not echo queries or data)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:300]
