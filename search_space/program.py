"""The lowered program: a target-neutral loop nest that a config of a template turns into.

Loops have static extents and a kind (serial, parallel, vectorized, unrolled; `tile` for a nest of
three over k groups, rows and columns that a CPU with AMX runs as tile products; on a GPU also
bound to blockIdx.x/y/z or threadIdx.x); buffers have a scope (input, output, packed scratch
in memory, register accumulators; on a GPU also shared memory per block and local memory per
thread); statements store a value built from loads, constants and a few arithmetic ops at an
affine index, and a `Barrier` synchronises the threads of a GPU block. Tails are peeled by
`tiled`, so every extent is a compile-time constant. Code generators (LLVM, CUDA), the GPU
emulator and the cost model's feature extractor read this object; `format_program` prints it
as readable pseudo-code.

A loop bound to a GPU index runs its iterations on the blocks or threads of a launch, not in
sequence. Directly nested loops bound to the same index split it mixed-radix (the outermost
is the most significant digit), so one thread index can be read as (row, column) by one part
of a kernel and as (row, vector) by another while every index stays affine. Every nest of
threadIdx.x loops in a stage spans the same number of threads: the block's size.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Union

GPU_INDICES = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x")
LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "tile") + GPU_INDICES
SCOPES = ("input", "output", "packed", "register", "shared", "local")
TILE_STEP = 16  # k groups a tile nest's k step takes: the 16 rows of an AMX tile of B
# fma(a, b, c) = a·b + c; dot2(a0, b0, a1, b1, c) = a0·b0 + a1·b1 + c (bfloat16 pairs, adjacent in memory, are loaded
# as one 32-bit lane); dot2_bf16 is dot2 by AVX-512 BF16's vdpbf16ps (which flushes denormals); dot4 is the same over
# four uint8·int8 products summed in int32 (a quad of bytes is one lane), dot4_vnni by AVX-512 VNNI's vpdpbusd,
# dot4_ubsw by AVX2's pmaddubsw (its byte pairs summed in int16: for uint8 operands in 0..127);
# dot2_amx and dot4_amx are the same sums inside a `tile` nest, by AMX's tdpbf16ps and tdpbusd;
# `float` converts an int32 to float32. Integer loads and constants make integer values; add, mul and fma take both.
OPS = {"add": 2, "mul": 2, "fma": 3, "max": 2, "tanh": 1, "erf": 1, "dot2": 5, "dot2_bf16": 5, "dot2_amx": 5,
       "dot4": 9, "dot4_ubsw": 9, "dot4_vnni": 9, "dot4_amx": 9, "float": 1}
ITEMSIZE = {"float32": 4, "bfloat16": 2, "uint8": 1, "int8": 1, "int32": 4}

# Nodes are values, compared and hashed by content and never changed once made; not `frozen`, whose __init__ (an
# object.__setattr__ per field) made lowering a config for the cost model a quarter slower.
node = dataclass(unsafe_hash=True, slots=True)


@node
class Affine:
    """const + Σ coeff·var over named integer loop variables."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(value: AffineLike) -> Affine:
        return value if isinstance(value, Affine) else Affine((), int(value))

    def __add__(self, other: AffineLike) -> Affine:
        # the short cuts (a constant, or no terms on one side) are most of the calls: lowering a config for the
        # cost model adds offsets by the hundred thousand
        if not isinstance(other, Affine):
            return Affine(self.terms, self.const + int(other)) if other else self
        if not other.terms or not self.terms:
            return Affine(self.terms or other.terms, self.const + other.const)
        coeffs = dict(self.terms)
        for name, c in other.terms:
            coeffs[name] = coeffs.get(name, 0) + c
        return Affine(tuple((n, c) for n, c in coeffs.items() if c), self.const + other.const)

    __radd__ = __add__

    def __mul__(self, factor: int) -> Affine:
        if factor == 1:
            return self
        return Affine(tuple((n, c * factor) for n, c in self.terms if c * factor), self.const * factor)

    __rmul__ = __mul__

    def exact_div(self, divisor: int) -> Affine:
        """Divide when every coefficient and the constant are multiples of `divisor` (tile offsets are)."""
        if self.const % divisor or any(c % divisor for _, c in self.terms):
            raise ValueError(f"{self} is not a multiple of {divisor}")
        return Affine(tuple((n, c // divisor) for n, c in self.terms), self.const // divisor)

    def coeff(self, name: str) -> int:
        for term, c in self.terms:  # a few terms: no dict
            if term == name:
                return c
        return 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    def __str__(self) -> str:
        parts = [n if c == 1 else f"{n}*{c}" for n, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


AffineLike = Union[Affine, int]


def var(name: str) -> Affine:
    return Affine(((name, 1),))


@node
class Buffer:
    """Memory a program reads or writes, row-major unless `strides` (in elements) says how an input view lies."""

    name: str
    shape: tuple[int, ...]
    scope: str
    dtype: str = "float32"
    strides: tuple[int, ...] | None = None

    def __post_init__(self):
        assert self.scope in SCOPES, self.scope

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return ITEMSIZE[self.dtype]

    def __getitem__(self, index) -> Load:
        return Load(self, _index(self, index))

    def store(self, index, value: Value) -> Store:
        return Store(self, _index(self, index), value)

    def prefetch(self, index, lead: int) -> Prefetch:
        return Prefetch(self, _index(self, index), lead)

    def prefetch_row(self, index, lead: int, width: int) -> list[Prefetch]:
        """Prefetches of the `width` elements from `index` as they lie `lead` elements on, a cache line each: a
        micro-kernel streaming packed weights asks for the row it reads so many steps ahead."""
        return [self.prefetch(index, lead + column) for column in range(0, width, 64 // self.itemsize)]

    def flat(self, index: tuple[Affine, ...]) -> Affine:
        """Element offset of an index: through the strides where given, else row-major (its terms in the order of
        their first dimension from the last). Summed in one pass, not an Affine a dimension (a 5-d index 5-6 µs, not
        21): code generation and the cost model's features take the offset of every access."""
        row_major = self.strides is None
        dims = reversed(tuple(zip(index, _row_major(self.shape)))) if row_major else zip(index, self.strides)
        coeffs, const = {}, 0
        for i, stride in dims:
            const += i.const * stride
            for name, c in i.terms:
                coeffs[name] = coeffs.get(name, 0) + c * stride
        return Affine(tuple((n, c) for n, c in coeffs.items() if c), const)


@functools.cache
def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Each dimension's stride in elements, row-major."""
    return tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))


def _index(buffer: Buffer, index) -> tuple[Affine, ...]:
    index = tuple(Affine.of(i) for i in (index if isinstance(index, tuple) else (index,)))
    if len(index) != len(buffer.shape):
        raise ValueError(f"{buffer.name} has {len(buffer.shape)} dims, indexed with {len(index)}")
    return index


@node
class Load:
    buffer: Buffer
    index: tuple[Affine, ...]


@node
class Const:
    value: float  # an int is an int32 constant


@node
class Op:
    name: str
    args: tuple[Value, ...]

    def __post_init__(self):
        assert OPS.get(self.name) == len(self.args), (self.name, len(self.args))


Value = Union[Load, Const, Op]


@node
class Store:
    buffer: Buffer
    index: tuple[Affine, ...]
    value: Value


@node
class Loop:
    var: str
    extent: int
    kind: str
    body: tuple[Stmt, ...]
    ahead: int = 0  # a tile nest's k loop: how many of its k steps (TILE_STEP groups) ahead the packed B is prefetched
    # a tile nest's k loop, instead: (index, count), the nest being the index-th (an Affine) of `count` that read the
    # same packed B rows; it prefetches over its k steps its share of the rows that follow them (the next panel)
    share: tuple = ()

    def __post_init__(self):
        assert self.kind in LOOP_KINDS and self.extent >= 1, (self.kind, self.extent)


@node
class If:
    """Branch on `lhs op rhs` (op is "==" or "<"); folded away when lhs is constant."""

    lhs: Affine
    op: str
    rhs: int
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()


@node
class Call:
    """A named sub-nest that sees only its parameters, bound here to affine values.

    Identical bodies (the micro-kernel of every full tile, say) are emitted once by the code
    generator and called, so peeled tails multiply loops, not code.
    """

    name: str
    args: tuple[tuple[str, Affine], ...]
    body: tuple[Stmt, ...]


@node
class Barrier:
    """Every thread of a GPU block waits here until all have arrived (`__syncthreads`): shared memory
    written before it is seen by every thread after it. It never stands inside a threadIdx loop."""


@node
class Prefetch:
    """A hint that the cache line `lead` elements past `buffer[index]` is read soon: its load starts now. It never
    faults, so it may point past the buffer's end. A micro-kernel streaming packed weights from memory asks for the
    rows it reads `lead` elements on; the cost model reads the lead."""

    buffer: Buffer
    index: tuple[Affine, ...]
    lead: int


Stmt = Union[Store, Loop, If, Call, Barrier, Prefetch]


@node
class Stage:
    """One loop nest run in order with the others; `constant` stages read only weights and may be hoisted."""

    name: str
    body: tuple[Stmt, ...]
    constant: bool = False


@node
class Program:
    name: str
    buffers: tuple[Buffer, ...]  # inputs in call order, then the output, then scratch and registers
    stages: tuple[Stage, ...]

    def scope(self, *scopes: str) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.scope in scopes)


def tiled(name: str, extent: int, tile: int, base: AffineLike,
          body: Callable[[Affine, int], list[Stmt]], kind: str = "serial") -> list[Stmt]:
    """Cover `extent` in tiles of `tile` starting at `base`; body(offset, size) builds one tile.

    The last, partial tile is peeled with its own static size. A parallel loop keeps its tail
    inside the loop (behind an `If`) so that the threads share it.
    """
    base = Affine.of(base)
    full, tail = divmod(extent, tile)
    index = base + var(name) * tile
    if kind == "parallel" and tail:
        return [Loop(name, full + 1, kind, (If(var(name), "<", full, tuple(body(index, tile)), tuple(body(index, tail))),))]
    stmts: list[Stmt] = []
    if full == 1 and kind == "serial":
        stmts += body(base, tile)
    elif full >= 1:
        stmts.append(Loop(name, full, kind, tuple(body(index, tile))))
    if tail:
        stmts += body(base + full * tile, tail)
    return stmts


def tile_nest(levels, chunks: dict, leaf: Callable[[dict], list[Stmt]], first: dict[str, int] | None = None
              ) -> list[Stmt]:
    """Nested `tiled` loops: each level (name, axis, tile, kind), outermost first, tiles the chunk
    (offset, extent) of its axis that the levels above left; `leaf(chunks)` builds the innermost body. A serial
    level over an axis of `first` starts that many elements in (a multiple of its tile) and runs the ones before
    them last (a convolution's edge rows, which would break its weights' stream, after its whole ones)."""
    if not levels:
        return leaf(chunks)
    (name, axis, size, kind), rest = levels[0], levels[1:]
    offset, extent = chunks[axis]
    inner = lambda o, e: tile_nest(rest, chunks | {axis: (o, e)}, leaf, first)
    start = (first or {}).get(axis, 0) if kind == "serial" else 0
    if start:
        return (tiled(name, extent - start, size, offset + start, inner)
                + tiled(name + "_rest", start, size, offset, inner))
    return tiled(name, extent, size, offset, inner, kind)


@node
class Launch:
    """How a GPU stage is launched: blocks along x, y, z and threads per block."""

    grid: tuple[int, int, int]
    block: int


def bound_chain(loop: Loop) -> list[Loop]:
    """`loop` and the loops directly nested in it that are bound to the same GPU index, outermost first."""
    chain = [loop]
    while len(chain[-1].body) == 1 and isinstance(chain[-1].body[0], Loop) and chain[-1].body[0].kind == loop.kind:
        chain.append(chain[-1].body[0])
    return chain


def launch(stage: Stage) -> Launch:
    """The grid and block a stage's bound loops span; ValueError when they disagree (a template bug)."""
    spans: dict[str, set[int]] = {}
    inner: set[int] = set()  # loops already counted as part of a chain
    for stmt, _, _ in walk(stage.body):
        if isinstance(stmt, Loop) and stmt.kind in GPU_INDICES and id(stmt) not in inner:
            chain = bound_chain(stmt)
            inner |= {id(loop) for loop in chain}
            spans.setdefault(stmt.kind, set()).add(math.prod(loop.extent for loop in chain))
    if any(len(extents) > 1 for extents in spans.values()):
        raise ValueError(f"stage {stage.name}: loops bound to one GPU index span different extents: {spans}")
    size = {kind: extents.pop() for kind, extents in spans.items()}
    grid = tuple(size.get(f"blockIdx.{axis}", 1) for axis in "xyz")
    return Launch(grid, size.get("threadIdx.x", 1))


def walk(stmts, depth: int = 0):
    """Yield (stmt, depth, enclosing loops) for every statement, outermost first."""
    yield from _walk(stmts, depth, ())


def _walk(stmts, depth, loops):
    for stmt in stmts:
        yield stmt, depth, loops
        if isinstance(stmt, Loop):
            yield from _walk(stmt.body, depth + 1, loops + (stmt,))
        elif isinstance(stmt, If):
            yield from _walk(stmt.then + stmt.orelse, depth + 1, loops)
        elif isinstance(stmt, Call):
            yield from _walk(stmt.body, depth + 1, loops)


def loads(value: Value):
    """Every load a value reads, depth first."""
    if isinstance(value, Load):
        yield value
    for arg in getattr(value, "args", ()):
        yield from loads(arg)


def format_value(value: Value) -> str:
    if isinstance(value, Load):
        return f"{value.buffer.name}[{', '.join(map(str, value.index))}]"
    if isinstance(value, Const):
        return repr(value.value)
    return f"{value.name}({', '.join(map(format_value, value.args))})"


def format_stmts(stmts, indent: int = 0, shown: dict | None = None) -> list[str]:
    """Pseudo-code lines; a Call's body is printed at its first use only (`shown` remembers which)."""
    pad, lines, shown = "  " * indent, [], {} if shown is None else shown
    for stmt in stmts:
        if isinstance(stmt, Loop):
            prefix = "" if stmt.kind == "serial" else stmt.kind + " "
            ahead = f"  # prefetch {stmt.ahead} k steps ahead" if stmt.ahead else \
                f"  # prefetch share {stmt.share[0]} of {stmt.share[1]} of what follows" if stmt.share else ""
            lines.append(f"{pad}{prefix}for {stmt.var} in range({stmt.extent}):{ahead}")
            lines += format_stmts(stmt.body, indent + 1, shown)
        elif isinstance(stmt, If):
            lines.append(f"{pad}if {stmt.lhs} {stmt.op} {stmt.rhs}:")
            lines += format_stmts(stmt.then, indent + 1, shown)
            if stmt.orelse:
                lines.append(f"{pad}else:")
                lines += format_stmts(stmt.orelse, indent + 1, shown)
        elif isinstance(stmt, Call):
            first = stmt.body not in shown
            label = shown.setdefault(stmt.body, f"{stmt.name}_{len(shown)}")
            args = ", ".join(f"{name}={value}" for name, value in stmt.args)
            lines.append(f"{pad}{label}({args}){':' if first else ''}")
            if first:
                lines += format_stmts(stmt.body, indent + 1, shown)
        elif isinstance(stmt, Barrier):
            lines.append(f"{pad}barrier()")
        elif isinstance(stmt, Prefetch):
            lines.append(f"{pad}prefetch {stmt.buffer.name}[{', '.join(map(str, stmt.index))}] + {stmt.lead}")
        else:
            lines.append(f"{pad}{stmt.buffer.name}[{', '.join(map(str, stmt.index))}] = {format_value(stmt.value)}")
    return lines


def format_program(program: Program) -> str:
    lines = [f"# {program.name}"]
    lines += [f"# {b.scope:8} {b.name}[{', '.join(map(str, b.shape))}] {b.dtype}" for b in program.buffers]
    shown: dict = {}
    for stage in program.stages:
        lines.append(f"\n# stage {stage.name}{' (constant: weights only, hoisted when bound)' if stage.constant else ''}")
        lines += format_stmts(stage.body, 0, shown)
    return "\n".join(lines)
