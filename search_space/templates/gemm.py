"""The CPU GEMM template: matmul, dense and batch_matmul as one register-blocked loop nest.

C[b, m, n] (+)= Σ_k A[b, m, k] · B[b, k, n]; dense reads B[k, n] from W[n, k] and may add a
bias and an epilogue. The shape is the BLIS/GOTO one: B optionally packed into panels
Bp[n/nr][k][nr], outer cache tiles (mo, no, ko) in a tunable order, inner tiles (mi, ni),
and a micro-kernel that keeps an mr × nr block of C in vector registers across the k loop:
per k, nr/vec vector loads of B, mr broadcasts of A and mr·nr/vec vector FMAs.

bfloat16 sums in float32 registers. Its packed B holds k in adjacent pairs, Bp[n/nr][k/2][nr][2],
so that one 32-bit load brings two k of A or of a B column: the `isa` knob multiplies the pairs
by two FMAs on widened halves (`fma`, any CPU) or by AVX-512 BF16's pair dot (`avx512bf16`).
Partial sums of a k-block go to a float32 workspace, not through the bfloat16 output.
"""
from __future__ import annotations

import itertools

from ..program import Affine, Buffer, Call, Const, If, Load, Loop, Op, Program, Stage, tile_nest, tiled, var
from ..space import Config, ConfigSpace, Knob
from ..target import Target
from ..workload import Workload
from .epilogue import epilogue
from .gemm_operands import gemm_operands

VERSION = 1  # bumped whenever a change alters the code generated for some config, or what a config means
DTYPES = ("float32", "bfloat16")
MR_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
NR_CHOICES = (4, 8, 12, 16, 24, 32, 48, 64)
BLOCK_CHOICES = (1, 2, 4, 8, 16, 32, 64)
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
    knobs = [
        Knob("tile_m", "split", _splits(m, MR_CHOICES)),
        Knob("tile_n", "split", _splits(n, tuple(c for c in NR_CHOICES if c <= max(64, n)) if n >= 4 else (4,))),
        Knob("tile_k", "split", _k_tiles(k)),
        Knob("vec", "annotate", vec_choices),
        Knob("unroll_k", "annotate", UNROLL_CHOICES),
        Knob("order", "reorder", tuple(itertools.permutations(("mo", "no", "ko")))),
        Knob("inner_order", "reorder", (("mi", "ni"), ("ni", "mi"))),
        Knob("parallel", "annotate", parallel),
        Knob("pack_b", "knob", (True, False)),
    ]
    registers = target.vector_registers

    def fits(tile_m, tile_n, vec):
        """The nr columns split into whole vectors, and accumulators + B vectors + a broadcast fit the register file."""
        mr, nr = tile_m[2], tile_n[2]
        return nr % vec == 0 and mr * (nr // vec) + nr // vec + 1 <= registers and nr // vec <= 8

    constraints = [(("tile_m", "tile_n", "vec"), fits)]
    if workload.dtype == "bfloat16":
        knobs.append(Knob("isa", "annotate", isas(target)))
        # the pair dot reads the pair layout of the packed B, on 16 lanes (or fewer with AVX-512 VL)
        constraints.append((("isa", "pack_b", "vec"), lambda isa, pack_b, vec: isa == "fma" or (
            pack_b and (vec == 16 or "avx512vl" in target.features))))
    return ConfigSpace(knobs, constraints)


def isas(target: Target) -> tuple[str, ...]:
    """The instruction families a bfloat16 product may use on the target: widen-and-FMA everywhere, AVX-512 BF16's
    pair dot where the target has it."""
    return ("fma",) + (("avx512bf16",) if "avx512bf16" in target.features else ())


def fallback(workload: Workload, target: Target, space_: ConfigSpace) -> Config:
    """The untuned default: an 8×(2 vectors) register block, B packed, k-blocks of 256, rows split across threads."""
    batch, m, n, k = _dims(workload)
    vec = max(space_.knobs["vec"].candidates)
    want = {
        "tile_m": (-1, 8, 8), "tile_n": (-1, 8, 2 * vec), "tile_k": (-1, 256), "vec": vec, "unroll_k": 4,
        "order": ("no", "ko", "mo"), "inner_order": ("ni", "mi"),
        "parallel": "b" if batch > 1 else ("m" if m >= n else "n"), "pack_b": True,
    }
    if "isa" in space_.knobs:
        want["isa"] = space_.knobs["isa"].candidates[-1]
    return space_.nearest(want)


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
        self.isa = dict(config.values).get("isa", "fma")
        self.pairs = self.pack and workload.dtype == "bfloat16"
        self.options = workload.p
        self.batched = workload.op == "batch_matmul"
        self.a, self.b, self.bias, self.c = gemm_operands(workload)
        panels = -(-self.n // self.nr)
        depth = (-(-self.k // 2), self.nr, 2) if self.pairs else (self.k, self.nr)
        self.bp = Buffer("Bp", ((self.batch,) if self.batched else ()) + (panels,) + depth, "packed", workload.dtype)
        self.acc = Buffer("acc", (self.mr, self.nr), "register")
        # where a k-block's partial sums wait for the next: C itself, unless C is narrower than the sums
        narrow = workload.dtype != "float32" and self.kc < self.k
        self.partial = Buffer("Cw", self.c.shape, "packed") if narrow else self.c

    def _batch(self, b: Affine, *index) -> tuple:
        return (b, *index) if self.batched else index

    def b_element(self, b: Affine, k: Affine, n: Affine) -> Load:
        if self.workload.op == "dense":
            return self.b[n, k]
        return self.b[self._batch(b, k, n)]

    def program(self) -> Program:
        buffers = [self.a, self.b] + ([self.bias] if self.bias else []) + [self.c]
        stages = []
        if self.pack:
            buffers.append(self.bp)
            stages.append(Stage("pack_" + self.b.name, tuple(self.pack_stage()), constant=self.workload.op == "dense"))
        if self.partial is not self.c:
            buffers.append(self.partial)
        stages.append(Stage("compute", tuple(self.compute_stage())))
        return Program(self.workload.key, tuple(buffers + [self.acc]), tuple(stages))

    def pack_stage(self):
        """Bp[p, k, l] = B[k, p·nr + l]: each panel of nr columns contiguous along k."""
        par = "parallel" if self.parallel != "none" else "serial"

        def panel(b, p0, width):
            p = p0.exact_div(self.nr)
            if self.workload.op == "dense":  # W rows are contiguous along k: read them in order
                return [Loop("l", width, "serial", (Loop("k", self.k, "serial", (
                    self.bp.store(self._batch(b, p, var("k"), var("l")), self.b[p0 + var("l"), var("k")]),)),))]
            return [Loop("k", self.k, "serial", (Loop("l", width, "vectorized", (
                self.bp.store(self._batch(b, p, var("k"), var("l")), self.b_element(b, var("k"), p0 + var("l"))),)),))]

        fill = self.pair_panel if self.pairs else panel
        panels = lambda b: tiled("p", self.n, self.nr, 0, lambda p0, w: fill(b, p0, w), par if not self.batched else "serial")
        if self.batched:
            return [Loop("b", self.batch, par, tuple(panels(var("b"))))]
        return panels(Affine())

    def pair_panel(self, b, p0, width):
        """Bp[p, q, l, j] = B[2q + j, p·nr + l], zero past the last k: the pairs a 32-bit lane holds."""
        p, full = p0.exact_div(self.nr), self.k // 2
        store = lambda q, l, j, value: self.bp.store(self._batch(b, p, q, l, j), value)
        element = lambda k, l: self.b_element(b, k, p0 + l)
        q, l, j = var("q"), var("l"), var("j")
        pair = (Loop("j", 2, "unrolled", (store(q, l, j, element(q * 2 + j, l)),)),)
        # dense reads W's rows along k, matmul B's rows along n: the inner loop follows the source
        loops = [("l", width), ("q", full)] if self.workload.op == "dense" else [("q", full), ("l", width)]
        body = [Loop(loops[0][0], loops[0][1], "serial", (Loop(loops[1][0], loops[1][1], "serial", pair),))] if full else []
        if self.k % 2:
            body.append(Loop("l", width, "serial", (store(full, l, 0, element(Affine.of(self.k - 1), l)),
                                                    store(full, l, 1, Const(0.0)))))
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

    def micro_kernel(self, chunks):
        """An mr × nr block of C over one k-block, as a call: identical tiles share one body."""
        (b, _), (m0, mr), (n0, nr), (k0, kc) = chunks["b"], chunks["m"], chunks["n"], chunks["k"]
        args = (("b0", b), ("m0", m0), ("n0", n0), ("k0", k0)) + ((("p0", n0.exact_div(self.nr)),) if self.pack else ())
        # the pair index of the block's first k: k-blocks start even, as an odd block is the whole of an odd k
        args += (("q0", k0.exact_div(2)),) if self.pairs else ()
        b, m0, n0, k0 = var("b0"), var("m0"), var("n0"), var("k0")
        rows = lambda body: [Loop("r", mr, "unrolled", tuple(self._columns(nr, lambda c: body(var("r"), c))))]
        zero = rows(lambda r, c: [self.acc.store((r, c), Const(0.0))])
        source = (lambda k, c: self.bp[self._batch(b, var("p0"), k, c)]) if self.pack else \
            (lambda k, c: self.b_element(b, k, n0 + c))
        a = lambda r, k: self.a[self._batch(b, m0 + r, k)]
        fma = lambda r, c, x, y: [self.acc.store((r, c), Op("fma", (x, y, self.acc[r, c])))]
        unrolled = lambda step: lambda k, u: [Loop("ku", u, "unrolled", tuple(step(k + var("ku"))))]
        if self.pairs:
            pair = lambda q, c, j: self.bp[self._batch(b, var("p0"), q, c, j)]
            dot = "dot2_bf16" if self.isa == "avx512bf16" else "dot2"
            step = lambda q: rows(lambda r, c: [self.acc.store((r, c), Op(dot, (
                a(r, q * 2), pair(q, c, 0), a(r, q * 2 + 1), pair(q, c, 1), self.acc[r, c])))])
            k_loop = tiled("ki", kc // 2, self.unroll, var("q0"), unrolled(step))
            if kc % 2:  # the last k of an odd k, paired with the packing's zero
                last = var("q0") + kc // 2
                k_loop += rows(lambda r, c: fma(r, c, a(r, last * 2), pair(last, c, 0)))
        else:
            step = lambda k: rows(lambda r, c: fma(r, c, a(r, k), source(k, c)))
            k_loop = tiled("ki", kc, self.unroll, k0, unrolled(step))
        body = zero + k_loop + self.write_back(b, m0, n0, k0, kc, rows)
        return [Call("micro_kernel", tuple((name, value) for name, value in args), tuple(body))]

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
                # the sum goes through the accumulator so the epilogue reads it once
                return [self.acc.store((r, c), self.biased(value, n0 + c)),
                        self.c.store(out(r, c), epilogue(self.options.get("epilogue", "none"), self.acc[r, c]))]
            return tuple(rows(body))

        if not self.epilogued and self.partial is self.c:
            return [If(k0, "==", 0, store(False, False), store(True, False))]
        return [If(k0, "==", 0, (If(k0, "==", last, store(False, True), store(False, False)),),
                   (If(k0, "==", last, store(True, True), store(True, False)),))]

    @property
    def epilogued(self) -> bool:
        return self.bias is not None or self.options.get("epilogue", "none") != "none"

    def biased(self, value, n):
        return Op("add", (value, self.bias[n])) if self.bias is not None else value


def lower(workload: Workload, target: Target, config: Config) -> Program:
    return _Gemm(workload, target, config).program()
