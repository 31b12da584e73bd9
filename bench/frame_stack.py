"""`python -m bench.frame_stack`: what a compiled graph's calls cost where its caller sits at the worst depth of a
CPython frame-stack chunk, called plainly and through frontend.frame_stack's runner (a greenlet kept per thread),
while another thread multiplies matrices on the other core as a kernel's threads do.

A graph here is CALLS calls of a function with a small frame, as a compiled graph calls its tuned ops. For each
of the depths a chunk holds, one graph call's page faults are counted, and the depth with the most is where the
graph is then timed, both ways (the median of ROUNDS rounds of REPEAT graph calls). Up to Python 3.12 the plain way
maps and unmaps a chunk at every call it makes there (python/cpython#142183); the runner's way pays, a graph call,
two greenlet switches and the one chunk its own entry's frame crosses into.
"""
from __future__ import annotations

import resource
import statistics
import threading
import time
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from frontend.frame_stack import THRASHES, on_runner_stack

CALLS = 50  # a graph's calls (BERT-base: 6 tuned ops a layer and Inductor's kernels between them)
DEPTHS = 200  # caller depths tried: a 16 KiB chunk holds fewer frames than this
ROUNDS, REPEAT = 7, 200


def callee():
    """A call with a frame of a few hundred bytes, as a tuned op's Python is."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = None  # noqa: F841


def graph():
    for _ in range(CALLS):
        callee()


def at_depth(depth: int, fn: Callable, *args):
    return fn(*args) if depth == 0 else at_depth(depth - 1, fn, *args)


def thread_faults() -> int:
    """The page faults of this thread so far: where the thrash is, without those of the process's other threads (a
    test suite's service, Ray's and the pool's: CI's run of the whole suite counted 9.4 a runner call)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def probe(fn: Callable, repeat: int) -> tuple[float, float]:
    """Seconds and page faults a call of `fn`, over `repeat` calls."""
    faults = thread_faults()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    seconds = time.perf_counter() - start
    return seconds / repeat, (thread_faults() - faults) / repeat


def probes(depths, fn: Callable, repeat: int) -> list[tuple[float, float]]:
    """`probe` from each of `depths` frames down: the depth search and the timings call through the same frames, so
    that a depth means the same place in a chunk to both."""
    return [at_depth(depth, probe, fn, repeat) for depth in depths]


def measure(rounds: int = ROUNDS, repeat: int = REPEAT) -> dict:
    """Per way: µs and page faults a graph call (medians of the rounds) at the caller depth where the plain way
    faults most."""
    faults = [fault for _, fault in probes(range(DEPTHS), graph, 1)]
    worst = faults.index(max(faults))
    ways = {"plain": graph, "runner": on_runner_stack(graph)}
    busy = threading.Event()

    def other_core():  # NumPy releases the GIL while it multiplies, as a kernel's other thread runs outside Python
        a, product = np.ones((256, 256), np.float32), np.empty((256, 256), np.float32)
        while not busy.is_set():
            np.matmul(a, a, out=product)  # into one buffer: no allocation, no page faults of its own

    neighbour = threading.Thread(target=other_core)
    with threadpool_limits(1, user_api="blas"):
        neighbour.start()
        try:
            for fn in ways.values():  # the runner's first call makes its greenlet: a fault count of its own, once
                probes([worst], fn, 1)
            samples = {name: [] for name in ways}
            for _ in range(rounds):  # from this frame, as the depth search: no comprehension's frame between
                for name, fn in ways.items():
                    samples[name].append(probes([worst], fn, repeat)[0])
        finally:
            busy.set()
            neighbour.join()
    return {"depth": worst, "calls": CALLS, **{name: {"us": round(statistics.median(s for s, _ in rows) * 1e6, 2),
                                                     "faults": statistics.median(f for _, f in rows)}
                                              for name, rows in samples.items()}}


def main() -> None:
    if not THRASHES:
        print("this Python keeps a spare frame-stack chunk (3.13+, or not CPython): the runner is not used")
        return
    row = measure()
    print(f"a graph of {row['calls']} calls, its caller {row['depth']} frames down (the worst depth of {DEPTHS}), "
          f"another thread busy on the other core:")
    for way in ("plain", "runner"):
        print(f"  {way:6s} {row[way]['us']:8.2f} µs and {row[way]['faults']:6.1f} page faults a graph call")


if __name__ == "__main__":
    main()
