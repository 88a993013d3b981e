"""Alembic environment: the URL comes from the caller (store.migrate) or TCTUNE_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from store.db import get_engine
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
    if connectable is None:
        engine = get_engine(url) if url.startswith("sqlite") else None
        if engine is None:
            from sqlalchemy import create_engine

            engine = create_engine(url, poolclass=pool.NullPool)
        with engine.connect() as connection:
            _run(connection)
    else:
        _run(connectable)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
