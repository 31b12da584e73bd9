"""The cache flush before a timed CPU call (the `flush` protocol of workers.task), written by the timed kernel's
own threads.

A flush times a call cold: a layer of a model finds its weights evicted by the layers before it. In a model its
threads are awake, though: the op before it ran on them (libgomp's workers spin a
while after each parallel region). The flush is therefore a kernel of the project's IR whose parallel loop
runs through libgomp like the timed kernels', on the target's threads, and the timed call starts as in a
model. Written by one thread (NumPy), the flush let the other threads fall asleep, and a kernel timed after
it started on one thread that streamed the weights from memory while the others woke and read them from
cache: dense 32×3072×768 + gelu with its rows split between two threads timed 441 µs that way on Zen 5, the
same kernel ran 793 µs in a model-like sequence of layers, 889 µs timed after this flush.
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
