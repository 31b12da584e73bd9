"""int8 GEMMs of a reduced range (`reduce_range=true`: activations in 0..127, as PyTorch's dynamic quantization makes
them) and the family they open on AVX2 CPUs, `pmaddubsw`: byte pairs multiplied and summed in int16, exact only in
that range. Offered only to such workloads, emitted at every vector width, computing the exact reference, and seen
to saturate outside the range it is offered for."""
import numpy as np
import pytest

from search_space import (Target, WorkloadError, batch_matmul, conv2d, dense, fallback_config, get_space, host_target,
                          lower, matmul, Workload)
from search_space.templates.gemm import isas
from workers import build
from workers.build import generated_assembly
from workers.llvm_codegen import generate
from tests.isa_helpers import HOST, assert_every_width_emits, check, configs_using, zen4

AVX2 = Target.parse("llvm -mcpu=znver3 -mattr=+avx,+avx2,+fma -threads=1")
ONE = Target.parse("llvm -threads=1")
on_avx2 = pytest.mark.skipif("avx2" not in host_target().features, reason="the host has no AVX2: assembly only")
REDUCED = [dense(33, 100, 77, bias=True, epilogue="gelu", dtype="int8", reduce_range=True),
           batch_matmul(3, 17, 42, 31, "int8", reduce_range=True), matmul(64, 64, 3072, "int8", reduce_range=True)]


def test_a_reduced_range_is_int8s_option_and_part_of_the_key():
    workload = dense(16, 24, 64, bias=True, dtype="int8", reduce_range=True)
    assert workload.key == "dense(M=16,N=24,K=64,bias=true,reduce_range=true,dtype=int8)"
    assert Workload.from_key(workload.key) == workload and dense(16, 24, 64, dtype="int8").key.count("reduce") == 0
    x, _, _, _, x_zero, _ = workload.random_inputs()
    assert x.max() == 127 and 0 <= x_zero[0] <= 127
    assert dense(16, 24, 64, dtype="int8").random_inputs()[0].max() == 255
    with pytest.raises(WorkloadError, match="reduce_range=true narrows int8 activations to 0..127; it has no meaning "
                                            "in float32"):
        dense(16, 24, 64, reduce_range=True)
    assert workload.in_dtype("float32") == dense(16, 24, 64, bias=True)
    with pytest.raises(WorkloadError, match="unknown parameter"):
        Workload.make("conv2d", "int8", N=1, C=8, H=8, W=8, K=8, R=3, S=3, reduce_range=True)


def test_bench_kernels_times_int8_dense_as_a_quantized_model_runs_it():
    from bench.kernels import in_dtype

    assert in_dtype(dense(128, 768, 768), "int8") == dense(128, 768, 768, dtype="int8", reduce_range=True)
    assert in_dtype(matmul(512, 512, 512), "int8") == matmul(512, 512, 512, "int8")  # against `_int_mm`, full range
    assert in_dtype(dense(128, 768, 768), "bfloat16") == dense(128, 768, 768, dtype="bfloat16")


def test_the_saturating_family_is_offered_only_to_a_reduced_range_on_avx2():
    """On an AVX2 CPU a reduced dense offers `pmaddubsw` and its fallback takes it; a full-range one, a convolution
    and a CPU without AVX2 never get it; with VNNI (exact at any range) the fallback keeps VNNI's dot."""
    reduced, full = dense(64, 768, 768, dtype="int8", reduce_range=True), dense(64, 768, 768, dtype="int8")
    assert isas(AVX2, "int8") == ("widen",) and isas(AVX2, "int8", reduced=True) == ("widen", "pmaddubsw")
    assert get_space(reduced, AVX2).knobs["isa"].candidates == ("widen", "pmaddubsw")
    assert fallback_config(reduced, AVX2)["isa"] == "pmaddubsw"
    assert get_space(full, AVX2).knobs["isa"].candidates == ("widen",)
    assert get_space(conv2d(1, 64, 14, 14, 64, 3, 3, 1, 1, dtype="int8"), AVX2).knobs["isa"].candidates == ("widen",)
    no_avx2 = Target.parse("llvm -mcpu=znver3 -mattr=+avx,-avx2,+fma -threads=1")
    assert get_space(reduced, no_avx2).knobs["isa"].candidates == ("widen",)
    vnni = zen4("avx512vnni")
    assert get_space(reduced, vnni).knobs["isa"].candidates == ("widen", "pmaddubsw", "avx512vnni")
    assert fallback_config(reduced, vnni)["isa"] == "avx512vnni"


@pytest.mark.parametrize("vec", [4, 8])
def test_the_saturating_family_multiplies_bytes_by_pmaddubsw(vec):
    """On AVX2 the micro-kernel multiplies bytes by pmaddubsw and sums its pairs by pmaddwd, widening no byte
    (no shift); AVX-512's widths emit it too; a target without x86's vectors splits each quad into bytes."""
    workload = matmul(64, 64, 256, "int8", reduce_range=True)
    [config] = configs_using(workload, AVX2, "pmaddubsw", 1, vec=vec, pack_b=True)
    compute = generated_assembly(lower(workload, AVX2, config), AVX2)
    compute = compute[compute.index("micro_kernel"):]
    assert "vpmaddubsw" in compute and "vpmaddwd" in compute and "vpsraw" not in compute and "vpsllw" not in compute
    assert "pmadd" not in str(generate(lower(workload, AVX2, config), 1, ("fma",)))
    assert_every_width_emits(REDUCED[1], zen4(), "pmaddubsw", "vpmaddubsw")


@on_avx2
def test_the_saturating_family_computes_the_exact_reference():
    """Odd shapes, one thread and two: dense with bias and GELU, batch_matmul, matmul with a long k (int32 sums
    beyond float32's exact integers)."""
    for workload in REDUCED:
        for target in (ONE, HOST):
            for config in configs_using(workload, target, "pmaddubsw", 3):
                check(workload, target, config)


@on_avx2
def test_outside_its_range_the_saturating_product_saturates():
    """Activations of 255 against weights of -128: each byte pair's sum, -65280, saturates in int16, so the family
    is wrong there, where `widen` is exact: why it is offered only to a reduced range."""
    workload = matmul(8, 16, 32, "int8", reduce_range=True)
    a, b = np.full((8, 32), 255, np.uint8), np.full((32, 16), -128, np.int8)
    exact = workload.reference(a, b)
    assert exact[0, 0] == 32 * 255 * -128
    [saturating] = configs_using(workload, ONE, "pmaddubsw", 1, vec=8, pack_b=True)
    assert build(workload, ONE, saturating)(a, b)[0, 0] == 16 * -32768
    [widened] = configs_using(workload, ONE, "widen", 1, vec=8, pack_b=True)
    assert np.array_equal(build(workload, ONE, widened)(a, b), exact)
