"""A graph called through on_fresh_chunk makes its calls without crossing a frame-stack chunk at any depth of its
caller, where CPython up to 3.12 maps a chunk (page faults) at every crossing."""
import resource

import pytest

from frontend.frame_stack import THRASHES, call_on_fresh_chunk, on_fresh_chunk

CALLS = 200


def callee():
    """A call with a frame of a few hundred bytes, as a tuned op's Python is."""
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = a8 = a9 = None  # noqa: F841
    return None


def graph():
    """What a compiled graph does: many calls from one frame; the page faults they cost."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(CALLS):
        callee()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def at_depth(depth: int, fn):
    return fn() if depth == 0 else at_depth(depth - 1, fn)


def worst_depth(fn) -> int:
    """The most page faults `fn` takes over the caller depths of one chunk (16 KiB of frames of ~100 bytes)."""
    return max(at_depth(depth, fn) for depth in range(0, 200))


@pytest.mark.skipif(not THRASHES, reason="this Python keeps a spare chunk (3.13+): nothing to work around")
def test_calls_cross_no_chunk_boundary_at_any_depth_of_the_caller():
    assert worst_depth(graph) >= CALLS  # the thrashing exists here: a chunk mapped at every call at one depth
    assert worst_depth(on_fresh_chunk(graph)) < CALLS // 10


def test_on_fresh_chunk_passes_arguments_result_and_attributes():
    def boxed(args):
        return sum(args)

    boxed._boxed_call = True
    wrapped = on_fresh_chunk(boxed)
    assert wrapped([1, 2, 3]) == 6 and wrapped._boxed_call is True


def faults(call) -> int:
    """The page faults of CALLS calls."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(CALLS):
        call()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not THRASHES, reason="this Python keeps a spare chunk (3.13+): nothing to work around")
def test_a_graph_called_within_a_fresh_chunk_maps_no_second_one():
    """bench model calls every way from a fresh chunk; tensortune's graph, wrapped by on_fresh_chunk, then runs in
    that one rather than mapping another (which cost it a second chunk a forward that the other ways did not pay),
    and outside one it still maps its own."""
    one = faults(lambda: call_on_fresh_chunk(callee, ()))
    assert one >= CALLS  # a chunk mapped (and its pages faulted in) at every call
    assert faults(lambda: call_on_fresh_chunk(on_fresh_chunk(callee), ())) < one * 1.5
    assert faults(lambda: on_fresh_chunk(callee)()) >= CALLS
