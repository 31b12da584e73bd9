"""Compiled graphs called clear of CPython's frame-stack thrashing (python/cpython#142183, fixed in 3.13).

Up to 3.12 a thread's Python frames live in chunks of 16 KiB, and a chunk is unmapped as soon as the last frame in
it returns. Where a compiled graph's function sits near the end of a chunk, every call it makes (dozens of tuned ops
a forward) crosses into a new chunk and back: mmap, page faults, munmap and a TLB shootdown on the core running the
kernel's other thread, each time. Whether a process meets it depends only on how deep its caller's stack is: BERT-base
at sequence 32 on a 2-core Zen 5 ran 22.7-26.7 ms a forward from `tensortune bench model` and 15.7-18.3 from a
script calling the same function (19,800 page faults in 10 s of timing against 2,900). `on_fresh_chunk` calls the
graph from a frame larger than a standard chunk, so CPython maps that frame a chunk of its own (32 KiB) and the graph
runs in the 16 KiB left above it: one chunk mapped a call, at a depth its callers cannot move.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Callable

CHUNK_SLOTS = 16 * 1024 // 8  # pointers in CPython's standard data-stack chunk (DATA_STACK_CHUNK_SIZE)
THRASHES = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] < (3, 13)


def _trampoline() -> Callable:
    """`call(fn, args)`: fn(*args) from a frame of a whole standard chunk of local slots (names only deleted in
    dead code, so none is ever set)."""
    names = ", ".join(f"_{index}" for index in range(CHUNK_SLOTS))
    namespace: dict = {}
    exec(f"def call(fn, args):\n    if False:\n        del {names}\n    return fn(*args)\n", namespace)
    return namespace["call"]


TRAMPOLINE = _trampoline() if THRASHES else None
_ON_FRESH = threading.local()  # `inside`: this thread runs within a trampoline's chunk


def call_on_fresh_chunk(fn: Callable, args: tuple):
    """fn(*args), from the top of a data-stack chunk of its own where CPython thrashes. A call already within one
    (a compiled graph timed by bench model, which calls every way so) runs where it is, a few frames into a fresh
    chunk: mapping a chunk costs 18-22 µs a call on a 2-core Zen 4, as much as a small model's two tuned ops."""
    if TRAMPOLINE is None or getattr(_ON_FRESH, "inside", False):
        return fn(*args)
    _ON_FRESH.inside = True
    try:
        return TRAMPOLINE(fn, args)
    finally:
        _ON_FRESH.inside = False


def on_fresh_chunk(fn: Callable) -> Callable:
    """`fn`, called as call_on_fresh_chunk calls it (`fn` itself where CPython does not thrash). Attributes of `fn`
    (Dynamo's `_boxed_call`) carry over."""
    if TRAMPOLINE is None:
        return fn

    @functools.wraps(fn)
    def called(*args):
        return call_on_fresh_chunk(fn, args)

    return called
