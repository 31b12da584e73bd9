"""Lower a GPU `Program` to CUDA C: one `extern "C" __global__` function per stage.

Each function takes the memory buffers (inputs, output, scratch) in program order, declares
its shared buffers (16-byte aligned) and local arrays, and runs its statements. Loops bound
to a GPU index become constants read from blockIdx / threadIdx (nested loops on one index
split it mixed-radix, as program.py says); serial loops are `for` loops, unrolled ones carry
`#pragma unroll`; a vectorized loop whose body copies a contiguous run of an operand becomes
float4 / float2 loads (and stores, where the destination is contiguous too) when every term
of both offsets is a multiple of the width, since CuPy's allocations and the shared buffers
are 16-byte aligned, and an unrolled loop otherwise. Barriers are `__syncthreads()`.
"""
from __future__ import annotations

from dataclasses import dataclass

from search_space.program import (GPU_INDICES, Affine, Barrier, Buffer, Const, If, Launch, Load, Loop, Op, Program,
                                  Stage, Store, Value, bound_chain, launch, walk)

from .llvm_codegen import CodegenError

MEMORY_SCOPES = ("input", "output", "packed")
FUNCTIONS = {"add": "({} + {})", "mul": "({} * {})", "fma": "fmaf({}, {}, {})", "max": "fmaxf({}, {})",
             "tanh": "tanhf({})", "erf": "erff({})"}
VECTOR_TYPES = {4: "float4", 2: "float2"}
LANES = "xyzw"


@dataclass(frozen=True)
class CudaSource:
    """The generated code and how to launch each of its kernels (one per stage, in order)."""

    code: str
    kernels: tuple[tuple[str, Launch], ...]


def affine(expr: Affine) -> str:
    parts = [name if c == 1 else f"{name} * {c}" for name, c in expr.terms]
    if expr.const or not parts:
        parts.append(str(expr.const))
    return " + ".join(parts)


def substitute(expr: Affine, name: str, value: int) -> Affine:
    return Affine(tuple((n, c) for n, c in expr.terms if n != name), expr.const + expr.coeff(name) * value)


def aligned(expr: Affine, width: int) -> bool:
    return expr.const % width == 0 and all(c % width == 0 for _, c in expr.terms)


class CudaCodegen:
    def __init__(self, program: Program):
        self.program = program
        self.memory = program.scope(*MEMORY_SCOPES)
        self.lines: list[str] = []

    def generate(self) -> CudaSource:
        kernels = []
        for stage in self.program.stages:
            try:
                shape = launch(stage)
            except ValueError as error:
                raise CodegenError(str(error)) from None
            self.kernel(stage, shape)
            kernels.append((stage.name, shape))
        return CudaSource("\n".join(self.lines) + "\n", tuple(kernels))

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def kernel(self, stage: Stage, shape: Launch) -> None:
        params = ", ".join(("const float* __restrict__ " if b.scope == "input" else "float* __restrict__ ") + b.name
                           for b in self.memory)
        used = {s.buffer.name for s, _, _ in walk(stage.body) if isinstance(s, Store)}
        self.emit(0, f'extern "C" __global__ void __launch_bounds__({shape.block}) {stage.name}({params}) {{')
        for buffer in self.program.scope("shared", "local"):
            if buffer.name in used:
                prefix = "__shared__ __align__(16) " if buffer.scope == "shared" else ""
                self.emit(1, f"{prefix}float {buffer.name}[{buffer.size}];")
        self.stmts(stage.body, 1)
        self.emit(0, "}")

    def stmts(self, stmts, depth: int) -> None:
        for stmt in stmts:
            if isinstance(stmt, Loop) and stmt.kind in GPU_INDICES:
                self.bound(stmt, depth)
            elif isinstance(stmt, Loop):
                self.loop(stmt, depth)
            elif isinstance(stmt, If):
                self.emit(depth, f"if ({affine(stmt.lhs)} {stmt.op} {stmt.rhs}) {{")
                self.stmts(stmt.then, depth + 1)
                if stmt.orelse:
                    self.emit(depth, "} else {")
                    self.stmts(stmt.orelse, depth + 1)
                self.emit(depth, "}")
            elif isinstance(stmt, Barrier):
                self.emit(depth, "__syncthreads();")
            elif isinstance(stmt, Store):
                self.emit(depth, f"{self.element(stmt.buffer, stmt.index)} = {self.value(stmt.value)};")
            else:
                raise CodegenError(f"the CUDA code generator cannot lower {type(stmt).__name__}")

    def bound(self, loop: Loop, depth: int) -> None:
        """A chain of loops on one GPU index: each loop's variable is a digit of the index."""
        chain = bound_chain(loop)
        self.emit(depth, "{")
        stride = 1
        for inner in reversed(chain):
            digit = f"{loop.kind} / {stride}" if stride > 1 else loop.kind
            if inner is not chain[0]:
                digit = f"({digit}) % {inner.extent}" if stride > 1 else f"{digit} % {inner.extent}"
            self.emit(depth + 1, f"const int {inner.var} = {digit};")
            stride *= inner.extent
        self.stmts(chain[-1].body, depth + 1)
        self.emit(depth, "}")

    def loop(self, loop: Loop, depth: int) -> None:
        if loop.kind == "vectorized" and self.vector_copy(loop, depth):
            return
        if loop.kind != "serial":
            self.emit(depth, "#pragma unroll")
        self.emit(depth, f"for (int {loop.var} = 0; {loop.var} < {loop.extent}; ++{loop.var}) {{")
        self.stmts(loop.body, depth + 1)
        self.emit(depth, "}")

    def vector_copy(self, loop: Loop, depth: int) -> bool:
        """`dst[..v..] = src[..v..]` over a contiguous, aligned run of src as vector loads; False if it is not one."""
        if len(loop.body) != 1 or not isinstance(loop.body[0], Store) or not isinstance(loop.body[0].value, Load):
            return False
        store, load = loop.body[0], loop.body[0].value
        source, target = load.buffer.flat(load.index), store.buffer.flat(store.index)
        width = next((w for w in VECTOR_TYPES if loop.extent % w == 0), 0)
        if not width or source.coeff(loop.var) != 1 or load.buffer.scope == "local":
            return False
        chunks = range(0, loop.extent, width)
        if not all(aligned(substitute(source, loop.var, c), width) for c in chunks):
            return False
        whole = target.coeff(loop.var) == 1 and store.buffer.scope != "local" and \
            all(aligned(substitute(target, loop.var, c), width) for c in chunks)
        vector = VECTOR_TYPES[width]
        for c in chunks:
            read = f"*reinterpret_cast<const {vector}*>(&{load.buffer.name}[{affine(substitute(source, loop.var, c))}])"
            if whole:
                self.emit(depth, f"*reinterpret_cast<{vector}*>(&{store.buffer.name}[{affine(substitute(target, loop.var, c))}]) "
                                 f"= {read};")
                continue
            self.emit(depth, "{")
            self.emit(depth + 1, f"const {vector} {loop.var}_{c} = {read};")
            for lane in range(width):
                self.emit(depth + 1, f"{store.buffer.name}[{affine(substitute(target, loop.var, c + lane))}] = "
                                     f"{loop.var}_{c}.{LANES[lane]};")
            self.emit(depth, "}")
        return True

    def element(self, buffer: Buffer, index: tuple[Affine, ...]) -> str:
        return f"{buffer.name}[{affine(buffer.flat(index))}]"

    def value(self, value: Value) -> str:
        if isinstance(value, Load):
            return self.element(value.buffer, value.index)
        if isinstance(value, Const):
            return f"{float(value.value)!r}f"
        if isinstance(value, Op):
            return FUNCTIONS[value.name].format(*map(self.value, value.args))
        raise CodegenError(f"the CUDA code generator cannot lower the value {value!r}")


def generate(program: Program) -> CudaSource:
    return CudaCodegen(program).generate()
