"""Which database, and an engine set up for many writers: the URL default, SQLite's WAL and busy timeout.

`--db` wins, then `TENSORTUNE_DB`, then `tensortune.db` in the working directory.
A file path is taken as a SQLite file; anything else must be a SQLAlchemy URL. A bare word (no suffix, no
directory) that names no file is refused rather than made a new file: it is most likely a mistyped URL.
"""
from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from .opening import DatabaseOpenError

DEFAULT_FILE = "tensortune.db"
BUSY_TIMEOUT_SECONDS = 60
# a server that does not answer is an outage (db/outage.py) after this long, not a hang
SERVER_CONNECT = {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}


def is_url(text: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+]*://", text) is not None


def resolve_url(url: str | Path | None = None) -> str:
    """The URL to open: the argument, else $TENSORTUNE_DB, else the SQLite file in the working directory;
    DatabaseOpenError for a bare word that names no file."""
    chosen = str(url) if url else os.environ.get("TENSORTUNE_DB") or DEFAULT_FILE
    if is_url(chosen):
        return chosen
    path = Path(chosen).expanduser()
    if "/" not in chosen and not path.suffix and not path.exists():
        given = chosen if url else f"{chosen} (from $TENSORTUNE_DB)"
        raise DatabaseOpenError(f"cannot open {given}: no such file, and not a URL; for a new SQLite file write "
                                f"{chosen}.db or ./{chosen}, for a server a URL such as "
                                "postgresql+psycopg://user@host/db")
    return f"sqlite:///{path.resolve()}"


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    """WAL lets readers run beside a writer; the busy timeout makes concurrent writers wait, not fail."""
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_SECONDS * 1000}")
    _write_ahead_log(cursor)
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _write_ahead_log(cursor) -> None:
    """Switch the file to WAL (it stays so), waiting out a busy file: processes opening a new database at once
    race to switch it, and SQLite may answer the losers `database is locked` without calling its busy handler."""
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_engine(engine: Engine) -> Engine:
    """An engine for one-statement reads: autocommit spares PostgreSQL a BEGIN and a ROLLBACK round trip
    per lookup (half the cost of a best-config query). SQLite reads open no transaction anyway, and an
    in-memory database must keep its one connection, so SQLite shares the engine."""
    if engine.dialect.name == "sqlite":
        return engine
    return create_engine(engine.url, isolation_level="AUTOCOMMIT", **SERVER_CONNECT)


def make_engine(url: str) -> Engine:
    """An engine for `url`; in-memory SQLite shares one connection so every session sees the same data."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, **SERVER_CONNECT)
    options = {"poolclass": StaticPool} if parsed.database in (None, "", ":memory:") else {}
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_SECONDS, "check_same_thread": False}, **options)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine
