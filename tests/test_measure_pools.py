"""The measurement suite, run against the local pool and a real two-node Ray cluster.

Every outcome is provoked by real generated machine code (tests/faulty_tasks.py); after
each, the same pool measures a correct candidate.
"""
import json
import os
import signal
import threading
import time

import pytest

from faulty_tasks import faulty
from search_space import Target, get_space, matmul
from workers import MeasureInput, MeasureOptions, Outcome, PoolOptions, Task, make_pool, measure

FAST = MeasureOptions(repeat=3, min_repeat_ms=2)
LIMITS = dict(build_timeout=3.0, run_timeout=3.0)
TARGET = Target.parse("llvm -threads=1")
WORKLOAD = matmul(64, 64, 64)


def real_tasks(n: int, seed: int = 0) -> list[Task]:
    return [Task.of(MeasureInput(WORKLOAD, TARGET, c)) for c in get_space(WORKLOAD, TARGET).sample(n, rng=seed)]


@pytest.fixture(scope="module")
def local_pool():
    pool = make_pool("local", PoolOptions(**LIMITS))
    yield pool
    pool.close()


@pytest.fixture(params=["local"])
def pool(request):
    return request.getfixturevalue(f"{request.param}_pool")


def test_real_candidates_are_checked_and_timed(pool):
    start = time.time()
    results = pool.measure(real_tasks(3), FAST)
    for result in results:
        assert result.outcome is Outcome.OK, result.error
        assert len(result.samples) == FAST.repeat and result.gflops > 0
        assert result.worker and result.host and start <= result.started_at <= result.finished_at <= time.time()
        assert {"build", "check", "time", "dispatch"} <= set(result.phases)
        assert result.flops == WORKLOAD.flops and result.compile_seconds > 0


FAULTS = [
    ("wrong_answer", Outcome.WRONG_ANSWER), ("compile_error", Outcome.COMPILE_ERROR),
    ("out_of_bounds", Outcome.RUNTIME_ERROR), ("runaway_allocation", Outcome.RUNTIME_ERROR),
    ("endless", Outcome.RUN_TIMEOUT), ("huge_unroll", Outcome.BUILD_TIMEOUT), ("kill", Outcome.WORKER_LOST),
]


@pytest.mark.parametrize("fault, outcome", FAULTS)
def test_a_faulty_candidate_costs_one_record(pool, fault, outcome):
    bad, good = pool.measure([faulty(fault), faulty("correct")], FAST)
    assert bad.outcome is outcome, bad.error
    assert good.outcome is Outcome.OK, good.error
    assert pool.measure(real_tasks(1, seed=7), FAST)[0].outcome is Outcome.OK


def test_invalid_config(pool):
    valid = real_tasks(1)[0]
    knobs = json.loads(valid.config)["knobs"] | {"tile_m": [-1, 1, 999]}
    foreign = Task(valid.workload, valid.target, json.dumps({"knobs": knobs}))
    bad, good = pool.measure([foreign, valid], FAST)
    assert bad.outcome is Outcome.INVALID_CONFIG and "tile_m" in bad.error
    assert good.outcome is Outcome.OK


def test_a_lost_worker_is_retried_once(pool, tmp_path):
    result = pool.measure([faulty("kill_once", str(tmp_path / "killed"))], FAST)[0]
    assert result.outcome is Outcome.OK and "retried" in result.error


def test_sigkill_mid_run_is_retried(pool):
    slow = MeasureOptions(repeat=4, min_repeat_ms=250)
    results = []
    thread = threading.Thread(target=lambda: results.extend(pool.measure(real_tasks(1, seed=3), slow)))
    thread.start()
    time.sleep(1.0)  # past the build, inside the timing
    for pid in pool.pids:
        os.kill(pid, signal.SIGKILL)
    thread.join()
    assert results[0].outcome is Outcome.OK and "retried" in results[0].error


def test_measure_entry_point_with_its_own_pool():
    config = get_space(WORKLOAD, TARGET).get(0)
    result, = measure([MeasureInput(WORKLOAD, TARGET, config)], FAST)
    assert result.outcome is Outcome.OK


def test_repeated_measurements_agree():
    """The same config measured 6 times. Other jobs share this machine's 2 cores, so the bound is on the
    fastest sample of each measurement (interference only slows samples down); both spreads are printed."""
    workload = matmul(192, 192, 192)
    task = Task.of(MeasureInput(workload, TARGET, get_space(workload, TARGET).get(0)))
    pool = make_pool("local", PoolOptions(workers=1))
    try:
        results = pool.measure([task] * 6, MeasureOptions(repeat=5, min_repeat_ms=20))
    finally:
        pool.close()
    spread = {name: max(values) / min(values) - 1 for name, values in
              (("median", [r.median for r in results]), ("fastest", [min(r.samples) for r in results]))}
    print("spread of 6 measurements: " + ", ".join(f"{name} {value:.1%}" for name, value in spread.items()))
    assert spread["fastest"] < 0.25
