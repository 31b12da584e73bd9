"""Register blocks: which fit the vector register file, and which a search measures first, before its cost model
knows anything of the target. GEMM's rows × column vectors and conv2d's output positions × channel vectors are
the same block: per step of the reduction, `vectors` loads, `rows` broadcasts and rows · vectors multiply-adds.
The first measured are the blocks that keep the most multiply-adds per value brought in, as BLIS picks its
micro-kernel from the register file alone (Low et al., "Analytical modeling is enough for high-performance
BLIS", 2016).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from ..space import ConfigSpace

L1_BYTES = 32 * 1024  # the data cache of every x86 core since Sandy Bridge, or more
CHAINS = 8  # independent accumulators that keep two FMA pipes of 4 cycles' latency busy


def fills(rows: int, vectors: int, registers: int) -> bool:
    """Whether rows × vectors accumulators, one row of B's vectors and a broadcast fit `registers`."""
    return rows * vectors + vectors + 1 <= registers


def best_blocks(rows: Iterable[int], vectors: Iterable[int], registers: int, count: int = 2, chains: int = 1
                ) -> list[tuple[int, int]]:
    """The `count` (rows, vectors) blocks that fit, of at least `chains` accumulators, with the most multiply-adds per
    value loaded, rows · vectors / (rows + vectors); on a tie the block with more accumulators (more independent
    chains hide the FMA's latency)."""
    blocks = [(r, v) for r in rows for v in vectors if fills(r, v, registers) and r * v >= chains]
    return sorted(blocks, key=lambda b: (-b[0] * b[1] / (b[0] + b[1]), -b[0] * b[1]))[:count]


def seed_blocks(space: ConfigSpace, rows_knob: str, columns_knob: str, most_vectors: int, registers: int,
                length: int | None = None) -> Iterator[tuple[int, int, int]]:
    """(vec, rows, columns) of the blocks a search measures first: at the widest vectors and at half that width
    (Zen 1 splits a 256-bit FMA in two, and its fastest GEMM blocks were 128-bit), the two best by `best_blocks`
    among the register tiles the two split knobs offer; with the `length` the rows tile, where both leave a tail of
    it, at the widest vectors also the two best whose rows divide it, of enough accumulators to hide the FMA's
    latency on two pipes (on a Zen 4, the best of those ran three of ResNet-18's 3 × 3 convolutions, with output
    rows of 14 and 7, 3-14% faster than the best of the others at 1 and 2 threads; the fourth, strided to rows of
    14, 1-4% slower)."""
    rows = sorted({split[-1] for split in space.knobs[rows_knob].candidates})
    columns = sorted({split[-1] for split in space.knobs[columns_knob].candidates})
    for half, vec in enumerate(sorted(space.knobs["vec"].candidates, reverse=True)[:2]):
        vectors = [c // vec for c in columns if c % vec == 0 and c // vec <= most_vectors]
        blocks = best_blocks(rows, vectors, registers)
        if length is not None and not half and all(length % r for r, _ in blocks):
            blocks += best_blocks([r for r in rows if length % r == 0], vectors, registers, chains=CHAINS)
        for r, v in blocks:
            yield vec, r, v * vec


def seed_families(space: ConfigSpace) -> list[dict]:
    """The `isa` of each set of seeds: every instruction family the space offers, the fallback's (the last) first;
    one set where there is no such knob. Which family is fastest is measured, not assumed: AVX-512 BF16's pair dot
    runs at twice the FMA's rate on a Zen 4 (232.9 against 116.2 GFLOPS at 1 thread, workers.peak), and at half it
    on an Intel Xeon without AMX (85.9 against 173.4), where bfloat16 widened into FMAs is faster (9 trials of a new
    target, 1 thread: dense 128×768×768 and 128×3072×768 at 111.0 and 111.2 GFLOPS, 98.4 and 103.4 with the pair
    dot's seeds only)."""
    if "isa" not in space.knobs:
        return [{}]
    return [{"isa": isa} for isa in reversed(space.knobs["isa"].candidates)]


def reduction_block(columns: int, itemsize: int, choices: Iterable[int]) -> int:
    """The longest reduction block among `choices` whose panel of B, `columns` wide, fills no more than L1: the
    panel is what every row block of the inner loop reads again (A's rows are read once a panel). Blocks whose A
    rows and B panel both fit half of L1, as before, gave AVX-512's seeds (6 × 64) a k-block of 32, and those ran
    5-13% slower than at 128 or more (dense 128×768×768 and matmul 512³, 1 and 2 threads, an Intel Xeon); AVX2's
    blocks ran within 2% at any k-block there. The shortest choice where none fits."""
    choices = sorted(choices)
    fitting = [k for k in choices if k * columns * itemsize <= L1_BYTES]
    return fitting[-1] if fitting else choices[0]
