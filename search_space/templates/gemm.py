"""The CPU GEMM template: matmul, dense and batch_matmul as one register-blocked loop nest.

C[b, m, n] (+)= Σ_k A[b, m, k] · B[b, k, n]; dense reads B[k, n] from W[n, k] and may add a
bias and an epilogue. The shape is the BLIS/GOTO one: B optionally packed into panels
Bp[n/nr][k][nr], outer cache tiles (mo, no, ko) in a tunable order, inner tiles (mi, ni),
and a micro-kernel that keeps an mr × nr block of C in vector registers across the k loop:
per k, nr/vec vector loads of B, mr broadcasts of A and mr·nr/vec vector FMAs. dense's bound
weights come from memory in a model: its `prefetch` knob has each k step prefetch the packed
W's row that many steps on.

bfloat16 sums in float32 registers. Its packed B holds k in adjacent pairs, Bp[n/nr][k/2][nr][2],
so that one 32-bit load brings two k of A or of a B column: the `isa` knob multiplies the pairs
by two FMAs on widened halves (`fma`, any CPU) or by AVX-512 BF16's pair dot (`avx512bf16`).
Or (`fma-f32`, any CPU) both operands are widened before the product, B as it is packed into
float32 panels (once, for bound weights) and A into a float32 copy at each call, and the product
is float32's: no widening in the inner loop, at twice the packed weights' bytes.
Partial sums of a k-block go to a float32 workspace, not through the bfloat16 output.

int8 (uint8 A × int8 B) sums in int32 registers, exactly. Its packed B holds k in groups of four
bytes, Bp[n/nr][k/4][nr][4] (AVX-512 VNNI's layout), so a 32-bit lane holds four k: `isa` picks
each byte widened to int32, multiplied and added (`widen`, any CPU), AVX2's `pmaddubsw` (byte
pairs summed in int16, then pmaddwd by ones: exact only for activations in 0..127, so offered only to
workloads of a reduced range, as PyTorch's x86 quantization makes them) or VNNI's `vpdpbusd`
(`avx512vnni`). dense dequantizes as it writes: the int32 sum corrected by the zero point times
the weights' row sums (summed once, when the weights are bound), scaled to float32, then bias and
epilogue; partial sums of a k-block wait in an int32 workspace.

Where the CPU has AMX, `isa` may be `amx-bf16` or `amx-int8`: the micro-kernel's block is then
up to 4 × 4 tiles of 16 rows × 16 columns of C, and its k loop a `tile` nest that the code
generator runs as tile loads and `tdpbf16ps` / `tdpbusd` products, 32 bf16 or 64 bytes of k a
step, from A's rows as they are and the packed B's group rows (16 columns × 4 bytes: exactly a
tile row), a group of tiles that fits the eight tile registers at a time, all under one tile
configuration. Its `prefetch` knob has each k step prefetch the packed B's rows that many steps ahead
into L2, as bound weights come from memory in a model.
"""
from __future__ import annotations

import itertools

from ..program import ITEMSIZE, Affine, Buffer, Call, Const, If, Load, Loop, Op, Program, Stage, tile_nest, tiled, var
from ..space import Config, ConfigSpace, Knob
from ..target import Target
from ..thread_balance import balanced_block
from ..workload import Workload
from .dequantize import dequantized, negated_sums
from .epilogue import epilogue
from .gemm_operands import gemm_operands, input_buffers
from .register_blocks import best_blocks, fills, reduction_block, seed_blocks, seed_families

VERSION = 2  # bumped whenever a change alters the code generated for some config, or what a config means (2: dense's
# `prefetch` knob, which gave its configs new indices)
# int8 one ahead: its `widen` has multiplied by pmaddwd on x86 since float32's version 1; bfloat16 one ahead: its
# `fma-f32` family gave its configs new indices
DTYPE_VERSIONS = {"int8": 3, "bfloat16": 3}
DTYPES = ("float32", "bfloat16", "int8")
VIEWS = True  # reads batch_matmul's operands through the strides its workload gives
VECTOR_SPLITS = ("tile_n",)  # splits whose register tile is counted in vectors: scaled with `vec` to another CPU
# per dtype whose packed B holds k in groups (as many as a 32-bit lane holds): the `isa` families (those any CPU
# has first, then those named by a target feature), and the IR op each family's dot is
FAMILIES = {"bfloat16": ("fma", "fma-f32", "avx512bf16", "amx-bf16"),
            "int8": ("widen", "pmaddubsw", "avx512vnni", "amx-int8")}
WIDENED = "fma-f32"  # bfloat16's family whose operands are widened to float32 before the product: float32's
GENERIC = ("fma", WIDENED, "widen")  # the families any CPU has
SATURATING = "pmaddubsw"  # int8's family whose byte pairs sum in int16: for activations of a reduced range, on AVX2
DOTS = {"fma": "dot2", "avx512bf16": "dot2_bf16", "amx-bf16": "dot2_amx", "widen": "dot4", "pmaddubsw": "dot4_ubsw",
        "avx512vnni": "dot4_vnni", "amx-int8": "dot4_amx"}
AMX = ("amx-bf16", "amx-int8")
TILE = 16  # rows of an AMX tile, and 32-bit columns
MR_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
AMX_MR_CHOICES = (32, 48, 64)  # register blocks of several tiles' rows, offered only where AMX is
AMX_ROWS = 4  # rows of an AMX block that a turn of its write-back loop takes
AHEAD_CHOICES = (0, 4, 16, 32)  # k steps ahead that a micro-kernel prefetches the packed B (0: not at all)
SHARED = "shared"  # AMX's other choice: each micro-kernel that reads a panel prefetches a share of the next one
NR_CHOICES = (4, 8, 12, 16, 24, 32, 48, 64)
MOST_VECTORS = 8  # of B's columns in a register block
BLOCK_CHOICES = (1, 2, 4, 8, 16, 32, 64)
BLOCK_TILES = 8  # register tiles to a cache block in the fallback and seeds, fewer where threads share them unevenly
UNROLL_CHOICES = (1, 2, 4, 8)


def _dims(workload: Workload) -> tuple[int, int, int, int]:
    p = workload.p
    return p.get("B", 1), p["M"], p["N"], p["K"]


def _splits(extent: int, inner: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """(-1, block, register) tiles of an axis: the register tile no larger than needed, blocks up to ~2x the axis."""
    regs = [r for r in inner if r <= extent] or [min(inner)]
    return tuple((-1, b, r) for r in regs for b in BLOCK_CHOICES if b == 1 or b * r < 2 * extent)


def _k_tiles(extent: int) -> tuple[tuple[int, int], ...]:
    sizes = sorted({s for s in (16, 32, 64, 128, 256, 512, 1024) if s < extent} | {extent})
    return tuple((-1, s) for s in sizes)


def space(workload: Workload, target: Target) -> ConfigSpace:
    batch, m, n, k = _dims(workload)
    vec_choices = tuple(v for v in (4, 8, 16) if v * 32 <= target.vector_bits)
    parallel = ("none",) if target.threads == 1 else ("none", "m", "n") + (("b",) if workload.op == "batch_matmul" else ())
    amx = offers_amx(workload, target)
    knobs = [
        Knob("tile_m", "split", _splits(m, MR_CHOICES + (AMX_MR_CHOICES if amx else ()))),
        Knob("tile_n", "split", _splits(n, tuple(c for c in NR_CHOICES if c <= max(64, n)) if n >= 4 else (4,))),
        Knob("tile_k", "split", _k_tiles(k)),
        Knob("vec", "annotate", vec_choices),
        Knob("unroll_k", "annotate", UNROLL_CHOICES),
        Knob("order", "reorder", tuple(itertools.permutations(("mo", "no", "ko")))),
        Knob("inner_order", "reorder", (("mi", "ni"), ("ni", "mi"))),
        Knob("parallel", "annotate", parallel),
        Knob("pack_b", "knob", (True,) if b_along_k(workload) and workload.op != "dense" else (True, False)),
    ]
    registers = target.vector_registers

    def fits(tile_m, tile_n, vec):
        """The nr columns split into whole vectors, and accumulators + B vectors + a broadcast fit the register file."""
        mr, nr = tile_m[2], tile_n[2]
        return nr % vec == 0 and fills(mr, nr // vec, registers) and nr // vec <= MOST_VECTORS

    def whole_tiles(tile_m, tile_n):
        """Whole tiles, or the whole extent where it is below one."""
        whole = lambda r, extent: r % TILE == 0 or r == min(extent, TILE)
        return whole(tile_m[2], m) and whole(tile_n[2], n)

    constraints = [(("tile_m", "tile_n", "vec"), fits)]
    # dense's bound weights come from memory in a model: its micro-kernel may prefetch them from the packed B
    dense = workload.op == "dense"
    streamed = lambda pack_b, prefetch: prefetch == 0 or dense and pack_b
    prefetches = Knob("prefetch", "knob", AHEAD_CHOICES + ((SHARED,) if amx else ()))
    if dense:
        knobs.append(prefetches)
        constraints.append((("pack_b", "prefetch"), streamed))
    if workload.dtype not in FAMILIES:
        return ConfigSpace(knobs, constraints)
    generic = FAMILIES[workload.dtype][0]
    knobs.append(Knob("isa", "annotate", isas(target, workload.dtype, workload.p.get("reduce_range", False))))
    # the special dots read the group layout of the packed B, AVX-512's on 16 lanes (or fewer with AVX-512 VL); the
    # widened family reads B as packed (unpacked, it would be `fma` unpacked: B's pairs widened as loaded)
    groups_read = lambda isa, pack_b, vec: isa == generic or (pack_b and (
        isa in (WIDENED, SATURATING) or vec == 16 or "avx512vl" in target.features))
    if not amx:
        return ConfigSpace(knobs, constraints + [(("isa", "pack_b", "vec"), groups_read)], strata="isa")
    if not dense:  # AMX's tile products prefetch in every op
        knobs.append(prefetches)
    a_strides = workload.operand_strides("A")
    a_rows = a_strides is None or a_strides[2] == 1  # a tile row of A is k's groups side by side

    # tiles for AMX, from A's rows as they lie, on a packed B, written back on 16 lanes, the k loop not unrolled (the
    # two knobs are fixed there); a register block for the vector families, prefetching only in dense and only k
    # steps ahead (`shared` is a tile nest's). Four rules, not one of seven knobs: the space is built a knob at a time
    amx_or = lambda isa, tiles, vector: tiles if isa in AMX else vector
    return ConfigSpace(knobs, [
        (("isa", "tile_m", "tile_n", "vec"), lambda isa, tile_m, tile_n, vec: amx_or(
            isa, whole_tiles(tile_m, tile_n) and vec == max(vec_choices), fits(tile_m, tile_n, vec))),
        (("isa", "pack_b", "vec"), lambda isa, pack_b, vec: amx_or(
            isa, a_rows and pack_b, groups_read(isa, pack_b, vec))),
        (("isa", "unroll_k"), lambda isa, unroll_k: amx_or(isa, unroll_k == 1, True)),
        (("isa", "pack_b", "prefetch"), lambda isa, pack_b, prefetch: amx_or(
            isa, True, streamed(pack_b, prefetch) and prefetch != SHARED))], strata="isa")


def version(workload: Workload, target: Target) -> int:
    """The version of a workload's configs on a target: DTYPE_VERSIONS' (or VERSION), three more where the space
    offers AMX, whose configs gained the `prefetch` knob and then its SHARED choice (each time new indices), then a
    write-back looping over rows; other targets' records stay valid."""
    base = DTYPE_VERSIONS.get(workload.dtype, VERSION)
    return base + 3 if offers_amx(workload, target) else base


def b_along_k(workload: Workload) -> bool:
    """Whether B's elements lie along k (dense's W [N, K]; kᵀ read in place from k [.., N, K]): packing transposes
    it, and a product reading it unpacked would gather every vector, so a batch_matmul's always packs it."""
    strides = workload.operand_strides("B")
    return workload.op == "dense" or strides is not None and strides[1] == 1 != strides[2]


def offers_amx(workload: Workload, target: Target) -> bool:
    """Whether the workload's space on the target has an AMX family: its dtype has one and the target AMX."""
    return workload.dtype in FAMILIES and isas(target, workload.dtype)[-1] in AMX


def isas(target: Target, dtype: str = "bfloat16", reduced: bool = False) -> tuple[str, ...]:
    """The instruction families a product in `dtype` may use on the target: widening (and FMA) everywhere, AVX2's
    saturating byte-pair product for int8 activations of a `reduced` range, AVX-512 BF16's pair dot or VNNI's
    byte-quad dot, and AMX's tile product, where the target has them."""
    def has(family: str) -> bool:
        if family == SATURATING:
            return reduced and "avx2" in target.features
        return family in GENERIC or family in target.features and (family not in AMX or "amx-tile" in target.features)
    return tuple(family for family in FAMILIES[dtype] if has(family))


def packed_dtype(isa: str | None, dtype: str) -> str:
    """The dtype an operand of `dtype` is packed in under the family `isa`: float32 where it widens ahead."""
    return "float32" if isa == WIDENED else dtype


def fallback(workload: Workload, target: Target, space_: ConfigSpace, isa: str | None = None) -> Config:
    """The untuned default, in `isa`'s instruction family (else the last the space offers): an 8×(2 vectors) register
    block where it fits the register file (AVX-512's 32), else the block `best_blocks` ranks first there (AVX2's 16:
    4 × 3 vectors, where the nearest valid config to 8 × 2 is 8 × 1, eight broadcasts and one load per eight
    multiply-adds), B packed, k-blocks of 256, the larger of M and N split across threads in blocks they share
    about evenly (`balanced`).
    AMX's is 2 × 2 tiles through the whole k (dense 128×768×3072 bfloat16, 1 thread, on an Intel AMX host: 802
    GFLOPS against 621 in k-blocks of 512), the row blocks of a panel (up to BLOCK_TILES) one after another, so that
    the next panel's shares are all fetched while it is read (BERT-base's dense shapes, weights rotated, an Intel
    AMX host: bf16 at 2 threads 4-13% faster than blocks of two row blocks and two panels in 7 of 8 shapes and runs,
    1% slower in the eighth, at 1 thread from 1% slower to 6% faster; int8 1-16% faster in all six), each row block
    prefetching its share of the next panel (SHARED): with their weights from memory, as in a model (rotated through
    copies), BERT-base's four 128-row dense shapes, on 1 thread and 2, ran 6-17% faster so than prefetching nothing
    in every shape in one run, and in three runs from 11% slower to 17% faster (19 of the 24 faster; an Intel AMX
    host, alternate rounds, its speed halving in some minutes); 16 k steps ahead, from 14% slower to 115% faster
    than nothing; 4 × 4 tiles (a seed: hot, those ran 10-21% faster on two of the three, 8-10% slower on K = 3072)
    mostly slower with their weights from memory. The vector families' dense prefetches 32 k steps on (BERT-base's
    four dense shapes at 32 rows, their weights rotated, 2 threads on a Zen 5: 13-28% faster than not at all; 16
    steps ahead ranged from 11% slower to 22% faster)."""
    batch, m, n, k = _dims(workload)
    vec, registers = max(space_.knobs["vec"].candidates), target.vector_registers
    rows, vectors = (8, 2) if fills(8, 2, registers) else \
        best_blocks(MR_CHOICES, range(1, MOST_VECTORS + 1), registers)[0]
    want = balanced({
        "tile_m": (-1, BLOCK_TILES, rows), "tile_n": (-1, BLOCK_TILES, vectors * vec), "tile_k": (-1, 256),
        "vec": vec, "unroll_k": 4, "order": ("no", "ko", "mo"), "inner_order": ("ni", "mi"),
        "parallel": "b" if batch > 1 else ("m" if m >= n else "n"), "pack_b": True,
        "prefetch": 32 if workload.op == "dense" else 0,
    }, workload, target)
    if "isa" in space_.knobs:
        want["isa"] = isa or space_.knobs["isa"].candidates[-1]
        if want["isa"] in AMX:  # 2 × 2 tiles of C through the whole k, a panel's row blocks one after another
            row_blocks = min(BLOCK_TILES, -(-m // (2 * TILE)))
            want |= {"tile_m": (-1, row_blocks, 2 * TILE), "tile_n": (-1, 1, 2 * TILE), "tile_k": (-1, k),
                     "unroll_k": 1, "prefetch": SHARED}
    return space_.nearest(want)


def seeds(workload: Workload, target: Target, space_: ConfigSpace) -> list[Config]:
    """What a search measures first where the op has not been searched on the target: the register blocks of
    `seed_blocks` in each vector family (`seed_families`), k in blocks whose B panel fits L1, the rest as the
    fallback. A float32
    batch_matmul's seeds read B in place: its B is an activation, packed again at every call, and unpacked the
    seed blocks of BERT's attention products ran 9-18% faster on an Intel AVX-512 host (the fallback, measured
    before them, packs it: the first batch has both). Where the fallback splits M across threads (M ≥ N), the first
    family's blocks are seeded split across N as well: each block of M rows reads all of B again, which costs where
    B outgrows L2 and not where it fits (an Intel Xeon, 2 threads, the seed blocks over M and over N: matmul 1024³
    0.94-1.08x as fast over N, 2048×512×512 0.87-1.00x). AMX's is the fallback's in 4 × 4 tiles."""
    base = dict(fallback(workload, target, space_).values)
    if base.get("isa") in AMX:
        return [space_.nearest(balanced(base | {"tile_m": (-1, 1, 4 * TILE), "tile_n": (-1, 2, 4 * TILE)}, workload,
                                        target))]
    if workload.op == "batch_matmul" and workload.dtype == "float32":
        base["pack_b"] = False
    k_blocks = [s[1] for s in space_.knobs["tile_k"].candidates]
    itemsize = lambda family: ITEMSIZE[packed_dtype(family.get("isa"), gemm_operands(workload)[1].dtype)]
    axes = (base["parallel"], "n") if base["parallel"] == "m" else (base["parallel"],)
    return [space_.nearest(balanced(base | family | {"parallel": axis, "vec": vec, "tile_m": (-1, BLOCK_TILES, mr),
                                                     "tile_n": (-1, BLOCK_TILES, nr),
                                                     "tile_k": (-1, reduction_block(nr, itemsize(family), k_blocks))},
                                    workload, target))
            for index, family in enumerate(seed_families(space_))
            for axis in (axes if index == 0 else axes[:1])
            for vec, mr, nr in seed_blocks(space_, "tile_m", "tile_n", MOST_VECTORS, target.vector_registers)]


def balanced(want: dict, workload: Workload, target: Target) -> dict:
    """`want` with its parallel axis in blocks of up to BLOCK_TILES register tiles that the target's threads split
    evenly, or within 5% of it (`balanced_block`): 8 × 32 columns of N = 768 are three blocks, one thread's two to
    the other's one."""
    axis = {"m": "tile_m", "n": "tile_n"}.get(want["parallel"])
    if axis is None:
        return want
    extent, register = _dims(workload)[1 if axis == "tile_m" else 2], want[axis][2]
    return want | {axis: (-1, balanced_block(extent, register, target.threads, BLOCK_CHOICES, BLOCK_TILES), register)}


class _Gemm:
    """Builds the program for one workload and config; one method per part of the loop nest."""

    def __init__(self, workload: Workload, target: Target, config: Config):
        self.workload, self.config = workload, config
        self.batch, self.m, self.n, self.k = _dims(workload)
        self.mb, self.mr = config["tile_m"][1:]
        self.nb, self.nr = config["tile_n"][1:]
        self.kc = config["tile_k"][1]
        self.vec, self.unroll = config["vec"], config["unroll_k"]
        self.parallel = config["parallel"] if target.threads > 1 else "none"
        self.pack = config["pack_b"]
        self.along_k = b_along_k(workload)
        self.isa = dict(config.values).get("isa")
        self.options = workload.p
        self.batched = workload.op == "batch_matmul"
        self.inputs = input_buffers(workload)
        self.a, self.b, self.bias, self.c = gemm_operands(workload)
        self.widened = self.isa == WIDENED
        grouped = self.pack and workload.dtype in FAMILIES and not self.widened
        self.group = 4 // ITEMSIZE[self.b.dtype] if grouped else 1  # k per 32-bit lane of the packed B
        panels = -(-self.n // self.nr)
        depth = (-(-self.k // self.group), self.nr, self.group) if self.group > 1 else (self.k, self.nr)
        batches = (self.batch,) if self.batched else ()
        self.bp = Buffer("Bp", batches + (panels,) + depth, "packed", packed_dtype(self.isa, self.b.dtype))
        # the widened family's float32 copy of A, made at each call, which the micro-kernel reads in A's place
        self.aw = Buffer("Aw", batches + (self.m, self.k), "packed", "float32")
        self.sums = "int32" if workload.dtype == "int8" else "float32"
        self.zero = Const(0 if self.sums == "int32" else 0.0)
        self.acc = Buffer("acc", (self.mr, self.nr), "register", self.sums)
        # where the result goes on through bias and epilogue: the accumulators, or beside them when they are int32
        self.result = Buffer("res", (self.mr, self.nr), "register") if self.sums != "float32" else self.acc
        # where a k-block's partial sums wait for the next: C itself, unless C is not of the sums' dtype
        own = self.c.dtype != self.sums and self.kc < self.k
        self.partial = Buffer("Cw", self.c.shape, "packed", self.sums) if own else self.c
        # dense int8: the weights' row sums, negated (the zero point's correction), summed when they are bound
        self.quantized = workload.dtype == "int8" and workload.op == "dense"
        self.row_sums = Buffer("Wsum", (self.n,), "packed", "int32")

    def _batch(self, b: Affine, *index) -> tuple:
        return (b, *index) if self.batched else index

    def b_element(self, b: Affine, k: Affine, n: Affine) -> Load:
        if self.workload.op == "dense":
            return self.b[n, k]
        return self.b[self._batch(b, k, n)]

    def program(self) -> Program:
        buffers = list(self.inputs.values()) + [self.c]
        stages = []
        if self.quantized:
            buffers.append(self.row_sums)
            stages.append(Stage("sum_W", tuple(negated_sums(self.row_sums, self.n, [("k", self.k)], lambda n, k: self.b[n, k])),
                                constant=True))
        if self.pack:
            buffers.append(self.bp)
            stages.append(Stage("pack_" + self.b.name, tuple(self.pack_stage()), constant=self.workload.op == "dense"))
        if self.widened:
            buffers.append(self.aw)
            stages.append(Stage("widen_" + self.a.name, tuple(self.widen_stage())))
        if self.partial is not self.c:
            buffers.append(self.partial)
        stages.append(Stage("compute", tuple(self.compute_stage())))
        registers = [self.acc] + ([self.result] if self.result is not self.acc else [])
        return Program(self.workload.key, tuple(buffers + registers), tuple(stages))

    @property
    def threaded(self) -> str:
        """The kind of a stage's outer loop: parallel where the compute stage's is."""
        return "parallel" if self.parallel != "none" else "serial"

    def widen_stage(self):
        """Aw[m, k] = A[m, k] in float32, a row at a time in vectors along k (A read through its strides)."""
        def rows(b):
            element = lambda k0: self._batch(b, var("m"), k0 + var("k"))
            return [Loop("m", self.m, "serial" if self.batched else self.threaded, tuple(tiled(
                "kv", self.k, self.vec, 0, lambda k0, w: [Loop("k", w, "vectorized", (
                    self.aw.store(element(k0), self.a[element(k0)]),))])))]
        return [Loop("b", self.batch, self.threaded, tuple(rows(var("b"))))] if self.batched else rows(Affine())

    def pack_stage(self):
        """Bp[p, k, l] = B[k, p·nr + l]: each panel of nr columns contiguous along k."""
        par = self.threaded

        def panel(b, p0, width):
            p = p0.exact_div(self.nr)
            if self.along_k:  # B's elements lie along k: a transposition, in blocks of vec × vec
                block = lambda l0, rows: tiled("kb", self.k, self.vec, 0, lambda k0, lanes: [
                    Loop("k", lanes, "vectorized", (Loop("l", rows, "unrolled", (self.bp.store(
                        self._batch(b, p, k0 + var("k"), l0 + var("l")),
                        self.b_element(b, k0 + var("k"), p0 + l0 + var("l"))),)),))])
                return tiled("lb", width, self.vec, 0, block)
            return [Loop("k", self.k, "serial", (Loop("l", width, "vectorized", (
                self.bp.store(self._batch(b, p, var("k"), var("l")), self.b_element(b, var("k"), p0 + var("l"))),)),))]

        fill = self.group_panel if self.group > 1 else panel
        panels = lambda b: tiled("p", self.n, self.nr, 0, lambda p0, w: fill(b, p0, w), par if not self.batched else "serial")
        if self.batched:
            return [Loop("b", self.batch, par, tuple(panels(var("b"))))]
        return panels(Affine())

    def group_panel(self, b, p0, width):
        """Bp[p, q, l, j] = B[g·q + j, p·nr + l], zero past the last k: the group of g k a 32-bit lane holds."""
        g = self.group
        p, full, rest = p0.exact_div(self.nr), self.k // g, self.k % g
        store = lambda q, l, j, value: self.bp.store(self._batch(b, p, q, l, j), value)
        element = lambda k, l: self.b_element(b, k, p0 + l)
        q, l, j = var("q"), var("l"), var("j")
        group = (Loop("j", g, "unrolled", (store(q, l, j, element(q * g + j, l)),)),)
        # B along k (dense's W) is read a row at a time, each group a copy; else B's g rows along n, in vectors
        # whose lanes the group stores interleave
        loops = [("l", width, "serial"), ("q", full, "serial")] if self.along_k else \
            [("q", full, "serial"), ("l", width, "vectorized")]
        body = [Loop(*loops[0], (Loop(*loops[1], group),))] if full else []
        if rest:
            body.append(Loop("l", width, "serial", tuple(
                store(full, l, i, element(Affine.of(self.k - rest + i), l) if i < rest else self.zero) for i in range(g))))
        return body

    def compute_stage(self):
        order = list(self.config["order"])
        axis_of = {"b": "b", "mo": "m", "no": "n", "ko": "k", "mi": "m", "ni": "n"}
        tile = {"b": 1, "mo": self.mb * self.mr, "no": self.nb * self.nr, "ko": self.kc, "mi": self.mr, "ni": self.nr}
        top = {"b": "b", "m": "mo", "n": "no"}.get(self.parallel)
        outer = ([top] if top else []) + (["b"] if self.batched and top != "b" else []) + [x for x in order if x != top]
        levels = [(name, axis_of[name], tile[name], "parallel" if name == top else "serial")
                  for name in outer + list(self.config["inner_order"])]
        extents = {"b": self.batch, "m": self.m, "n": self.n, "k": self.k}
        return tile_nest(levels, {axis: (Affine(), extent) for axis, extent in extents.items()}, self.micro_kernel)

    def _columns(self, width: int, body) -> list:
        """Columns 0..width of the register block: unrolled whole vectors, then a narrower tail vector."""
        return tiled("v", width, self.vec, 0, lambda c0, w: [Loop("l", w, "vectorized", tuple(body(c0 + var("l"))))],
                     "unrolled")

    def _rows(self, height: int, body) -> list:
        """Rows 0..height of the register block, unrolled: vector registers need constant rows. AMX's block lies in
        memory between tile products, so its rows run in a loop, AMX_ROWS a turn: configs of odd shapes compiled
        1.5-2.4x faster (2.4x with tails of rows and an epilogue), and BERT-base's bf16 dense shapes ran at
        0.94-1.07x the speed of all rows unrolled (an Intel AMX host, 1 and 2 threads, hot or rotated weights: as
        wide as that host's noise)."""
        if self.isa not in AMX:
            return [Loop("r", height, "unrolled", tuple(body(var("r"))))]
        return tiled("ro", height, AMX_ROWS, 0, lambda r0, h: [Loop("r", h, "unrolled", tuple(body(r0 + var("r"))))])

    def micro_kernel(self, chunks):
        """An mr × nr block of C over one k-block, as a call: identical tiles share one body."""
        (b, _), (m0, mr), (n0, nr), (k0, kc) = chunks["b"], chunks["m"], chunks["n"], chunks["k"]
        args = (("b0", b), ("m0", m0), ("n0", n0), ("k0", k0)) + ((("p0", n0.exact_div(self.nr)),) if self.pack else ())
        shared = self.isa in AMX and self.config["prefetch"] == SHARED
        args += (("s0", m0.exact_div(self.mr)),) if shared else ()  # which of the row blocks that read the panel
        # the group index of the block's first k: k-blocks are whole groups but for the last of the whole k
        args += (("q0", k0.exact_div(self.group)),) if self.group > 1 else ()
        b, m0, n0, k0 = var("b0"), var("m0"), var("n0"), var("k0")
        rows = lambda body: self._rows(mr, lambda r: self._columns(nr, lambda c: body(r, c)))
        zero = rows(lambda r, c: [self.acc.store((r, c), self.zero)])
        source = (lambda k, c: self.bp[self._batch(b, var("p0"), k, c)]) if self.pack else \
            (lambda k, c: self.b_element(b, k, n0 + c))
        a = lambda r, k: (self.aw if self.widened else self.a)[self._batch(b, m0 + r, k)]
        fma = lambda r, c, x, y: [self.acc.store((r, c), Op("fma", (x, y, self.acc[r, c])))]
        unrolled = lambda step: lambda k, u: [Loop("ku", u, "unrolled", tuple(step(k + var("ku"))))]
        if self.group > 1:
            g, dot = self.group, DOTS[self.isa]
            packed = lambda q, c, j: self.bp[self._batch(b, var("p0"), q, c, j)]
            terms = lambda r, c, q: tuple(x for j in range(g) for x in (a(r, q * g + j), packed(q, c, j)))
            product = lambda r, c, q: [self.acc.store((r, c), Op(dot, terms(r, c, q) + (self.acc[r, c],)))]
            if self.isa in AMX:  # k groups, rows, columns: the nest the code generator runs as tile products
                r, c, q = var("r"), var("c"), var("q0") + var("ki")
                ahead = {"share": (var("s0"), -(-self.m // self.mr))} if shared else {"ahead": self.config["prefetch"]}
                k_loop = [Loop("ki", kc // g, "tile", (Loop("r", mr, "tile", (Loop("c", nr, "tile", tuple(
                    product(r, c, q))),)),), **ahead)] if kc >= g else []
            else:
                k_loop = tiled("ki", kc // g, self.unroll, var("q0"), unrolled(
                    lambda q: self.ahead(b, (q, 0, 0)) + rows(lambda r, c: product(r, c, q))))
            if kc % g:  # the last k of a k not a multiple of g, in a group the packing filled up with zeros
                last = var("q0") + kc // g
                k_loop += rows(lambda r, c: [s for j in range(kc % g) for s in fma(r, c, a(r, last * g + j),
                                                                                  packed(last, c, j))])
        else:
            step = lambda k: self.ahead(b, (k, 0)) + rows(lambda r, c: fma(r, c, a(r, k), source(k, c)))
            k_loop = tiled("ki", kc, self.unroll, k0, unrolled(step))
        body = zero + k_loop + self.write_back(b, m0, n0, k0, kc, rows)
        return [Call("micro_kernel", tuple((name, value) for name, value in args), tuple(body))]

    def ahead(self, b: Affine, row: tuple) -> list:
        """Prefetches of the packed B's row `prefetch` k steps on from `row` (its first element), a cache line each:
        bound weights come from memory in a model, and one stream of them a k step at a time leaves the memory idle
        between misses."""
        steps, width = dict(self.config.values).get("prefetch", 0), self.nr * self.group  # a k step's row
        return self.bp.prefetch_row(self._batch(b, var("p0"), *row), steps * width, width) if steps else []

    def write_back(self, b, m0, n0, k0, kc, rows):
        """C = acc on the first k-block, C += acc after (through the float32 workspace, when C is narrower); bias
        and epilogue once the last block is in."""
        out = lambda r, c: self._batch(b, m0 + r, n0 + c)
        last = self.k - kc

        def store(accumulate: bool, final: bool):
            def body(r, c):
                value = self.acc[r, c]
                if accumulate:
                    value = Op("add", (self.partial[out(r, c)], value))
                if not final or not self.epilogued:
                    return [(self.c if final else self.partial).store(out(r, c), value)]
                # the sum goes through a register so the epilogue reads it once
                if self.quantized:
                    value = dequantized(value, self.inputs, self.row_sums, n0 + c)
                return [self.result.store((r, c), self.biased(value, n0 + c)),
                        self.c.store(out(r, c), epilogue(self.options.get("epilogue", "none"), self.result[r, c]))]
            return tuple(rows(body))

        if not self.epilogued and self.partial is self.c:
            return [If(k0, "==", 0, store(False, False), store(True, False))]
        if kc == self.k and self.c.dtype != self.sums == "int32":  # one k-block, and no partial sum fits C
            return list(store(False, True))
        return [If(k0, "==", 0, (If(k0, "==", last, store(False, True), store(False, False)),),
                   (If(k0, "==", last, store(True, True), store(True, False)),))]

    @property
    def epilogued(self) -> bool:
        return self.bias is not None or self.options.get("epilogue", "none") != "none" or self.quantized

    def biased(self, value, n):
        return Op("add", (value, self.bias[n])) if self.bias is not None else value


def lower(workload: Workload, target: Target, config: Config) -> Program:
    return _Gemm(workload, target, config).program()
