"""Checking and timing a CudaKernel on its GPU, the way Triton's do_bench does.

Inputs are copied to the GPU once. The result is copied back and checked against NumPy on the
host. Timing: warm-up calls first; then every timed call is preceded by a write of twice the
L2 cache (so each call starts with a cold L2, as a layer in a network sees it) and bracketed
by CUDA events, which time the GPU's work alone, not Python's launch overhead. A sample is the
mean of enough calls to last `min_repeat_ms`.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from search_space import Workload

from .cuda_kernel import CudaKernel
from .task import MeasureOptions

WARMUP_CALLS = 3
MAX_CALLS_PER_SAMPLE = 1000


class CudaTimedCall:
    """One kernel launch over fixed device inputs: callable, its output on the host, its timing samples."""

    def __init__(self, kernel: CudaKernel, inputs):
        self.kernel = kernel
        self.arrays, _ = kernel.device_arrays(inputs)

    def __call__(self) -> None:
        self.kernel.launch(self.arrays)

    def output(self) -> np.ndarray:
        self()
        return self.arrays[self.kernel.output.name].get()

    def samples(self, options: MeasureOptions) -> list[float]:
        return event_samples(self, options)


def event_samples(fn: Callable[[], object], options: MeasureOptions) -> list[float]:
    """Seconds per call of `fn` (work it queues on the current stream), one value per sample."""
    import cupy

    from search_space.gpu_device import host_gpus

    l2 = host_gpus()[cupy.cuda.Device().id].l2_bytes
    flush = cupy.empty(2 * l2 // 4, np.float32)
    for _ in range(WARMUP_CALLS):
        fn()
    once = np.mean(_timed(fn, flush, WARMUP_CALLS))
    calls = min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(options.min_repeat_ms / max(once, 1e-3))))
    samples = []
    for _ in range(options.repeat):
        samples.append(float(np.mean(_timed(fn, flush, calls))) / 1e3)
        if options.cooldown_ms:
            time.sleep(options.cooldown_ms / 1e3)
    return samples


def cublas_call(workload: Workload, inputs) -> Callable[[], object]:
    """The reference on the GPU: the core product by CuPy (cuBLAS SGEMM, batched for batch_matmul), into a
    preallocated output."""
    import cupy

    a, b = (cupy.asarray(x) for x in inputs[:2])
    if workload.op == "dense":
        b = b.T
    out = cupy.empty(workload.output_shape, np.float32)
    return lambda: cupy.matmul(a, b, out=out)


def cuda_head_to_head(calls: dict[str, Callable[[], object]], rounds: int, min_repeat_ms: float) -> dict[str, float]:
    """Median seconds per call of each contender, timed by events in alternating rounds: a passing clock change
    hits all alike."""
    options = MeasureOptions(repeat=1, min_repeat_ms=min_repeat_ms)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name] += event_samples(call, options)
    return {name: float(np.median(s)) for name, s in samples.items()}


def _timed(fn: Callable[[], object], flush, calls: int) -> list[float]:
    """Milliseconds of each of `calls` calls, the L2 flushed before each, read after one synchronisation."""
    import cupy

    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(calls)]
    for start, end in events:
        flush.fill(0)
        start.record()
        fn()
        end.record()
    events[-1][1].synchronize()
    return [cupy.cuda.get_elapsed_time(start, end) for start, end in events]
