"""AMX tile products in LLVM IR: a `tile` nest of a program (k groups, rows, columns) as tile loads, products and
stores, through the AMX intrinsics on numbered tile registers.

The nest's product is C[r, c] += Σ_q Σ_j A[r, g·q + j] · B[q, c, j], with C a float32 or int32 block in memory,
A's rows as they are (g elements of a group adjacent) and B's groups packed [q][c][g]. It runs in tiles of 16 rows ×
16 columns of C and steps of 16 groups of k (64 bytes of a row of A; 16 rows of B), the tails in smaller tiles.
Each register has one shape under a tile configuration, so tiles of each shape get functions of their own (a pass):
C's tiles of one height and width, loaded, carried through the k steps of one depth, and stored back. A block of
whole tiles and whole steps is one pass; the tails add a few.

The configuration is written once by the function that runs a stage's tile nests (`configure`, for the shape of
their first pass: the whole tiles), not by each pass: writing one costs about as much as twelve tile products
(passes that wrote their own, as LLVM's shape-carrying intrinsics have every function do, ran dense 128×3072×768
bfloat16's fallback 8-11% slower on an Intel AMX host, one thread, hot caches). A pass of another shape writes its
own and then the stage's again.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby, product as pairs

from llvmlite import ir

from search_space.program import TILE_STEP as STEP

I8, I32, I64, PTR, VOID = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.PointerType(), ir.VoidType()
TILE, GROUP = 16, 4  # rows and 32-bit columns of a tile; bytes of a group
C_REGISTERS, A_REGISTERS, B_REGISTERS = (0, 1, 2, 3), (4, 5), (6, 7)  # the tile registers each operand's tiles use
REGISTERS = len(C_REGISTERS + A_REGISTERS + B_REGISTERS)  # tile registers: eight
LINE = 64  # bytes of a cache line
CHUNK = 4  # k steps a pass's register groups take in turn, so that their A and B rows come again from L1 (see _pass)
# the family's feature and its tile product
PRODUCTS = {"dot2_amx": ("amx-bf16", "llvm.x86.tdpbf16ps"), "dot4_amx": ("amx-int8", "llvm.x86.tdpbusd")}
Shape = tuple[int, int, int]  # a pass's tiles: rows of C and A, 32-bit columns of C and B, groups of k a step takes


@dataclass(frozen=True)
class Operand:
    """A matrix in memory: the address of its first element and the bytes from one row to the next."""

    base: ir.Value
    stride: int


@dataclass(frozen=True)
class Tiles:
    """The tile instructions at `b`, on numbered registers, declared in its module through `declare(name, ret,
    args)`."""

    b: ir.IRBuilder
    declare: object

    @classmethod
    def of(cls, b: ir.IRBuilder) -> Tiles:
        """Tiles at `b`, declaring each intrinsic in its module the first time."""
        module = b.module
        return cls(b, lambda name, ret, args: module.globals[name] if name in module.globals else ir.Function(
            module, ir.FunctionType(ret, args), name))

    def _call(self, name: str, types: list, args: list) -> None:
        self.b.call(self.declare(name, VOID, types), args)

    def load(self, register: int, address: ir.Value, stride: int) -> None:
        self._call("llvm.x86.tileloadd64", [I8, PTR, I64], [_byte(register), address, ir.Constant(I64, stride)])

    def store(self, register: int, address: ir.Value, stride: int) -> None:
        self._call("llvm.x86.tilestored64", [I8, PTR, I64], [_byte(register), address, ir.Constant(I64, stride)])

    def zero(self, register: int) -> None:
        self._call("llvm.x86.tilezero", [I8], [_byte(register)])

    def dot(self, product: str, c: int, a: int, b: int) -> None:
        self._call(PRODUCTS[product][1], [I8] * 3, [_byte(c), _byte(a), _byte(b)])

    def configure(self, shape: Shape) -> None:
        """Write the tile configuration of `shape` (a constant of the module's)."""
        module, name = self.b.module, "tiles.palette." + ".".join(map(str, shape))
        if name not in module.globals:
            constant = ir.GlobalVariable(module, ir.ArrayType(I8, 64), name)
            constant.global_constant, constant.linkage, constant.align = True, "internal", 64
            constant.initializer = ir.Constant(ir.ArrayType(I8, 64), bytearray(palette(shape)))
        address = self.b.gep(module.globals[name], [ir.Constant(I32, 0), ir.Constant(I32, 0)])
        self._call("llvm.x86.ldtilecfg", [PTR], [address])

    def release(self) -> None:
        """Return the tiles to their initial state, so that a context switch need not save them."""
        self._call("llvm.x86.tilerelease", [], [])


def _byte(n: int) -> ir.Constant:
    return ir.Constant(I8, n)


def palette(shape: Shape) -> bytes:
    """`ldtilecfg`'s 64 bytes for a pass of `shape`: palette 1; C's registers height rows of 4·width bytes, A's
    height rows of GROUP·depth, B's depth rows of 4·width (bytes a row at 16 + 2·register, rows at 48 + register)."""
    height, width, depth = shape
    config = bytearray(64)
    config[0] = 1
    for registers, rows, row_bytes in ((C_REGISTERS, height, 4 * width), (A_REGISTERS, height, GROUP * depth),
                                       (B_REGISTERS, depth, 4 * width)):
        for register in registers:
            config[16 + 2 * register], config[48 + register] = row_bytes, rows
    return bytes(config)


def first_shape(rows: int, columns: int, groups: int) -> Shape:
    """The shape of a tile nest's first pass (`tile_product`'s first runs: whole tiles where it has any): what its
    stage configures."""
    return tuple(_uniform(extent, size)[0][1] for extent, size in ((rows, TILE), (columns, TILE), (groups, STEP)))


def _uniform(extent: int, size: int) -> list[tuple[int, int, int]]:
    """(first, size, count): runs of equal spans covering `extent`, the whole ones then the rest."""
    spans = [(start, min(size, extent - start)) for start in range(0, extent, size)]
    return [(group[0][0], length, len(group)) for length, runs in groupby(spans, key=lambda s: s[1])
            for group in [list(runs)]]


def tile_product(b: ir.IRBuilder, declare, product: str, c: Operand, a: Operand, bp: Operand, rows: int,
                 columns: int, groups: int, configured: Shape, from_zero: bool = False, ahead: int = 0,
                 share: tuple[ir.Value, int] | None = None) -> None:
    """C[rows × columns] += A[rows × groups] · Bp[groups × columns], one pass per shape of tiles and of k step,
    under the tile configuration of shape `configured`; `declare(name, ret, args)` declares an intrinsic in the
    module. `from_zero`: C = A · Bp, whatever C holds (the first pass of each block of C's tiles starts from zero
    tiles, the passes of later k steps from the first's). `ahead`: each k step prefetches the packed B's rows that
    many steps on (`_pass`). `share` (index, count; index an i64): the nest is the index-th of `count` that read
    these rows of Bp, and its first pass prefetches the index-th share of as many bytes as follow them, spread
    over its k steps: each nest that shares a panel fetches part of the next, where with `ahead` the first of them
    fetches it all while itself waiting on memory."""
    at = lambda operand, offset: b.gep(operand.base, [offset if isinstance(offset, ir.Value) else
                                                      ir.Constant(I64, offset)], source_etype=I8)
    for r0, height, row_tiles in _uniform(rows, TILE):
        for c0, width, column_tiles in _uniform(columns, TILE):
            for k0, depth, steps in _uniform(groups, STEP):
                shape = (height, row_tiles, width, column_tiles, depth, steps)
                strides = (c.stride, a.stride, bp.stride)
                spread, following = 0, []
                if share and r0 == c0 == k0 == 0 and steps > 1:
                    index, count = share
                    lines = -(-groups * bp.stride // (LINE * count))  # cache lines of the share
                    spread = -(-lines // steps)
                    following = [at(bp, b.add(ir.Constant(I64, groups * bp.stride), b.mul(index, ir.Constant(
                        I64, lines * LINE))))]
                function = _pass(b.module, declare, product, shape, strides, configured, from_zero and k0 == 0, ahead,
                                 spread)
                b.call(function, [at(c, r0 * c.stride + 4 * c0), at(a, r0 * a.stride + GROUP * k0),
                                  at(bp, GROUP * c0 + k0 * bp.stride)] + following)


def register_groups(row_tiles: int, column_tiles: int) -> list[tuple[range, range]]:
    """C's tiles in groups that fit the tile registers beside their operands (the group's tiles, its smaller side's
    and one of the other's: at most eight), in row order so that a group's A tiles come again from L1: 2 × 2 where
    both sides have two, else a single row or column of up to four."""
    rows, columns = (4, 1) if column_tiles == 1 else (1, 4) if row_tiles == 1 else (2, 2)
    return [(range(i, min(i + rows, row_tiles)), range(j, min(j + columns, column_tiles)))
            for i in range(0, row_tiles, rows) for j in range(0, column_tiles, columns)]


def _pass(module: ir.Module, declare, product: str, shape: tuple, strides: tuple, configured: Shape,
          from_zero: bool, ahead: int = 0, spread: int = 0) -> ir.Function:
    """`void (ptr C, ptr A, ptr Bp[, ptr following])`: C's row_tiles × column_tiles tiles += `steps` k steps of
    `depth` groups (C's tiles from zero tiles, not from C, where `from_zero`); one function per shape, strides and
    start in a module.
    It runs C's tiles a register group at a time (loaded, carried through the k steps, stored); several groups take
    CHUNK steps in turn, so that a group reads again from L1 the A or B rows the one before it read (4 × 4 tiles
    read 8 KB of rows a step; dense 128×3072×768 bfloat16, three register blocks, one thread, hot caches: CHUNK 4
    1158-1268 GFLOPS, 2 1077-1112, 8 1085-1191, the whole k in one go 992-1019). Within a step the group's smaller
    side's tiles are all loaded, the other side's one at a time, in turns between two registers. Where `ahead` and
    there are several steps, each step first prefetches into L2 the rows of its B tiles `ahead` steps on (past the
    block's last step, the rows that follow: the next panel's): in a model bound weights come from memory or L3,
    and a tile load waits for all sixteen of its rows. Where `spread`, each step prefetches that many cache lines
    more of `following`, a line after the last."""
    height, row_tiles, width, column_tiles, depth, steps = shape
    own = (height, width, depth)
    ahead = ahead if steps > 1 else 0
    name = f"tiles.{product}.{'.'.join(map(str, shape + strides))}" + (".zero" if from_zero else "") + \
        (f".ahead{ahead}" if ahead else "") + (f".spread{spread}" if spread else "") + \
        ("" if own == configured else ".in." + ".".join(map(str, configured)))
    if name in module.globals:
        return module.globals[name]
    c_stride, a_stride, b_stride = strides
    function = ir.Function(module, ir.FunctionType(VOID, [PTR] * (4 if spread else 3)), name)
    function.linkage = "internal"
    for attribute in ("noinline", "nounwind"):
        function.attributes.add(attribute)
    for argument in function.args[:3]:  # `following` is only prefetched (and lies in Bp)
        argument.add_attribute("noalias")
    c, a, bp, *following = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))
    tiles, long = Tiles(b, declare), (lambda n: ir.Constant(I64, n))
    prefetch = declare("llvm.prefetch.p0", VOID, [PTR, I32, I32, I32])
    fetch = lambda address: b.call(prefetch, [address, *(ir.Constant(I32, n) for n in (0, 2, 1))])  # read, L2, data
    at = lambda base, offset: b.gep(base, [offset], source_etype=I8)
    c_tile = lambda i, j: at(c, long(i * TILE * c_stride + 4 * TILE * j))

    def step(s, registers: dict, rows: range, columns: range, leads: bool) -> None:
        """The group's C tiles (in `registers`) after k step `s` (an i64); the step's spread prefetches where
        `leads` (the first group of a pass: once a step)."""
        k = b.mul(s, long(depth))
        a_tile = lambda i, register: tiles.load(register, at(a, b.add(long(i * TILE * a_stride),
                                                                      b.mul(k, long(GROUP)))), a_stride)
        b_tile = lambda j, register: tiles.load(register, at(bp, b.add(long(GROUP * TILE * j),
                                                                        b.mul(k, long(b_stride)))), b_stride)
        for j in columns if ahead else ():
            for row in range(depth):  # one row of a B tile: 64 bytes, a cache line of the packed B
                fetch(at(bp, b.add(long(GROUP * TILE * j + (ahead * depth + row) * b_stride),
                                   b.mul(k, long(b_stride)))))
        for line in range(spread) if leads else ():
            fetch(at(following[0], b.add(b.mul(s, long(spread * LINE)), long(line * LINE))))
        if len(rows) <= len(columns):
            a_of = dict(zip(rows, A_REGISTERS))
            for i in rows:
                a_tile(i, a_of[i])
            for turn, j in enumerate(columns):
                b_tile(j, B_REGISTERS[turn % 2])
                for i in rows:
                    tiles.dot(product, registers[i, j], a_of[i], B_REGISTERS[turn % 2])
        else:
            b_of = dict(zip(columns, B_REGISTERS))
            for j in columns:
                b_tile(j, b_of[j])
            for turn, i in enumerate(rows):
                a_tile(i, A_REGISTERS[turn % 2])
                for j in columns:
                    tiles.dot(product, registers[i, j], A_REGISTERS[turn % 2], b_of[j])

    groups = register_groups(row_tiles, column_tiles)
    chunk = min(steps, CHUNK) if len(groups) > 1 else steps

    def run(first, count: int, zeroed: bool = False) -> None:
        """Every group's C tiles through `count` k steps from step `first` (an i64), from zero tiles where
        `zeroed`."""
        for n, (rows, columns) in enumerate(groups):
            registers = dict(zip(pairs(rows, columns), C_REGISTERS))
            for (i, j), register in registers.items():
                if zeroed:
                    tiles.zero(register)
                else:
                    tiles.load(register, c_tile(i, j), c_stride)
            at_step = lambda s: step(b.add(first, s), registers, rows, columns, n == 0)
            if count == 1:
                at_step(long(0))
            else:
                counted(b, function, count, at_step)
            for (i, j), register in registers.items():
                tiles.store(register, c_tile(i, j), c_stride)

    if own != configured:
        tiles.configure(own)
    whole, rest = divmod(steps, chunk)
    run(long(0), chunk, from_zero)
    if whole > 1:
        counted(b, function, whole - 1, lambda n: run(b.mul(b.add(n, long(1)), long(chunk)), chunk))
    if rest:
        run(long(whole * chunk), rest)
    if own != configured:
        tiles.configure(configured)
    b.ret_void()
    return function


def counted(b: ir.IRBuilder, function: ir.Function, count: int, body) -> None:
    """`body(index)` for index 0..count-1 (an i64), as a loop."""
    entry = b.block
    loop, done = function.append_basic_block("loop"), function.append_basic_block("done")
    b.branch(loop)
    b.position_at_end(loop)
    index = b.phi(I64)
    body(index)
    following = b.add(index, ir.Constant(I64, 1))
    index.add_incoming(ir.Constant(I64, 0), entry)
    index.add_incoming(following, b.block)
    b.cbranch(b.icmp_signed("<", following, ir.Constant(I64, count)), loop, done)
    b.position_at_end(done)
