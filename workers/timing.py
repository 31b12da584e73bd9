"""Timing a callable the way AutoTVM and Triton users trust: warm up, then `repeat` samples of
`number` calls each, with `number` raised until one sample lasts at least `min_repeat_ms`."""
from __future__ import annotations

import time
from typing import Callable


def calls_per_sample(fn: Callable[[], object], min_repeat_ms: float) -> int:
    """Smallest power-of-two call count whose total time reaches min_repeat_ms (at least 1)."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        if (time.perf_counter() - start) * 1e3 >= min_repeat_ms or number >= 1 << 20:
            return number
        number *= 2


def time_samples(fn: Callable[[], object], repeat: int = 5, min_repeat_ms: float = 20.0) -> list[float]:
    """Seconds per call, one value per sample; every sample is kept (take the median, not the mean)."""
    fn()  # warm-up: page faults, caches, thread pool start
    number = calls_per_sample(fn, min_repeat_ms)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
    return samples
