"""Lower a `Program` to LLVM IR with llvmlite's IR builder.

One function per stage, `void stage(ptr noalias buf0, ...)` over the memory buffers. Loop
kinds map directly: serial → a counted loop, unrolled → replicated code with the variable
a constant, vectorized → `<W x float>` operations (a load that does not move with the
vector variable is a broadcast, a unit-stride one a vector load, any other a gather),
parallel (top level) → an outlined worker run by `GOMP_parallel`, each thread taking a
contiguous share of the iterations. Register buffers are allocas in the entry block
indexed by constants only, which SROA promotes to SSA vectors: the accumulators never
touch memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from search_space.program import Affine, Buffer, Call, Const, If, Load, Loop, Program, Stage, Store, Value

F32, I32, I64, PTR = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.PointerType()
VOID = ir.VoidType()
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
    # index sums already emitted, one dict per open block scope: reused while they dominate
    sums: list[dict] = field(default_factory=lambda: [{}])
    # values loaded or stored in the current basic block, by (buffer, index, shape): reused until it ends.
    # Buffers are noalias, so a store invalidates only its own buffer's entries.
    known: dict = field(default_factory=dict)

    def scoped(self, emit) -> None:
        self.sums.append({})
        self.known.clear()
        emit()
        self.sums.pop()
        self.known.clear()

    def forget(self, buffer: str) -> None:
        for key in [k for k in self.known if k[0] == buffer]:
            del self.known[key]


class LLVMCodegen:
    def __init__(self, program: Program, threads: int):
        self.program, self.threads = program, threads
        self.module = ir.Module(name=program.name)
        self.memory = program.scope("input", "output", "packed")
        self.registers = program.scope("register")
        self._intrinsics: dict[str, ir.Function] = {}
        self._subroutines: dict[tuple, ir.Function] = {}

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
            alloca = builder.alloca(ir.ArrayType(F32, reg.size), name=reg.name)
            alloca.align = 64
            pointers[reg.name] = builder.bitcast(alloca, F32.as_pointer())
        return _Function(fn, builder, pointers)

    def stage(self, stage: Stage) -> None:
        """`stage.name` runs the stage; a parallel top-level loop becomes `name.chunkN` run by every thread."""
        main = self._function(stage.name)
        for i, stmt in enumerate(stage.body):
            if isinstance(stmt, Loop) and stmt.kind == "parallel" and self.threads > 1:
                self._parallel(main, self._chunk(f"{stage.name}.chunk{i}", stmt), stmt.extent)
            else:
                self.stmts(main, (stmt,))
        main.builder.ret_void()

    def _chunk(self, name: str, loop: Loop) -> ir.Function:
        """`void chunk(bufs..., i64 lo, i64 hi)`: iterations lo..hi of a parallel loop, with noalias buffers."""
        f = self._function(name, [I64, I64])
        lo, hi = f.fn.args[-2:]
        self._counted(f, loop.var, lo, hi, loop.body, guarded=True)
        f.builder.ret_void()
        return f.fn

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
        for stmt in stmts:
            if isinstance(stmt, Store):
                self.store(f, stmt, vector)
            elif isinstance(stmt, If):
                self.branch(f, stmt, vector)
            elif isinstance(stmt, Call):
                self.call(f, stmt, vector)
            elif stmt.kind == "unrolled" or (stmt.kind == "vectorized" and stmt.extent == 1):
                for i in range(stmt.extent):
                    f.env[stmt.var] = i
                    self.stmts(f, stmt.body, vector)
                del f.env[stmt.var]
            elif stmt.kind == "vectorized":
                if vector is not None:
                    raise CodegenError(f"nested vectorized loops {vector.var} and {stmt.var}")
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
        key = (stmt.name, names, stmt.body)
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

    def store(self, f: _Function, stmt: Store, vector: _Vector | None) -> None:
        b = f.builder
        value = self.value(f, stmt.value, vector)
        offset = stmt.buffer.flat(stmt.index)
        stride = offset.coeff(vector.var) if vector else 0
        if vector and stride == 0:
            raise CodegenError(f"store to {stmt.buffer.name} does not move with vectorized loop {vector.var}")
        f.forget(stmt.buffer.name)
        if not vector or stride == 1:
            parts = self.index_parts(f, offset, vector)
            b.store(value, self.address(f, stmt.buffer, parts, value.type), align=4)
            f.known[self._key(stmt.buffer, parts, value.type)] = value
            return
        for lane in range(vector.width):
            f.env[vector.var] = lane
            address = self.address(f, stmt.buffer, self.index_parts(f, offset, None), F32)
            b.store(b.extract_element(value, ir.Constant(I32, lane)), address, align=4)
        del f.env[vector.var]

    @staticmethod
    def _key(buffer: Buffer, parts: tuple, shape) -> tuple:
        symbolic, const = parts
        return buffer.name, None if symbolic is None else id(symbolic), const, str(shape)

    # --- values ----------------------------------------------------------------------------
    def value(self, f: _Function, value: Value, vector: _Vector | None):
        b = f.builder
        vt = ir.VectorType(F32, vector.width) if vector else F32
        if isinstance(value, Const):
            return ir.Constant(vt, [value.value] * vector.width) if vector else ir.Constant(F32, value.value)
        if isinstance(value, Load):
            return self.load(f, value, vector)
        args = [self.value(f, a, vector) for a in value.args]
        if value.name == "add":
            return b.fadd(*args)
        if value.name == "mul":
            return b.fmul(*args)
        if value.name == "fma":
            return b.call(self._intrinsic("llvm.fma", vt, 3), args)
        if value.name == "max":
            return b.call(self._intrinsic("llvm.maxnum", vt, 2), args)
        if value.name == "erf":
            return self.rational(f, args[0], vt, ERF_CLAMP, ERF_P, ERF_Q)
        return self.rational(f, args[0], vt, TANH_CLAMP, TANH_P, TANH_Q)

    def load(self, f: _Function, load: Load, vector: _Vector | None):
        b = f.builder
        offset = load.buffer.flat(load.index)
        stride = offset.coeff(vector.var) if vector else 0
        if vector and stride not in (0, 1):
            lanes = ir.Constant(ir.VectorType(F32, vector.width), ir.Undefined)
            for lane in range(vector.width):  # gather
                f.env[vector.var] = lane
                address = self.address(f, load.buffer, self.index_parts(f, offset, None), F32)
                lanes = b.insert_element(lanes, b.load(address, typ=F32, align=4), ir.Constant(I32, lane))
            del f.env[vector.var]
            return lanes
        parts = self.index_parts(f, offset, vector)
        typ = ir.VectorType(F32, vector.width) if vector else F32
        key = self._key(load.buffer, parts, typ if stride == 1 else ("broadcast", typ))
        if key not in f.known:
            shape = typ if stride == 1 else F32
            loaded = b.load(self.address(f, load.buffer, parts, shape), typ=shape, align=4)
            f.known[key] = loaded if shape is typ else self.splat(b, loaded, vector.width)
        return f.known[key]

    @staticmethod
    def splat(b: ir.IRBuilder, scalar, width: int):
        vt = ir.VectorType(F32, width)
        one = b.insert_element(ir.Constant(vt, ir.Undefined), scalar, ir.Constant(I32, 0))
        return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), ir.Constant(ir.VectorType(I32, width), [0] * width))

    def rational(self, f: _Function, x, vt, clamp: float, odd: tuple, even: tuple):
        """x·P(x²)/Q(x²) on x clamped to [-clamp, clamp] (tanh, erf): Horner's rule in FMAs."""
        b = f.builder
        const = lambda c: ir.Constant(vt, [c] * vt.count) if isinstance(vt, ir.VectorType) else ir.Constant(F32, c)
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
        for scope in reversed(f.sums):
            if key in scope:
                return scope[key]
        f.sums[-1][key] = value = emit()
        return value

    def address(self, f: _Function, buffer: Buffer, parts: tuple, typ: ir.Type):
        """Pointer to a `typ` (float or a float vector) at the element index `parts` of a buffer."""
        b = f.builder
        symbolic, const = parts

        def emit():
            base = f.pointers[buffer.name]
            if symbolic is not None:
                base = self._memo(f, ("row", buffer.name, id(symbolic)), lambda: element(b, base, F32, symbolic))
            scalar = element(b, base, F32, ir.Constant(I64, const)) if const else base
            return scalar if typ == F32 or scalar.type.is_opaque else b.bitcast(scalar, typ.as_pointer())

        return self._memo(f, ("address", buffer.name, None if symbolic is None else id(symbolic), const, str(typ)), emit)


def element(b: ir.IRBuilder, base, typ: ir.Type, index) -> ir.Value:
    """&base[index] as elements of `typ`, whether llvmlite gives typed or opaque pointers."""
    if base.type.is_opaque:
        return b.gep(base, [index], inbounds=True, source_etype=typ)
    return b.gep(b.bitcast(base, typ.as_pointer()), [index], inbounds=True)


def generate(program: Program, threads: int) -> ir.Module:
    return LLVMCodegen(program, threads).generate()
