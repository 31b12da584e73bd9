"""The CUDA GEMM template: matmul, dense and batch_matmul as one shared-memory tiled kernel.

The shape of the classic SGEMM kernels that approach cuBLAS: each block computes a BM × BN
tile of C, its threads laid out (BM/TM) × (BN/TN), each keeping a TM × TN tile of C in
registers. Per step of BK along k, the block stages a BM × BK tile of A and a BK × BN tile
of B in shared memory (k-major, rows padded against bank conflicts; two buffers when double
buffering, so the next tile loads while this one is used), with vector loads from global
memory where the operand's rows allow; then each thread reads TM values of A and TN of B per
k and does TM·TN FMAs. Split-K spreads k over the grid's z axis for small M × N: each split
writes its partial tile, and a second kernel sums them and applies bias and epilogue.
Edges are guarded: loads outside the matrix read zeros, stores outside are skipped.
"""
from __future__ import annotations

from ..gpu_device import MAX_GRID_YZ, limits
from ..program import Affine, Barrier, Buffer, Const, If, Loop, Op, Program, Stage, Stmt, tiled, var
from ..space import Config, ConfigSpace, InvalidConfig, Knob, knob_distance
from ..target import Target
from ..workload import Workload
from .epilogue import epilogue
from .gemm_operands import gemm_operands

VERSION = 1  # bumped whenever a change alters the code generated for some config, or what a config means
DTYPES = ("float32",)
THREAD_CHOICES = (1, 2, 4, 8, 16, 32)
REGISTER_TILE_CHOICES = (1, 2, 4, 8)
BK_CHOICES = (4, 8, 16, 32)
VEC_CHOICES = (1, 2, 4)
UNROLL_CHOICES = (1, 2, 4, 8)
PAD_CHOICES = (0, 1, 4)
SPLIT_CHOICES = (1, 2, 4, 8, 16)
MIN_THREADS = 32  # a warp
SPLIT_K_OUTPUTS = 1 << 18  # split-K is offered when C has at most this many elements
SPLIT_K_MIN_DEPTH = 16  # ... and each split gets at least this much of k
REDUCE_THREADS = 128
REGISTER_OVERHEAD = 24  # indices, pointers and loop counters besides the tiles


def _dims(workload: Workload) -> tuple[int, int, int, int]:
    p = workload.p
    return p.get("B", 1), p["M"], p["N"], p["K"]


def _splits(extent: int) -> tuple[tuple[int, int, int], ...]:
    """(-1, threads, register tile) of an axis: block tiles up to ~2x the axis (any up to 16)."""
    return tuple((-1, t, r) for t in THREAD_CHOICES for r in REGISTER_TILE_CHOICES if t * r < 2 * extent or t * r <= 16)


def _b_contiguous(workload: Workload) -> str:
    """The axis along which B's rows are contiguous: n for B[k, n], k for dense's W[n, k]."""
    return "k" if workload.op == "dense" else "n"


def _resources(tile_m, tile_n, tile_k, double_buffer, pad) -> tuple[int, int, int]:
    """(threads, shared bytes, registers per thread, estimated) of a block."""
    (_, ty, tm), (_, tx, tn) = tile_m, tile_n
    shared = (2 if double_buffer else 1) * tile_k[1] * (ty * tm + tx * tn + 2 * pad) * 4
    return ty * tx, shared, tm * tn + tm + tn + REGISTER_OVERHEAD


def _loads_fit(rows: int, cols: int, contiguous_cols: bool, vec: int, threads: int) -> bool:
    """A rows × cols tile splits into whole passes of `threads` vector loads along its contiguous axis."""
    along, across = (cols, rows) if contiguous_cols else (rows, cols)
    return along % vec == 0 and along // vec <= threads and (along // vec) * across >= threads


def space(workload: Workload, target: Target) -> ConfigSpace:
    batch, m, n, k = _dims(workload)
    b_inner = k if _b_contiguous(workload) == "k" else n
    device = limits(target.arch)
    splits = tuple(s for s in SPLIT_CHOICES if s == 1 or (batch * m * n <= SPLIT_K_OUTPUTS and s * SPLIT_K_MIN_DEPTH <= k))
    knobs = [
        Knob("tile_m", "split", _splits(m)),
        Knob("tile_n", "split", _splits(n)),
        Knob("tile_k", "split", tuple((-1, bk) for bk in BK_CHOICES if bk <= max(4, 2 * k))),
        Knob("vec", "annotate", tuple(v for v in VEC_CHOICES if k % v == 0 and b_inner % v == 0)),
        Knob("unroll_k", "annotate", UNROLL_CHOICES),
        Knob("double_buffer", "knob", (True, False)),
        Knob("pad", "knob", PAD_CHOICES),
        Knob("split_k", "knob", splits),
    ]
    b_rows_along_n = _b_contiguous(workload) == "n"

    def fits(tile_m, tile_n, tile_k, vec, double_buffer, pad):
        threads, shared, registers = _resources(tile_m, tile_n, tile_k, double_buffer, pad)
        bm, bn, bk = tile_m[1] * tile_m[2], tile_n[1] * tile_n[2], tile_k[1]
        return (threads >= MIN_THREADS and not device.problems(threads, shared, registers)
                and _loads_fit(bm, bk, True, vec, threads) and _loads_fit(bk, bn, b_rows_along_n, vec, threads))

    return ConfigSpace(knobs, [(("tile_m", "tile_n", "tile_k", "vec", "double_buffer", "pad"), fits),
                               (("unroll_k", "tile_k"), lambda unroll, tile_k: unroll <= tile_k[1])])


def fallback(workload: Workload, target: Target, space_: ConfigSpace) -> Config:
    """The untuned default: 64 × 64 tiles of 256 threads with 4 × 4 each, BK 16, double-buffered, float4 loads."""
    want = {"tile_m": (-1, 16, 4), "tile_n": (-1, 16, 4), "tile_k": (-1, 16), "vec": 4, "unroll_k": 4,
            "double_buffer": True, "pad": 4, "split_k": 1}
    return space_.nearest(want, _distance)


def _distance(candidate, wanted) -> tuple:
    """knob_distance, with a padding of 0 as near to 1 as 1 is to 3."""
    if isinstance(wanted, int) and not isinstance(wanted, bool):
        return knob_distance(candidate + 1, wanted + 1)
    return knob_distance(candidate, wanted)


def _guarded(conditions: list[tuple[Affine, int]], then: list[Stmt], orelse: list[Stmt] = ()) -> list[Stmt]:
    """`then` where every `lhs < rhs` holds, else `orelse`."""
    for lhs, rhs in reversed(conditions):
        then = [If(lhs, "<", rhs, tuple(then), tuple(orelse))]
    return list(then)


class _GemmCuda:
    """Builds the program for one workload and config; one method per part of the kernel."""

    def __init__(self, workload: Workload, target: Target, config: Config):
        self.workload, self.options = workload, workload.p
        self.batch, self.m, self.n, self.k = _dims(workload)
        (_, self.ty, self.tm), (_, self.tx, self.tn) = config["tile_m"], config["tile_n"]
        self.bm, self.bn, self.bk = self.ty * self.tm, self.tx * self.tn, config["tile_k"][1]
        self.threads = self.ty * self.tx
        self.vec, self.unroll, self.pad = config["vec"], config["unroll_k"], config["pad"]
        self.stages = 2 if config["double_buffer"] else 1
        k_tiles = -(-self.k // self.bk)
        self.tiles_per_split = -(-k_tiles // config["split_k"])
        self.splits = -(-k_tiles // self.tiles_per_split)  # no split left empty
        self.batched = workload.op == "batch_matmul"
        self.a, self.b, self.bias, self.c = gemm_operands(workload)
        self.partial = Buffer("partial", (self.splits, self.batch, self.m, self.n), "packed")
        self.a_tile = Buffer("As", (self.stages, self.bk, self.bm + self.pad), "shared")
        self.b_tile = Buffer("Bs", (self.stages, self.bk, self.bn + self.pad), "shared")
        self.a_reg = Buffer("a", (self.tm,), "local")
        self.b_reg = Buffer("b", (self.tn,), "local")
        self.acc = Buffer("acc", (self.tm, self.tn), "local")
        self.sum = Buffer("total", (1,), "local")
        # block indices: batch and split along z, M tiles along y, N tiles along x
        self.bz, self.split = (var("bz") if self.batched else Affine()), (var("split") if self.splits > 1 else Affine())
        self.m0, self.n0 = var("by") * self.bm, var("bx") * self.bn
        # the axes whose last tile reaches past the matrix, so that accesses along them need a guard
        self.ragged = {"m": self.m % self.bm != 0, "n": self.n % self.bn != 0,
                       "k": self.splits * self.tiles_per_split * self.bk != self.k}

    def program(self) -> Program:
        inputs = [self.a, self.b] + ([self.bias] if self.bias else [])
        stages = [Stage("gemm", tuple(self.grid(self.gemm_body())))]
        scratch = [self.partial] if self.splits > 1 else []
        if self.splits > 1:
            stages.append(Stage("sum_splits", tuple(self.sum_splits())))
        locals_ = [self.a_reg, self.b_reg, self.acc] + ([self.sum] if self.splits > 1 else [])
        return Program(self.workload.key, tuple(inputs + [self.c] + scratch + [self.a_tile, self.b_tile] + locals_),
                       tuple(stages))

    def grid(self, body: list[Stmt]) -> list[Stmt]:
        blocks_m, blocks_n = -(-self.m // self.bm), -(-self.n // self.bn)
        if max(blocks_m, self.batch * self.splits) > MAX_GRID_YZ:
            raise InvalidConfig(f"{blocks_m} x {self.batch * self.splits} blocks exceed the grid's {MAX_GRID_YZ} on y, z")
        nest = [Loop("by", blocks_m, "blockIdx.y", (Loop("bx", blocks_n, "blockIdx.x", tuple(body)),))]
        if self.splits > 1:
            nest = [Loop("split", self.splits, "blockIdx.z", tuple(nest))]
        if self.batched:
            nest = [Loop("bz", self.batch, "blockIdx.z", tuple(nest))]
        return nest

    def threads_as_tile(self, body) -> list[Stmt]:
        """The block's threads as a ty × tx grid over the C tile; body(row, col) of the thread's TM × TN tile."""
        return [Loop("ty", self.ty, "threadIdx.x", (Loop("tx", self.tx, "threadIdx.x", tuple(
            body(var("ty") * self.tm, var("tx") * self.tn))),))]

    def gemm_body(self) -> list[Stmt]:
        zero = self.threads_as_tile(lambda r, c: self.register_tile(lambda i, j: [self.acc.store((i, j), Const(0.0))]))
        return zero + self.k_loop() + self.threads_as_tile(self.write_back)

    def k_loop(self) -> list[Stmt]:
        """Over this split's k tiles: load, wait, compute, wait; double-buffered, tile t+1 loads while t is used."""
        tiles = self.tiles_per_split
        if self.stages == 1:
            return tiled("kt", tiles, 1, 0, lambda t, _: self.load(t, 0) + [Barrier()] + self.compute(0) + [Barrier()])
        pair = var("kp") * 2

        def second_half() -> list[Stmt]:
            prefetch = self.load(pair + 2, 0)
            if tiles % 2 == 0:  # the last pair has no tile after it
                prefetch = [If(var("kp"), "<", (tiles - 1) // 2, tuple(prefetch))] if tiles > 2 else []
            return prefetch + self.compute(1) + [Barrier()]

        pairs = [Loop("kp", tiles // 2, "serial", tuple(self.load(pair + 1, 1) + self.compute(0) + [Barrier()]
                                                        + second_half()))] if tiles >= 2 else []
        return self.load(Affine(), 0) + [Barrier()] + pairs + (self.compute(0) if tiles % 2 else [])

    def k_start(self, tile: Affine) -> Affine:
        return (self.split * self.tiles_per_split + tile) * self.bk

    def load(self, tile: Affine, stage: int) -> list[Stmt]:
        """Both operands' tiles of k tile `tile` of this split into shared buffer `stage`."""
        k0 = self.k_start(tile)
        a = self.cooperative(self.a_tile, self.bm, self.bk, lambda r, c: (
            (stage, c, r), self.a[self._batch(self.m0 + r, k0 + c)], [("m", self.m0 + r, self.m), ("k", k0 + c, self.k)]))
        if _b_contiguous(self.workload) == "k":  # W[n, k]: rows along n, contiguous along k
            b = self.cooperative(self.b_tile, self.bn, self.bk, lambda r, c: (
                (stage, c, r), self.b[self.n0 + r, k0 + c], [("n", self.n0 + r, self.n), ("k", k0 + c, self.k)]))
        else:
            b = self.cooperative(self.b_tile, self.bk, self.bn, lambda r, c: (
                (stage, r, c), self.b[self._batch(k0 + r, self.n0 + c)], [("k", k0 + r, self.k), ("n", self.n0 + c, self.n)]))
        return a + b

    def cooperative(self, tile: Buffer, rows: int, cols: int, element) -> list[Stmt]:
        """All threads copy a rows × cols block of an operand, contiguous along cols, `vec` columns per load: the
        threads as (rows per pass) × (cols / vec), in passes down the rows; zeros outside the matrix.
        element(r, c) → (index in the tile, the operand's value, [(axis, lhs, limit) bounds])."""
        lanes = cols // self.vec
        per_pass = self.threads // lanes
        row, col = var("lp") * per_pass + var("lr"), var("lc") * self.vec
        bounds = [(lhs, limit) for axis, lhs, limit in element(row, col)[2] if self.ragged[axis]]
        copy = lambda value: [Loop("v", self.vec, "vectorized", (
            tile.store(element(row, col + var("v"))[0], value(row, col + var("v"))),))]
        one_pass = _guarded(bounds, copy(lambda r, c: element(r, c)[1]), copy(lambda r, c: Const(0.0)))
        return [Loop("lr", per_pass, "threadIdx.x", (Loop("lc", lanes, "threadIdx.x", (
            Loop("lp", rows // per_pass, "unrolled", tuple(one_pass)),)),))]

    def compute(self, stage: int) -> list[Stmt]:
        """Each thread: per k of the tile, TM values of A and TN of B into registers, then TM·TN FMAs."""
        def per_thread(r: Affine, c: Affine) -> list[Stmt]:
            def step(k: Affine) -> list[Stmt]:
                return [Loop("i", self.tm, "vectorized", (self.a_reg.store(var("i"), self.a_tile[stage, k, r + var("i")]),)),
                        Loop("j", self.tn, "vectorized", (self.b_reg.store(var("j"), self.b_tile[stage, k, c + var("j")]),)),
                        *self.register_tile(lambda i, j: [self.acc.store((i, j), Op("fma", (
                            self.a_reg[i], self.b_reg[j], self.acc[i, j])))])]
            return tiled("kk", self.bk, self.unroll, 0, lambda k, u: [Loop("ku", u, "unrolled", tuple(step(k + var("ku"))))])
        return self.threads_as_tile(per_thread)

    def register_tile(self, body) -> list[Stmt]:
        return [Loop("i", self.tm, "unrolled", (Loop("j", self.tn, "unrolled", tuple(body(var("i"), var("j")))),))]

    def write_back(self, r: Affine, c: Affine) -> list[Stmt]:
        """The thread's tile to C (bias and epilogue applied) or, split, to its partial sums; edges skipped."""
        row, col = self.m0 + r + var("i"), self.n0 + c + var("j")
        bounds = [(lhs, limit) for axis, lhs, limit in (("m", row, self.m), ("n", col, self.n)) if self.ragged[axis]]
        if self.splits > 1:
            store = [self.partial.store((self.split, self.bz, row, col), self.acc[var("i"), var("j")])]
        else:
            store = self.finish(self.acc, (var("i"), var("j")), self._batch(row, col), col)
        return self.register_tile(lambda i, j: _guarded(bounds, store))

    def finish(self, register: Buffer, index: tuple, out: tuple, col: Affine) -> list[Stmt]:
        """C[out] = epilogue(register[index] + bias[col]); the sum goes through the register so it is read once."""
        kind = self.options.get("epilogue", "none")
        if self.bias is None and kind == "none":
            return [self.c.store(out, register[index])]
        biased = Op("add", (register[index], self.bias[col])) if self.bias is not None else register[index]
        return [register.store(index, biased), self.c.store(out, epilogue(kind, register[index]))]

    def sum_splits(self) -> list[Stmt]:
        """C = epilogue(Σ over splits of the partial tiles + bias): one thread per element of C."""
        width = REDUCE_THREADS
        col = var("nb") * width + var("t")
        total = [self.sum.store(0, Const(0.0))] + [self.sum.store(0, Op("add", (
            self.sum[0], self.partial[s, self.bz, var("m"), col]))) for s in range(self.splits)]
        body = total + self.finish(self.sum, (0,), self._batch(var("m"), col), col)
        guard = _guarded([(col, self.n)] if self.n % width else [], body)
        nest = [Loop("m", self.m, "blockIdx.y", (Loop("nb", -(-self.n // width), "blockIdx.x", (
            Loop("t", width, "threadIdx.x", tuple(guard)),)),))]
        return [Loop("bz", self.batch, "blockIdx.z", tuple(nest))] if self.batched else nest

    def _batch(self, *index) -> tuple:
        return (self.bz, *index) if self.batched else index


def lower(workload: Workload, target: Target, config: Config) -> Program:
    return _GemmCuda(workload, target, config).program()
