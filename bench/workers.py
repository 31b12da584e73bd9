"""`tensortune bench workers`: candidates measured per second by the local and the Ray pool, where each
candidate's time goes (build, correctness check, timing, dispatch and bookkeeping), and the spread of
repeated measurements of one config.

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

from search_space import Target, get_space, matmul
from workers import MeasureInput, MeasureOptions, RayPoolOptions, Task, make_pool

OPTIONS = MeasureOptions(repeat=3, min_repeat_ms=10)
CASES = [(matmul(128, 128, 128), 8), (matmul(512, 512, 512), 4)]  # (workload, candidates)
PHASES = ("build", "check", "time", "dispatch")


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


def spread(pool) -> dict:
    workload = matmul(256, 256, 256)
    task = candidates(workload, 1)[0]
    results = pool.measure([task] * 6, MeasureOptions(repeat=5, min_repeat_ms=20))
    medians = [r.median for r in results]
    return {"workload": workload.key, "medians_us": [m * 1e6 for m in medians],
            "spread": max(medians) / min(medians) - 1}


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
    for row in rows:
        if "measurement_spread" in row:
            s = row["measurement_spread"]
            table.add_row(row["pool"], s["workload"], f"spread of 6 medians {s['spread']:.1%}", "", "", "", "", "")
            continue
        shares = [f"{row['phase_seconds'][p] * 1e3:.0f} ms ({row['phase_share'][p]:.0%})" for p in PHASES]
        table.add_row(row["pool"], row["workload"], f"{row['candidates_per_second']:.2f}", *shares,
                      f"{row['startup_seconds']:.1f}")
    Console().print(table)
