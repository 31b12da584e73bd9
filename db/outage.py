"""A database that is away for a while (stopped, restarting, its connections cut, SQLite busy past its
timeout) pauses the work instead of failing it: `unavailable` tells such an error from a real one, and
`wait_until_reachable` waits, backing off, until the database answers again."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

log = logging.getLogger("tensortune.db")

SQLITE_TRANSIENT = ("database is locked", "database is busy", "database table is locked")


class LockLost(RuntimeError):
    """A job's lock went with the connection that held it (a restart, a cut): the job is no longer ours, and
    nothing more is written for it until it is claimed again."""


def unavailable(error: BaseException) -> str | None:
    """The one-line reason when `error` means the database cannot serve us now but may soon; None when it
    is any other error (a bug, a constraint, a missing table), which waiting would not cure."""
    if isinstance(error, LockLost):
        return str(error)
    if not isinstance(error, DBAPIError):
        return None
    cause = str(error.orig).strip().splitlines()[0] if error.orig is not None else str(error)
    if error.connection_invalidated:
        return cause
    if not isinstance(error, (OperationalError, InterfaceError)):
        return None
    if error.orig is not None and type(error.orig).__module__.startswith("sqlite3"):
        return cause if any(text in cause for text in SQLITE_TRANSIENT) else None
    return cause


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: doubling from `first`, never above `most` (so a database that is back is
    noticed within `most` seconds)."""

    first: float = 0.25
    most: float = 2.0

    def delays(self) -> Iterator[float]:
        delay = self.first
        while True:
            yield delay
            delay = min(delay * 2, self.most)


def wait_until_reachable(ping: Callable[[], None], reason: str, waiting_to: str,
                         announce: Callable[[str], None] = log.warning, stop: threading.Event | None = None,
                         backoff: Backoff = Backoff()) -> bool:
    """Call `ping` until it succeeds, announcing each wait (what failed, what waits on it, when the next try
    is); True once the database answers, False if `stop` was set first. Errors other than an outage raise."""
    started, delays = time.monotonic(), backoff.delays()
    while True:
        delay = next(delays)
        announce(f"database unavailable ({reason}); {waiting_to} waits, next try in {delay:.1f} s "
                 f"(waiting {time.monotonic() - started:.0f} s)")
        if stop.wait(delay) if stop else time.sleep(delay):
            return False
        try:
            ping()
        except Exception as error:
            reason = unavailable(error)
            if reason is None:
                raise
            continue
        log.warning("database reachable again after %.1f s; %s goes on", time.monotonic() - started, waiting_to)
        return True
