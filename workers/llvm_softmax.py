"""Softmax over the last dimension, y = softmax(x·scale + bias), as one LLVM kernel: attention's, between its two
batch_matmuls. Not tuned (a softmax is three passes over a row in L1; there is nothing to choose), written for the
exponential: Inductor's (Sleef's, to 1 ulp) made its softmax of BERT's 12 × 128 × 128 scores 120 µs hot on a Zen 4
and ~145 µs in the model, float32 or bfloat16, where this kernel takes a fraction of it.

Each row is one pass for its maximum, one for exp(v − max) and their sum, one to scale by 1/sum, in float32 at the
target's vector width (a scalar loop for the tail of a row); bfloat16 rows are widened on load and rounded (to
nearest even) on store, their exponentials kept in float32 until then. `bias` (an additive mask) is read through
strides, so that one broadcast over heads or rows is read where it lies. A row whose every value is −inf is NaN, as
torch.softmax gives it, or zeros where `safe` (aten's _safe_softmax, what scaled_dot_product_attention gives).
Rows are split evenly over the threads, through libgomp as the tuned kernels' parallel loops are.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from typing import Callable

from llvmlite import ir

from search_space.program import ITEMSIZE
from search_space.target import Target

from .llvm_codegen import ELEMENTS, F32, I32, I64, PTR, VOID, LLVMCodegen, element, narrow, splat_constant, widen
from .llvm_jit import Compiled, compile_module
from .object_cache import object_cache

DTYPES = ("float32", "bfloat16")
LOG2E, LN2_HIGH, LN2_LOW = 1.44269504088896341, 0.693359375, -2.12194440e-4  # ln 2 in two parts, as Cephes
EXP_TERMS = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
SMALLEST = -87.33654  # below, exp underflows float32: 0 (so a −inf of a mask gives exactly 0)
# x, bias, out; rows; scale; the row index's three parts (sizes of the middle two), the bias's strides for them
ARGUMENTS = (PTR, PTR, PTR, I64, F32, I64, I64, I64, I64, I64)
CALL = ctypes.CFUNCTYPE(None, *(ctypes.c_void_p,) * 3, ctypes.c_int64, ctypes.c_float, *(ctypes.c_int64,) * 5)


def vector_width(features: tuple[str, ...]) -> int:
    """float32 lanes of the target's widest vectors."""
    return 16 if "avx512f" in features else 8 if "avx" in features else 4


def load(b: ir.IRBuilder, pointer, typ: ir.Type, align: int):
    """A `typ` at `pointer`, typed or opaque (llvmlite gives an alloca a typed pointer)."""
    return b.load(pointer if pointer.type.is_opaque else b.bitcast(pointer, typ.as_pointer()), typ=typ, align=align)


def store(b: ir.IRBuilder, value, pointer, align: int) -> None:
    b.store(value, pointer if pointer.type.is_opaque else b.bitcast(pointer, value.type.as_pointer()), align=align)


class _Emitter:
    """The IR of one kernel: helpers over a builder for scalars or vectors of one width."""

    def __init__(self, module: ir.Module, dtype: str):
        self.module, self.dtype, self.intrinsics = module, dtype, {}

    def intrinsic(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        if name not in self.intrinsics:
            self.intrinsics[name] = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return self.intrinsics[name]

    @staticmethod
    def suffix(typ: ir.Type) -> str:
        return f"v{typ.count}f32" if isinstance(typ, ir.VectorType) else "f32"

    @staticmethod
    def like(typ: ir.Type, element: ir.Type) -> ir.Type:
        """`element`s, as many as `typ` has lanes (one for a scalar)."""
        return ir.VectorType(element, typ.count) if isinstance(typ, ir.VectorType) else element

    def load(self, b: ir.IRBuilder, pointer, typ: ir.Type):
        """float32 values (`typ`) at `pointer`, held there in this kernel's dtype."""
        held = self.like(typ, ELEMENTS[self.dtype])
        return widen(b, load(b, pointer, held, align=ITEMSIZE[self.dtype]), self.dtype)

    def store(self, b: ir.IRBuilder, value, pointer) -> None:
        """float32 `value` stored at `pointer` in this kernel's dtype (bfloat16 rounded to nearest even)."""
        store(b, narrow(b, value, self.dtype), pointer, align=ITEMSIZE[self.dtype])

    def exp(self, b: ir.IRBuilder, x):
        """exp(x) for x ≤ 0 (NaN stays NaN): 2ⁿ·P(r), n = round(x·log2 e), r = x − n·ln 2, Cephes' polynomial."""
        typ = x.type
        c = lambda value: splat_constant(typ, value)
        maxnum = self.intrinsic(f"llvm.maxnum.{self.suffix(typ)}", typ, [typ, typ])
        roundeven = self.intrinsic(f"llvm.roundeven.{self.suffix(typ)}", typ, [typ])
        n = b.call(roundeven, [b.call(maxnum, [b.fmul(x, c(LOG2E)), c(-127.0)])])
        r = b.fsub(b.fsub(x, b.fmul(n, c(LN2_HIGH))), b.fmul(n, c(LN2_LOW)))
        fma = self.intrinsic(f"llvm.fma.{self.suffix(typ)}", typ, [typ, typ, typ])
        p = c(EXP_TERMS[0])
        for term in EXP_TERMS[1:]:
            p = b.call(fma, [p, r, c(term)])
        p = b.fadd(b.call(fma, [p, b.fmul(r, r), r]), c(1.0))
        wide = self.like(typ, I32)
        power = b.bitcast(b.shl(b.add(b.fptosi(n, wide), splat_constant(wide, 127)), splat_constant(wide, 23)), typ)
        return b.select(b.fcmp_ordered("<", x, c(SMALLEST)), c(0.0), b.fmul(p, power))


def halving(b: ir.IRBuilder, vector, combine):
    """The vector's lanes combined pairwise, halves then quarters: log₂ steps. LLVM's ordered reduction of a sum,
    and its maxnum of a maximum, ran lane after lane: 1536 rows of 128 took 131.8 µs so on one Zen 4 thread, 84.8
    this way."""
    while vector.type.count > 1:
        half = vector.type.count // 2
        take = lambda start: b.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined),
                                              ir.Constant(ir.VectorType(I32, half), list(range(start, start + half))))
        vector = combine(take(0), take(half))
    return b.extract_element(vector, ir.Constant(I32, 0))


def _loop(b: ir.IRBuilder, function: ir.Function, lo, hi, carried: list, body, name: str, guarded=False) -> list:
    """for i in [lo, hi): carried = body(i, carried); the final carried values. `guarded`, for a loop that may run
    zero times, carries nothing."""
    entry = b.block
    loop, done = function.append_basic_block(f"{name}.loop"), function.append_basic_block(f"{name}.done")
    if guarded:
        b.cbranch(b.icmp_signed("<", lo, hi), loop, done)
    else:
        b.branch(loop)
    b.position_at_end(loop)
    index, phis = b.phi(I64), [b.phi(value.type) for value in carried]
    for phi, value in zip([index, *phis], [lo, *carried]):
        phi.add_incoming(value, entry)
    updated = body(index, phis)
    following = b.add(index, ir.Constant(I64, 1))
    for phi, value in zip([index, *phis], [following, *updated]):
        phi.add_incoming(value, b.block)
    b.cbranch(b.icmp_signed("<", following, hi), loop, done)
    b.position_at_end(done)
    return updated


def _rows(module: ir.Module, n: int, dtype: str, width: int, safe: bool, biased: bool) -> ir.Function:
    """`softmax_rows(x, bias, out, first, last, scale, d1, d2, s0, s1, s2)`: rows [first, last)."""
    function = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, PTR, I64, I64, F32, I64, I64, I64, I64, I64]),
                           "softmax_rows")
    x, bias, out, first, last, scale, d1, d2, s0, s1, s2 = function.args
    emit, b = _Emitter(module, dtype), ir.IRBuilder(function.append_basic_block("entry"))
    item, vec, chunks = ITEMSIZE[dtype], ir.VectorType(F32, width), n // width
    exps = b.alloca(ir.ArrayType(F32, n), name="exps")  # the row's exponentials, in float32
    exps.align = 64
    splat = lambda value: {F32: value, vec: LLVMCodegen.splat(b, value, width)}  # as one float and as a vector
    scales = splat(scale)
    at = lambda base, index, size: element(b, base, ir.IntType(8 * size), index)
    lanes = lambda chunk: b.mul(chunk, ir.Constant(I64, width))
    tails = [ir.Constant(I64, i) for i in range(chunks * width, n)]
    larger = lambda u, v: b.select(b.fcmp_ordered(">", u, v), u, v)  # x86's max: NaN is caught by the sum below

    def row(r, _):
        start = b.mul(r, ir.Constant(I64, n))
        row_x, row_out = at(x, start, item), at(out, start, item)
        if biased:  # r = (i0·d1 + i1)·d2 + i2
            parts = [b.udiv(r, b.mul(d1, d2)), b.urem(b.udiv(r, d2), d1), b.urem(r, d2)]
            row_bias = at(bias, b.add(b.add(b.mul(parts[0], s0), b.mul(parts[1], s1)), b.mul(parts[2], s2)), item)

        def scored(index, typ):  # x·scale + bias at element `index`, `typ` (a vector or one float) of them
            v = b.fmul(emit.load(b, at(row_x, index, item), typ), scales[typ])
            return b.fadd(v, emit.load(b, at(row_bias, index, item), typ)) if biased else v

        top = splat_constant(vec, float("-inf"))
        if chunks:
            top, = _loop(b, function, ir.Constant(I64, 0), ir.Constant(I64, chunks), [top],
                         lambda chunk, acc: [larger(acc[0], scored(lanes(chunk), vec))], "max")
        top = halving(b, top, larger)
        for index in tails:
            top = larger(top, scored(index, F32))
        if safe:  # a row all −inf: exp(−inf − 0) = 0 everywhere, and the sum 0 below
            top = b.select(b.fcmp_ordered("==", top, splat_constant(F32, float("-inf"))), splat_constant(F32, 0.0), top)
        tops = splat(top)

        def exponential(index, typ):
            e = emit.exp(b, b.fsub(scored(index, typ), tops[typ]))
            store(b, e, at(exps, index, 4), align=4)
            return e

        total = splat_constant(vec, 0.0)
        if chunks:
            total, = _loop(b, function, ir.Constant(I64, 0), ir.Constant(I64, chunks), [total],
                           lambda chunk, acc: [b.fadd(acc[0], exponential(lanes(chunk), vec))], "sum")
        total = halving(b, total, b.fadd)
        for index in tails:
            total = b.fadd(total, exponential(index, F32))
        inverse = b.fdiv(splat_constant(F32, 1.0), total)
        if safe:
            inverse = b.select(b.fcmp_ordered("==", total, splat_constant(F32, 0.0)), splat_constant(F32, 0.0), inverse)
        inverses = splat(inverse)

        def normalized(index, typ):
            emit.store(b, b.fmul(load(b, at(exps, index, 4), typ, align=4), inverses[typ]), at(row_out, index, item))

        if chunks:
            _loop(b, function, ir.Constant(I64, 0), ir.Constant(I64, chunks), [],
                  lambda chunk, _: normalized(lanes(chunk), vec) or [], "scale")
        for index in tails:
            normalized(index, F32)
        return []

    _loop(b, function, first, last, [], row, "rows", guarded=True)
    b.ret_void()
    return function


def softmax_module(n: int, dtype: str, width: int, threads: int, safe: bool, biased: bool) -> ir.Module:
    """`softmax(x, bias, out, rows, scale, d1, d2, s0, s1, s2)` over rows of `n` elements, bias (where `biased`)
    row r starting (r / (d1·d2))·s0 + (r / d2 mod d1)·s1 + (r mod d2)·s2 elements into `bias`: the row index's
    three parts, each with its stride (0 where the bias is broadcast)."""
    module = ir.Module(name=f"softmax_{dtype}_{n}")
    rows = _rows(module, n, dtype, width, safe, biased)
    entry = ir.Function(module, ir.FunctionType(VOID, list(ARGUMENTS)), "softmax")
    b = ir.IRBuilder(entry.append_basic_block("entry"))
    x, bias, out, count, scale, *index = entry.args
    if threads == 1:
        b.call(rows, [x, bias, out, ir.Constant(I64, 0), count, scale, *index])
        b.ret_void()
        return module
    worker = ir.Function(module, ir.FunctionType(VOID, [PTR]), "softmax_worker")
    w = ir.IRBuilder(worker.append_basic_block("entry"))
    words = [w.load(w.gep(worker.args[0], [ir.Constant(I64, i)], source_etype=I64), typ=I64) for i in range(10)]
    tid = w.sext(w.call(ir.Function(module, ir.FunctionType(I32, []), "omp_get_thread_num"), []), I64)
    nth = w.sext(w.call(ir.Function(module, ir.FunctionType(I32, []), "omp_get_num_threads"), []), I64)
    share = lambda t: w.sdiv(w.mul(t, words[3]), nth)
    pointers = [w.inttoptr(word, PTR) for word in words[:3]]
    w.call(rows, [*pointers, share(tid), share(w.add(tid, ir.Constant(I64, 1))),
                  w.bitcast(w.trunc(words[4], I32), F32), *words[5:]])
    w.ret_void()
    table = b.alloca(ir.ArrayType(I64, 10))
    values = [b.ptrtoint(p, I64) for p in (x, bias, out)] + [count, b.zext(b.bitcast(scale, I32), I64), *index]
    for i, value in enumerate(values):
        b.store(value, b.gep(table, [ir.Constant(I64, 0), ir.Constant(I64, i)]))
    gomp = ir.Function(module, ir.FunctionType(VOID, [PTR, PTR, I32, I32]), "GOMP_parallel")
    b.call(gomp, [worker, table, ir.Constant(I32, threads), ir.Constant(I32, 0)])
    b.ret_void()
    return module


@dataclass
class SoftmaxKernel:
    """A compiled softmax over rows of `n`; call it on addresses (`bias` 0 where not `biased`)."""

    n: int
    dtype: str
    safe: bool
    biased: bool
    compiled: Compiled
    call: Callable


@cache
def softmax_kernel(n: int, dtype: str, target: Target, safe: bool, biased: bool) -> SoftmaxKernel:
    """The kernel for rows of `n` in `dtype` on `target` (its vector width and threads), built once a process."""
    if dtype not in DTYPES:
        raise ValueError(f"softmax: dtype {dtype} is not one of {', '.join(DTYPES)}")
    module = softmax_module(n, dtype, vector_width(target.features), target.threads, safe, biased)
    compiled = compile_module(module, target, object_cache())
    return SoftmaxKernel(n, dtype, safe, biased, compiled, CALL(compiled.address("softmax")))
