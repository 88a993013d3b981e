"""Engine and session factory. SQLite gets WAL and a busy timeout so that the API, the
dispatcher and its worker processes can share one file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from store.settings import get_settings


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False},
                               pool_size=20, max_overflow=40)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    # Settings.db_pre_ping says why the fleet's processes ping no connection.
    engine = create_engine(url, pool_pre_ping=get_settings().db_pre_ping, pool_size=20,
                           max_overflow=40)
    if engine.dialect.name == "postgresql":

        @event.listens_for(engine, "connect")
        def _custom_plans(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            # psycopg prepares a statement run 5 times on a connection, and PostgreSQL may
            # then keep one generic plan for it for the connection's life. The fleet's
            # tables start empty: a plan cached then (sequential scans) stayed after the
            # tables grew, until an ANALYZE that nothing guarantees (autovacuum off here)
            # — the lease read the whole candidate table. A custom plan sees the table's
            # size at every run, for a planning cost of a fraction of a millisecond.
            with dbapi_conn.cursor() as cur:
                cur.execute("SET plan_cache_mode = force_custom_plan")
            dbapi_conn.commit()

    return engine


@lru_cache(maxsize=8)
def _factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@lru_cache(maxsize=8)
def _autocommit_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url).execution_options(isolation_level="AUTOCOMMIT"),
                        expire_on_commit=False)


@contextmanager
def statement_scope(url: str) -> Iterator[Session]:
    """A session whose statements each commit on their own, for work that is one statement
    or reads that need no common snapshot (a measuring worker's lease, the rounds its write
    closed). On PostgreSQL without a transaction: BEGIN and COMMIT were two of a chunk's
    round trips each time. Elsewhere a `session_scope`."""
    if not url.startswith("postgresql"):
        with session_scope(url) as s:
            yield s
        return
    session = _autocommit_factory(url)()
    try:
        yield session
    finally:
        session.close()


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on error."""
    session = _factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
