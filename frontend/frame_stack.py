"""Compiled graphs called clear of CPython's frame-stack thrashing (python/cpython#142183, fixed in 3.13).

Up to 3.12 a thread's Python frames live in chunks of 16 KiB, and a chunk is unmapped as soon as the last frame in
it returns. Where a compiled graph's function sits near the end of a chunk, every call it makes (dozens of tuned ops
a forward) crosses into a new chunk and back: mmap, page faults, munmap and a TLB shootdown on the core running the
kernel's other thread, each time. Whether a process meets it depends only on how deep its caller's stack is: BERT-base
at sequence 32 on a 2-core Zen 5 ran 22.7-26.7 ms a forward from `tensortune bench model` and 15.7-18.3 from a
script calling the same function (19,800 page faults in 10 s of timing against 2,900). `on_runner_stack` calls the
graph in a greenlet kept for the thread: a greenlet has a frame stack of its own, whose first chunk CPython never
unmaps, so the graph runs a few frames into a chunk that stays mapped between calls, at a depth its callers cannot
move. A call costs the two switches, ~1 µs on a Zen 4; the frame of a whole chunk's slots that did the same before
mapped a chunk a call: 16-20 µs and 5 page faults on that Zen 4, ~100 µs a forward on a Zen 3 VM, where the munmap's
TLB shootdown reaches the kernel's spinning threads.
"""
from __future__ import annotations

import functools
import sys
import threading
from typing import Callable

THRASHES = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] < (3, 13)
if THRASHES:
    from greenlet import getcurrent, greenlet


def _serve():
    """The runner's life: each call's outcome switched back to its caller, which sends the next call. It starts with
    no arguments, and the outcome goes in a list the caller empties, so that the runner, waiting, holds nothing of a
    call alive (greenlet keeps the arguments it started with until it ends)."""
    fn, args, caller = getcurrent().parent.switch()
    while True:
        try:
            outcome = [True, fn(*args)]
        except BaseException as error:  # raised again in the caller, with this traceback
            outcome = [False, error]
        del fn, args
        fn, args, caller = caller.switch(outcome)


class _Runners(threading.local):
    """Each thread's runner (greenlets switch only within their thread)."""
    runner = None


_RUNNERS = _Runners()


def call_on_runner_stack(fn: Callable, args: tuple):
    """fn(*args), a few frames into a data-stack chunk that stays mapped, where CPython thrashes. A call already in
    the runner (a compiled graph timed by bench model, which calls every way so) runs where it is. The runner runs in
    its caller's contextvars context (the kernel clock's variable read, any other set as in a plain call)."""
    if not THRASHES:
        return fn(*args)
    runner, caller = _RUNNERS.runner, getcurrent()
    if caller is runner:
        return fn(*args)
    if runner is None or runner.dead:
        runner = _RUNNERS.runner = greenlet(_serve)
        runner.switch()  # to its first wait
    runner.gr_context = caller.gr_context
    outcome = runner.switch(fn, args, caller)
    ok, result = outcome
    outcome.clear()
    if not ok:
        raise result
    return result


def on_runner_stack(fn: Callable) -> Callable:
    """`fn`, called as call_on_runner_stack calls it (`fn` itself where CPython does not thrash). Attributes of `fn`
    (Dynamo's `_boxed_call`) carry over."""
    if not THRASHES:
        return fn

    @functools.wraps(fn)
    def called(*args):
        return call_on_runner_stack(fn, args)

    return called
