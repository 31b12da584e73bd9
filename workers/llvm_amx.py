"""AMX tile products in LLVM IR: a `tile` nest of a program (k groups, rows, columns) as tile loads, products and
stores, through LLVM's `.internal` AMX intrinsics (shapes as operands; LLVM writes the tile configuration and
releases the tiles at the function's end).

The nest's product is C[r, c] += Σ_q Σ_j A[r, g·q + j] · B[q, c, j], with C a float32 or int32 block in memory,
A's rows as they are (g elements of a group adjacent) and B's groups packed [q][c][g]. It runs in tiles of 16 rows ×
16 columns of C and steps of 16 groups of k (64 bytes of a row of A; 16 rows of B), the tails in smaller tiles.
A function configures each tile register for one shape, so tiles of each shape get functions of their own (a
pass): C's tiles of one height and width, loaded, carried through the k steps of one depth, and stored back. A block
of whole tiles and whole steps is one pass; the tails add a few.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from llvmlite import ir

I8, I16, I32, I64, PTR = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.PointerType()
TILE, STEP, GROUP = 16, 16, 4  # rows and 32-bit columns of a tile; groups of k a step takes; bytes of a group
REGISTERS = 8  # tile registers
# the family's feature and its tile product
PRODUCTS = {"dot2_amx": ("amx-bf16", "llvm.x86.tdpbf16ps.internal"), "dot4_amx": ("amx-int8", "llvm.x86.tdpbusd.internal")}


class _Tile(ir.Type):
    """LLVM's `x86_amx`, which llvmlite lacks: a tile register's value."""

    def _to_string(self) -> str:
        return "x86_amx"

    def __eq__(self, other) -> bool:
        return isinstance(other, _Tile)

    def __hash__(self) -> int:
        return hash(_Tile)


AMX = _Tile()


@dataclass(frozen=True)
class Operand:
    """A matrix in memory: the address of its first element and the bytes from one row to the next."""

    base: ir.Value
    stride: int


def intrinsics(declare, product: str) -> tuple[ir.Function, ir.Function, ir.Function]:
    """The tile load, the tile store and `product`'s tile product (shapes first: rows, bytes a row), declared
    through `declare(name, ret, args)`."""
    return (declare("llvm.x86.tileloadd64.internal", AMX, [I16, I16, PTR, I64]),
            declare("llvm.x86.tilestored64.internal", ir.VoidType(), [I16, I16, PTR, I64, AMX]),
            declare(PRODUCTS[product][1], AMX, [I16, I16, I16, AMX, AMX, AMX]))


def _uniform(extent: int, size: int) -> list[tuple[int, int, int]]:
    """(first, size, count): runs of equal spans covering `extent`, the whole ones then the rest."""
    spans = [(start, min(size, extent - start)) for start in range(0, extent, size)]
    return [(group[0][0], length, len(group)) for length, runs in groupby(spans, key=lambda s: s[1])
            for group in [list(runs)]]


def tile_product(b: ir.IRBuilder, declare, product: str, c: Operand, a: Operand, bp: Operand,
                 rows: int, columns: int, groups: int, from_zero: bool = False, ahead: int = 0) -> None:
    """C[rows × columns] += A[rows × groups] · Bp[groups × columns], one pass per shape of tiles and of k step;
    `declare(name, ret, args)` declares an intrinsic in the module. `from_zero`: C = A · Bp, whatever C holds (the
    first pass of each block of C's tiles starts from zero tiles, the passes of later k steps from the first's).
    `ahead`: each k step prefetches the packed B's rows that many steps on (`_pass`)."""
    at = lambda operand, offset: b.gep(operand.base, [ir.Constant(I64, offset)], source_etype=I8)
    for r0, height, row_tiles in _uniform(rows, TILE):
        for c0, width, column_tiles in _uniform(columns, TILE):
            for k0, depth, steps in _uniform(groups, STEP):
                shape = (height, row_tiles, width, column_tiles, depth, steps)
                strides = (c.stride, a.stride, bp.stride)
                function = _pass(b.module, declare, product, shape, strides, from_zero and k0 == 0, ahead)
                b.call(function, [at(c, r0 * c.stride + 4 * c0), at(a, r0 * a.stride + GROUP * k0),
                                  at(bp, GROUP * c0 + k0 * bp.stride)])


def register_groups(row_tiles: int, column_tiles: int) -> list[tuple[range, range]]:
    """C's tiles in groups that fit the tile registers beside their operands (the group's tiles, its smaller side's
    and one of the other's: at most eight), in row order so that a group's A tiles come again from L1: 2 × 2 where
    both sides have two, else a single row or column of up to four."""
    rows, columns = (4, 1) if column_tiles == 1 else (1, 4) if row_tiles == 1 else (2, 2)
    return [(range(i, min(i + rows, row_tiles)), range(j, min(j + columns, column_tiles)))
            for i in range(0, row_tiles, rows) for j in range(0, column_tiles, columns)]


def _pass(module: ir.Module, declare, product: str, shape: tuple, strides: tuple, from_zero: bool,
          ahead: int = 0) -> ir.Function:
    """`void (ptr C, ptr A, ptr Bp)`: C's row_tiles × column_tiles tiles += `steps` k steps of `depth` groups (C's
    tiles from zero tiles, not from C, where `from_zero`); one function per shape, strides and start in a module.
    It runs C's tiles a register group at a time (loaded, carried through the k steps, stored), all under the one
    tile configuration LLVM writes at its entry: writing one costs about as much as twelve tile products (78 ns on
    an Intel AMX host). Within a step the group's smaller side's tiles are all loaded, the other side's one at a
    time. Where `ahead` and there are several steps, each step first prefetches into L2 the rows of its B tiles
    `ahead` steps on (past the block's last step, the rows that follow: the next panel's): in a model bound weights
    come from memory or L3, and a tile load waits for all sixteen of its rows."""
    ahead = ahead if shape[-1] > 1 else 0
    name = f"tiles.{product}.{'.'.join(map(str, shape + strides))}" + (".zero" if from_zero else "") + \
        (f".ahead{ahead}" if ahead else "")
    if name in module.globals:
        return module.globals[name]
    height, row_tiles, width, column_tiles, depth, steps = shape
    c_stride, a_stride, b_stride = strides
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * 3), name)
    function.linkage = "internal"
    for attribute in ("noinline", "nounwind"):
        function.attributes.add(attribute)
    for argument in function.args:
        argument.add_attribute("noalias")
    c, a, bp = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))
    word, long = (lambda n: ir.Constant(I16, n)), (lambda n: ir.Constant(I64, n))
    load, store, dot = intrinsics(declare, product)
    zero = declare("llvm.x86.tilezero.internal", AMX, [I16, I16])
    prefetch = declare("llvm.prefetch.p0", ir.VoidType(), [PTR, I32, I32, I32])  # read, locality 2 (L2), data
    tile_at = lambda base, offset, rows, row_bytes, stride: b.call(load, [word(rows), word(row_bytes), b.gep(
        base, [offset], source_etype=I8), long(stride)])
    c_tile = lambda i, j: (c, long(i * TILE * c_stride + 4 * TILE * j))

    def step(k, acc: dict, rows: range, columns: range) -> dict:
        """The group's C tiles after the k step from group `k` (an i64)."""
        a_tile = lambda i: tile_at(a, b.add(long(i * TILE * a_stride), b.mul(k, long(GROUP))), height, GROUP * depth,
                                   a_stride)
        b_tile = lambda j: tile_at(bp, b.add(long(GROUP * TILE * j), b.mul(k, long(b_stride))), depth, 4 * width,
                                   b_stride)
        product_ = lambda tile, a_, b_: b.call(dot, [word(height), word(4 * width), word(GROUP * depth), tile, a_, b_])
        for j in columns if ahead else ():
            for row in range(depth):  # one row of a B tile: 64 bytes, a cache line of the packed B
                at = b.add(long(GROUP * TILE * j + (ahead * depth + row) * b_stride), b.mul(k, long(b_stride)))
                b.call(prefetch, [b.gep(bp, [at], source_etype=I8), *(ir.Constant(I32, n) for n in (0, 2, 1))])
        out = dict(acc)
        if len(rows) <= len(columns):
            a_tiles = {i: a_tile(i) for i in rows}
            for j in columns:
                b_j = b_tile(j)
                for i in rows:
                    out[i, j] = product_(out[i, j], a_tiles[i], b_j)
        else:
            b_tiles = {j: b_tile(j) for j in columns}
            for i in rows:
                a_i = a_tile(i)
                for j in columns:
                    out[i, j] = product_(out[i, j], a_i, b_tiles[j])
        return out

    for rows, columns in register_groups(row_tiles, column_tiles):
        acc = {(i, j): b.call(zero, [word(height), word(4 * width)]) if from_zero else
               tile_at(*c_tile(i, j), height, 4 * width, c_stride) for i in rows for j in columns}
        if steps == 1:
            acc = step(long(0), acc, rows, columns)
        else:  # a loop whose phis carry the group's C tiles
            entry = b.block
            loop, done = function.append_basic_block("steps"), function.append_basic_block("done")
            b.branch(loop)
            b.position_at_end(loop)
            index = b.phi(I64, name="step")
            carried = {key: b.phi(AMX) for key in acc}
            acc_next = step(b.mul(index, long(depth)), carried, rows, columns)
            following = b.add(index, long(1))
            index.add_incoming(long(0), entry)
            index.add_incoming(following, b.block)
            for key, phi in carried.items():
                phi.add_incoming(acc[key], entry)
                phi.add_incoming(acc_next[key], b.block)
            b.cbranch(b.icmp_signed("<", following, long(steps)), loop, done)
            b.position_at_end(done)
            acc = acc_next
        for (i, j), tile in acc.items():
            base, offset = c_tile(i, j)
            b.call(store, [word(height), word(4 * width), b.gep(base, [offset], source_etype=I8), long(c_stride), tile])
    b.ret_void()
    return function
