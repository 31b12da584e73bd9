from typer.testing import CliRunner

from search_space import Target, format_program, get_space, lower, matmul
from search_space.program import Loop, walk
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
