"""The machine's peak FMA rate, measured with a kernel of independent vector FMA chains written in
tensortune's own loop-nest IR and compiled by its own code generator."""
from __future__ import annotations

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


def peak_gflops(target: Target) -> float:
    """GFLOPS of CHAINS independent FMA chains per thread at the target's widest vector width."""
    width = target.vector_bits // 32
    (function,), _compiled = compile_program(peak_program(target.threads, width), target)
    x = np.full(width, 1e-3, np.float32)
    out = np.empty((target.threads, CHAINS, width), np.float32)
    seconds = min(time_samples(lambda: function(x.ctypes.data, out.ctypes.data), repeat=5, min_repeat_ms=50))
    return 2 * width * CHAINS * ITERATIONS * target.threads / seconds / 1e9
