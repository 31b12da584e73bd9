"""A worker lets the host lock go only once its kernel's threads sleep (workers/settle.py): libgomp's threads spin a
while after each parallel region, on cores the next worker's timing needs."""
import os

import numpy as np
import pytest

from search_space import Target, dense, fallback_config, get_space
from workers import MeasureInput, MeasureOptions, PoolOptions, Task, build, make_pool
from workers.settle import SETTLE_LIMIT, running_threads, settle

TARGET = Target.parse("llvm -threads=2")
WORKLOAD = dense(64, 256, 256)

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores for a kernel's 2 threads")


def test_a_kernels_threads_spin_after_its_call_until_settle_has_waited_for_them():
    kernel = build(WORKLOAD, TARGET, fallback_config(WORKLOAD, TARGET))
    a, b = np.ones((64, 256), np.float32), np.ones((256, 256), np.float32)
    kernel(a, b)
    assert settle() < SETTLE_LIMIT and running_threads() == 0
    kernel(a, b)
    assert running_threads() >= 1  # the parallel region's other thread, still spinning
    waited = settle()
    assert 0 < waited < SETTLE_LIMIT
    assert running_threads() == 0


def test_a_pools_workers_hand_back_their_results_with_their_threads_asleep():
    """Right after measure() returns, the last worker to time has replied: without the settle its kernel's other
    thread was still spinning then (seen for 8-9 ms on a Zen 4). Every ok record says how long its steps settled."""
    space = get_space(WORKLOAD, TARGET)
    tasks = [Task.of(MeasureInput(WORKLOAD, TARGET, config)) for config in space.sample(4, rng=1)]
    pool = make_pool("local", PoolOptions(workers=2))
    try:
        for _ in range(3):
            results = pool.measure(tasks, MeasureOptions(repeat=3))
            # its main thread may still be on its way back to wait for the next step
            assert {pid: running_threads(pid, besides=pid) for pid in pool.pids} == dict.fromkeys(pool.pids, 0)
            assert all(r.ok and 0 < r.phases["settle"] < 2 * SETTLE_LIMIT for r in results), results
    finally:
        pool.close()
