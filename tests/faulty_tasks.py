"""Test-only candidates whose generated machine code misbehaves: the faults a pool must survive.

Each `FaultyTask` lowers a hand-built loop nest for a small matmul instead of the GEMM template,
and compiles it through the real code generator and JIT. Workers import this module when they
unpickle such a task, so the tests put this directory on the workers' PYTHONPATH.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from llvmlite import ir

from search_space import Target, Workload, fallback_config
from search_space.program import Buffer, Const, Loop, Op, Program, Stage, var
from workers import Kernel, Task, compile_program
from workers.llvm_jit import compile_module

SHAPE = dict(M=16, N=16, K=16)


def faulty(fault: str, marker: str = "") -> FaultyTask:
    return FaultyTask(Workload.make("matmul", **SHAPE).key, str(Target.parse("llvm -threads=1")), "{}", fault, marker)


@dataclass(frozen=True)
class FaultyTask(Task):
    fault: str = "wrong_answer"
    marker: str = ""  # a file path: with "kill_once", only the first attempt dies

    def build(self) -> Kernel:
        workload, target = Workload.from_key(self.workload), Target.parse(self.target)
        if self.fault == "compile_error":
            compile_module(invalid_ir(), target)
        if self.fault == "kill" or (self.fault == "kill_once" and not os.path.exists(self.marker)):
            if self.marker:
                open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        start = time.perf_counter()
        program = PROGRAMS[self.fault if self.fault in PROGRAMS else "correct"]()
        stages, compiled = compile_program(program, target)
        return Kernel(workload, target, fallback_config(workload, target), program, stages, compiled,
                      time.perf_counter() - start)


A = Buffer("A", (SHAPE["M"], SHAPE["K"]), "input")
B = Buffer("B", (SHAPE["K"], SHAPE["N"]), "input")
C = Buffer("C", (SHAPE["M"], SHAPE["N"]), "output")


def matmul_nest(value, extra=()) -> Program:
    """C[m, n] = value(m, n), where value may read A and B; `extra` are more buffers."""
    m, n = var("m"), var("n")
    body = Loop("m", SHAPE["M"], "serial", (Loop("n", SHAPE["N"], "serial", (C.store((m, n), value(m, n)),)),))
    return Program("faulty", (A, B, C) + extra, (Stage("compute", (body,)),))


def correct() -> Program:
    m, n, k = var("m"), var("n"), var("k")
    zero = Loop("m", SHAPE["M"], "serial", (Loop("n", SHAPE["N"], "serial", (C.store((m, n), Const(0.0)),)),))
    acc = C.store((m, n), Op("fma", (A[m, k], B[k, n], C[m, n])))
    nest = Loop("m", SHAPE["M"], "serial", (Loop("n", SHAPE["N"], "serial", (Loop("k", SHAPE["K"], "serial", (acc,)),)),))
    return Program("faulty", (A, B, C), (Stage("zero", (zero,)), Stage("compute", (nest,))))


def out_of_bounds() -> Program:
    """Stores 2^36 elements past C: an unmapped page, so the process takes SIGSEGV."""
    return Program("faulty", (A, B, C), (Stage("compute", (C.store((1 << 32, 0), Const(1.0)),)),))


def endless() -> Program:
    """2^62 dependent floating-point adds: nothing LLVM may fold, so it runs until killed."""
    step = C.store((0, 0), Op("add", (C[0, 0], Const(1.0))))
    return Program("faulty", (A, B, C), (Stage("compute", (Loop("i", 1 << 62, "serial", (step,)),)),))


def huge_unroll() -> Program:
    """A million-iteration loop unrolled in the generated code: the build never ends in time."""
    store = C.store((0, 0), Op("add", (C[0, 0], Const(1.0))))
    return Program("faulty", (A, B, C), (Stage("compute", (Loop("i", 1 << 20, "unrolled", (store,)),)),))


def runaway_allocation() -> Program:
    """A 256 GiB scratch buffer: more than the machine can give."""
    scratch = Buffer("P", (1 << 18, 1 << 18), "packed")
    return matmul_nest(lambda m, n: Const(0.0), (scratch,))


def big_allocation() -> Program:
    """A 4 GiB scratch buffer, never touched: a host gives it, a worker's memory limit may not."""
    scratch = Buffer("P", (1 << 15, 1 << 15), "packed")
    return matmul_nest(lambda m, n: Const(0.0), (scratch,))


PROGRAMS = {
    "correct": correct, "wrong_answer": lambda: matmul_nest(lambda m, n: Const(1.0)),
    "nan": lambda: matmul_nest(lambda m, n: Const(float("nan"))), "inf": lambda: matmul_nest(lambda m, n: Const(float("inf"))),
    "out_of_bounds": out_of_bounds, "endless": endless, "huge_unroll": huge_unroll,
    "runaway_allocation": runaway_allocation, "big_allocation": big_allocation,
}


def invalid_ir() -> ir.Module:
    """A function whose only block has no terminator: LLVM's parser rejects it."""
    module = ir.Module(name="faulty")
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "broken")
    ir.IRBuilder(function.append_basic_block("entry")).add(ir.Constant(ir.IntType(32), 1), ir.Constant(ir.IntType(32), 2))
    return module
