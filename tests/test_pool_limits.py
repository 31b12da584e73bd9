"""A local pool shares its host: a lock keeps every pool's timings apart, and a memory limit keeps a
runaway allocation inside its worker."""
import fcntl
import os
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest

from faulty_tasks import faulty
from search_space import Target, get_space, matmul
from workers import MeasureInput, MeasureOptions, Outcome, PoolOptions, Task, make_pool

FAST = MeasureOptions(repeat=3, min_repeat_ms=2)
WORKLOAD, TARGET = matmul(64, 64, 64), Target.parse("llvm -threads=1")
TASK = Task.of(MeasureInput(WORKLOAD, TARGET, get_space(WORKLOAD, TARGET).get(0)))


@contextmanager
def held_elsewhere(path: str, seconds: float, mode: int = fcntl.LOCK_EX) -> Iterator[list[float]]:
    """Another pool's step, as the lock file sees it: the lock held for `seconds`, or until the block ends
    if that is sooner. Yields a list that gets the time.time() of the release."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, mode)
    released, releasing = [], threading.Lock()

    def release():
        with releasing:
            if not released:
                released.append(time.time())  # before the close: nothing that waited can start earlier
                os.close(fd)
    timer = threading.Timer(seconds, release)
    timer.start()
    try:
        yield released
    finally:
        timer.cancel()
        release()


@pytest.mark.parametrize("hold, wait_limit", [(4.0, 60.0), (8.0, 1.0)])
def test_a_pool_waits_for_another_pools_timing(tmp_path, hold, wait_limit):
    """Held 4 s, longer than the build and run timeouts (3 s): the candidate waits and is measured,
    and the wait is its own phase. Held 8 s against a 1 s wait limit: it is measured without the lock
    after waiting the limit twice (build, then timing), and its record says so. Bounds are causal (nothing
    starts before the release) or a wide fraction of the hold, for a loaded host."""
    lock = str(tmp_path / "host.lock")
    pool = make_pool("local", PoolOptions(workers=1, build_timeout=3.0, run_timeout=3.0, host_lock=lock,
                                          host_lock_wait=wait_limit))
    try:
        pool.measure([TASK], FAST)  # workers up and warm
        with held_elsewhere(lock, hold) as released:
            start = time.perf_counter()
            result, = pool.measure([TASK], FAST)
            wall = time.perf_counter() - start
    finally:
        pool.close()
    assert result.outcome is Outcome.OK, result.error
    if wait_limit > hold:
        assert result.started_at >= released[0] and wall >= hold - 0.1  # the build began after the release
        assert result.phases["wait"] >= hold / 2 and not result.error
    else:
        assert wall < hold and 2 * wait_limit <= result.phases["wait"] < hold
        assert "without the host lock" in result.error
    assert result.phases["dispatch"] < 0.5  # the wait is not bookkeeping


def test_builds_share_the_lock_and_timings_do_not(tmp_path, monkeypatch):
    """A shared holder (another pool's build) for 2 s lets a build through but holds back the timing. The
    lock file comes from TENSORTUNE_HOST_LOCK, as docker-compose.yml sets it."""
    lock = str(tmp_path / "host.lock")
    monkeypatch.setenv("TENSORTUNE_HOST_LOCK", lock)
    pool = make_pool("local", PoolOptions(workers=1))
    try:
        pool.measure([TASK], FAST)
        with held_elsewhere(lock, 2.0, fcntl.LOCK_SH) as released:
            result, = pool.measure([TASK], FAST)
    finally:
        pool.close()
    assert result.outcome is Outcome.OK
    assert result.finished_at > released[0] and result.phases["wait"] >= 1.0 and result.phases["build"] < 1.0


def test_a_memory_limit_turns_a_big_allocation_into_a_runtime_error():
    """4 GiB of scratch: under a 2 GiB limit the build fails with MemoryError and the worker lives on;
    without one the same candidate builds (and computes the wrong answer it was written to)."""
    capped = make_pool("local", PoolOptions(workers=1, memory_limit=2 << 30))
    try:
        big, good = capped.measure([faulty("big_allocation"), TASK], FAST)
    finally:
        capped.close()
    assert big.outcome is Outcome.RUNTIME_ERROR and "MemoryError" in big.error
    assert good.outcome is Outcome.OK
    free = make_pool("local", PoolOptions(workers=1, memory_limit=0))
    try:
        assert free.measure([faulty("big_allocation")], FAST)[0].outcome is Outcome.WRONG_ANSWER
    finally:
        free.close()
