"""The measurement suite, run against the local pool and a real two-node Ray cluster.

Every outcome is provoked by real generated machine code (tests/faulty_tasks.py); after
each, the same pool measures a correct candidate.
"""
import contextlib
import fcntl
import json
import os
import signal
import threading
import time
from dataclasses import replace

import pytest

from faulty_tasks import faulty
from ray_helpers import start_node, stop, two_node_cluster, wait_for
from tests.test_pool_limits import held_elsewhere
from search_space import Target, dense, fallback_config, get_space, matmul
from workers import MeasureInput, MeasureOptions, Outcome, PoolOptions, RayPoolOptions, Task, make_pool, measure

FAST = MeasureOptions(repeat=3, min_repeat_ms=2)
WARM = replace(FAST, cache="warm")
# the watchdog allows for all three; the lock wait outlasts the hold in test_the_run_timeout_starts_once_...
LIMITS = dict(build_timeout=3.0, run_timeout=3.0, host_lock_wait=5.0)
TARGET = Target.parse("llvm -threads=1")
WORKLOAD = matmul(64, 64, 64)


def node_env() -> dict:
    """Ray's workers import tests/faulty_tasks.py when they unpickle a faulty task."""
    return os.environ | {"PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def real_tasks(n: int, seed: int = 0) -> list[Task]:
    return [Task.of(MeasureInput(WORKLOAD, TARGET, c)) for c in get_space(WORKLOAD, TARGET).sample(n, rng=seed)]


def test_the_pool_times_as_fast_as_this_process():
    """The same config measured through the pool and in this process, alternately, 4 times each; first
    in the module so that no Ray cluster runs beside it. This host's neighbours slow any measurement
    by up to 2x at times (`tensortune bench workers` shows it for both sides alike), so the assertion
    compares the fastest samples: interference only slows samples down, while a pool that got in its
    own way would be slower every time (a thread pool left spinning beside the timing costs 1.7x on two cores:
    workers/reference.py). The margin holds on a loaded 2-core host; `tensortune bench workers` shows both
    sides' medians side by side."""
    from threadpoolctl import threadpool_limits

    from workers.task import build_step, run_step
    workload, host = matmul(192, 192, 192), Target.parse("llvm")  # all cores: the kernel's threads must not meet others
    task = Task.of(MeasureInput(workload, host, get_space(workload, host).sample(1, rng=2)[0]))
    options = MeasureOptions(repeat=5, min_repeat_ms=20, cache="warm")
    pool = make_pool("local", PoolOptions(workers=2))
    pooled, local = [], []
    try:
        with threadpool_limits(1, user_api="blas"):
            built = build_step(task)
            for _ in range(4):
                pooled += pool.measure([task, task], options)
                local.append(run_step(built, options))
    finally:
        pool.close()
    fastest = {name: min(min(r.samples) for r in results) for name, results in (("pool", pooled), ("local", local))}
    spread = max(r.median for r in pooled) / min(r.median for r in pooled) - 1
    print(f"fastest sample: pool {fastest['pool'] * 1e6:.0f} µs, this process {fastest['local'] * 1e6:.0f} µs; "
          f"spread of the pool's 8 medians {spread:.1%}")
    assert all(r.outcome is Outcome.OK for r in pooled + local)
    assert fastest["pool"] < 1.5 * fastest["local"]


@pytest.fixture(scope="module")
def host_lock(tmp_path_factory) -> str:
    """The lock file of this module's pools, so that a test can hold it and no other run on the machine does."""
    return str(tmp_path_factory.mktemp("lock") / "host.lock")


@pytest.fixture(scope="module")
def local_pool(host_lock):
    pool = make_pool("local", PoolOptions(host_lock=host_lock, **LIMITS))
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def ray_cluster():
    """A head and a second node advertising a fake GPU, started with `ray start --block` so that
    stopping these two processes stops exactly their nodes (`ray stop` would stop every node here)."""
    with two_node_cluster(node_env(), ["--num-cpus=1"], ["--num-cpus=1", '--resources={"gpu_host": 1}']) as address:
        yield address


@pytest.fixture(scope="module")
def ray_pool(ray_cluster, host_lock):
    pool = make_pool("ray", RayPoolOptions(address=ray_cluster, gpu_resource="gpu_host", watchdog_slack=3.0,
                                           host_lock=host_lock, **LIMITS))
    yield pool
    pool.close()


@pytest.fixture(params=["local", "ray"])
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


def test_dense_candidates_with_bias_are_measured_with_their_weights_bound(pool):
    """The README's main job, dense 128×3072×768 with bias and gelu: W and bias are bound (packed once) for
    the check and the timing, X alone is passed per call. Timed warm: the rotation binds copies of the 9.4 MB weights
    filling twice the last-level cache (27 on an Intel host's 260 MiB L3) and calls each once a round, which took a
    random config past this module's 3 s run limit on a loaded host; test_timing checks the copies."""
    workload = dense(128, 3072, 768, bias=True, epilogue="gelu")
    configs = [fallback_config(workload, TARGET)] + get_space(workload, TARGET).sample(1, rng=0)
    for result in pool.measure([Task.of(MeasureInput(workload, TARGET, c)) for c in configs], WARM):
        assert result.outcome is Outcome.OK, result.error
        assert result.flops == workload.flops and result.gflops > 0


FAULTS = [
    ("wrong_answer", Outcome.WRONG_ANSWER), ("nan", Outcome.WRONG_ANSWER), ("inf", Outcome.WRONG_ANSWER),
    ("compile_error", Outcome.COMPILE_ERROR),
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
    """The timing alone (hot caches) lasts at least 5 × 150 ms (calibration and 4 samples), so a kill 0.5 s
    after the call lands while the candidate is in flight; its retry, about a second, stays far inside the 3 s
    run timeout on a loaded host."""
    slow = MeasureOptions(repeat=4, min_repeat_ms=150, cache="warm")
    results = []
    thread = threading.Thread(target=lambda: results.extend(pool.measure(real_tasks(1, seed=3), slow)))
    thread.start()
    time.sleep(0.5)
    for pid in pool.pids:
        os.kill(pid, signal.SIGKILL)
    thread.join()
    assert results[0].outcome is Outcome.OK and "retried" in results[0].error


@pytest.mark.parametrize("fault, outcome", [("correct", Outcome.OK), ("endless", Outcome.RUN_TIMEOUT)])
def test_the_run_timeout_starts_once_the_host_lock_is_held(pool, host_lock, fault, outcome):
    """Another pool builds for 1 s longer than the run timeout: the candidate's build and check go beside it, its
    timing waits for the lock, and its timeout starts once the lock is held, so a quick candidate is measured with
    the lock; one that hangs hangs in its check (its first call), which needs no lock to itself, and is stopped at
    the run timeout from the check's start, before the other pool lets go."""
    hold = LIMITS["run_timeout"] + 1.0
    with held_elsewhere(host_lock, hold, fcntl.LOCK_SH) as released:
        start = time.perf_counter()
        result, = pool.measure([faulty(fault)], FAST)
        wall = time.perf_counter() - start
    assert result.outcome is outcome, result.error
    if outcome is Outcome.OK:
        assert wall > LIMITS["run_timeout"] and result.finished_at > released[0]  # nothing ran before the release
        assert result.phases["wait"] >= hold / 2 and not result.error  # timed with the lock
    else:
        assert "check exceeded" in result.error and result.finished_at < released[0]
        assert result.finished_at - result.started_at >= LIMITS["run_timeout"]


def test_a_fresh_workers_set_up_is_not_run_time(tmp_path):
    """A worker's first flushed run first writes its cache-flush buffer, twice the last-level cache, faulting
    in every page, many times as long as a later flush. That is set-up the worker
    pays once, so it is done before the run's timeout starts (fresh workers' first runs overran this module's
    3 s run timeouts so on a loaded host) and recorded as its own phase, in that run's record alone."""
    one_flushed_call = MeasureOptions(repeat=1, min_repeat_ms=2, cache="flush")
    pool = make_pool("local", PoolOptions(workers=1, host_lock=str(tmp_path / "host.lock"), **LIMITS))
    try:
        first, = pool.measure([faulty("correct")], one_flushed_call)
        second, = pool.measure([faulty("correct")], one_flushed_call)
    finally:
        pool.close()
    assert first.outcome is second.outcome is Outcome.OK, first.error or second.error
    assert first.phases["setup"] > 0 and "setup" not in second.phases


def test_measure_entry_point_with_its_own_pool():
    config = get_space(WORKLOAD, TARGET).get(0)
    result, = measure([MeasureInput(WORKLOAD, TARGET, config)], FAST)
    assert result.outcome is Outcome.OK


def test_candidates_are_routed_by_target(ray_pool):
    """llvm candidates run on CPU agents of their model; the node advertising the (fake) GPU resource gets a GPU
    agent, which reports the GPU CuPy sees there (none), so a cuda candidate is refused by name, not run."""
    cpu_result, = ray_pool.measure([real_tasks(1)[0]], FAST)
    assert cpu_result.outcome is Outcome.OK
    cuda = Task(WORKLOAD.key, "cuda -device=Fake_GPU -arch=sm_80", get_space(WORKLOAD, TARGET).get(0).to_json())
    with pytest.raises(LookupError, match=r"no Ray worker host for target 'cuda -device=Fake_GPU -arch=sm_80'; "
                                          r"hosts: .*cuda \(no GPU seen\)"):
        ray_pool.measure([cuda], FAST)
    cpu_agents = [a for a in ray_pool.agents if a.kind == "llvm"]
    assert len(cpu_agents) == 2 and len(ray_pool.agents) == 3


def test_a_cpu_model_no_host_has_is_refused_by_name(ray_pool):
    """Candidates go only to hosts of their CPU model; a batch none can measure says which hosts there are."""
    foreign = Target.parse("llvm -mcpu=skylake-avx512 -threads=1")
    task = Task(WORKLOAD.key, str(foreign), get_space(WORKLOAD, foreign).get(0).to_json())
    with pytest.raises(LookupError, match=f"no Ray worker host for target .*skylake-avx512.*; hosts: .*llvm {TARGET.model}"):
        ray_pool.measure([task], FAST)


def test_the_watchdog_restarts_a_stuck_agent(ray_pool):
    """The first CPU agent (which gets a one-candidate batch) is frozen with SIGSTOP: the watchdog
    kills it, Ray restarts it, and the candidate is measured by the other agent."""
    stuck = ray_pool.pids[0]
    os.kill(stuck, signal.SIGSTOP)
    result, = ray_pool.measure(real_tasks(1, seed=9), FAST)
    with contextlib.suppress(ProcessLookupError):  # the watchdog's kill has usually removed it
        os.kill(stuck, signal.SIGCONT)
    assert result.outcome is Outcome.OK and "retried" in result.error


def test_a_cache_flush_precedes_every_timed_call_and_is_not_timed():
    """With a flush, each sample is one call right after a flush, and the flush's 0.1 s is not in it."""
    from workers.timing import time_samples

    events = []

    def flush():
        events.append("flush")
        time.sleep(0.1)
    samples = time_samples(lambda: events.append("call"), repeat=3, min_repeat_ms=0.1, flush=flush)
    assert events == ["call"] + ["flush", "call"] * 3  # a warm-up call, then flush and call per sample
    assert len(samples) == 3 and max(samples) < 0.05


def test_tuning_rotates_over_copies_of_the_weights_by_default_or_flushes_or_runs_warm():
    """By default each timed call is of the next copy of the weights, from the one touched longest ago, after one
    untimed call of the copy touched last (the threads woken), so each finds its weights evicted by the others'
    (rotate), and finds its activations written again just before it, as the op before leaves them (one call without
    weights: the same, single calls); flushed, single calls after a write of twice
    this host's largest cache (one buffer per process); warm, as the benchmarks' references run, many calls per
    sample."""
    import numpy as np

    from search_space import Target
    from workers.flush import host_flusher
    from workers.task import HostTimedCall
    from workers.timing import host_flush_buffer, last_level_cache_bytes

    calls, seen, target, activation = [], [], Target.parse("llvm"), np.zeros(1)

    def call(copy: int) -> None:  # records what it finds, then writes over its input as no kernel does
        calls.append(copy)
        seen.append(activation[0])
        activation[0] += 1
    timed = HostTimedCall([lambda copy=copy: call(copy) for copy in range(3)], np.zeros(1), target, [activation])
    timed.samples(MeasureOptions(repeat=4))
    assert calls == [2] + [0, 1, 2, 0]
    assert seen == [0] + [0, 0, 0, 0]  # each timed call after its input's rewrite
    calls.clear()
    timed.samples(MeasureOptions(repeat=2))  # on from where the last timing left the rotation
    assert calls == [0] + [1, 2]
    calls.clear()
    seen.clear()
    activation[0] = 0
    HostTimedCall([lambda: call(0)], np.zeros(1), target, [activation]).samples(MeasureOptions(repeat=3))
    assert calls == [0] * (1 + 3) and seen == [0] + [0] * 3
    calls.clear()
    timed.samples(MeasureOptions(repeat=3, cache="flush"))
    assert calls == [0] * (1 + 3)  # the first call in the rotation's order: copy 0 again
    calls.clear()
    timed.samples(MeasureOptions(repeat=3, min_repeat_ms=2, cache="warm"))
    assert len(calls) > 1 + 3 and set(calls) == {0}
    sizes = [int(open(f"/sys/devices/system/cpu/cpu0/cache/index{i}/size").read().strip().rstrip("K")) << 10
             for i in range(4) if os.path.exists(f"/sys/devices/system/cpu/cpu0/cache/index{i}/size")]
    assert last_level_cache_bytes() == max(sizes, default=32 << 20)
    assert host_flush_buffer() is host_flush_buffer() and host_flusher(target) is host_flusher(target)
    with pytest.raises(ValueError, match="cache protocol 'cold': expected one of rotate, flush, warm"):
        MeasureOptions(cache="cold")


def test_a_host_that_joins_or_leaves_is_followed(ray_pool, ray_cluster):
    """A third node started with plain `ray start --address` gets an agent at the next batch and
    measures its share; once it is stopped, batches go to the others again."""
    import ray
    node = start_node(node_env(), f"--address={ray_cluster}", "--num-cpus=1")
    try:
        wait_for(lambda: len([n for n in ray.nodes() if n["Alive"]]) == 3, 60, "the third node")
        results = ray_pool.measure(real_tasks(3, seed=11), FAST)
        assert all(r.outcome is Outcome.OK for r in results)
        assert len([a for a in ray_pool.agents if a.kind == "llvm"]) == 3
        assert len({r.worker.split("/")[0] for r in results}) == 3  # one candidate on each CPU host
    finally:
        stop(node)
    wait_for(lambda: len([n for n in ray.nodes() if n["Alive"]]) == 2, 60, "the third node to leave")
    results = ray_pool.measure(real_tasks(2, seed=12), FAST)
    assert all(r.outcome is Outcome.OK for r in results)
    assert len([a for a in ray_pool.agents if a.kind == "llvm"]) == 2
