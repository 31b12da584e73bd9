"""The machine's peak FMA rate (and int8's widened and pmaddubsw byte-quad dots, AVX-512 BF16's pair-dot, VNNI's
byte-quad-dot and AMX's tile-product rates, where it has them), and what launching a parallel kernel costs, all
measured with kernels written in tensortune's own loop-nest IR (the x86 byte dots' and AMX's in LLVM IR through their
intrinsics) and compiled by its own code generator."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from llvmlite import ir

from search_space import Target
from search_space.program import ITEMSIZE, Buffer, Const, Loop, Op, Program, Stage, var

from .build import compile_program
from .kernel import cfunc
from .llvm_amx import A_REGISTERS, B_REGISTERS, C_REGISTERS, STEP, TILE, Tiles
from .llvm_codegen import pmaddubsw, pmaddwd
from .llvm_jit import compile_module
from .timing import time_samples

MOST_CHAINS = 24  # two pipes of a dot slower than the FMA (Zen 5's vdpbf16ps: 8% under its rate on 12), and slack
ITERATIONS = 200_000


# instruction family: its operands (A's, B's), the dtype it sums in, flops a 32-bit lane
FAMILIES = {"fma": ("float32", "float32", "float32", 2), "avx512bf16": ("bfloat16", "bfloat16", "float32", 4),
            "avx512vnni": ("uint8", "int8", "int32", 8)}
# a family whose product is another's instruction, and that family: bfloat16 widened to float32 copies runs FMAs
RUNS_AS = {"fma-f32": "fma"}
# AMX family: its tile product (an IR op), operations of one product (16 × 16 sums of 32 bf16 or 64 byte products)
TILE_PRODUCTS = {"amx-bf16": ("dot2_amx", 2 * 16 * 16 * 32), "amx-int8": ("dot4_amx", 2 * 16 * 16 * 64)}
TILE_ITERATIONS = 20_000
BYTE_DOT_OPS = 8  # int8's `widen` and `pmaddubsw`: a byte quad's dot, four multiply-adds a 32-bit lane
BYTE_DOTS = ("widen", "pmaddubsw")  # int8's families whose peak kernels are written with x86 intrinsics


def chains(target: Target) -> int:
    """Independent accumulator vectors a thread of a peak kernel carries: enough to keep two pipes of the slowest
    family busy through its latency, and no more than the register file holds beside the operands (AVX2's 16
    registers: 12)."""
    return min(MOST_CHAINS, target.vector_registers - 4)


def peak_program(threads: int, width: int, family: str, accumulators: int) -> Program:
    """`accumulators` vectors, each updated ITERATIONS times by the family's instruction: `fma` by
    acc·x + y, a group dot by the dot of x's first group with y's group in each lane."""
    from search_space.templates.gemm import DOTS

    a_dtype, b_dtype, sums, _ = FAMILIES[family]
    group = 4 // ITEMSIZE[a_dtype]
    x, y = Buffer("x", (group * width,), "input", a_dtype), Buffer("y", (group * width,), "input", b_dtype)
    out = Buffer("out", (threads, accumulators, width), "output", sums)
    acc = Buffer("acc", (accumulators, width), "register", sums)
    lanes = lambda body: Loop("a", accumulators, "unrolled", (Loop("l", width, "vectorized", (body,)),))
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
    """A zero-argument call running `chains(target)` independent chains of the family's instruction per thread at the
    target's widest vector width, and the flops of one call. It touches no memory: only the cores' own speed
    shows."""
    width, count = target.vector_bits // 32, chains(target)
    (function,), compiled = compile_program(peak_program(target.threads, width, family, count), target)
    a_dtype, b_dtype, sums, flops_per_lane = FAMILIES[family]
    x, y = (np.ones(4 // ITEMSIZE[a_dtype] * width, dtype) for dtype in (a_dtype, b_dtype))  # as peak_program's
    out = np.empty((target.threads, count, width), sums)
    call = lambda: (compiled, function(x.ctypes.data, y.ctypes.data, out.ctypes.data))  # keeps the machine code alive
    return call, flops_per_lane * width * count * ITERATIONS * target.threads


def tile_peak_module(family: str) -> ir.Module:
    """`void peak(ptr tiles)`: TILE_ITERATIONS times, four tile products into four C tiles from two A and two B
    tiles loaded once (each product depends on the last into its C, four apart: enough to keep the unit busy)."""
    module = ir.Module(name=f"peak_{family}")
    i64 = ir.IntType(64)
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()]), "peak")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    tiles = Tiles.of(b)
    tile = lambda n: b.gep(function.args[0], [ir.Constant(i64, 1024 * n)], source_etype=ir.IntType(8))
    registers = C_REGISTERS + A_REGISTERS + B_REGISTERS  # C's four tiles, then two of A and two of B
    tiles.configure((TILE, TILE, STEP))
    for n, register in enumerate(registers):
        tiles.load(register, tile(n), 64)
    entry, loop, done = b.block, function.append_basic_block("loop"), function.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    index = b.phi(i64)
    for n, c in enumerate(C_REGISTERS):
        tiles.dot(TILE_PRODUCTS[family][0], c, A_REGISTERS[n // 2], B_REGISTERS[n % 2])
    step = b.add(index, ir.Constant(i64, 1))
    index.add_incoming(ir.Constant(i64, 0), entry)
    index.add_incoming(step, loop)
    b.cbranch(b.icmp_signed("<", step, ir.Constant(i64, TILE_ITERATIONS)), loop, done)
    b.position_at_end(done)
    for n, c in enumerate(C_REGISTERS):
        tiles.store(c, tile(n), 64)
    tiles.release()
    b.ret_void()
    return module


def byte_dot_peak_module(target: Target, family: str) -> ir.Module:
    """`void peak(ptr out)`: ITERATIONS times, `chains(target)` accumulator vectors of the target's widest width each
    add the byte-quad dot as the code generator runs `family` on x86 (the accumulator's own bits as A's, so that
    nothing is loop-invariant): `widen` as two pmaddwd of 16-bit halves (two B operands) and their sum,
    `pmaddubsw` as its byte-pair sums (one B operand) multiplied by pmaddwd with ones."""
    width = target.vector_bits // 32
    module = ir.Module(name=f"peak_{family}")
    i64, words = ir.IntType(64), ir.VectorType(ir.IntType(32), width)
    halves, pairs = ir.VectorType(ir.IntType(16), 2 * width), ir.VectorType(ir.IntType(8), 4 * width)
    product = ir.Function(module, ir.FunctionType(words, [halves, halves]), pmaddwd(width, target.features))
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()]), "peak")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    if family == "pmaddubsw":
        byte_pairs = ir.Function(module, ir.FunctionType(halves, [pairs, pairs]), pmaddubsw(width, target.features))
        ones, weights = ir.Constant(halves, [1] * halves.count), ir.Constant(pairs, [3] * pairs.count)
        dot = lambda acc: b.call(product, [b.call(byte_pairs, [b.bitcast(acc, pairs), weights]), ones])
    else:
        even, odd = (ir.Constant(halves, [value] * halves.count) for value in (3, -5))
        dot = lambda acc: b.add(b.call(product, [b.bitcast(acc, halves), even]),
                                b.call(product, [b.bitcast(acc, halves), odd]))
    entry, loop, done = b.block, function.append_basic_block("loop"), function.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    index, carried = b.phi(i64), [b.phi(words) for _ in range(chains(target))]
    following = []
    for acc in carried:
        following.append(b.add(acc, dot(acc)))
    step = b.add(index, ir.Constant(i64, 1))
    index.add_incoming(ir.Constant(i64, 0), entry)
    index.add_incoming(step, loop)
    for n, (phi, last) in enumerate(zip(carried, following)):
        phi.add_incoming(ir.Constant(words, [n] * width), entry)
        phi.add_incoming(last, loop)
    b.cbranch(b.icmp_signed("<", step, ir.Constant(i64, ITERATIONS)), loop, done)
    b.position_at_end(done)
    for n, value in enumerate(following):
        b.store(value, b.gep(function.args[0], [ir.Constant(i64, 4 * width * n)], source_etype=ir.IntType(8)), align=4)
    b.ret_void()
    return module


def threaded_call(module: ir.Module, target: Target, bytes_per_thread: int) -> Callable[[], None]:
    """A call running `void peak(ptr)` of the module on each of the target's threads at once, each on zeroed memory of
    its own (Python threads: ctypes lets go of the GIL)."""
    compiled = compile_module(module, target)
    function = cfunc(compiled.address("peak"), 1)
    memory = [np.zeros(bytes_per_thread, np.uint8) for _ in range(target.threads)]  # zeros: no denormal or overflow
    pool = ThreadPoolExecutor(target.threads)
    return lambda: (compiled, list(pool.map(lambda m: function(m.ctypes.data), memory)))


def tile_peak_call(target: Target, family: str) -> tuple[Callable[[], None], int]:
    """A call running the tile-product peak kernel on each of the target's threads at once, and the operations of
    one call."""
    return (threaded_call(tile_peak_module(family), target, 8 * 1024),
            4 * TILE_PRODUCTS[family][1] * TILE_ITERATIONS * target.threads)


def byte_dot_peak_call(target: Target, family: str) -> tuple[Callable[[], None], int]:
    """A call running the byte-quad dot's peak kernel of `family` on each of the target's threads at once, at its
    widest vector width, and the operations of one call."""
    width, count = target.vector_bits // 32, chains(target)
    return (threaded_call(byte_dot_peak_module(target, family), target, 4 * width * count),
            BYTE_DOT_OPS * width * count * ITERATIONS * target.threads)


def has_byte_dot_peak(target: Target, family: str) -> bool:
    """Whether the target runs the byte-dot `family` by its x86 instructions at its widest vectors (its peak is
    measured then)."""
    width = target.vector_bits // 32
    return pmaddwd(width, target.features) is not None and (
        family == "widen" or pmaddubsw(width, target.features) is not None)


def family_peak_call(target: Target, family: str = "fma") -> tuple[Callable[[], None], int]:
    """The call of `family`'s peak kernel on the target's threads, and the operations of one call."""
    return (tile_peak_call(target, family) if family in TILE_PRODUCTS else
            byte_dot_peak_call(target, family) if family in BYTE_DOTS else peak_call(target, family))


def peak_gflops(target: Target, family: str = "fma") -> float:
    return peak_rate(*family_peak_call(target, family))


def peak_rate(call: Callable[[], None], operations: int, samples: int = 5, sample_ms: float = 50.0) -> float:
    """GFLOPS (or integer GOPS) of a peak kernel's call, by the fastest of `samples` samples."""
    return operations / min(time_samples(call, repeat=samples, min_repeat_ms=sample_ms)) / 1e9


def family_peak_calls(target: Target, dtype: str) -> dict[str, tuple[Callable[[], None], int]]:
    """The peak kernel's call and operations of each instruction family a kernel of this dtype may use on the target
    (the GEMM template's `isa` knob, int8's activations of a reduced range included) and that has a peak of its own:
    float32's only family is `fma`; int8's `widen` and `pmaddubsw` have one where they run by x86's instructions,
    none where their bytes are split."""
    from search_space.templates.gemm import isas

    families = isas(target, dtype, reduced=True) if dtype != "float32" else ("fma",)
    byte_dots = {family for family in BYTE_DOTS if has_byte_dot_peak(target, family)}
    measured = FAMILIES.keys() | TILE_PRODUCTS.keys() | byte_dots
    return {family: family_peak_call(target, family) for family in families if family in measured}


def family_peaks(target: Target, dtype: str) -> dict[str, float]:
    """The peak rate of each of `family_peak_calls`' families."""
    return {family: peak_rate(*call) for family, call in family_peak_calls(target, dtype).items()}


def launch_microseconds(target: Target) -> float:
    """Median cost of one call from Python of a kernel whose parallel loop does one store per thread."""
    out = Buffer("out", (target.threads,), "output")
    x = Buffer("x", (1,), "input")
    body = (Loop("t", target.threads, "parallel", (out.store(var("t"), x[0]),)),)
    (function,), _compiled = compile_program(Program("launch", (x, out), (Stage("launch", body),)), target)
    xs, outs = np.ones(1, np.float32), np.empty(target.threads, np.float32)
    return float(np.median(time_samples(lambda: function(xs.ctypes.data, outs.ctypes.data), 7, 20))) * 1e6
