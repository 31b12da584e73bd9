"""Alembic, configured in code: the migrations ship inside the package, so no alembic.ini is needed.

`upgrade(engine)` runs on first use of a database and from `tensortune db upgrade`. Several
processes opening a new database at once take turns: PostgreSQL through an advisory lock,
SQLite through its write lock (BEGIN IMMEDIATE), and each re-reads the revision once it holds it.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text

from .opening import DatabaseOpenError

MIGRATIONS = Path(__file__).parent / "migrations"
ADVISORY_LOCK_KEY = 0x74656E736F72  # "tensor"


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


@cache
def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _lock_schema(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
    elif connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def known_revisions() -> set[str]:
    return {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def check_schema(connection: Connection, revision: str | None, tables: list[str]) -> None:
    """Refuse a schema this version cannot take over: one written by a newer tensortune, or another
    program's tables (migrating would add ours among them)."""
    where = connection.engine.url.render_as_string(hide_password=True)
    if revision is not None and revision not in known_revisions():
        raise DatabaseOpenError(f"cannot open {where}: its schema (revision {revision}) is newer than this "
                                f"version of tensortune knows (newest {head_revision()}); upgrade tensortune")
    if revision is None and tables:
        raise DatabaseOpenError(f"cannot open {where}: not a tensortune database (it holds the tables "
                                f"{', '.join(sorted(tables)[:5])} and no tensortune schema)")


def upgrade(engine: Engine) -> str:
    """Bring the schema to the newest revision (a no-op when it is there) and return that revision."""
    head = head_revision()
    with engine.connect() as connection:
        # the tables before the revision: a migration another process commits between the two reads then
        # shows its revision too (read the other way round, its tables looked like another program's)
        tables = inspect(connection).get_table_names()
        revision = current_revision(connection)
        if revision == head:
            return head
        check_schema(connection, revision, tables)
    with engine.begin() as connection:
        _lock_schema(connection)
        if current_revision(connection) != head:
            command.upgrade(alembic_config(connection), "head")
    return head
