"""Timing a callable the way AutoTVM and Triton users trust: warm up, then `repeat` samples of
`number` calls each, with `number` raised until one sample lasts at least `min_repeat_ms`.

By the time a model reaches a layer, the layers before it have evicted its weights, while its
activations (the op before's output) were just written, into the cache of the core that wrote them. Rotating
over copies of a kernel's weights (`rotated_samples`), the activations written again before each call
(`producer_writes`), leaves both as those layers do. A cache flush (AutoTVM's protocol:
write twice the last-level cache before each call) evicts the activations too; it times one call per
sample, since the flush must not be counted. A cooldown sleeps between samples so thermal throttling
from one sample does not leak into the next.
"""
from __future__ import annotations

import functools
import glob
import time
from pathlib import Path
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


@functools.cache
def last_level_cache_bytes(default: int = 32 << 20) -> int:
    """The largest CPU cache of this host, as Linux describes cpu0's caches (`default` where it does not);
    read once per process, not at every candidate."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text = Path(path).read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * scale)
    return max(sizes, default=default)


ROTATION_MOST = 256 << 20  # bytes of weight copies a rotated timing cycles through, at most


def rotation_bytes() -> int:
    """Bytes of weight copies a rotated timing cycles through: twice the last-level cache, at most ROTATION_MOST.
    On an Intel host whose L3 reads 480 MiB, twice that had each candidate of a BERT-sized dense copy and pack 64
    copies of its 9.4 MB weights (0.4-1.6 s a candidate for a 2-5 ms kernel, half of a 32-trial tune's 39 s), to
    time it within 8% of what 256 MiB of copies times (29 copies; 2 threads, two configs each of three dense
    shapes)."""
    return min(2 * last_level_cache_bytes(), ROTATION_MOST)


@functools.cache
def host_flush_buffer() -> np.ndarray:
    """This process's flush buffer, twice the host's last-level cache (workers.flush writes it), written once here:
    that faults in every page (0.2 s for 64 MB here); a flush after that takes 4 ms."""
    buffer = np.zeros(2 * last_level_cache_bytes() // 4, np.float32)
    buffer += 1.0
    return buffer


def time_samples(fn: Callable[[], object], repeat: int = 5, min_repeat_ms: float = 20.0,
                 flush: Callable[[], None] | None = None, cooldown_ms: float = 0.0, number: int | None = None) -> list[float]:
    """Seconds per call, one value per sample of `number` calls (by default the count calls_per_sample finds; one
    with a flush); every sample is kept (take the median, not the mean)."""
    fn()  # warm-up: page faults, caches, thread pool start
    number = number or (1 if flush else calls_per_sample(fn, min_repeat_ms))
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


def rotated_samples(calls: list[Callable[[], object]], repeat: int, before: Callable[[], None]) -> list[float]:
    """Seconds of `repeat` single calls, each of the next of `calls` in turn from the first: `calls` come in the order
    their memory was last touched, the longest ago first (workers.reference.WeightCopies), so each timed call reads
    memory that all the others were touched after. The last, touched most recently, runs once first, untimed, to
    wake the threads. `before` runs, untimed, ahead of each timed call."""
    calls[-1]()
    samples = []
    for sample in range(repeat):
        call = calls[sample % len(calls)]
        before()
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def producer_writes(arrays: list[np.ndarray]) -> Callable[[], None]:
    """A call that writes the arrays over again with their own values, from this thread, as the op before a kernel
    leaves its inputs in a model: just written, dirty in one core's cache. A kernel's threads on the other cores read
    them from there, not from their own caches as after a warm call; on a Zen 5 host (2 threads) BERT-base's FFN
    down projection as tuned warm took 1.18-1.20 ms on inputs it had read last and 1.48-1.68 ms on inputs so written
    (1.45-1.61 ms after the up projection that writes them in the model), while a config that reads its A in longer
    runs took 1.21 and 1.22-1.23 ms (in some phases of the host; in others all four ran alike)."""
    sources = [array.copy() for array in arrays]

    def write() -> None:
        for array, source in zip(arrays, sources):
            np.copyto(array, source)
    return write
