"""Who runs a job: one lock per job, which dies with the process that holds it.

A job left `running` whose lock nobody holds lost its runner (a killed service or `tensortune
tune`) and may be taken over; one whose lock is held is someone's, whoever asks. PostgreSQL: a
session advisory lock keyed by schema and job id, on a connection of the holder's own. SQLite:
a one-byte POSIX record lock at the job id's offset in `<database file>-jobs.lock`. POSIX locks
belong to a process, not to a descriptor, so each process opens that file once and keeps its
own set of the jobs it holds.
"""
from __future__ import annotations

import fcntl
import os
import threading
from dataclasses import dataclass
from typing import Callable

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from .opening import sqlite_file


@dataclass
class Claim:
    """A job this process runs; `release` it when the run ends, however it ends. `connection` (PostgreSQL)
    is the session holding the lock: whoever writes for the job writes through it (`Database.fenced`), so
    that once the lock is lost with its connection (a restart, a cut) no write of the old run lands."""

    job_id: int
    release: Callable[[], None]
    connection: Connection | None = None

    def __post_init__(self):
        self._session = self.connection.connection.dbapi_connection if self.connection is not None else None

    def held(self) -> bool:
        """Whether the lock's connection is still the one that took it (SQLAlchemy quietly replaces a lost
        connection at its next use, and the new one holds nothing)."""
        if self.connection is None:
            return True
        return not self.connection.invalidated and self.connection.connection.dbapi_connection is self._session


class PostgresJobLocks:
    def __init__(self, engine: Engine):
        """Advisory locks are per database; the first of their two keys is the schema's hash, so that
        installations in other schemas of the same database, whose job ids repeat ours, are not us."""
        self.engine = engine
        with engine.connect() as connection:
            self.space = connection.scalar(text("SELECT hashtext(current_schema())"))

    def acquire(self, job_id: int) -> Claim | None:
        connection = self.engine.connect()
        key = {"space": self.space, "id": job_id}
        taken = connection.scalar(text("SELECT pg_try_advisory_lock(:space, :id)"), key)
        connection.commit()  # a session lock outlives the transaction; the connection is left idle
        if taken:
            def release() -> None:  # explicitly: closing a pooled connection keeps its session (and locks)
                try:
                    connection.rollback()
                    connection.scalar(text("SELECT pg_advisory_unlock(:space, :id)"), key)
                    connection.commit()
                    connection.close()
                except DBAPIError:  # the connection is gone, and its lock with it; never reuse it
                    connection.invalidate()
                    connection.close()
            return Claim(job_id, release, connection)
        connection.close()
        return None


class FileJobLocks:
    _open: dict[str, int] = {}  # lock file (or in-memory database) → this process's one descriptor of it
    _held: dict[str, set[int]] = {}  # the same → the jobs this process holds
    _guard = threading.Lock()

    def __init__(self, path: str | None, key: str):
        """`path` None (an in-memory database, `key` naming it): only this process can see the jobs."""
        self.key = key
        with self._guard:
            if key not in self._open:
                self._open[key] = os.open(path, os.O_RDWR | os.O_CREAT, 0o666) if path else -1
                self._held[key] = set()

    def acquire(self, job_id: int) -> Claim | None:
        fd, held = self._open[self.key], self._held[self.key]
        with self._guard:
            if job_id in held:
                return None
            if fd >= 0:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, job_id)
                except OSError:
                    return None
            held.add(job_id)
        return Claim(job_id, lambda: self._release(job_id))

    def _release(self, job_id: int) -> None:
        fd = self._open[self.key]
        with self._guard:
            if job_id in self._held[self.key]:
                if fd >= 0:
                    fcntl.lockf(fd, fcntl.LOCK_UN, 1, job_id)
                self._held[self.key].discard(job_id)


def job_locks(engine: Engine) -> PostgresJobLocks | FileJobLocks:
    if engine.dialect.name == "postgresql":
        return PostgresJobLocks(engine)
    database = sqlite_file(engine.url)  # a URI filename too (sqlite:///file:PATH?mode=ro&uri=true)
    if database is None:
        return FileJobLocks(None, f"memory-{id(engine)}")
    path = f"{os.path.abspath(database)}-jobs.lock"
    return FileJobLocks(path, path)
