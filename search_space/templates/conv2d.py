"""The CPU conv2d template: direct convolution over channel-blocked layouts, as TVM's x86 conv2d and oneDNN.

The data is packed, zero-padded, into Dp[n][C/cb][Hp][Wp][cb] and the weights once into
Wk[K/kb][C/cb][R][S][cb][kb]; the micro-kernel keeps an owr × kb block of the output (owr output
positions of one row, kb output channels as kb/vec vectors) in registers over the whole reduction
(C/cb, R, S in a tunable order, then cb), so per input channel it does kb/vec vector loads of
weights, owr broadcasts of data and owr·kb/vec vector FMAs: GEMM's micro-kernel with the output
width as rows and the output channels as columns. Bias, residual and the epilogue are applied as
the block is written to the output. Where taps reach into the padding around the image, the micro-kernel sums over
the taps that read the image only: at the edge rows over the taps' rows inside it, at the edge blocks of a row over
each of the taps' columns for the positions inside it (a micro-kernel for each kind of edge, chosen per row and
block). The activations (data, residual, output) lie NCHW, or NHWC where the
workload's layout is nhwc (PyTorch's channels_last): the pack then copies runs of adjacent channels, and the
`channels` write-back stores whole vectors of them. In a model the packed weights come from memory, read once a
row of output (ResNet-18's last layers: 9.4 MB of them for 49 output positions): the `prefetch` knob has each channel
step prefetch their row that many steps on, as dense's micro-kernel does.

bfloat16 and int8 read their channels in the GEMM template's groups (2 bfloat16 or 4 bytes to a 32-bit lane):
the packed weights hold each group of a channel block adjacent, Wk[..][cb/g][kb][g], so that a group of the
data's adjacent channels, broadcast, meets a vector of kb channels' groups, and the `isa` knob picks the GEMM
template's dot for them (widened, or AVX-512 BF16's / VNNI's). A block of channels that is not whole groups
is zero-padded to them. bfloat16's `fma-f32` packs both in float32 instead (the data is packed at every call
anyway), and the micro-kernel is float32's. int8 (uint8 data, int8 weights) pads the image with the zero point,
sums exactly in int32 and dequantizes as it writes, as dense does.
"""
from __future__ import annotations

import functools
import itertools

from ..program import ITEMSIZE, Affine, Buffer, Call, Const, If, Loop, Op, Program, Stage, tile_nest, tiled, var
from ..space import Config, ConfigSpace, Knob
from ..target import Target
from ..workload import Workload, conv2d_activation, conv2d_output
from .dequantize import dequantized, negated_sums
from .epilogue import epilogue
from .gemm import AHEAD_CHOICES, AMX, DOTS, FAMILIES, UNROLL_CHOICES, WIDENED, isas, packed_dtype
from .gemm_operands import input_buffers
from .register_blocks import fills, seed_blocks, seed_families

VERSION = 4  # bumped whenever a change alters the code generated for some config, or what a config means (2: the
# data packed a row at a time, by every thread where threads split output rows or channels; 3: the taps that read
# padding skipped; 4: the `prefetch` knob, which gave every config a new index)
# bfloat16 two ahead: it gained the `isa` knob and grouped layouts at float32's 1, then the `fma-f32` family; int8
# skips no padding (its padding is the zero point): its code stayed at 2 until the `prefetch` knob
DTYPE_VERSIONS = {"bfloat16": 6, "int8": 3}
DTYPES = ("float32", "bfloat16", "int8")
VECTOR_SPLITS = ("tile_k",)  # splits whose register tile is counted in vectors: scaled with `vec` to another CPU
OWR_CHOICES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 28)
KB_VECTORS = (1, 2, 3, 4)
STREAMED_BYTES = 1 << 20  # packed weights past an L2's size, which the fallback prefetches 32 channel steps ahead
EDGE_SHARE = 0.04  # the share of the taps' reads along rows (columns) in the padding from which they are skipped


def _channel_blocks(c: int, group: int) -> tuple[int, ...]:
    """Input channel blocks: the divisors of C up to 64 (so no block has a tail), in whole groups where any
    divisor is (else the largest, padded to whole groups)."""
    blocks = tuple(b for b in range(1, min(c, 64) + 1) if c % b == 0)
    return tuple(b for b in blocks if b % group == 0) or blocks[-1:]


def _group(workload: Workload, isa: str | None = None) -> int:
    """The channels a 32-bit lane of the packed operands holds: 2 in bfloat16, 4 in int8, else 1."""
    return 4 // ITEMSIZE[packed_dtype(isa, workload.operand_dtype("data"))] if workload.dtype in FAMILIES else 1


def space(workload: Workload, target: Target) -> ConfigSpace:
    p = workload.p
    _, ow = conv2d_output(p)
    vec_choices = tuple(v for v in (4, 8, 16) if v * 32 <= target.vector_bits)
    kb_choices = sorted({v * n for v in vec_choices for n in KB_VECTORS if v * n < 2 * max(p["K"], v)})
    parallel = ("none",) if target.threads == 1 else ("none", "k", "h") + (("n",) if p["N"] > 1 else ())
    knobs = [
        Knob("tile_k", "split", tuple((-1, kb) for kb in kb_choices)),
        Knob("tile_ow", "split", tuple((-1, r) for r in OWR_CHOICES if r <= ow) or ((-1, 1),)),
        Knob("tile_c", "split", tuple((-1, cb) for cb in _channel_blocks(p["C"], _group(workload)))),
        Knob("vec", "annotate", vec_choices),
        Knob("unroll_c", "annotate", UNROLL_CHOICES),
        Knob("order", "reorder", tuple(itertools.permutations(("ko", "oh", "owo")))),
        Knob("reduce_order", "reorder", tuple(itertools.permutations(("co", "r", "s")))),
        Knob("parallel", "annotate", parallel),
        Knob("write", "annotate", ("channels", "rows")),  # the register block leaves by channel vectors or by rows
        Knob("prefetch", "knob", AHEAD_CHOICES),
    ]
    registers = target.vector_registers

    def fits(tile_k, tile_ow, vec):
        """kb splits into whole vectors, and accumulators + weight vectors + a broadcast fit the register file."""
        kb, owr = tile_k[1], tile_ow[1]
        return kb % vec == 0 and kb // vec <= 4 and fills(owr, kb // vec, registers)

    register_block = [(("tile_k", "tile_ow", "vec"), fits)]
    if workload.dtype not in FAMILIES:
        return ConfigSpace(knobs, register_block)
    families = tuple(family for family in isas(target, workload.dtype) if family not in AMX)
    knobs.append(Knob("isa", "annotate", families))
    # the special dots on 16 lanes, or fewer with AVX-512 VL
    reads = lambda isa, vec: isa in (families[0], WIDENED) or vec == 16 or "avx512vl" in target.features
    return ConfigSpace(knobs, register_block + [(("isa", "vec"), reads)], strata="isa")


def fallback(workload: Workload, target: Target, space_: ConfigSpace, isa: str | None = None) -> Config:
    """The untuned default, in `isa`'s instruction family (else the last the space offers): 4 output positions × 4
    vectors of output channels where that fits the register file (AVX-512's 32; on a Zen 4 it ran 1-14% faster than
    6 × 2 in 13 of ResNet-18's 14 layers at 1 thread), else 6 × 2 vectors; channel blocks of 16, and threads over
    images, else over the larger operand (rows of a large image, as the stem's; output channels of large weights, as
    the last layers'), so each thread streams a share of it and all share the smaller. Weights past STREAMED_BYTES
    are prefetched 32 channel steps ahead (rotated as tuning times them, ResNet-18's tuned configs on a Zen 5 at 2
    threads: its 512-channel 3×3 convolutions, 9.4 MB of weights, took 10-14% less time; the 4.7 MB of 256 to 512
    channels 14% less; the 2.4 MB of 256 channels 3%; the 1.2 MB of 128 to 256 channels 1%; the small ones the same,
    but the strided 1×1's 0.5 MB 12% more; the fallback itself 5-6% less there, in bfloat16 from 7% less to 2% more
    by family), but not in int8 (its fallback took 5-7% more time so with VNNI, 29-35% more with `widen`, whose
    accumulators then spill)."""
    p, vec = workload.p, max(space_.knobs["vec"].candidates)
    rows, vectors = (4, 4) if fills(4, 4, target.vector_registers) else (6, 2)
    oh, ow = conv2d_output(p)
    # the padded span the windows cover (a strided 1×1 packs only every stride-th pixel of it)
    data_floats = p["C"] * ((oh - 1) * p["stride"] + p["R"]) * ((ow - 1) * p["stride"] + p["S"])
    weights = p["K"] * p["C"] * p["R"] * p["S"]
    weight_bytes = weights * ITEMSIZE[workload.operand_dtype("weight")]
    parallel = "n" if p["N"] > 1 else "h" if data_floats > weights else "k"
    want = {"tile_k": (-1, vectors * vec), "tile_ow": (-1, rows), "tile_c": (-1, 16), "vec": vec, "unroll_c": 4,
            "order": ("ko", "oh", "owo"), "reduce_order": ("co", "r", "s"), "parallel": parallel,
            "write": "channels" if p["layout"] == "nhwc" else "rows",  # the output's contiguous runs
            "prefetch": 32 if weight_bytes > STREAMED_BYTES and workload.dtype != "int8" else 0}
    if "isa" in space_.knobs:
        want["isa"] = isa or space_.knobs["isa"].candidates[-1]
    return space_.nearest(want)


def relaid(knobs: dict, stored: Workload, wanted: Workload) -> dict:
    """A config of `stored`'s convolution for `wanted`'s, the same laid out otherwise: the write-back swapped, so
    that the one that stored whole contiguous runs there stores them here (rows in NCHW, channel vectors in
    NHWC)."""
    if stored.p["layout"] == wanted.p["layout"]:
        return knobs
    return knobs | {"write": {"rows": "channels", "channels": "rows"}[knobs["write"]]}


def seeds(workload: Workload, target: Target, space_: ConfigSpace) -> list[Config]:
    """What a search measures first where the op has not been searched on the target: the register blocks of
    `seed_blocks` (output positions × channel vectors; those that leave no tail of the output row among them) in
    each vector family (`seed_families`), the rest as the fallback."""
    base = dict(fallback(workload, target, space_).values)
    return [space_.nearest(base | family | {"vec": vec, "tile_ow": (-1, owr), "tile_k": (-1, kb)})
            for family in seed_families(space_)
            for vec, owr, kb in seed_blocks(space_, "tile_ow", "tile_k", max(KB_VECTORS), target.vector_registers,
                                            conv2d_output(workload.p)[1])]


class _Conv2d:
    """Builds the program for one workload and config; one method per stage."""

    def __init__(self, workload: Workload, target: Target, config: Config):
        p = self.p = workload.p
        self.workload, self.config = workload, config
        self.oh, self.ow = conv2d_output(p)
        # a strided 1×1 convolution reads every stride-th pixel only: the packing keeps just those, and the
        # compute runs at stride 1 over them (ResNet's downsampling shortcuts)
        self.skip = p["stride"] if (p["R"], p["S"], p["pad"]) == (1, 1, 0) else 1
        self.stride, self.pad = p["stride"] // self.skip, p["pad"]
        self.kb, self.owr, self.cb = config["tile_k"][1], config["tile_ow"][1], config["tile_c"][1]
        self.vec, self.unroll = config["vec"], config["unroll_c"]
        self.parallel = config["parallel"] if target.threads > 1 else "none"
        self.isa = dict(config.values).get("isa")
        self.inputs = input_buffers(workload)  # operands and packed copies in their dtypes; the sums in float32 or int32
        self.data, self.weight = self.inputs["data"], self.inputs["weight"]
        self.bias, self.residual = self.inputs.get("bias"), self.inputs.get("residual")
        self.out = Buffer("out", workload.output_shape, "output", workload.output_dtype)
        self.quantized = workload.dtype == "int8"
        self.zero = Const(0 if self.quantized else 0.0)
        # what the padding holds: the zero point, int8's quantized 0.0
        self.padding = self.inputs["x_zero"][0] if self.quantized else self.zero
        self.group = _group(workload, self.isa)
        self.cbp = -(-self.cb // self.group) * self.group  # a channel block padded to whole groups
        self.hp, self.wp = (self.oh - 1) * self.stride + p["R"], (self.ow - 1) * self.stride + p["S"]
        self.dp = Buffer("Dp", (p["N"], p["C"] // self.cb, self.hp, self.wp, self.cbp), "packed",
                         packed_dtype(self.isa, self.data.dtype))
        depth = (self.cbp // self.group, self.kb, self.group) if self.group > 1 else (self.cb, self.kb)
        self.wk = Buffer("Wk", (-(-p["K"] // self.kb), p["C"] // self.cb, p["R"], p["S"]) + depth, "packed",
                         packed_dtype(self.isa, self.weight.dtype))
        self.acc = Buffer("acc", (self.owr, self.kb), "register", "int32" if self.quantized else "float32")
        self.row_sums = Buffer("Wsum", (p["K"],), "packed", "int32")  # int8: the weights' sums, negated
        # built once per kind: the top and bottom rows and each edge block's rows call the same few micro-kernels
        self.block_sum = functools.cache(self.block_sum)

    def program(self) -> Program:
        p, buffers = self.p, list(self.inputs.values()) + [self.out, self.dp, self.wk, self.acc]
        stages = [Stage("pack_weight", tuple(self.pack_weight()), constant=True),
                  Stage("pack_data", tuple(self.pack_data())),
                  Stage("compute", tuple(self.compute()))]
        if self.quantized:
            buffers.append(self.row_sums)
            reduction = [("c", p["C"]), ("r", p["R"]), ("s", p["S"])]
            stages.insert(0, Stage("sum_W", tuple(negated_sums(self.row_sums, p["K"], reduction, lambda k, c, r, s:
                                                               self.weight[k, c, r, s])), constant=True))
        return Program(self.workload.key, tuple(buffers), tuple(stages))

    def at(self, n, c, y, x) -> tuple:
        """The index of an activation's element (image, channel, row, column) in the workload's layout."""
        return conv2d_activation(self.p, n, c, y, x)

    def _kind(self, axis: str) -> str:
        return "parallel" if self.parallel == axis else "serial"

    def _vectors(self, name: str, width: int, base: Affine, body) -> list:
        """A loop of `width` lanes as whole vectors of the config's width, then a narrower tail vector."""
        return tiled(name + "o", width, self.vec, base, lambda x0, lanes: [
            Loop(name, lanes, "vectorized", tuple(body(x0 + var(name))))])

    def pack_weight(self):
        """Wk[ko, co, r, s, ci, l] = weight[ko·kb + l, co·cb + ci, r, s]; a last block of K keeps its width. In
        groups, Wk[ko, co, r, s, q, l, j] holds channel ci = q·g + j, zero past the block's last."""
        p = self.p
        co, ci, r, s = var("co"), var("ci"), var("r"), var("s")

        def block(k0: Affine, width: int):
            ko = k0.exact_div(self.kb)
            element = lambda channel, l: self.weight[k0 + l, co * self.cb + channel, r, s]
            if self.group == 1:
                channels = (Loop("ci", self.cb, "serial", tuple(self._vectors("l", width, Affine(), lambda l: [
                    self.wk.store((ko, co, r, s, ci, l), element(ci, l))]))),)
            else:
                channels = self.group_copy(lambda q, l, j, channel: self.wk.store(
                    (ko, co, r, s, q, l, j), element(channel, l) if channel is not None else self.zero), width)
            return [Loop("co", p["C"] // self.cb, "serial", (Loop("r", p["R"], "serial", (Loop("s", p["S"], "serial",
                                                                                              channels),)),))]

        return tiled("ko", p["K"], self.kb, 0, block, self._kind("k"))

    def group_copy(self, store, width: int) -> tuple:
        """store(q, l, j, channel q·g + j, or None past the block's channels) over a block's groups and `width`
        output channels."""
        g, (full, rest) = self.group, divmod(self.cb, self.group)
        q, l, j = var("q"), var("l"), var("j")
        whole = (Loop("q", full, "serial", (Loop("l", width, "serial", (Loop("j", g, "unrolled", (
            store(q, l, j, q * g + j),)),)),)),) if full else ()
        last = (Loop("l", width, "serial", tuple(store(full, l, i, Affine.of(full * g + i) if i < rest else None)
                                                 for i in range(g))),) if rest else ()
        return whole + last

    def pack_data(self):
        """Dp[n, co, y, x, ci] = data[n, co·cb + ci, y - pad, x - pad], the padding (zero, or int8's zero point)
        outside the input and past the block's channels; rows and columns no output reads are left out (for a
        strided 1×1, Dp[y, x] = data[y·stride, x·stride]). Threads that split the images pack their own; threads
        that split output rows or channels each pack a share of the rows, so that the rows a thread computes from
        are mostly in its own cache (the stem's 2-thread call spent 88 µs outside its compute stage with one thread
        packing, 60 with both, on a Zen 4; threads over output channels 147 and 104)."""
        p, pad, skip = self.p, self.pad, self.skip
        n, co, y = var("n"), var("co"), var("y")
        rows, cols = min(-(-p["H"] // skip), self.hp - pad), min(-(-p["W"] // skip), self.wp - pad)

        def fill(row: Affine, x0: int, width: int, value) -> list:
            """Dp[n, co, row, x0 + x, :] = value(x, ci) over `width` pixels of one row of this channel block (the
            padding past its channels), in vectors along the channels that Dp keeps adjacent (loads gathered from
            cb planes; vectors along a row would be stored cb apart, a lane at a time), or along the row when a
            block is one channel."""
            if width <= 0:
                return []
            x = var("x")
            store = lambda column, ci, value: [self.dp.store((n, co, row, x0 + column, ci), value(column, ci))]
            if self.cbp == 1:
                return self._vectors("x", width, Affine(), lambda c: store(c, 0, value))
            pixel = self._vectors("ci", self.cb, Affine(), lambda ci: store(x, ci, value))
            if self.cbp > self.cb:
                pixel += self._vectors("cz", self.cbp - self.cb, Affine.of(self.cb), lambda ci: store(x, ci, padding))
            return [Loop("x", width, "serial", tuple(pixel))]

        padding = lambda x, ci: self.padding
        rows_of = lambda first, count, body: [Loop("y", count, "serial", tuple(body(y + first)))] if count > 0 else []
        edge = lambda row: fill(row, 0, self.wp, padding)
        edges = rows_of(0, pad, edge) + rows_of(pad + rows, self.hp - pad - rows, edge)
        pixel = lambda x, ci: self.data[self.at(n, co * self.cb + ci, y * skip, x * skip)]
        inside = (fill(y + pad, 0, pad, padding) + fill(y + pad, pad + cols, self.wp - pad - cols, padding)
                  + fill(y + pad, pad, cols, pixel))
        images = lambda body, kind="serial": Loop("n", p["N"], kind, (Loop("co", p["C"] // self.cb, "serial",
                                                                          tuple(body)),))
        if self.parallel == "n":
            return [images(edges + [Loop("y", rows, "serial", tuple(inside))], "parallel")]
        return [images(edges), Loop("y", rows, "serial" if self.parallel == "none" else "parallel",
                                    (images(inside),))]

    def compute(self):
        """The output's blocks in the config's order, threads splitting the top loop; where a serial loop runs over
        the output rows, from the first row whose taps all read the image, the rows above it last: the first row a
        block of output channels computes streams its weights from memory, and a row that skips some (`edge_rows`)
        breaks the stream (ResNet's 512-channel 3×3 over a 7×7 image, threads over channels, weights rotated as
        tuning times them: 1.15x the time with the top row first, 0.89-0.91x last, on a Zen 4)."""
        order = list(self.config["order"])
        top = {"k": "ko", "h": "oh", "n": "n"}.get(self.parallel)
        outer = ([top] if top else []) + (["n"] if top != "n" else []) + [x for x in order if x != top]
        tile = {"n": 1, "ko": self.kb, "oh": 1, "owo": self.owr}
        axis_of = {"n": "n", "ko": "k", "oh": "h", "owo": "w"}
        extents = {"n": self.p["N"], "k": self.p["K"], "h": self.oh, "w": self.ow}
        levels = [(name, axis_of[name], tile[name], "parallel" if name == top else "serial") for name in outer]
        edges = self.edge_rows()
        first = next(row for row in range(self.oh + 1) if row not in edges) % self.oh  # 0 where every row is an edge
        return tile_nest(levels, {axis: (Affine(), extent) for axis, extent in extents.items()},
                         lambda chunks: self.micro_kernel(chunks, edges), {"h": first})

    def micro_kernel(self, chunks, edges: dict[int, range]):
        """An owr × kb block of one output row, summed over C·R·S in registers, then written; at an edge row over
        the taps' rows that read the image only, at an edge block over the taps' columns each position reads the
        image at (a micro-kernel for each kind of edge, chosen per row and block)."""
        (n, _), (k0, kw), (oh, _), (ow0, owr) = chunks["n"], chunks["k"], chunks["h"], chunks["w"]
        args = (("n0", n), ("k0", k0), ("kblock", k0.exact_div(self.kb)), ("oh0", oh), ("ow0", ow0))
        summed = lambda taps, columns=None: [Call("micro_kernel", args + (("r0", Affine.of(taps.start)),),
                                                  self.block_sum(kw, owr, len(taps), columns))]

        blocks = self.edge_columns(ow0, owr)

        def by_block(taps: range) -> list:
            body = summed(taps)
            for start, columns in reversed(blocks.items()):
                body = [If(ow0, "==", start, tuple(summed(taps, columns)), tuple(body))]
            return body

        body = by_block(range(self.p["R"]))
        for row, taps in reversed(edges.items()):
            body = [If(oh, "==", row, tuple(by_block(taps)), tuple(body))]
        return body

    def edge_rows(self) -> dict[int, range]:
        """The output rows some of whose taps' rows lie in the padding, each with the taps' rows that read the image
        (none where `skips` says not to)."""
        image = -(-self.p["H"] // self.skip)
        if not self.skips(self.oh, self.p["R"], image):
            return {}
        whole = range(self.p["R"])
        return {oh: taps for oh in range(self.oh) if (taps := self.inside(oh, self.p["R"], image)) != whole}

    def edge_columns(self, ow0: Affine, owr: int) -> dict[int, tuple[range, ...]]:
        """The blocks at `ow0` (a constant, or the full blocks of a loop) some of whose positions read padding left
        or right of the image at some of the taps' columns, each with the positions that read the image at each
        column (none where `skips` says not to)."""
        image, columns = -(-self.p["W"] // self.skip), self.p["S"]
        if not self.skips(self.ow, columns, image):
            return {}
        starts = range(0, self.ow // owr * owr, owr) if ow0.terms else (ow0.const,)
        inside = lambda start, s: [w for w in range(owr) if s in self.inside(start + w, columns, image)]
        spans = lambda start: tuple(range(ws[0], ws[-1] + 1) if (ws := inside(start, s)) else range(0)
                                    for s in range(columns))
        return {start: edge for start in starts if (edge := spans(start)) != (range(owr),) * columns}

    def inside(self, out: int, taps: int, image: int) -> range:
        """The taps (along rows or columns) by which output position `out` there reads the image, not the padding."""
        first = self.pad - out * self.stride
        return range(max(0, first), min(taps, first + image))

    def skips(self, outputs: int, taps: int, image: int) -> bool:
        """Whether the taps that read padding along rows (columns) are skipped: where they are EDGE_SHARE of the
        taps' reads there at least. A padding tap's products add nothing (oneDNN skips them too: a 7×7 image's 3×3
        taps read 2 padding rows in 21, and its 512-channel convolution ran faster than the FMA peak counts them),
        but each kind of edge is a micro-kernel more to compile: on a Zen 4, 175 ms a config of 512-channel 3×3
        over 7×7 with none, 743 with the rows' and the columns' (ResNet-18's tuning 2.8x as long with every
        convolution's), where a 56×56 image's edges save 2.5% of its time. int8's padding, the zero point, is summed
        like the data and taken off with the weights' sums as the block is written: never."""
        reads = sum(len(self.inside(out, taps, image)) for out in range(outputs))
        return not self.quantized and reads <= (1 - EDGE_SHARE) * outputs * taps

    def block_sum(self, kw: int, owr: int, taps: int, columns: tuple[range, ...] | None = None) -> tuple:
        """The block's accumulators zeroed, summed over the channels and `taps` of the taps' rows from r0 (an
        argument: the top and bottom rows' micro-kernels are one), then written. With
        `columns` (the block's positions that read the image at each of the taps' columns), the taps' columns are
        unrolled and each sums those positions only; else every position at every column, in a loop."""
        n, kblock, oh, ow0 = var("n0"), var("kblock"), var("oh0"), var("ow0")
        p = self.p

        def block(body, positions: range = range(owr)):
            vectors = lambda w: tiled("v", kw, self.vec, 0, lambda c0, width: [
                Loop("l", width, "vectorized", tuple(body(w, c0 + var("l"))))], "unrolled")
            if not positions:
                return []
            return [Loop("w", len(positions), "unrolled", tuple(vectors(var("w") + positions.start)))]

        r = var("r") + var("r0")

        def channels(s: Affine, positions: range) -> list:
            """The reduction over the channels at the taps' column s, for the block's `positions`."""
            data = lambda ci, w: self.dp[n, var("co"), oh * self.stride + r, (ow0 + w) * self.stride + s, ci]
            weights = lambda *index: self.wk[(kblock, var("co"), r, s) + index]

            def ahead(*row) -> list:
                """The packed weights' row as it lies `prefetch` channel steps on (the row kb·g elements long)."""
                steps, index = self.config["prefetch"], (kblock, var("co"), r, s) + row
                return self.wk.prefetch_row(index, steps * self.kb * self.group, kw * self.group) if steps else []

            def fma_step(ci):
                return ahead(ci, 0) + block(lambda w, c: [self.acc.store((w, c), Op("fma", (
                    data(ci, w), weights(ci, c), self.acc[w, c])))], positions)

            def group_step(q):
                terms = lambda w, c: tuple(t for j in range(self.group)
                                           for t in (data(q * self.group + j, w), weights(q, c, j)))
                return ahead(q, 0, 0) + block(lambda w, c: [self.acc.store((w, c), Op(
                    DOTS[self.isa], terms(w, c) + (self.acc[w, c],)))], positions)

            step, steps = (fma_step, self.cb) if self.group == 1 else (group_step, self.cbp // self.group)
            return tiled("ci", steps, self.unroll, 0,
                         lambda c0, u: [Loop("cu", u, "unrolled", tuple(step(c0 + var("cu"))))])

        extent = {"co": p["C"] // self.cb, "r": taps, "s": p["S"]}

        def reduction(names: list[str], s: Affine) -> list:
            if not names:
                return channels(s, columns[s.const] if columns else range(owr))
            if names[0] == "s" and columns:
                return [stmt for column in range(p["S"]) for stmt in reduction(names[1:], Affine.of(column))]
            body = reduction(names[1:], s)
            return [Loop(names[0], extent[names[0]], "serial", tuple(body))] if body else []

        zero = block(lambda w, c: [self.acc.store((w, c), self.zero)])
        summed = reduction(list(self.config["reduce_order"]), var("s")) if taps else []  # a row of padding: none
        return tuple(zero + summed + (block(self.write) if self.config["write"] == "channels" else
                                      self._rows(owr, kw, self.write)))

    def _rows(self, owr: int, kw: int, body) -> list:
        """The block by output channel, each channel's owr positions a vector: stores run along the output
        row (the accumulators are transposed on the way out), not one lane at a time across channels."""
        return [Loop("c", kw, "unrolled", tuple(tiled("wo", owr, self.vec, 0, lambda w0, lanes: [
            Loop("w", lanes, "vectorized", tuple(body(w0 + var("w"), var("c"))))], "unrolled")))]

    def write(self, w: Affine, c: Affine):
        """out = epilogue(acc + bias + residual) at this block's place in the NCHW output (int8's acc dequantized)."""
        place = self.at(var("n0"), var("k0") + c, var("oh0"), var("ow0") + w)
        value = self.acc[w, c]
        if self.quantized:
            value = dequantized(value, self.inputs, self.row_sums, var("k0") + c)
        if self.bias is not None:
            value = Op("add", (value, self.bias[var("k0") + c]))
        if self.residual is not None:
            value = Op("add", (value, self.residual[place]))
        return [self.out.store(place, epilogue(self.p["epilogue"], value))]


def lower(workload: Workload, target: Target, config: Config) -> Program:
    return _Conv2d(workload, target, config).program()
