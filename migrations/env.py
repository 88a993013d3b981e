"""Alembic environment: the URL comes from the caller (store.migrate) or TCTUNE_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from store.models import Base
from store.settings import get_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().db_url


def run_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    # A private engine: SQLite's batch migrations copy a table, drop the old one and rename
    # the copy; with foreign keys on, dropping `job` would cascade into every measurement.
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        if url.startswith("sqlite"):
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")  # outside any transaction
            connection.commit()  # end SQLAlchemy's implicit one, so Alembic's own commits
        _run(connection)
        if url.startswith("sqlite"):
            connection.commit()
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                raise RuntimeError(f"migration left dangling foreign keys: {broken[:5]}")
    engine.dispose()


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
