"""`tensortune bench workers`: candidates measured per second by the local and the Ray pool, where each
candidate's time goes (build, correctness check, timing, its threads settling, waiting for other pools on the host,
dispatch and bookkeeping), what Ray costs over the local pool, and the spread of repeated
measurements of one config beside the same measurement made in this process.

Phases are per candidate, as the worker saw them; "dispatch" is what the pool adds between the
driver and the worker. Builds of a batch run in parallel, so candidates/second exceeds
1 / (sum of phases) when there is more than one worker.
"""
from __future__ import annotations

import json
import statistics
import time

from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from search_space import Target, get_space, matmul
from workers import MeasureInput, MeasureOptions, RayPoolOptions, Task, make_pool
from workers.task import build_step, run_step
from workers.timing import time_samples

from workers.peak import peak_call

OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=10, cache="warm")
CASES = [(matmul(128, 128, 128), 8), (matmul(512, 512, 512), 4)]  # (workload, candidates)
PHASES = ("build", "check", "time", "settle", "wait", "dispatch")


def candidates(workload, count: int) -> list[Task]:
    target = Target.parse("llvm")
    space = get_space(workload, target)
    return [Task.of(MeasureInput(workload, target, c)) for c in space.sample(count, rng=1)]


def measure_case(pool, workload, count: int) -> dict:
    tasks = candidates(workload, count)
    start = time.perf_counter()
    results = pool.measure(tasks, OPTIONS)
    wall = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    phases = {p: statistics.fmean(r.phases.get(p, 0.0) for r in ok) if ok else 0.0 for p in PHASES}
    total = sum(phases.values()) or 1.0
    return {"workload": workload.key, "candidates": len(tasks), "ok": len(ok), "seconds": wall,
            "candidates_per_second": len(tasks) / wall, "phase_seconds": phases,
            "phase_share": {p: v / total for p, v in phases.items()}}


def spread(pool, rounds: int = 12, settle_seconds: float = 0.3) -> dict:
    """The same config measured `rounds` times through the pool, each alternating with the same
    measurement in this process and with a compute-only FMA kernel, so all three see the same
    machine. If the pool's spread is the in-process one, the pool adds none: the rest is the host's.
    The FMA kernel touches no memory, so a steady FMA rate beside a varying GEMM points at
    neighbours sharing the caches and memory, not at the cores' clock."""
    workload = matmul(256, 256, 256)
    task = candidates(workload, 1)[0]
    options = MeasureOptions(repeat=5, min_repeat_ms=20, cache="warm")
    fma, fma_flops = peak_call(Target.parse("llvm"))
    seconds: dict[str, list[float]] = {"pool": [], "in_process": [], "fma": []}
    with threadpool_limits(1, user_api="blas"):  # no spinning BLAS pool of ours beside the workers
        built = build_step(task)
        for _ in range(rounds):
            for side in seconds:
                time.sleep(settle_seconds)  # the previous side's threads stop spinning
                if side == "pool":
                    seconds[side].append(pool.measure([task], options)[0].median)
                elif side == "in_process":
                    seconds[side].append(run_step(built, options).median)
                else:
                    seconds[side].append(statistics.median(time_samples(fma, 5, 20)))
    summary = {side: {"spread": max(v) / min(v) - 1, "median_over_fastest": statistics.median(v) / min(v) - 1}
               for side, v in seconds.items()}
    return {"workload": workload.key, "rounds": rounds, "median_us": {k: [x * 1e6 for x in v] for k, v in seconds.items()},
            "fma_gflops": [fma_flops / x / 1e9 for x in seconds["fma"]]} | summary


def run(json_lines: bool = False) -> list[dict]:
    rows = []
    for kind, options in (("local", None), ("ray", RayPoolOptions())):
        started = time.perf_counter()
        pool = make_pool(kind, options)
        startup = time.perf_counter() - started
        try:
            for workload, count in CASES:
                rows.append({"pool": kind, "startup_seconds": startup} | measure_case(pool, workload, count))
            rows.append({"pool": kind, "measurement_spread": spread(pool)})
        finally:
            pool.close()
    rate = {(r["pool"], r["workload"]): r["candidates_per_second"] for r in rows if "workload" in r}
    rows += [{"ray_over_local": workload.key, "extra_time_per_candidate": rate["local", workload.key] / rate["ray", workload.key] - 1}
             for workload, _ in CASES]
    if json_lines:
        for row in rows:
            print(json.dumps(row))
    else:
        show(rows)
    return rows


def show(rows: list[dict]) -> None:
    table = Table(title="measurement pools")
    for column in ("pool", "workload", "cand/s", *PHASES, "start-up s"):
        table.add_column(column)
    for row in (r for r in rows if "phase_share" in r):
        shares = [f"{row['phase_seconds'][p] * 1e3:.0f} ms ({row['phase_share'][p]:.0%})" for p in PHASES]
        table.add_row(row["pool"], row["workload"], f"{row['candidates_per_second']:.2f}", *shares,
                      f"{row['startup_seconds']:.1f}")
    Console().print(table)
    for row in (r for r in rows if "ray_over_local" in r):
        Console().print(f"Ray over local, {row['ray_over_local']}: {row['extra_time_per_candidate']:+.1%} time per candidate")
    spreads = Table(title="the same config measured again and again, alternating with the same in this process")
    for column in ("pool", "measured by", "medians (µs)", "max/min", "median/min"):
        spreads.add_column(column)
    for row in (r for r in rows if "measurement_spread" in r):
        s = row["measurement_spread"]
        for side in ("pool", "in_process", "fma"):
            values = s["median_us"][side]
            spreads.add_row(row["pool"], side, f"{min(values):.0f}–{max(values):.0f}", f"{s[side]['spread']:.1%}",
                            f"{s[side]['median_over_fastest']:.1%}")
    Console().print(spreads)
