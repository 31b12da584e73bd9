"""The cache flush before a timed CPU call (the `flush` protocol of workers.task), written by the timed kernel's
own threads.

A flush times a call cold, as a layer of a model finds its weights, evicted by the layers before it. In a model
its threads are awake, though: the op before it ran on them, and libgomp's workers spin a while after each
parallel region. So the flush is a kernel of the project's IR whose parallel loop runs through libgomp on the
target's threads, as the timed kernels' loops do. Written by one thread (NumPy), it let the other threads fall
asleep, and every timed call paid a wake-up that calls in a model do not: fallback configs on Zen 5,
batch_matmul 12×32×32×64 70.7 µs after NumPy's flush, 53.7 after this one (12.3 warm).
"""
from __future__ import annotations

import functools
from typing import Callable

from search_space import Target
from search_space.program import Buffer, Const, Loop, Op, Program, Stage, var

from .build import compile_program
from .timing import host_flush_buffer


def flush_program(threads: int, rows: int, width: int) -> Program:
    """Each of `threads` threads adds one to its `rows` × `width` floats of the buffer, `width` at a time."""
    lines = Buffer("lines", (threads, rows, width), "output")
    index = (var("t"), var("r"), var("l"))
    add = lines.store(index, Op("add", (lines[index], Const(1.0))))
    body = Loop("r", rows, "serial", (Loop("l", width, "vectorized", (add,)),))
    return Program("flush", (lines,), (Stage("flush", (Loop("t", threads, "parallel", (body,)),)),))


@functools.cache
def host_flusher(target: Target) -> Callable[[], None]:
    """The flush before each timed call of a kernel for `target`: twice the host's last-level cache written by
    the target's threads (the process's one flush buffer, compiled once per target)."""
    buffer = host_flush_buffer()
    width = target.vector_bits // 32
    program = flush_program(target.threads, buffer.nbytes // (4 * width * target.threads), width)
    (function,), compiled = compile_program(program, target)
    return lambda: (compiled, function(buffer.ctypes.data))  # keeps the machine code alive
