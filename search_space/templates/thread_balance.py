"""How evenly a parallel loop's blocks keep the threads busy. The code generator gives each thread a contiguous
run of the loop's iterations, as even in count as can be; an axis cut into blocks whose count the threads do not
divide leaves threads idle: dense 128×768×768 on 2 threads, parallel over N in blocks of 256 columns, runs one
thread 512 columns and the other 256 (hot, an Intel AVX-512 host: 240-259 GFLOPS against 300-322 for blocks of
128, the same register block)."""
from __future__ import annotations

from typing import Iterable


def thread_balance(extent: int, block: int, threads: int) -> float:
    """The share of the threads' time spent working when [0, extent) in blocks of `block` is split that way: the
    work over `threads` times the busiest thread's."""
    blocks = -(-extent // block)
    sizes = [min(block, extent - i * block) for i in range(blocks)]
    busiest = max(sum(sizes[t * blocks // threads:(t + 1) * blocks // threads]) for t in range(threads))
    return extent / (threads * busiest)


def balanced_block(extent: int, register: int, threads: int, choices: Iterable[int], most: int) -> int:
    """The number of register tiles a parallel block holds (of `choices`, at most `most`) that keeps the threads
    busiest; the largest of those (fewer, larger blocks share the packed operand's cache lines)."""
    return max((c for c in choices if c <= most), key=lambda c: (thread_balance(extent, c * register, threads), c))
