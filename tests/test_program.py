import math

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from search_space import Target, format_program, get_space, lower, matmul
from search_space.program import Affine, Buffer, Loop, var, walk
from service.cli import app


def test_show_prints_the_loop_nest():
    result = CliRunner().invoke(app, ["show", "matmul", "M=64", "N=64", "K=64", "--config", "0"])
    assert result.exit_code == 0, result.output
    assert "# config 0 of" in result.output
    assert "for mo in range(" in result.output
    assert "vectorized for l in range(" in result.output
    assert "C[" in result.output and "fma(A[" in result.output


def test_show_rejects_bad_input_clearly():
    result = CliRunner().invoke(app, ["show", "matmul", "M=64", "N=64"])
    assert result.exit_code != 0 and "missing parameter(s) K" in result.output
    result = CliRunner().invoke(app, ["show", "matmul", "M=8", "N=8", "K=8", "--config", str(10 ** 12)])
    assert result.exit_code == 2 and "out of range" in result.output


def test_tails_are_peeled_with_static_extents():
    # lowered only, never run: an AVX-512 target named outright, whatever this host has
    workload, target = matmul(127, 61, 13), Target.parse("llvm -mcpu=skylake-avx512 -mattr=+avx512f,+fma -threads=1")
    space = get_space(workload, target)
    config = space.config(space.get(0).to_dict() | {"tile_m": (-1, 1, 8), "tile_n": (-1, 1, 16), "vec": 16})
    program = lower(workload, target, config)
    extents = {loop.var: set() for loop, _, _ in walk(program.stages[-1].body) if isinstance(loop, Loop)}
    for loop, _, _ in walk(program.stages[-1].body):
        if isinstance(loop, Loop):
            extents[loop.var].add(loop.extent)
    assert 127 // 8 in extents["mo"] and 7 in extents["r"]  # 15 full row tiles, then a 7-row tail
    assert 13 in extents["l"] and 16 in extents["l"]  # the last 61 % 16 = 13 columns as a narrower vector
    assert "parallel" not in format_program(program)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=5).flatmap(lambda shape: st.tuples(
    st.just(tuple(shape)), st.none() | st.lists(st.integers(0, 50), min_size=len(shape), max_size=len(shape)),
    st.lists(st.tuples(st.dictionaries(st.sampled_from("abc"), st.integers(-3, 3)), st.integers(-5, 5)),
             min_size=len(shape), max_size=len(shape)))), st.dictionaries(st.sampled_from("abc"), st.integers(-4, 4),
                                                                          min_size=3))
def test_a_buffers_flat_offset_is_each_dimensions_index_times_its_stride(case, at):
    """Row-major where no strides are given; the offset's terms are the variables left with a coefficient."""
    shape, strides, parts = case
    buffer = Buffer("x", shape, "input", strides=tuple(strides) if strides is not None else None)
    index = tuple(sum((var(n) * c for n, c in terms.items()), Affine()) + const for terms, const in parts)
    steps = strides or [math.prod(shape[d + 1:]) for d in range(len(shape))]
    value = lambda a: a.const + sum(c * at[n] for n, c in a.terms)
    offset = buffer.flat(index)
    assert value(offset) == sum(value(i) * s for i, s in zip(index, steps))
    assert all(c for _, c in offset.terms) and len(offset.names) == len(set(offset.names))
