"""A graph called through on_runner_stack makes its calls without crossing a frame-stack chunk at any depth of its
caller, where CPython up to 3.12 maps a chunk (page faults) at every crossing."""
import contextvars
import threading
import weakref

import pytest

from bench.frame_stack import DEPTHS, at_depth, callee, thread_faults
from frontend.frame_stack import THRASHES, call_on_runner_stack, on_runner_stack

CALLS = 200


def graph():
    """What a compiled graph does: many calls from one frame; the page faults they cost."""
    before = thread_faults()
    for _ in range(CALLS):
        callee()
    return thread_faults() - before


def worst_depth(fn) -> int:
    """The most page faults `fn` takes over the caller depths of one chunk (16 KiB of frames of ~100 bytes)."""
    return max(at_depth(depth, fn) for depth in range(DEPTHS))


@pytest.mark.skipif(not THRASHES, reason="this Python keeps a spare chunk (3.13+): nothing to work around")
def test_calls_cross_no_chunk_boundary_at_any_depth_of_the_caller():
    assert worst_depth(graph) >= CALLS  # the thrashing exists here: a chunk mapped at every call at one depth
    assert worst_depth(on_runner_stack(graph)) < CALLS // 10


def test_on_runner_stack_passes_arguments_result_and_attributes():
    def boxed(args):
        return sum(args)

    boxed._boxed_call = True
    wrapped = on_runner_stack(boxed)
    assert wrapped([1, 2, 3]) == 6 and wrapped._boxed_call is True


def faults(call) -> int:
    """The page faults of CALLS calls."""
    before = thread_faults()
    for _ in range(CALLS):
        call()
    return thread_faults() - before


@pytest.mark.skipif(not THRASHES, reason="this Python keeps a spare chunk (3.13+): nothing to work around")
def test_no_chunk_is_mapped_a_call_from_outside_the_runner_or_within_it():
    """The runner's chunk stays mapped between calls (a frame of a chunk's slots mapped one every call, 16-20 µs on a
    Zen 4); bench model calls every way through it, and a graph wrapped again runs where it is."""
    assert faults(lambda: on_runner_stack(callee)()) < CALLS // 10
    assert faults(lambda: call_on_runner_stack(on_runner_stack(callee), ())) < CALLS // 10


def test_an_exception_reaches_the_caller_and_the_runner_serves_on():
    def fails(message):
        raise ValueError(message)

    with pytest.raises(ValueError, match="bad shape"):
        on_runner_stack(fails)("bad shape")
    assert on_runner_stack(lambda a, b: a * b)(6, 7) == 42


CLOCK: contextvars.ContextVar = contextvars.ContextVar("clock", default=None)


def test_context_variables_read_and_set_as_in_a_plain_call():
    """The kernel clock is a ContextVar that bench model sets around the forwards it times."""
    def reads_and_sets():
        seen = CLOCK.get()
        CLOCK.set("set within")
        return seen

    token = CLOCK.set("set outside")
    try:
        assert on_runner_stack(reads_and_sets)() == "set outside"
        assert CLOCK.get() == "set within"
    finally:
        CLOCK.reset(token)


def test_the_runner_holds_nothing_of_a_call_alive():
    """Neither the graph, its arguments nor its result, from the call that started the runner (in a new thread)
    or a later one."""
    class Tensor:
        pass

    def held_after_call():
        result = Tensor()
        graph, argument = (lambda given: result), Tensor()
        refs = [weakref.ref(graph), weakref.ref(argument), weakref.ref(on_runner_stack(graph)(argument))]
        del result, graph, argument
        return [ref() is not None for ref in refs]

    held = []
    thread = threading.Thread(target=lambda: held.extend(held_after_call() + held_after_call()))
    thread.start()
    thread.join()
    assert held == [False] * 6


def test_each_thread_calls_through_its_own_runner():
    results = []
    threads = [threading.Thread(target=lambda n=n: results.append(on_runner_stack(lambda: n * n)()))
               for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [0, 1, 4, 9]
