"""Jobs that wait for a worker host. On a Ray cluster with no host for a job's target yet (no GPU node of its
architecture, no CPU of its model) the job waits rather than fails: such a host may join at any time. A service
measuring on its own host (the local pool) has a job for another CPU model wait too: a service on a host of that
model, sharing the database, may take it.

The service's runner puts such a job back in the queue, `queued` with what it waits for in `jobs.waiting`:
no process runs it, so the runner's thread serves other jobs meanwhile, a cancel is a queued job's, and a
restarted (or another) service takes the job up as any queued one. `HostWaits` keeps it out of the runner's
claims, looking for its host with a backoff, until one has joined. `tensortune tune` waits in place:
`WaitingForHosts` holds its batch until a host joins.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from db.outage import Backoff
from search_space import Target
from workers.pool import NoWorkerHost, Pool
from workers.result import MeasureResult
from workers.task import MeasureOptions, Task

HOST_BACKOFF = Backoff(first=1.0, most=30.0)  # a node joins within seconds; the cluster is asked every 30 s at most


@dataclass
class HostWait:
    job_id: int
    target: Target
    delays: Iterator[float]
    due: float  # time.monotonic() of the next look for a host


class HostWaits:
    """The jobs a runner put back to wait for a host, and when to look for each one's host again (the runner's
    threads share them)."""

    def __init__(self, backoff: Backoff = HOST_BACKOFF):
        self.backoff = backoff
        self._waits: dict[int, HostWait] = {}
        self._lock = threading.Lock()

    def add(self, job_id: int, target: Target) -> None:
        delays = self.backoff.delays()
        with self._lock:
            self._waits[job_id] = HostWait(job_id, target, delays, time.monotonic() + next(delays))

    def job_ids(self) -> list[int]:
        with self._lock:
            return list(self._waits)

    def due(self) -> list[HostWait]:
        """The waits whose look is due, each put off by its next delay (so that one thread looks at a time)."""
        now = time.monotonic()
        with self._lock:
            found = [wait for wait in self._waits.values() if wait.due <= now]
            for wait in found:
                wait.due = now + next(wait.delays)
            return found

    def forget(self, job_id: int) -> None:
        with self._lock:
            self._waits.pop(job_id, None)


def waiting_line(error: NoWorkerHost) -> str:
    """What a command that waits for a host prints, once."""
    return f"{error}: waiting for {error.awaited} to join (Ctrl-C stops; the same command resumes)"


class WaitingForHosts:
    """A pool whose batch, when no host can measure it, waits for one to join, looking with a backoff, and is then
    measured; `on_wait(error)` hears of a wait once, as it begins. Ctrl-C ends the wait as it ends a batch: the
    job is cancelled, and the same command resumes it."""

    def __init__(self, pool: Pool, on_wait: Callable[[NoWorkerHost], None], backoff: Backoff = HOST_BACKOFF):
        self.pool, self.on_wait, self.backoff = pool, on_wait, backoff

    def measure(self, tasks: Sequence[Task], options: MeasureOptions) -> list[MeasureResult]:
        delays = None
        while True:
            try:
                return self.pool.measure(tasks, options)
            except NoWorkerHost as error:
                if delays is None:
                    self.on_wait(error)
                    delays = self.backoff.delays()
                time.sleep(next(delays))

    def require_host(self, target: Target) -> None:
        self.pool.require_host(target)

    def close(self) -> None:
        self.pool.close()
