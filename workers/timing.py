"""Timing a callable the way AutoTVM and Triton users trust: warm up, then `repeat` samples of
`number` calls each, with `number` raised until one sample lasts at least `min_repeat_ms`.

A CPU cache flush (write a buffer larger than the last-level cache before each call) measures
cold-cache performance, as a layer in a network sees it; it times one call per sample, since
the flush must not be counted. A cooldown sleeps between samples so thermal throttling from
one sample does not leak into the next.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np


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


def cache_flusher(nbytes: int) -> Callable[[], None]:
    """Writes `nbytes` (choose more than the last-level cache) so the next call starts cold."""
    buffer = np.zeros(nbytes // 8, np.float64)

    def flush() -> None:
        buffer[...] += 1.0  # in place: the closure writes the array, not the name
    return flush


def time_samples(fn: Callable[[], object], repeat: int = 5, min_repeat_ms: float = 20.0,
                 flush: Callable[[], None] | None = None, cooldown_ms: float = 0.0) -> list[float]:
    """Seconds per call, one value per sample; every sample is kept (take the median, not the mean)."""
    fn()  # warm-up: page faults, caches, thread pool start
    number = 1 if flush else calls_per_sample(fn, min_repeat_ms)
    samples = []
    for _ in range(repeat):
        if flush:
            flush()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
        if cooldown_ms:
            time.sleep(cooldown_ms / 1e3)
    return samples
