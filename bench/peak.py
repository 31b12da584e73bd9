"""The machine's peak FMA rate (and AVX-512 BF16's pair-dot and VNNI's byte-quad-dot rates, where it has them),
and what launching a parallel kernel costs, all measured with kernels written in tensortune's own loop-nest IR and compiled by its
own code generator."""
from __future__ import annotations

from typing import Callable

import numpy as np

from search_space import Target
from search_space.program import ITEMSIZE, Buffer, Const, Loop, Op, Program, Stage, var
from workers import compile_program
from workers.timing import time_samples

CHAINS = 12  # FMA latency 4 × 2 pipes, plus slack: enough independent chains to fill both FMA units
ITERATIONS = 200_000


# instruction family: its operands (A's, B's), the dtype it sums in, flops a 32-bit lane
FAMILIES = {"fma": ("float32", "float32", "float32", 2), "avx512bf16": ("bfloat16", "bfloat16", "float32", 4),
            "avx512vnni": ("uint8", "int8", "int32", 8)}


def peak_program(threads: int, width: int, family: str = "fma") -> Program:
    """CHAINS accumulator vectors, each updated ITERATIONS times by the family's instruction: `fma` by
    acc·x + y, a group dot by the dot of x's first group with y's group in each lane."""
    from search_space.templates.gemm import DOTS

    a_dtype, b_dtype, sums, _ = FAMILIES[family]
    group = 4 // ITEMSIZE[a_dtype]
    x, y = Buffer("x", (group * width,), "input", a_dtype), Buffer("y", (group * width,), "input", b_dtype)
    out = Buffer("out", (threads, CHAINS, width), "output", sums)
    acc = Buffer("acc", (CHAINS, width), "register", sums)
    lanes = lambda body: Loop("a", CHAINS, "unrolled", (Loop("l", width, "vectorized", (body,)),))
    a, l = var("a"), var("l")
    update = Op("fma", (acc[a, l], x[l], y[l])) if family == "fma" else \
        Op(DOTS[family], tuple(v for j in range(group) for v in (x[j], y[l * group + j])) + (acc[a, l],))
    body = (
        lanes(acc.store((a, l), Const(0 if sums == "int32" else 0.0))),
        Loop("i", ITERATIONS, "serial", (lanes(acc.store((a, l), update)),)),
        lanes(out.store((var("t"), a, l), acc[a, l])),
    )
    return Program(f"peak_{family}", (x, y, out, acc), (Stage("peak", (Loop("t", threads, "parallel", body),)),))


def peak_call(target: Target, family: str = "fma") -> tuple[Callable[[], None], int]:
    """A zero-argument call running CHAINS independent chains of the family's instruction per thread at the
    target's widest vector width, and the flops of one call. It touches no memory: only the cores' own speed
    shows."""
    width = target.vector_bits // 32
    (function,), compiled = compile_program(peak_program(target.threads, width, family), target)
    a_dtype, b_dtype, sums, flops_per_lane = FAMILIES[family]
    x, y = (np.ones(4 // ITEMSIZE[a_dtype] * width, dtype) for dtype in (a_dtype, b_dtype))  # as peak_program's
    out = np.empty((target.threads, CHAINS, width), sums)
    call = lambda: (compiled, function(x.ctypes.data, y.ctypes.data, out.ctypes.data))  # keeps the machine code alive
    return call, flops_per_lane * width * CHAINS * ITERATIONS * target.threads


def peak_gflops(target: Target, family: str = "fma") -> float:
    call, flops = peak_call(target, family)
    return flops / min(time_samples(call, repeat=5, min_repeat_ms=50)) / 1e9


def family_peaks(target: Target, dtype: str) -> dict[str, float]:
    """The peak rate of each instruction family a kernel of this dtype may use on the target (the GEMM
    template's `isa` knob) and that has a peak of its own: float32's only family is `fma`; int8's `widen` has
    none (integer multiplies and adds whose mix depends on the kernel), its kernels stand beside the FMA's."""
    from search_space.templates.gemm import isas

    families = isas(target, dtype) if dtype != "float32" else ("fma",)
    return {family: peak_gflops(target, family) for family in families if family in FAMILIES}


def launch_microseconds(target: Target) -> float:
    """Median cost of one call from Python of a kernel whose parallel loop does one store per thread."""
    out = Buffer("out", (target.threads,), "output")
    x = Buffer("x", (1,), "input")
    body = (Loop("t", target.threads, "parallel", (out.store(var("t"), x[0]),)),)
    (function,), _compiled = compile_program(Program("launch", (x, out), (Stage("launch", body),)), target)
    xs, outs = np.ones(1, np.float32), np.empty(target.threads, np.float32)
    return float(np.median(time_samples(lambda: function(xs.ctypes.data, outs.ctypes.data), 7, 20))) * 1e6
