"""The machine's peak FMA rate, and what launching a parallel kernel costs, both measured with
kernels written in tensortune's own loop-nest IR and compiled by its own code generator."""
from __future__ import annotations

from typing import Callable

import numpy as np

from search_space import Target
from search_space.program import Buffer, Loop, Op, Program, Stage, var
from workers import compile_program
from workers.timing import time_samples

CHAINS = 12  # FMA latency 4 × 2 pipes, plus slack: enough independent chains to fill both FMA units
ITERATIONS = 200_000


def peak_program(threads: int, width: int) -> Program:
    x = Buffer("x", (width,), "input")
    out = Buffer("out", (threads, CHAINS, width), "output")
    acc = Buffer("acc", (CHAINS, width), "register")
    lanes = lambda body: Loop("a", CHAINS, "unrolled", (Loop("l", width, "vectorized", (body,)),))
    a, l = var("a"), var("l")
    body = (
        lanes(acc.store((a, l), x[l])),
        Loop("i", ITERATIONS, "serial", (lanes(acc.store((a, l), Op("fma", (acc[a, l], x[l], x[l])))),)),
        lanes(out.store((var("t"), a, l), acc[a, l])),
    )
    return Program("peak_fma", (x, out, acc), (Stage("peak", (Loop("t", threads, "parallel", body),)),))


def peak_call(target: Target) -> tuple[Callable[[], None], int]:
    """A zero-argument call running CHAINS independent FMA chains per thread at the target's widest
    vector width, and the flops of one call. It touches no memory: only the cores' own speed shows."""
    width = target.vector_bits // 32
    (function,), compiled = compile_program(peak_program(target.threads, width), target)
    x = np.full(width, 1e-3, np.float32)
    out = np.empty((target.threads, CHAINS, width), np.float32)
    call = lambda: (compiled, function(x.ctypes.data, out.ctypes.data))  # keeps the machine code alive
    return call, 2 * width * CHAINS * ITERATIONS * target.threads


def peak_gflops(target: Target) -> float:
    call, flops = peak_call(target)
    return flops / min(time_samples(call, repeat=5, min_repeat_ms=50)) / 1e9


def launch_microseconds(target: Target) -> float:
    """Median cost of one call from Python of a kernel whose parallel loop does one store per thread."""
    out = Buffer("out", (target.threads,), "output")
    x = Buffer("x", (1,), "input")
    body = (Loop("t", target.threads, "parallel", (out.store(var("t"), x[0]),)),)
    (function,), _compiled = compile_program(Program("launch", (x, out), (Stage("launch", body),)), target)
    xs, outs = np.ones(1, np.float32), np.empty(target.threads, np.float32)
    return float(np.median(time_samples(lambda: function(xs.ctypes.data, outs.ctypes.data), 7, 20))) * 1e6
