"""Lower a `Program` to LLVM IR with llvmlite's IR builder.

One function per stage, `void stage(ptr noalias buf0, ...)` over the memory buffers. Loop
kinds map directly: serial → a counted loop, unrolled → replicated code with the variable
a constant, vectorized → `<W x float>` operations (a load that does not move with the
vector variable is a broadcast, a unit-stride one a vector load, any other a gather),
parallel (top level) → an outlined worker run by `GOMP_parallel`, each thread taking a
contiguous share of the iterations. Register buffers are allocas in the entry block
indexed by constants only, which SROA promotes to SSA vectors: the accumulators never
touch memory.

Arithmetic is float32. A bfloat16 buffer holds the upper halves of float32 bit patterns: a
load widens them by a shift, a store rounds to nearest even, and a copy between bfloat16
buffers moves the bits. A pair dot (`dot2`) whose operands are adjacent bfloat16 pairs
loads each pair as one 32-bit lane and splits it by a shift and a mask; `dot2_bf16` is the
same sum by AVX-512 BF16's `vdpbf16ps`, for targets that have it; a tail narrower than the
instruction (or not in pairs) takes two FMAs, the same sum, as a bfloat16 product is exact.

Integer buffers (uint8, int8, int32) load as int32, zero- or sign-extended, and integer
constants are int32: add, mul and fma of them are integer arithmetic, exact, and `float`
converts. `dot4` of uint8 quads and int8 quads adjacent in memory loads each quad as one lane
and, on x86, widens its bytes in 16-bit halves for two `pmaddwd` (each lane's sum of two products:
exact, unlike `pmaddubsw`'s saturating one), elsewhere splits it into bytes; `dot4_ubsw` (for activations
in 0..127) is `pmaddubsw` then pmaddwd by ones, and `dot4_vnni` AVX-512 VNNI's `vpdpbusd`.

A `tile` nest (k groups, rows, columns around one `dot2_amx` or `dot4_amx` into a block of C)
becomes AMX tile products (llvm_amx). Two copies are emitted as whole vectors: g rows interleaved into
groups (`interleaved_copy`) and a square block transposed (`transposed_copy`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from llvmlite import ir

from search_space.program import (ITEMSIZE, Affine, Buffer, Call, Const, If, Load, Loop, Op, Prefetch, Program, Stage,
                                  Store, Value, walk)

from .llvm_amx import PRODUCTS, Operand, Shape, Tiles, first_shape, tile_product

F32, I8, I16, I32, I64, PTR = ir.FloatType(), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.PointerType()
VOID = ir.VoidType()


class _BFloat(ir.types._BaseFloatType):
    """LLVM's `bfloat`, which llvmlite lacks: the operand type of the AVX-512 BF16 intrinsics."""

    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"


_BFloat._create_instance()
BF16 = _BFloat()


@functools.cache
def vector_type(element: ir.Type, width: int) -> ir.VectorType:
    """One type object for each vector shape: llvmlite prints a type it has printed before from a cache, and a new
    one spelled the same is formatted and hashed (by its text) anew at each of a micro-kernel's thousands of uses."""
    return ir.VectorType(element, width)


ELEMENTS = {"float32": F32, "bfloat16": I16, "uint8": I8, "int8": I8, "int32": I32}  # how elements are held in memory
SIGNED = ("int8", "int32")
# (source, destination) dtypes of the copies emitted as whole vectors: the bits moved, or bfloat16 widened
COPIES = {(dtype, dtype) for dtype in ELEMENTS} | {("bfloat16", "float32")}
WIDTHS = {4: "128", 8: "256", 16: "512"}  # vdpbf16ps's and vpdpbusd's 32-bit lanes → the intrinsic's suffix
# the group dots: their operands' dtypes (A's, B's), and the instruction of the feature that names the special one
GROUP_DOTS = {"dot2": ("bfloat16", "bfloat16"), "dot2_bf16": ("bfloat16", "bfloat16"), "dot4": ("uint8", "int8"),
              "dot4_ubsw": ("uint8", "int8"), "dot4_vnni": ("uint8", "int8")}
SPECIAL_DOTS = {"dot2_bf16": ("avx512bf16", "llvm.x86.avx512bf16.dpbf16ps"),
                "dot4_vnni": ("avx512vnni", "llvm.x86.avx512.vpdpbusd")}
# pmaddwd by 32-bit lanes: the feature that has it at that width, and its intrinsic
PAIR_PRODUCTS = {4: ("avx", "llvm.x86.sse2.pmadd.wd"), 8: ("avx2", "llvm.x86.avx2.pmadd.wd"),
                 16: ("avx512bw", "llvm.x86.avx512.pmaddw.d.512")}


# pmaddubsw by 32-bit lanes (each two of its 16-bit ones)
BYTE_PAIR_PRODUCTS = {4: ("avx", "llvm.x86.ssse3.pmadd.ub.sw.128"), 8: ("avx2", "llvm.x86.avx2.pmadd.ub.sw"),
                      16: ("avx512bw", "llvm.x86.avx512.pmaddubs.w.512")}


def pmaddwd(width: int, features) -> str | None:
    """The pmaddwd intrinsic on `width` 32-bit lanes where the features have it (x86), else None."""
    return _x86(PAIR_PRODUCTS, width, features)


def pmaddubsw(width: int, features) -> str | None:
    """The pmaddubsw intrinsic on `width` 32-bit lanes where the features have it (x86), else None."""
    return _x86(BYTE_PAIR_PRODUCTS, width, features)


def _x86(products: dict, width: int, features) -> str | None:
    feature, intrinsic = products.get(width, ("", None))
    return intrinsic if feature in features else None
# Rational approximation of tanh on [-7.9053, 7.9053] (as in Eigen): odd numerator / even denominator.
TANH_CLAMP = 7.90531110763549805
TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
          1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
# Rational approximation of erf on [-4, 4], beyond which float32 erf is ±1 (as in Eigen): odd / even.
ERF_CLAMP = 4.0
ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
         -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
         -1.42647390514189e-02)
TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)


class CodegenError(ValueError):
    """The program uses a construct this code generator cannot lower (a template bug or an invalid config)."""


@dataclass
class _Vector:
    """The vectorized loop being emitted: its variable and width."""

    var: str
    width: int


@dataclass
class _Function:
    """Per-function state: the builder, where each buffer lives, and the register allocas."""

    fn: ir.Function
    builder: ir.IRBuilder
    pointers: dict[str, ir.Value]
    env: dict = field(default_factory=dict)
    # index sums and addresses already emitted, reused while they dominate: by key, and each open block scope's
    # keys, dropped as it closes (one lookup a value, not one a scope: a micro-kernel looks up thousands)
    sums: dict = field(default_factory=dict)
    scopes: list[list] = field(default_factory=lambda: [[]])
    # values loaded or stored in the current basic block, by (buffer, index, shape): reused until it ends.
    # Buffers are noalias, so a store invalidates only its own buffer's entries.
    known: dict = field(default_factory=dict)

    def scoped(self, emit) -> None:
        self.scopes.append([])
        self.known.clear()
        emit()
        for key in self.scopes.pop():
            del self.sums[key]
        self.known.clear()

    def forget(self, buffer: str) -> None:
        for key in [k for k in self.known if k[0] == buffer]:
            del self.known[key]


class LLVMCodegen:
    def __init__(self, program: Program, threads: int, features: tuple[str, ...] = ()):
        self.program, self.threads, self.features = program, threads, features
        self.module = ir.Module(name=program.name)
        self.memory = program.scope("input", "output", "packed")
        self.registers = program.scope("register")
        self._intrinsics: dict[str, ir.Function] = {}
        self._subroutines: dict[tuple, ir.Function] = {}
        self._configured: Shape | None = None  # the tile configuration the function being emitted runs under
        self._offsets: dict[tuple, tuple] = {}  # (id of an access's index, buffer): (the index, kept alive; offset)

    def generate(self) -> ir.Module:
        for stage in self.program.stages:
            self.stage(stage)
        return self.module

    # --- functions -------------------------------------------------------------------------
    def _function(self, name: str, extra: list[ir.Type] = ()) -> _Function:
        fnty = ir.FunctionType(VOID, [PTR] * len(self.memory) + list(extra))
        fn = ir.Function(self.module, fnty, name)
        fn.attributes.add("nounwind")
        for arg, buf in zip(fn.args, self.memory):
            arg.name = buf.name
            arg.add_attribute("noalias")
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        pointers = dict(zip((b.name for b in self.memory), fn.args))
        for reg in self.registers:
            elem = ELEMENTS[reg.dtype]
            alloca = builder.alloca(ir.ArrayType(elem, reg.size), name=reg.name)
            alloca.align = 64
            pointers[reg.name] = builder.bitcast(alloca, elem.as_pointer())
        return _Function(fn, builder, pointers)

    def stage(self, stage: Stage) -> None:
        """`stage.name` runs the stage; a parallel top-level loop becomes `name.chunkN` run by every thread."""
        main = self._function(stage.name)
        for i, stmt in enumerate(stage.body):
            if isinstance(stmt, Loop) and stmt.kind == "parallel" and self.threads > 1:
                self._parallel(main, self._chunk(f"{stage.name}.chunk{i}", stmt), stmt.extent)
            else:
                self._tiled(main, (stmt,), lambda: self.stmts(main, (stmt,)))
        main.builder.ret_void()

    def _chunk(self, name: str, loop: Loop) -> ir.Function:
        """`void chunk(bufs..., i64 lo, i64 hi)`: iterations lo..hi of a parallel loop, with noalias buffers."""
        f = self._function(name, [I64, I64])
        lo, hi = f.fn.args[-2:]
        self._tiled(f, loop.body, lambda: self._counted(f, loop.var, lo, hi, loop.body, guarded=True))
        f.builder.ret_void()
        return f.fn

    def _tiled(self, f: _Function, stmts, emit) -> None:
        """emit(), under the tile configuration of the first tile nest in `stmts` where there is one (written
        before, the tiles released after): each thread's share of a stage writes it once (llvm_amx)."""
        nest = next((stmt for stmt, _, _ in walk(stmts) if isinstance(stmt, Loop) and stmt.kind == "tile"), None)
        if nest is None:
            return emit()
        rows, columns, _ = _tile_parts(nest)
        self._configured = first_shape(rows.extent, columns.extent, nest.extent)
        tiles = Tiles(f.builder, self._extern)
        tiles.configure(self._configured)
        emit()
        tiles.release()
        self._configured = None

    def _parallel(self, caller: _Function, chunk: ir.Function, extent: int) -> None:
        """Outline a worker `void(ptr args)` that splits [0, extent) evenly by thread id, and launch it."""
        worker = ir.Function(self.module, ir.FunctionType(VOID, [PTR]), chunk.name + ".omp")
        b = ir.IRBuilder(worker.append_basic_block("entry"))
        args = [b.inttoptr(b.load(element(b, worker.args[0], I64, ir.Constant(I64, i)), typ=I64), PTR)
                for i in range(len(self.memory))]
        tid = b.sext(b.call(self._extern("omp_get_thread_num", I32, []), []), I64)
        nth = b.sext(b.call(self._extern("omp_get_num_threads", I32, []), []), I64)
        share = lambda t: b.sdiv(b.mul(t, ir.Constant(I64, extent)), nth)
        b.call(chunk, args + [share(tid), share(b.add(tid, ir.Constant(I64, 1)))])
        b.ret_void()
        cb = caller.builder
        table = cb.alloca(ir.ArrayType(I64, len(self.memory)))
        for i, arg in enumerate(caller.fn.args[:len(self.memory)]):
            cb.store(cb.ptrtoint(arg, I64), element(cb, table, I64, ir.Constant(I64, i)))
        gomp = self._extern("GOMP_parallel", VOID, [PTR, PTR, I32, I32])
        cb.call(gomp, [worker, table, ir.Constant(I32, self.threads), ir.Constant(I32, 0)])
        caller.known.clear()

    def _extern(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        if name not in self._intrinsics:
            self._intrinsics[name] = ir.Function(self.module, ir.FunctionType(ret, args), name)
        return self._intrinsics[name]

    # --- statements ------------------------------------------------------------------------
    def stmts(self, f: _Function, stmts, vector: _Vector | None = None) -> None:
        stmts, zeroed = list(stmts), None
        for stmt, following in zip(stmts, stmts[1:] + [None]):
            if zeroed is not None:  # the tile nest whose block the statement before zeroed: it starts from zero tiles
                self.tile_nest(f, stmt, from_zero=True)
                zeroed = None
            elif vector is None and (zeroed := _zeroing_before_tiles(stmt, following)) is not None:
                continue
            elif isinstance(stmt, Store):
                self.store(f, stmt, vector)
            elif isinstance(stmt, If):
                self.branch(f, stmt, vector)
            elif isinstance(stmt, Call):
                self.call(f, stmt, vector)
            elif isinstance(stmt, Prefetch):
                self.prefetch(f, stmt)
            elif stmt.kind == "tile" and vector is None:
                self.tile_nest(f, stmt)
            elif stmt.kind == "unrolled" or (stmt.kind == "vectorized" and stmt.extent == 1):
                for i in range(stmt.extent):
                    f.env[stmt.var] = i
                    self.stmts(f, stmt.body, vector)
                del f.env[stmt.var]
            elif stmt.kind == "vectorized":
                if vector is not None:
                    raise CodegenError(f"nested vectorized loops {vector.var} and {stmt.var}")
                if (interleaved := _interleaved(stmt)) is not None:
                    self.interleaved_copy(f, _Vector(stmt.var, stmt.extent), *interleaved)
                elif (transposed := _transposed(stmt)) is not None:
                    self.transposed_copy(f, _Vector(stmt.var, stmt.extent), *transposed)
                else:
                    self.stmts(f, stmt.body, _Vector(stmt.var, stmt.extent))
            else:  # serial, or parallel below the top level / on one thread
                if vector is not None:
                    raise CodegenError(f"loop {stmt.var} inside vectorized loop {vector.var}")
                self._counted(f, stmt.var, ir.Constant(I64, 0), ir.Constant(I64, stmt.extent), stmt.body)

    def _counted(self, f: _Function, name: str, lo, hi, body, guarded: bool = False) -> None:
        """for name in [lo, hi): body — a bottom-tested loop, guarded when it may run zero times."""
        b = f.builder
        pre = b.block
        loop = f.fn.append_basic_block(f"{name}.loop")
        done = f.fn.append_basic_block(f"{name}.done")
        if guarded:
            b.cbranch(b.icmp_signed("<", lo, hi), loop, done)
        else:
            b.branch(loop)
        b.position_at_end(loop)
        iv = b.phi(I64, name=name)
        iv.add_incoming(lo, pre)
        f.env[name] = iv
        f.scoped(lambda: self.stmts(f, body))
        step = b.add(iv, ir.Constant(I64, 1))
        iv.add_incoming(step, b.block)
        b.cbranch(b.icmp_signed("<", step, hi), loop, done)
        b.position_at_end(done)
        del f.env[name]

    def branch(self, f: _Function, stmt: If, vector: _Vector | None) -> None:
        lhs = self._affine_const(f, stmt.lhs)
        if lhs is not None:  # static: keep only the branch taken
            taken = lhs == stmt.rhs if stmt.op == "==" else lhs < stmt.rhs
            self.stmts(f, stmt.then if taken else stmt.orelse, vector)
            return
        b = f.builder
        cond = b.icmp_signed("==" if stmt.op == "==" else "<", self.index(f, stmt.lhs), ir.Constant(I64, stmt.rhs))
        with b.if_else(cond) as (then, orelse):
            with then:
                f.scoped(lambda: self.stmts(f, stmt.then, vector))
            with orelse:
                f.scoped(lambda: self.stmts(f, stmt.orelse, vector))

    def call(self, f: _Function, stmt: Call, vector: _Vector | None) -> None:
        """Emit each distinct body once, as a noinline function over (buffers..., i64 params...)."""
        if vector is not None:
            raise CodegenError(f"call of {stmt.name} inside vectorized loop {vector.var}")
        names = tuple(name for name, _ in stmt.args)
        key = (stmt.name, names, stmt.body, self._configured)
        if key not in self._subroutines:
            sub = self._function(f"{stmt.name}.{len(self._subroutines)}", [I64] * len(names))
            sub.fn.attributes.add("noinline")
            sub.fn.linkage = "internal"
            sub.env = dict(zip(names, sub.fn.args[len(self.memory):]))
            self.stmts(sub, stmt.body)
            sub.builder.ret_void()
            self._subroutines[key] = sub.fn
        arguments = [self.index(f, value) for _, value in stmt.args]
        f.builder.call(self._subroutines[key], list(f.fn.args[:len(self.memory)]) + arguments)
        f.known.clear()

    def tile_nest(self, f: _Function, nest: Loop, from_zero: bool = False) -> None:
        """acc[r, c] = dot(A[r, g·q + j], Bp[q, c, j] for each j, acc[r, c]) in loops q, r, c of kind `tile`: A's
        groups along its rows, B's packed a group a column, the block's columns contiguous, as AMX tile products;
        `from_zero`: acc's block is zero before it (its zeroing left out), so C's tiles start as zero tiles."""
        rows, columns, store = _tile_parts(nest)
        op = getattr(store, "value", None)
        if not isinstance(op, Op) or op.name not in PRODUCTS or {rows.kind, columns.kind} != {"tile"}:
            raise CodegenError(f"tile nest {nest.var} is not three tile loops around one AMX product")
        if missing := {"amx-tile", PRODUCTS[op.name][0]} - set(self.features):
            raise CodegenError(f"{op.name} needs {', '.join(sorted(missing))}; the target has "
                               f"{', '.join(self.features) or 'no vector features'}")
        q, r, c = nest.var, rows.var, columns.var
        terms, g = op.args[:-1], (len(op.args) - 1) // 2
        offsets = [self.offset(x) for x in terms]
        a_offset, b_offset, c_offset = offsets[0], offsets[1], self.offset(store)
        steps = (a_offset.coeff(q), a_offset.coeff(c), b_offset.coeff(c), b_offset.coeff(r), c_offset.coeff(q),
                 c_offset.coeff(c))
        if (op.args[-1] != Load(store.buffer, store.index) or offsets != [o + j for j in range(g) for o in offsets[:2]]
                or steps != (g, 0, g, 0, 0, 1)):
            raise CodegenError(f"tile nest {nest.var}: operands not laid out as A's rows, packed B and C's block")

        def operand(load: Load | Store, offset: Affine, row: str) -> Operand:
            f.env.update(dict.fromkeys((q, r, c), 0))
            base = self.address(f, load.buffer, self.index_parts(f, offset, None), I8)
            for name in (q, r, c):
                del f.env[name]
            return Operand(base, offset.coeff(row) * load.buffer.itemsize)

        tile_product(f.builder, self._extern, op.name, operand(store, c_offset, r), operand(terms[0], a_offset, r),
                     operand(terms[1], b_offset, q), rows.extent, columns.extent, nest.extent, self._configured,
                     from_zero, nest.ahead, (self.index(f, nest.share[0]), nest.share[1]) if nest.share else None)
        f.forget(store.buffer.name)

    def interleaved_copy(self, f: _Function, vector: _Vector, group: Loop, store: Store) -> None:
        """dst[g·l + j] = src_j[l] for the g unrolled j of `group`, as g vector loads interleaved by one shuffle into
        a vector g times as wide, stored at once (not g·width single lanes)."""
        b, g, width = f.builder, group.extent, vector.width
        parts = []
        for j in range(g):
            f.env[group.var] = j
            parts.append(self.load(f, store.value, vector, raw=True))
        while len(parts) > 1:  # concatenated pairwise (g is a power of two): [src_0 | src_1 | ...]
            parts = [b.shuffle_vector(x, y, ir.Constant(vector_type(I32, 2 * x.type.count), list(range(2 * x.type.count))))
                     for x, y in zip(parts[::2], parts[1::2])]
        lanes = [j * width + lane for lane in range(width) for j in range(g)]
        value = b.shuffle_vector(parts[0], ir.Constant(parts[0].type, ir.Undefined),
                                 ir.Constant(vector_type(I32, g * width), lanes))
        f.env[group.var] = 0
        address = self.address(f, store.buffer, self.index_parts(f, self.offset(store), vector), value.type)
        del f.env[group.var]
        f.forget(store.buffer.name)
        b.store(value, address, align=store.buffer.itemsize)

    def transposed_copy(self, f: _Function, vector: _Vector, rows: Loop, store: Store) -> None:
        """dst[l, k] = src[k, l] over a square block of w × w (w a power of two): w vector loads along the source's
        rows, a transposition in registers by log2(w) rounds of two-vector shuffles (round t swaps bit t of the row
        and lane indices), w vector stores along the destination's rows (bfloat16 widened into a float32 one);
        not w² single-lane stores."""
        b, width = f.builder, vector.width
        lines = []
        for row in range(width):
            f.env[rows.var] = row
            lines.append(self.load(f, store.value, vector, raw=True))
        bit = 1
        while bit < width:
            lanes = vector_type(I32, width)
            low = ir.Constant(lanes, [c if not c & bit else width + (c ^ bit) for c in range(width)])
            high = ir.Constant(lanes, [c ^ bit if not c & bit else width + c for c in range(width)])
            for r in range(width):
                if not r & bit:
                    lines[r], lines[r | bit] = (b.shuffle_vector(lines[r], lines[r | bit], low),
                                                b.shuffle_vector(lines[r], lines[r | bit], high))
            bit *= 2
        f.forget(store.buffer.name)
        offset = self.offset(store)
        for lane, line in enumerate(lines):  # line `lane` holds lane `lane` of every source row: a destination row
            f.env[vector.var], f.env[rows.var] = lane, 0
            if store.buffer.dtype != store.value.buffer.dtype:
                line = widen(b, line, store.value.buffer.dtype)
            b.store(line, self.address(f, store.buffer, self.index_parts(f, offset, None), line.type),
                    align=store.buffer.itemsize)
        del f.env[vector.var], f.env[rows.var]

    def store(self, f: _Function, stmt: Store, vector: _Vector | None) -> None:
        b, buffer = f.builder, stmt.buffer
        if buffer.dtype != "float32" and isinstance(stmt.value, Load) and stmt.value.buffer.dtype == buffer.dtype:
            value = self.load(f, stmt.value, vector, raw=True)  # a copy (packing): the bits, not a round trip
        else:
            value = narrow(b, self.value(f, stmt.value, vector), buffer.dtype)
        offset = self.offset(stmt)
        stride = offset.coeff(vector.var) if vector else 0
        if vector and stride == 0:
            raise CodegenError(f"store to {buffer.name} does not move with vectorized loop {vector.var}")
        f.forget(buffer.name)
        align = buffer.itemsize
        if not vector or stride == 1:
            parts = self.index_parts(f, offset, vector)
            b.store(value, self.address(f, buffer, parts, value.type), align=align)
            f.known[self._key(buffer, parts, value.type)] = value
            return
        for lane in range(vector.width):
            f.env[vector.var] = lane
            address = self.address(f, buffer, self.index_parts(f, offset, None), value.type.element)
            b.store(b.extract_element(value, ir.Constant(I32, lane)), address, align=align)
        del f.env[vector.var]

    def prefetch(self, f: _Function, stmt: Prefetch) -> None:
        """`llvm.prefetch` (read, into every cache level, data) of the cache line `lead` elements on."""
        parts = self.index_parts(f, self.offset(stmt) + stmt.lead, None)
        address = self.address(f, stmt.buffer, parts, ELEMENTS[stmt.buffer.dtype])
        hint = self._extern("llvm.prefetch.p0", ir.VoidType(), [address.type, I32, I32, I32])
        f.builder.call(hint, [address, *(ir.Constant(I32, n) for n in (0, 3, 1))])

    def offset(self, access: Load | Store | Prefetch) -> Affine:
        """The element offset of a load, store or prefetch, flattened once per index: an unrolled micro-kernel
        emits the same accesses hundreds of times."""
        key = id(access.index), access.buffer.name
        if (known := self._offsets.get(key)) is None:
            known = self._offsets[key] = access.index, access.buffer.flat(access.index)
        return known[1]

    @staticmethod
    def _key(buffer: Buffer, parts: tuple, shape) -> tuple:
        symbolic, const = parts
        return buffer.name, None if symbolic is None else id(symbolic), const, str(shape)

    # --- values ----------------------------------------------------------------------------
    def value(self, f: _Function, value: Value, vector: _Vector | None):
        b = f.builder
        vt = vector_type(F32, vector.width) if vector else F32
        if isinstance(value, Const):
            scalar = I32 if isinstance(value.value, int) else F32
            return splat_constant(vector_type(scalar, vector.width) if vector else scalar, value.value)
        if isinstance(value, Load):
            return self.load(f, value, vector)
        if value.name in PRODUCTS:
            raise CodegenError(f"{value.name} outside a tile nest: AMX products are tiles, not lanes")
        if value.name in SPECIAL_DOTS and (feature := SPECIAL_DOTS[value.name][0]) not in self.features:
            raise CodegenError(f"{value.name} on {vector.width if vector else 1} lanes needs {feature}; "
                               f"the target has {', '.join(self.features) or 'no vector features'}")
        if value.name in GROUP_DOTS and (groups := self.groups(f, value, vector)) is not None:
            return self.group_dot(f, value.name, groups, self.value(f, value.args[-1], vector), vector)
        args = [self.value(f, a, vector) for a in value.args]
        integer = isinstance(_scalar(args[0]), ir.IntType)
        if value.name in GROUP_DOTS:  # operands not in groups (a one-column tail, say): multiply-adds
            total = args[-1]
            for x, y in zip(args[:-1:2], args[1:-1:2]):
                total = self.multiply_add(b, x, y, total)
            return total
        if value.name == "float":
            return b.sitofp(args[0], vt)
        if value.name == "add":
            return (b.add if integer else b.fadd)(*args)
        if value.name == "mul":
            return (b.mul if integer else b.fmul)(*args)
        if value.name == "fma":
            return self.multiply_add(b, *args)
        if value.name == "max":
            return b.call(self._intrinsic("llvm.maxnum", vt, 2), args)
        if value.name == "erf":
            return self.rational(f, args[0], vt, ERF_CLAMP, ERF_P, ERF_Q)
        return self.rational(f, args[0], vt, TANH_CLAMP, TANH_P, TANH_Q)

    def multiply_add(self, b: ir.IRBuilder, x, y, acc):
        """x·y + acc: an FMA, or integer multiply and add."""
        if isinstance(_scalar(x), ir.IntType):
            return b.add(b.mul(x, y), acc)
        return b.call(self._intrinsic("llvm.fma", x.type, 3), [x, y, acc])

    def load(self, f: _Function, load: Load, vector: _Vector | None, raw: bool = False):
        """The loaded value as float32 or int32 (a vector of them in a vectorized loop), or as held in memory when
        `raw`."""
        b, buffer = f.builder, load.buffer
        elem, align = ELEMENTS[buffer.dtype], buffer.itemsize
        offset = self.offset(load)
        stride = offset.coeff(vector.var) if vector else 0
        if vector and stride not in (0, 1):
            lanes = ir.Constant(vector_type(elem, vector.width), ir.Undefined)
            for lane in range(vector.width):  # gather
                f.env[vector.var] = lane
                address = self.address(f, buffer, self.index_parts(f, offset, None), elem)
                lanes = b.insert_element(lanes, b.load(address, typ=elem, align=align), ir.Constant(I32, lane))
            del f.env[vector.var]
            return lanes if raw else widen(b, lanes, buffer.dtype)
        parts = self.index_parts(f, offset, vector)
        typ = vector_type(elem, vector.width) if vector else elem
        key = self._key(buffer, parts, typ if stride == 1 else ("broadcast", typ))
        if key not in f.known:
            shape = typ if stride == 1 else elem
            loaded = b.load(self.address(f, buffer, parts, shape), typ=shape, align=align)
            f.known[key] = loaded if shape is typ else self.splat(b, loaded, vector.width)
        return f.known[key] if raw else widen(b, f.known[key], buffer.dtype)

    def groups(self, f: _Function, op: Op, vector: _Vector | None) -> tuple | None:
        """A group dot's operands as (the A group, broadcast as 32-bit lanes; the B groups, one per lane) when they
        are groups adjacent in memory of the dot's dtypes, A's fixed across the vector and B's moving a group a
        lane."""
        terms = op.args[:-1]
        g, dtypes = len(terms) // 2, GROUP_DOTS[op.name]
        if not vector or not all(isinstance(x, Load) and x.buffer.dtype == dtypes[i % 2] for i, x in enumerate(terms)):
            return None
        offsets = [self.offset(x) for x in terms]
        a0, b0 = offsets[:2]
        if offsets != [o + j for j in range(g) for o in (a0, b0)] or (a0.coeff(vector.var), b0.coeff(vector.var)) != (0, g):
            return None
        b = f.builder
        group = lambda load, offset, typ: self.address(f, load.buffer, self.index_parts(f, offset, vector), typ)
        words = vector_type(I32, vector.width)
        align = terms[0].buffer.itemsize
        a_group = self.splat(b, b.load(group(terms[0], a0, I32), typ=I32, align=align), vector.width)
        b_groups = b.load(group(terms[1], b0, words), typ=words, align=align)
        return a_group, b_groups

    def group_dot(self, f: _Function, name: str, groups: tuple, acc, vector: _Vector):
        """acc + Σ_j a_j·b_j on 32-bit lanes each holding a group (its first element in the low bits): by the
        special instruction, or split into its elements and multiply-added. A block's tail narrower than the
        instruction (or below 16 lanes without AVX-512 VL) takes the split form: the same sum, as a bfloat16
        product is exact in float32 and integers are exact."""
        b = f.builder
        a_group, b_groups = groups
        if name in SPECIAL_DOTS and vector.width in WIDTHS and (vector.width == 16 or "avx512vl" in self.features):
            operand = vector_type(BF16, 2 * vector.width) if name == "dot2_bf16" else a_group.type
            fn = self._extern(f"{SPECIAL_DOTS[name][1]}.{WIDTHS[vector.width]}", acc.type, [acc.type, operand, operand])
            return b.call(fn, [acc, b.bitcast(a_group, operand), b.bitcast(b_groups, operand)])
        if name == "dot4" and (intrinsic := pmaddwd(vector.width, self.features)):
            return self.pair_products(b, intrinsic, a_group, b_groups, acc)
        if name == "dot4_ubsw" and (intrinsic := pmaddubsw(vector.width, self.features)):
            return self.byte_pair_products(b, intrinsic, pmaddwd(vector.width, self.features), a_group, b_groups, acc)
        a_dtype, b_dtype = GROUP_DOTS[name]
        for j in range(4 // ITEMSIZE[a_dtype]):
            acc = self.multiply_add(b, _element(b, a_group, a_dtype, j), _element(b, b_groups, b_dtype, j), acc)
        return acc

    def pair_products(self, b: ir.IRBuilder, intrinsic: str, a_group, b_groups, acc):
        """acc + Σ_j a_j·b_j over uint8 quads a and int8 quads b, as two pmaddwd of 16-bit halves: bytes 0 and 2
        widened in place (A's by a mask, B's by shifts up and back with the sign), then bytes 1 and 3 (shifted down).
        Each lane of a pmaddwd sums two products of at most 255·128 in magnitude: exact in 32 bits."""
        halves = vector_type(I16, 2 * acc.type.count)
        a16, b16 = b.bitcast(a_group, halves), b.bitcast(b_groups, halves)
        const = lambda n: splat_constant(halves, n)
        pmaddwd = self._extern(intrinsic, acc.type, [halves, halves])
        even = b.call(pmaddwd, [b.and_(a16, const(0xFF)), b.ashr(b.shl(b16, const(8)), const(8))])
        odd = b.call(pmaddwd, [b.lshr(a16, const(8)), b.ashr(b16, const(8))])
        return b.add(acc, b.add(even, odd))

    def byte_pair_products(self, b: ir.IRBuilder, intrinsic: str, words: str, a_group, b_groups, acc):
        """acc + Σ_j a_j·b_j over uint8 quads a and int8 quads b, as fbgemm's AVX2 kernels multiply: pmaddubsw sums
        byte pairs into int16 lanes (saturating: exact while a ≤ 127, as |2 · 127 · -128| < 2^15), pmaddwd by ones
        sums the lanes' pairs into int32."""
        pairs, halves = vector_type(I8, 4 * acc.type.count), vector_type(I16, 2 * acc.type.count)
        product = self._extern(intrinsic, halves, [pairs, pairs])
        sums = b.call(product, [b.bitcast(a_group, pairs), b.bitcast(b_groups, pairs)])
        return b.add(acc, b.call(self._extern(words, acc.type, [halves, halves]), [sums, splat_constant(halves, 1)]))

    @staticmethod
    def splat(b: ir.IRBuilder, scalar, width: int):
        vt = vector_type(scalar.type, width)
        one = b.insert_element(ir.Constant(vt, ir.Undefined), scalar, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), splat_constant(vector_type(I32, width), 0))

    def rational(self, f: _Function, x, vt, clamp: float, odd: tuple, even: tuple):
        """x·P(x²)/Q(x²) on x clamped to [-clamp, clamp] (tanh, erf): Horner's rule in FMAs."""
        b = f.builder
        const = lambda c: splat_constant(vt, c)
        fma = self._intrinsic("llvm.fma", vt, 3)
        x = b.call(self._intrinsic("llvm.minnum", vt, 2), [x, const(clamp)])
        x = b.call(self._intrinsic("llvm.maxnum", vt, 2), [x, const(-clamp)])
        x2 = b.fmul(x, x)
        p, q = const(odd[0]), const(even[0])
        for c in odd[1:]:
            p = b.call(fma, [x2, p, const(c)])
        for c in even[1:]:
            q = b.call(fma, [x2, q, const(c)])
        return b.fdiv(b.fmul(x, p), q)

    def _intrinsic(self, name: str, vt: ir.Type, arity: int) -> ir.Function:
        suffix = f"v{vt.count}f32" if isinstance(vt, ir.VectorType) else "f32"
        return self._extern(f"{name}.{suffix}", vt, [vt] * arity)

    # --- addresses -------------------------------------------------------------------------
    def _affine_const(self, f: _Function, expr: Affine) -> int | None:
        if all(isinstance(f.env.get(n), int) for n in expr.names):
            return expr.const + sum(c * f.env[n] for n, c in expr.terms)
        return None

    def index(self, f: _Function, expr: Affine, vector: _Vector | None = None):
        """Emit an affine expression as i64; the vectorized variable counts as 0 (lane 0's index)."""
        symbolic, const = self.index_parts(f, expr, vector)
        if symbolic is None:
            return ir.Constant(I64, const)
        return f.builder.add(symbolic, ir.Constant(I64, const)) if const else symbolic

    def index_parts(self, f: _Function, expr: Affine, vector: _Vector | None) -> tuple:
        """(the emitted sum of the loop-variable terms or None, the constant part)."""
        const, symbolic = expr.const, []
        for name, coeff in expr.terms:
            if vector and name == vector.var:
                continue
            if name not in f.env:
                raise CodegenError(f"index uses {name} outside its loop")
            value = f.env[name]
            if isinstance(value, int):
                const += coeff * value
            else:
                symbolic.append((coeff, value))
        return (self._sum(f, tuple(symbolic)) if symbolic else None), const

    def _sum(self, f: _Function, terms: tuple) -> ir.Value:
        """Σ coeff·iv, emitted once per scope in which it dominates its uses."""
        def emit():
            b, total = f.builder, None
            for coeff, value in terms:
                term = value if coeff == 1 else b.mul(value, ir.Constant(I64, coeff))
                total = term if total is None else b.add(total, term)
            return total
        return self._memo(f, ("sum",) + tuple((c, id(v)) for c, v in terms), emit)

    @staticmethod
    def _memo(f: _Function, key: tuple, emit) -> ir.Value:
        """A pure value (index sum, address) emitted once per open scope, where it dominates later uses."""
        if (value := f.sums.get(key)) is None:
            f.sums[key] = value = emit()
            f.scopes[-1].append(key)
        return value

    def address(self, f: _Function, buffer: Buffer, parts: tuple, typ: ir.Type):
        """Pointer to a `typ` (an element, a vector of them, a pair) at the element index `parts` of a buffer."""
        b, elem = f.builder, ELEMENTS[buffer.dtype]
        symbolic, const = parts

        def emit():
            base = f.pointers[buffer.name]
            if symbolic is not None:
                base = self._memo(f, ("row", buffer.name, id(symbolic)), lambda: element(b, base, elem, symbolic))
            scalar = element(b, base, elem, ir.Constant(I64, const)) if const else base
            return scalar if scalar.type.is_opaque else b.bitcast(scalar, typ.as_pointer())

        return self._memo(f, ("address", buffer.name, None if symbolic is None else id(symbolic), const, str(typ)), emit)


def _unrolled_copy(loop: Loop) -> tuple[Loop, Store, Affine, Affine] | None:
    """(the inner loop, its store, the destination's and the source's offsets) when a vectorized loop holds only an
    unrolled loop (of a power-of-two extent) of one copy between buffers of one dtype, or from bfloat16 to float32."""
    inner = loop.body[0] if len(loop.body) == 1 and isinstance(loop.body[0], Loop) else None
    if (inner is None or inner.kind != "unrolled" or inner.extent & (inner.extent - 1) or len(inner.body) != 1
            or not isinstance(inner.body[0], Store)):
        return None
    store = inner.body[0]
    if not isinstance(store.value, Load) or (store.value.buffer.dtype, store.buffer.dtype) not in COPIES:
        return None
    return inner, store, store.buffer.flat(store.index), store.value.buffer.flat(store.value.index)


def _zeroing_before_tiles(stmt, following) -> str | None:
    """The buffer `stmt` sets to zero, element by element, when `following` is a tile nest accumulating into all
    of it: the nest's C tiles then start as zero tiles, and the zeroing is left out. A tile load of what vector
    stores have just written waits for them to reach the cache (the stall was a third of a pass's time, in perf, on
    an Intel AMX host)."""
    if not (isinstance(stmt, Loop) and isinstance(following, Loop) and following.kind == "tile"):
        return None
    buffer, count = _tile_store(following), 0
    for inner, _, loops in walk([stmt]):
        if isinstance(inner, Store):
            if inner.buffer != buffer or inner.value != Const(0) and inner.value != Const(0.0):
                return None
            count += math.prod(loop.extent for loop in loops)
        elif not isinstance(inner, Loop):
            return None
    return buffer.name if buffer is not None and count == buffer.size else None


def _tile_store(nest: Loop) -> Buffer | None:
    """The buffer a tile nest (k groups, rows, columns around one store) accumulates into, if it fills it."""
    rows, columns, store = _tile_parts(nest)
    return store.buffer if isinstance(store, Store) and rows.extent * columns.extent == store.buffer.size else None


def _tile_parts(nest: Loop) -> tuple[Loop | None, Loop | None, object]:
    """A tile nest's rows loop, columns loop and single statement, where it has them (None where it does not)."""
    rows = nest.body[0] if len(nest.body) == 1 and isinstance(nest.body[0], Loop) else None
    columns = rows.body[0] if rows and len(rows.body) == 1 and isinstance(rows.body[0], Loop) else None
    return rows, columns, columns.body[0] if columns and len(columns.body) == 1 else None


def _interleaved(loop: Loop) -> tuple[Loop, Store] | None:
    """(the group loop, its store) when a vectorized loop holds only an unrolled loop of g copies dst[.., l, j] =
    src[.., j, .., l] (same dtype, not float32) whose destinations interleave: lane l of copy j at g·l + j."""
    found = _unrolled_copy(loop)
    if found is None or found[1].buffer.dtype == "float32":
        return None
    group, store, offset, source = found
    if (offset.coeff(loop.var), offset.coeff(group.var), source.coeff(loop.var)) != (group.extent, 1, 1):
        return None
    return group, store


def _transposed(loop: Loop) -> tuple[Loop, Store] | None:
    """(the row loop, its store) when a vectorized loop of w lanes holds only an unrolled loop of w copies (w a power
    of two) dst[.., l, k] = src[.., k, l] (`COPIES`), the source moving one element a lane, the destination one
    element a row: a square block transposed (dense's weights packed into panels)."""
    found = _unrolled_copy(loop)
    if found is None or found[0].extent != loop.extent:
        return None
    rows, store, offset, source = found
    if offset.coeff(rows.var) != 1 or abs(offset.coeff(loop.var)) < loop.extent or source.coeff(loop.var) != 1:
        return None  # (destination rows that overlap are left to the lane-by-lane stores)
    return rows, store


def widen(b: ir.IRBuilder, value, dtype: str):
    """float32 or int32 from a value as held in memory: bfloat16 bits are a float32's upper half; int8 extends by
    its sign, uint8 by zeros."""
    if _scalar(value) in (F32, I32):
        return value
    if dtype == "bfloat16":
        return b.bitcast(b.shl(b.zext(value, _like(value, I32)), _const(value, I32, 16)), _like(value, F32))
    return (b.sext if dtype in SIGNED else b.zext)(value, _like(value, I32))


def _element(b: ir.IRBuilder, word, dtype: str, j: int):
    """Element j of the group a 32-bit lane holds (the first in the low bits): a bfloat16 as float32 (the upper
    half as it is, the lower shifted up), a byte as int32 (shifted to the top, then down with its sign or not)."""
    if dtype == "bfloat16":
        bits = b.and_(word, _const(word, I32, 0xFFFF0000 - (1 << 32))) if j else b.shl(word, _const(word, I32, 16))
        return b.bitcast(bits, _like(word, F32))
    top = 24 - 8 * j
    shifted = b.shl(word, _const(word, I32, top)) if top else word
    return (b.ashr if dtype in SIGNED else b.lshr)(shifted, _const(word, I32, 24))


def narrow(b: ir.IRBuilder, value, dtype: str):
    """A float32 or int32 value as held in memory as `dtype`: for bfloat16, rounded to nearest even (x + 0x7FFF +
    the lowest kept bit, upper half); 8-bit integers keep their low byte."""
    elem = ELEMENTS[dtype]
    if _scalar(value) == elem:
        return value
    if dtype in ("uint8", "int8") and _scalar(value) == I32:
        return b.trunc(value, _like(value, I8))
    if dtype != "bfloat16" or _scalar(value) != F32:
        raise CodegenError(f"a {_scalar(value)} value stored to a {dtype} buffer")
    const = lambda c: _const(value, I32, c)
    bits = b.bitcast(value, _like(value, I32))
    odd = b.and_(b.lshr(bits, const(16)), const(1))
    return b.trunc(b.lshr(b.add(bits, b.add(odd, const(0x7FFF))), const(16)), _like(value, I16))


def _scalar(value) -> ir.Type:
    """The element type of a value or vector."""
    return value.type.element if isinstance(value.type, ir.VectorType) else value.type


def _like(value, typ: ir.Type) -> ir.Type:
    """`typ`, or a vector of it as wide as `value` when that is a vector."""
    return vector_type(typ, value.type.count) if isinstance(value.type, ir.VectorType) else typ


def _const(value, typ: ir.Type, number: int) -> ir.Constant:
    """`number` as a `typ` shaped like `value` (splat across a vector)."""
    return splat_constant(_like(value, typ), number)


_SPLATS: dict[tuple[ir.Type, str], ir.Constant] = {}


def splat_constant(typ: ir.Type, number) -> ir.Constant:
    """`number` in every lane of a vector `typ`, or as a scalar `typ`; made once a process: an unrolled micro-kernel
    and its epilogue use the same constants hundreds of times a module, and llvmlite builds and formats a new one
    element by element, where it prints one it has printed before from a cache. Keyed by repr: -0.0 is not 0.0."""
    key = (typ, repr(number))
    if key not in _SPLATS:
        _SPLATS[key] = ir.Constant(typ, [number] * typ.count if isinstance(typ, ir.VectorType) else number)
    return _SPLATS[key]


def element(b: ir.IRBuilder, base, typ: ir.Type, index) -> ir.Value:
    """&base[index] as elements of `typ`, whether llvmlite gives typed or opaque pointers."""
    if base.type.is_opaque:
        return b.gep(base, [index], inbounds=True, source_etype=typ)
    return b.gep(b.bitcast(base, typ.as_pointer()), [index], inbounds=True)


def generate(program: Program, threads: int, features: tuple[str, ...] = ()) -> ir.Module:
    """The module for a program; `features` (the target's) say which special instructions it may use."""
    return LLVMCodegen(program, threads, features).generate()
