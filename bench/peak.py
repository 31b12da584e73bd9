"""The machine's peak FMA rate (and AVX-512 BF16's pair-dot rate, where it has that), and what launching a
parallel kernel costs, all measured with kernels written in tensortune's own loop-nest IR and compiled by its
own code generator."""
from __future__ import annotations

from typing import Callable

import numpy as np

from search_space import Target
from search_space.program import Buffer, Loop, Op, Program, Stage, var
from workers import compile_program
from workers.timing import time_samples

CHAINS = 12  # FMA latency 4 × 2 pipes, plus slack: enough independent chains to fill both FMA units
ITERATIONS = 200_000


FAMILIES = {"fma": ("float32", 2), "avx512bf16": ("bfloat16", 4)}  # instruction family: its operands, flops a lane


def peak_program(threads: int, width: int, family: str = "fma") -> Program:
    """CHAINS accumulator vectors, each updated ITERATIONS times by the family's instruction: `fma` by
    acc·x + x, `avx512bf16` by the pair dot of x's first pair with its lanes' pairs."""
    dtype, _ = FAMILIES[family]
    x = Buffer("x", (2 * width,), "input", dtype)
    out = Buffer("out", (threads, CHAINS, width), "output")
    acc = Buffer("acc", (CHAINS, width), "register")
    lanes = lambda body: Loop("a", CHAINS, "unrolled", (Loop("l", width, "vectorized", (body,)),))
    a, l = var("a"), var("l")
    update = Op("fma", (acc[a, l], x[l], x[l])) if family == "fma" else \
        Op("dot2_bf16", (x[0], x[l * 2], x[1], x[l * 2 + 1], acc[a, l]))
    body = (
        lanes(acc.store((a, l), x[l])),
        Loop("i", ITERATIONS, "serial", (lanes(acc.store((a, l), update)),)),
        lanes(out.store((var("t"), a, l), acc[a, l])),
    )
    return Program(f"peak_{family}", (x, out, acc), (Stage("peak", (Loop("t", threads, "parallel", body),)),))


def peak_call(target: Target, family: str = "fma") -> tuple[Callable[[], None], int]:
    """A zero-argument call running CHAINS independent chains of the family's instruction per thread at the
    target's widest vector width, and the flops of one call. It touches no memory: only the cores' own speed
    shows."""
    width = target.vector_bits // 32
    (function,), compiled = compile_program(peak_program(target.threads, width, family), target)
    dtype, flops_per_lane = FAMILIES[family]
    x = np.full(2 * width, 1e-3, np.float32).astype(dtype)
    out = np.empty((target.threads, CHAINS, width), np.float32)
    call = lambda: (compiled, function(x.ctypes.data, out.ctypes.data))  # keeps the machine code alive
    return call, flops_per_lane * width * CHAINS * ITERATIONS * target.threads


def peak_gflops(target: Target, family: str = "fma") -> float:
    call, flops = peak_call(target, family)
    return flops / min(time_samples(call, repeat=5, min_repeat_ms=50)) / 1e9


def family_peaks(target: Target, dtype: str) -> dict[str, float]:
    """The peak rate of each instruction family a kernel of this dtype may use on the target (the GEMM
    template's `isa` knob); float32's only family is `fma`."""
    from search_space.templates.gemm import isas

    return {family: peak_gflops(target, family) for family in (isas(target) if dtype == "bfloat16" else ("fma",))}


def launch_microseconds(target: Target) -> float:
    """Median cost of one call from Python of a kernel whose parallel loop does one store per thread."""
    out = Buffer("out", (target.threads,), "output")
    x = Buffer("x", (1,), "input")
    body = (Loop("t", target.threads, "parallel", (out.store(var("t"), x[0]),)),)
    (function,), _compiled = compile_program(Program("launch", (x, out), (Stage("launch", body),)), target)
    xs, outs = np.ones(1, np.float32), np.empty(target.threads, np.float32)
    return float(np.median(time_samples(lambda: function(xs.ctypes.data, outs.ctypes.data), 7, 20))) * 1e6
