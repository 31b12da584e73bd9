"""`python -m bench.tile_stream [M N K [DTYPE]]`: how fast AMX's tile products can run where a GEMM of few rows
feeds them, so that a tuned kernel's fraction of the AMX peak reads against what its tile loads allow.

The GEMM template's AMX nests hold C in register groups of 2 × 2 tiles (of eight tile registers, four are C's, two
A's and two B's), so each k step loads four tiles, 4 KB, for four tile products. This times that step alone over a
whole product C[M × N] = A[M × K] · Bp (B packed in 32-column panels, as the template packs it): each panel in turn
and, for each, every pair of A's row tiles through the whole k, as the fallback's nest runs them, one thread, in
three ways:
- stream: each step loads the next tiles (at BERT's 128 rows, A and each panel come from L2, not L1);
- in L1: each step loads the first step's tiles again (4 KB that stay in L1);
- loads: the stream's tile loads without the products;
beside the products alone (`workers.peak`'s AMX peak) and the template's own dense kernel of the shape (the best
config stored in the default database, $TENSORTUNE_DB or ./tensortune.db, else the fallback; its weights bound), in
alternating rounds. The step loop has no write-back, no prefetch, no edges: what is left is the tile unit and where
its operands lie.
"""
from __future__ import annotations

import statistics
import sys
from typing import Callable

import numpy as np
from llvmlite import ir

from search_space import Target, dense
from search_space.workload import aligned
from workers import build
from workers.kernel import cfunc
from workers.llvm_amx import A_REGISTERS, B_REGISTERS, C_REGISTERS, GROUP, STEP, TILE, Tiles, counted
from workers.llvm_jit import compile_module
from workers.reference import alternating_samples, inference_call, median_ratio

from workers.peak import TILE_PRODUCTS, tile_peak_call

PLACEMENTS = ("stream", "in L1", "loads")
# dtype: its AMX family, A's and B's element types, the sums' type
DTYPES = {"bfloat16": ("amx-bf16", "bfloat16", "bfloat16", np.float32), "int8": ("amx-int8", np.uint8, np.int8,
                                                                                 np.int32)}
PANEL = 2 * TILE  # columns of a packed panel: the group's two B tiles
ROUNDS = 7
ONE_THREAD = "llvm -threads=1"  # this host, one thread: what everything here runs on


def stream_module(dtype: str, m: int, n: int, k: int, placement: str) -> ir.Module:
    """`void run(ptr A, ptr Bp, ptr C)`: C = A · Bp in 2 × 2-tile groups, A [m × k] row-major, Bp [n/32][k/g][32][g]
    (g = k per 4-byte group), C [m × n] in 32-bit sums; the step loads as the template's does (both A tiles, then
    each B tile and its two products) from where `placement` says."""
    family, g = DTYPES[dtype][0], _per_group(dtype)
    depth = STEP * GROUP  # bytes of k a step: one row of an A tile
    a_stride, b_stride, c_stride = k * GROUP // g, PANEL * GROUP, 4 * n
    steps = k // (STEP * g)
    module = ir.Module(name=f"tile_stream_{family}")
    i64 = ir.IntType(64)
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()] * 3), "run")
    a, bp, c = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))
    tiles, long = Tiles.of(b), (lambda value: ir.Constant(i64, value))
    at = lambda base, offset: b.gep(base, [offset], source_etype=ir.IntType(8))
    product = TILE_PRODUCTS[family][0]
    tiles.configure((TILE, TILE, STEP))

    def panel(p):
        def row_pair(i):
            for register in C_REGISTERS:
                tiles.zero(register)

            def step(s):
                s = long(0) if placement == "in L1" else s
                rows = b.mul(i, long(2 * TILE * a_stride))
                for row, register in enumerate(A_REGISTERS):
                    tiles.load(register, at(a, b.add(rows, b.add(long(row * TILE * a_stride), b.mul(s, long(depth))))),
                               a_stride)
                for column, register in enumerate(B_REGISTERS):
                    start = b.add(b.mul(p, long(k // g * b_stride)), b.mul(s, long(STEP * b_stride)))
                    tiles.load(register, at(bp, b.add(start, long(TILE * GROUP * column))), b_stride)
                    for row in range(2) if placement != "loads" else ():
                        tiles.dot(product, C_REGISTERS[2 * row + column], A_REGISTERS[row], register)
            counted(b, function, steps, step)
            for tile, register in enumerate(C_REGISTERS):
                row, column = divmod(tile, 2)
                offset = b.add(b.mul(i, long(2 * TILE * c_stride)), b.mul(p, long(PANEL * 4)))
                tiles.store(register, at(c, b.add(offset, long(row * TILE * c_stride + column * TILE * 4))), c_stride)
        counted(b, function, m // PANEL, row_pair)
    counted(b, function, n // PANEL, panel)
    tiles.release()
    b.ret_void()
    return module


def _per_group(dtype: str) -> int:
    """k in a 4-byte group: two bf16 or four bytes (a tile product takes STEP groups)."""
    return 4 // np.dtype(DTYPES[dtype][2]).itemsize


def operands(m: int, n: int, k: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [m × k] and B [k × n] at random in the dtype's operand types, and B packed as `stream_module` reads it."""
    _, a_type, b_type, _ = DTYPES[dtype]
    rng = np.random.default_rng(seed)
    if dtype == "int8":
        a, b = rng.integers(0, 256, (m, k)).astype(a_type), rng.integers(-128, 128, (k, n)).astype(b_type)
    else:
        a, b = rng.standard_normal((m, k)).astype(a_type), rng.standard_normal((k, n)).astype(b_type)
    g = _per_group(dtype)
    packed = b.reshape(k // g, g, n // PANEL, PANEL).transpose(2, 0, 3, 1)
    return aligned(a), b, aligned(np.ascontiguousarray(packed))


def amx_target(dtype: str, target: str = ONE_THREAD) -> Target:
    """The target, refused unless it has the dtype's AMX family: without it LLVM aborts the process compiling tile
    instructions ("Cannot select: intrinsic %llvm.x86.ldtilecfg"), and a CPU without it faults on them."""
    parsed, family = Target.parse(target), DTYPES[dtype][0]
    if missing := {"amx-tile", family} - set(parsed.features):
        raise ValueError(f"bench.tile_stream times AMX's tile products, and {parsed} has no "
                         f"{', '.join(sorted(missing))}")
    return parsed


def stream_call(dtype: str, m: int, n: int, k: int, placement: str,
                target: str = ONE_THREAD) -> tuple[Callable[[], None], np.ndarray]:
    """A zero-argument call running `stream_module` on operands of its own on the target (one thread of an AMX
    host), and the C it writes."""
    if m % PANEL or n % PANEL or k % (STEP * _per_group(dtype)):
        raise ValueError(f"tile_stream needs M and N multiples of {PANEL} and K of {STEP * _per_group(dtype)}: "
                         f"got {m} × {n} × {k}")
    compiled = compile_module(stream_module(dtype, m, n, k, placement), amx_target(dtype, target))
    run = cfunc(compiled.address("run"), 3)
    a, _, packed = operands(m, n, k, dtype)
    c = aligned(np.empty((m, n), DTYPES[dtype][3]))
    return lambda: (compiled, run(a.ctypes.data, packed.ctypes.data, c.ctypes.data)), c


def kernel_call(dtype: str, m: int, n: int, k: int) -> tuple[Callable[[], None], str]:
    """The template's dense kernel of the shape on one thread, its weights bound, with the best config the default
    database holds for it (else the fallback), and which config that is."""
    from db import apply_history_best  # here: the step loops need no database

    workload = dense(m, n, k, dtype=dtype)
    with apply_history_best() as context:
        kernel = build(workload, Target.parse(ONE_THREAD))
    origin = "the fallback: none stored" if context.warned else "the best stored"
    return inference_call(kernel, workload.random_inputs())[0], f"config {kernel.config.index}, {origin}"


def rates(m: int, n: int, k: int, dtype: str = "bfloat16") -> tuple[dict[str, list[float]], dict[str, float], str]:
    """GFLOPS (GOPS for int8; for `loads`, the product's operations over its time) of each placement, of the
    template's kernel ("kernel") and of the peak ("peak"), one per round, the ways alternating within each round
    (`alternating_samples`); each way's fraction of the peak, the median of the rounds' ratios; and which config the
    kernel has."""
    peak, peak_operations = tile_peak_call(amx_target(dtype), DTYPES[dtype][0])
    calls = {placement: stream_call(dtype, m, n, k, placement)[0] for placement in PLACEMENTS}
    calls["kernel"], config = kernel_call(dtype, m, n, k)
    calls["peak"] = peak
    operations = dict.fromkeys(calls, 2 * m * n * k) | {"peak": peak_operations}
    samples = alternating_samples(calls, 1, ROUNDS)
    found = {name: [operations[name] / seconds / 1e9 for seconds in values] for name, values in samples.items()}
    fractions = {name: median_ratio(samples, "peak", name, operations[name] / peak_operations)[0] for name in calls}
    return found, fractions, config


def main() -> None:
    m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (128, 768, 768)
    dtype = sys.argv[4] if len(sys.argv) > 4 else "bfloat16"
    try:
        found, fractions, config = rates(m, n, k, dtype)
    except ValueError as error:  # no AMX here, or a shape it cannot tile
        sys.exit(str(error))
    print(f"{DTYPES[dtype][0]}, C[{m} × {n}] = A[{m} × {k}] · B in 2 × 2 tiles, one thread: medians of {ROUNDS} "
          "alternating rounds (their range), GFLOPS, and the median of the rounds' fractions of the peak")
    for name, label in (("peak", "the tile products alone (peak)"), ("in L1", "2 × 2 tiles, operands in L1"),
                        ("stream", "2 × 2 tiles, streaming"), ("loads", "the stream's loads alone"),
                        ("kernel", "the template's dense kernel")):
        values = found[name]
        print(f"  {label:32s} {statistics.median(values):7.0f} ({min(values):.0f}-{max(values):.0f})"
              f"  {fractions[name]:4.0%} of the peak" + (f": {config}" if name == "kernel" else ""))


if __name__ == "__main__":
    main()
