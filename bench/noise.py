"""`python -m bench.noise [SECONDS]`: how steady this machine is, measured with nothing of ours beside it.

One process times a bound 256³ GEMM kernel, a kernel of pure FMAs (which touches no memory) and,
where the CPU has AMX, one of pure tile products, in alternation (a measurement: the median of 5
samples of 20 ms; one round about every 0.3 s) for SECONDS. It prints, for each, the median and
90th percentile over the fastest, the share of measurements more than 10% slower than the fastest,
and how long such slow phases last. A steady FMA rate beside a varying GEMM points at neighbours
sharing the caches and memory (a cloud host); both varying points at the cores themselves; a
varying tile rate beside a steady FMA rate, at the tile unit, one to a physical core and shared by
its two hyperthreads (on an Intel AMX cloud host, over 60 s: the FMA kernel's median 1.07x its
fastest, the tile products' 2.36x).
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

from search_space import Target, matmul
from workers.reference import inference_call
from workers.task import build_step
from workers.timing import time_samples

from workers.peak import peak_call, tile_peak_call
from .workers import candidates


def trace(seconds: float) -> dict[str, np.ndarray]:
    built = build_step(candidates(matmul(256, 256, 256), 1)[0])
    inputs = built.kernel.workload.random_inputs()
    target = Target.parse("llvm")
    calls = {"gemm": inference_call(built.kernel, inputs)[0], "fma": peak_call(target)[0]}
    if {"amx-tile", "amx-bf16"} <= set(target.features):
        calls["amx"] = tile_peak_call(target, "amx-bf16")[0]
    values: dict[str, list[float]] = {name: [] for name in calls}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, call in calls.items():
            values[name].append(statistics.median(time_samples(call, 5, 20)))
        time.sleep(0.05)
    return {name: np.array(v) for name, v in values.items()}


def summary(values: np.ndarray) -> str:
    fastest = values.min()
    slow = values > 1.1 * fastest
    runs = [len(list(group)) for is_slow, group in itertools.groupby(slow) if is_slow]
    return (f"median/fastest {np.median(values) / fastest:.3f}  p90/fastest {np.percentile(values, 90) / fastest:.3f}  "
            f"slow (>10%) {slow.mean():.0%} of the time, in {len(runs)} phase(s) of "
            f"{min(runs, default=0)}-{max(runs, default=0)} measurements")


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    with threadpool_limits(1, user_api="blas"):
        values = trace(seconds)
    for name, v in values.items():
        print(f"{name:5s} {len(v)} measurements, fastest {v.min() * 1e6:.0f} µs: {summary(v)}")


if __name__ == "__main__":
    main()
