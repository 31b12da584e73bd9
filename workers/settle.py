"""A worker hands the host lock on only once its own threads have stopped running.

libgomp's threads spin for a while after each parallel region (8-9 ms on a Zen 4), so a worker that has just checked
or timed a kernel still holds a core when its step replies, and a timing begun then has one of its threads share a
core with the spinner. On a Zen 4, 5 calls of a 1 ms dense right after another process's call of one, 40 times: over
3x the fastest call in 46 and 45 of 200, in 9 and 21 where that process had settled first; in tuning, a 0.17 ms
dense took 4-8 ms a call in four samples of five, and its config was ranked at 4 GFLOPS where it runs at 197. So a
step that ran a kernel waits, still holding the lock, until the other threads of its process sleep.
"""
from __future__ import annotations

import os
import threading
import time

SETTLE_LIMIT = 0.1  # seconds: a thread that runs on for longer is not a parallel region's spin, and is left running
POLL_SECONDS = 0.0005


def running_threads(process: int | str = "self", besides: int | None = None) -> int:
    """How many threads of `process` (this one by default), besides thread `besides` (the calling one by default),
    are running or runnable (Linux's /proc; 0 where there is none)."""
    besides = threading.get_native_id() if besides is None else besides
    try:
        tids = [int(tid) for tid in os.listdir(f"/proc/{process}/task")]
    except OSError:
        return 0
    running = 0
    for tid in tids:
        if tid == besides:
            continue
        try:
            with open(f"/proc/{process}/task/{tid}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:  # the thread has ended
            continue
        running += stat[stat.rindex(b")") + 2] == ord("R")  # the state follows the name, which may hold ")"
    return running


def settle(limit: float = SETTLE_LIMIT) -> float:
    """Wait until no other thread of this process runs, or `limit` seconds; the seconds waited."""
    start = time.perf_counter()
    while running_threads() and time.perf_counter() - start < limit:
        time.sleep(POLL_SECONDS)
    return time.perf_counter() - start
