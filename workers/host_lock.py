"""One timing at a time per machine, whichever tensortune pool asks: a reader-writer lock on a file.

Builds and checks hold it shared and timing holds it exclusive, so two pools on one host (two
Ray nodes, the CLI beside the service, the service's several runners) never time a kernel while
another builds, checks or times. The lock belongs to the worker process's open file, so a worker
that is killed mid-step never leaves it taken.
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

POLL_SECONDS = 0.002


def default_path() -> str:
    """$TENSORTUNE_HOST_LOCK (containers on one machine share it through a volume), else a file in /tmp."""
    return os.environ.get("TENSORTUNE_HOST_LOCK") or os.path.join(tempfile.gettempdir(), "tensortune-host.lock")


class HostLock:
    def __init__(self, path: str, wait_limit: float):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        self.wait_limit = wait_limit

    @contextmanager
    def held(self, exclusive: bool) -> Iterator[tuple[float, bool]]:
        """Yields (seconds waited, whether the lock is held). After `wait_limit` seconds the step
        runs without it rather than not at all: its record then says so."""
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        start = time.perf_counter()
        while True:
            try:
                fcntl.flock(self.fd, mode)
                locked = True
                break
            except BlockingIOError:
                if time.perf_counter() - start >= self.wait_limit:
                    locked = False
                    break
                time.sleep(POLL_SECONDS)
        try:
            yield time.perf_counter() - start, locked
        finally:
            if locked:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
