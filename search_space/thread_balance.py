"""How evenly a parallel loop's blocks keep the threads busy. The code generator gives each thread a contiguous
run of the loop's iterations, as even in count as can be; an axis cut into blocks whose count the threads do not
divide leaves threads idle: dense 128×768×768 on 2 threads, parallel over N in blocks of 256 columns, runs one
thread 512 columns and the other 256 (hot, an Intel AVX-512 host, the same three register blocks in blocks of 8
register tiles, 256 or 512 columns, and of 2, 64 or 128: 177-263 GFLOPS against 273-361, at every k-block)."""
from __future__ import annotations

from typing import Iterable, Sequence


def busy_share(works: Sequence[float], threads: int) -> float:
    """The share of the threads' time spent working when iterations of these `works` are split that way: the work
    over `threads` times the busiest thread's."""
    count = len(works)
    busiest = max(sum(works[t * count // threads:(t + 1) * count // threads]) for t in range(threads))
    return sum(works) / (threads * busiest)


def thread_balance(extent: int, block: int, threads: int) -> float:
    """`busy_share` of [0, extent) in blocks of `block`, the last one partial."""
    return busy_share([min(block, extent - start) for start in range(0, extent, block)], threads)


SLACK = 0.05  # of the threads' busy share that a larger block may give up


def balanced_block(extent: int, register: int, threads: int, choices: Iterable[int], most: int) -> int:
    """The number of register tiles a parallel block holds (of `choices`, at most `most`): the largest that keeps
    the threads within SLACK of the busiest split. Each block reads the other operand again (a block of M's rows all
    of B): 1024 rows on 2 threads in blocks of 6 (busy 0.992) ran matmul 1024³ at 163 GFLOPS where blocks of 48
    (busy 0.970) at 283 (an Intel Xeon, 6 × 4 vectors); fewer, larger blocks also share the packed operand's cache
    lines."""
    busy = {c: thread_balance(extent, c * register, threads) for c in choices if c <= most}
    enough = max(busy.values()) - SLACK
    return max(c for c, share in busy.items() if share >= enough)
