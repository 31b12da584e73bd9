"""An op with no record runs the template's fallback in the instruction family measured fastest on this CPU: the
ranking rule on rates measured on the project's CPU kinds, then the real measurement on this host, the kernels a
build and a compiled model run with it, and a target that is not this CPU keeping the template's choice."""
from dataclasses import replace

import pytest

from typer.testing import CliRunner

from frontend.shapes import Kernels
from search_space import Target, conv2d, dense, fallback_config, get_space, host_target
from service.cli import app
from tuner.tune import tune
from workers import MeasureOptions, build, make_pool
from workers.untuned import CLEAR, family_rates, ranked_family, runs_here, untuned_config

HOST = Target.parse("llvm -threads=2")
BF16 = ("fma", "fma-f32", "avx512bf16")


@pytest.mark.parametrize("rates, family", [
    ({"fma": 170.2, "avx512bf16": 85.6}, "fma-f32"),  # an Intel Xeon without AMX: the later of the two FMA families
    ({"fma": 116.2, "avx512bf16": 232.9}, "avx512bf16"),  # a Zen 4: the pair dot, the template's own choice
    ({"fma": 100.0, "avx512bf16": 100.0 / CLEAR}, "avx512bf16"),  # not clearly faster: the template's choice kept
    ({"fma": 170.2}, "avx512bf16"),  # the template's choice unmeasured: kept
])
def test_another_family_replaces_the_templates_only_where_clearly_faster(rates, family):
    assert ranked_family("avx512bf16", BF16, rates) == family
    assert ranked_family("avx512vnni", ("widen", "avx512vnni"), {"widen": 216.6, "avx512vnni": 708.0}) == "avx512vnni"
    # a Zen 3's int8 of a reduced range: AVX2's saturating byte product, the template's choice, ahead of `widen`
    assert ranked_family("pmaddubsw", ("widen", "pmaddubsw"), {"widen": 124.0, "pmaddubsw": 155.0}) == "pmaddubsw"


@pytest.mark.parametrize("workload", [dense(64, 256, 256, bias=True, dtype="bfloat16"),
                                      conv2d(1, 32, 10, 10, 32, 3, 3, 1, 1, dtype="bfloat16"),
                                      dense(64, 256, 256, dtype="int8", reduce_range=True)])
def test_an_untuned_op_runs_the_family_measured_fastest_here(workload, tmp_path):
    static = fallback_config(workload, HOST)
    if len(get_space(workload, HOST).knobs["isa"].candidates) < 2:
        pytest.skip("this host offers one family for the dtype: nothing to rank")
    rates = family_rates(replace(HOST, threads=1), workload.dtype)  # as untuned_config measured them: one per process
    family = ranked_family(static["isa"], get_space(workload, HOST).knobs["isa"].candidates, rates)
    chosen = untuned_config(workload, HOST)
    assert chosen["isa"] == family and chosen.index == fallback_config(workload, HOST, isa=family).index
    # a build with no config and no dispatch context, and a model's kernel with no record, run it, and compute right
    kernel = build(workload, HOST)
    assert kernel.config.index == chosen.index
    inputs = workload.random_inputs()
    assert workload.max_error(kernel(*inputs), workload.reference(*inputs)) <= 1
    assert Kernels(f"sqlite:///{tmp_path / 'empty.db'}", HOST).get(workload).config.index == chosen.index
    # and `show` with no --config shows it
    params = workload.key[len(workload.op) + 1:-1].split(",")
    shown = CliRunner().invoke(app, ["show", workload.op, *params, "--target", str(HOST)])
    assert shown.exit_code == 0 and f"# config {chosen.index} of" in shown.output, shown.output


def test_a_target_that_is_not_this_cpu_keeps_the_templates_choice():
    """Its peak kernels could not run here (another CPU model, or a feature the host lacks): nothing is measured."""
    workload = dense(64, 256, 256, dtype="bfloat16")
    other = "znver4" if host_target().model != "znver4" else "sapphirerapids"
    elsewhere = Target.parse(f"llvm -mcpu={other} -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl,"
                             "+avx512bf16")
    before = family_rates.cache_info().misses
    assert not runs_here(elsewhere)
    assert untuned_config(workload, elsewhere).index == fallback_config(workload, elsewhere).index
    assert family_rates.cache_info().misses == before
    float32 = dense(64, 256, 256)
    assert untuned_config(float32, HOST).index == fallback_config(float32, HOST).index and runs_here(HOST)


def test_a_search_measures_the_untuned_config_in_its_first_batch(tmp_path):
    """A tune never ends worse than not tuning: the config the op runs untuned is among its first candidates."""
    workload, one = dense(32, 64, 64, dtype="bfloat16"), replace(HOST, threads=1)
    with make_pool("local") as pool:
        result = tune(workload, one, 4, "random", f"sqlite:///{tmp_path / 'tune.db'}", pool, batch=4,
                      measure=MeasureOptions(repeat=2, min_repeat_ms=1.0))
    assert untuned_config(workload, one).index in {measured.config.index for measured, _ in result.measured[:4]}
