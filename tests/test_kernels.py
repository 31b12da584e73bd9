"""Every config of every space computes the right result, on awkward shapes too."""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_space import Target, batch_matmul, conv2d, dense, fallback_config, get_space, matmul
from search_space.templates.gemm import AMX
from workers import KernelArgumentError, build

SIZES = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 16, 17, 31, 32, 61, 64, 97, 127]), st.integers(1, 300))
TARGETS = [Target.parse("llvm -threads=1"), Target.parse("llvm -threads=2"),
           Target.parse("llvm -threads=2 -mattr=+avx,+avx2,+fma")]


@st.composite
def workloads(draw):
    op = draw(st.sampled_from(["matmul", "dense", "batch_matmul"]))
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    if op == "matmul":
        return matmul(m, n, k)
    if op == "dense":
        return dense(m, n, k, bias=draw(st.booleans()), epilogue=draw(st.sampled_from(["none", "relu", "gelu", "gelu_erf"])))
    b, m, n, k = draw(st.integers(1, 4)), min(m, 96), min(n, 96), min(k, 96)
    return batch_matmul(b, m, n, k, a_strides=draw(views(b, m, k, ("", "heads"))),
                        b_strides=draw(views(b, k, n, ("", "heads", "transposed heads", "transposed"))))


def views(batch: int, rows: int, columns: int, layouts: tuple[str, ...]):
    """The strides of a [batch, rows, columns] operand as a model's views give it: contiguous; each batch a block
    of columns of wider rows (attention's heads split from one activation, `pad` columns left over); those heads
    transposed (kᵀ); each batch transposed."""
    def strides(layout: str, pad: int) -> str:
        return {"": "", "heads": f"{columns}:{batch * columns + pad}:1", "transposed": f"{rows * columns}:1:{rows}",
                "transposed heads": f"{rows}:1:{batch * rows + pad}"}[layout]
    return st.builds(strides, st.sampled_from(layouts), st.integers(0, 5))


@st.composite
def convolutions(draw):
    """Strides, padding, 1×1 to 7×7 (R ≠ S too), H ≠ W, N > 1, channel counts that fill no vector, every fusion."""
    r, s = draw(st.sampled_from([1, 3, 5, 7])), draw(st.sampled_from([1, 2, 3, 7]))
    pad = draw(st.integers(0, 3))
    h, w = draw(st.integers(max(1, r - 2 * pad), 19)), draw(st.integers(max(1, s - 2 * pad), 19))
    return conv2d(draw(st.integers(1, 2)), draw(st.sampled_from([1, 3, 5, 8, 17, 24])), h, w,
                  draw(st.sampled_from([1, 5, 8, 16, 17, 33, 40])), r, s, draw(st.integers(1, 3)), pad,
                  bias=draw(st.booleans()), residual=draw(st.booleans()),
                  epilogue=draw(st.sampled_from(["none", "relu", "gelu", "gelu_erf"])))


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@PROPERTY
@given(data=st.data())
def test_any_config_matches_numpy(data):
    assert_any_config_matches_numpy(data, workloads())


@settings(PROPERTY, max_examples=120)
@given(data=st.data())
def test_any_convolution_config_matches_numpy(data):
    assert_any_config_matches_numpy(data, convolutions())


def assert_any_config_matches_numpy(data, workloads_of_op):
    workload = data.draw(workloads_of_op, "workload")
    target = data.draw(st.sampled_from(TARGETS), "target")
    space = get_space(workload, target)
    config = space.get(data.draw(st.integers(0, space.size - 1), "config index"))
    kernel = build(workload, target, config)
    inputs = workload.random_inputs(seed=config.index % 97)
    error = workload.max_error(kernel(*inputs), workload.reference(*inputs))
    assert error <= 1, f"{workload.key} config {config}: error {error:.2f}x tolerance"


@pytest.mark.parametrize("workload", [matmul(256, 256, 256), dense(64, 384, 256, bias=True, epilogue="gelu"),
                                      batch_matmul(3, 64, 48, 32)])
def test_out_argument_and_bound_weights(workload):
    kernel = build(workload, "llvm", None)
    inputs = workload.random_inputs()
    expected = workload.reference(*inputs)
    out = np.full(workload.output_shape, np.nan, np.float32)
    assert kernel(*inputs, out=out) is out
    assert workload.max_error(out, expected) <= 1
    bound = kernel.bind(**{b.name: a for b, a in zip(kernel.inputs[1:], inputs[1:])})
    assert workload.max_error(bound(inputs[0]), expected) <= 1
    assert workload.max_error(bound(inputs[0]), expected) <= 1  # and again: the packed weights persist
    out[...] = np.nan
    bound.address_call()(inputs[0].ctypes.data, out.ctypes.data)  # the torch backend's unchecked call
    assert workload.max_error(out, expected) <= 1
    out[...] = np.nan
    kernel.address_call()(*(a.ctypes.data for a in inputs), out.ctypes.data)
    assert workload.max_error(out, expected) <= 1


def test_bound_dense_weights_are_packed_once():
    """The packing stage runs at bind time only: W overwritten in place afterwards does not reach the bound
    kernel, which computes with the W it packed (a kernel that packed on every call would see the new W)."""
    workload = dense(32, 64, 48)
    kernel = build(workload, "llvm", fallback_config(workload, "llvm"))
    assert kernel.config["pack_b"]
    x, w = workload.random_inputs()
    bound_w = w.copy()
    bound = kernel.bind(W=bound_w)
    call = kernel.bind(W=bound_w).address_call()  # nothing else holds this BoundKernel: the call keeps it alive
    bound_w *= 2
    np.testing.assert_allclose(bound(x), x @ w.T, rtol=1e-4, atol=1e-4)
    out = np.empty(workload.output_shape, np.float32)
    call(x.ctypes.data, out.ctypes.data)
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(kernel(x, bound_w), x @ bound_w.T, rtol=1e-4, atol=1e-4)


def test_dense_weights_are_packed_by_transposing_blocks_in_registers():
    """A trained dense packs its W at every call: W's rows are loaded as vectors and transposed in registers, each
    panel row stored whole, no element moved on its own where the blocks are whole; the rows and columns a block
    leaves (N and K not multiples of the vector) are packed too."""
    from search_space import lower
    from workers.build import generated_assembly

    target = Target.parse("llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl -threads=1")
    workload = dense(32, 64, 48)
    assembly = generated_assembly(lower(workload, target, fallback_config(workload, target)), target)
    pack = assembly[assembly.index("pack_W:"):assembly.index(".Lfunc_end", assembly.index("pack_W:"))]
    moves = [line.split() for line in pack.splitlines() if line.startswith("\tvmov")]
    stores = [move for move in moves if move[-1].endswith(")")]
    assert stores and all("%zmm" in move[1] for move in stores), stores[:4]
    assert not {"vmovss", "vextractps"} & {move[0] for move in moves}
    for workload in (dense(3, 70, 50, bias=True), dense(2, 17, 16), dense(1, 16, 35)):
        kernel = build(workload, "llvm", fallback_config(workload, "llvm"))
        inputs = workload.random_inputs()
        assert workload.max_error(kernel(*inputs), workload.reference(*inputs)) <= 1, workload.key


@pytest.mark.parametrize("bad, message", [
    (lambda a, b: (a[:, :-1], b), "expected shape (16, 24), got (16, 23)"),
    (lambda a, b: (a.astype(np.float64), b), "expected dtype float32, got float64"),
    (lambda a, b: (np.asfortranarray(a), b), "must be C-contiguous"),
    (lambda a, b: (a,), "takes 2 input(s) (A, B), got 1"),
    (lambda a, b: (a.tolist(), b), "expected a numpy.ndarray, got list"),
])
def test_bad_arguments_are_named(bad, message):
    workload = matmul(16, 32, 24)
    kernel = build(workload, "llvm", 0)
    with pytest.raises(KernelArgumentError) as error:
        kernel(*bad(*workload.random_inputs()))
    assert message in str(error.value)
    with pytest.raises(KernelArgumentError, match="output C: expected shape"):
        kernel(*workload.random_inputs(), out=np.empty((3, 3), np.float32))


def test_a_view_must_lie_as_the_workload_says():
    workload = batch_matmul(2, 3, 4, 5, a_strides="5:10:1")
    kernel = build(workload, "llvm", fallback_config(workload, "llvm"))
    a, b = workload.random_inputs()
    with pytest.raises(KernelArgumentError, match=r"batch_matmul input A: expected a view of element strides "
                                                  r"\(5, 10, 1\), got \(15, 5, 1\)"):
        kernel(np.ascontiguousarray(a), b)


def test_a_transposed_b_is_packed_by_transposing_blocks_in_registers_and_always_packed():
    """kᵀ read in place has its elements along k, as dense's W: its packing moves no element on its own, and no
    config reads it unpacked (every vector a gather)."""
    from search_space import lower
    from workers.build import generated_assembly

    target = Target.parse("llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl -threads=1")
    workload = batch_matmul(4, 32, 64, 48, a_strides="48:192:1", b_strides="48:1:192")
    assert get_space(workload, target).knobs["pack_b"].candidates == (True,)
    assembly = generated_assembly(lower(workload, target, fallback_config(workload, target)), target)
    pack = assembly[assembly.index("pack_B:"):assembly.index(".Lfunc_end", assembly.index("pack_B:"))]
    moves = [line.split() for line in pack.splitlines() if line.startswith("\tvmov")]
    assert moves and not {"vmovss", "vextractps"} & {move[0] for move in moves}
    assert "gather" not in pack


VECTOR_REGISTERS = {512: "zmm", 256: "ymm", 128: "xmm"}


def test_accumulators_stay_in_registers_of_the_widest_vectors():
    """The fallback micro-kernel's FMAs use the host's widest vector registers (zmm with AVX-512, ymm with
    AVX2) and never read spilled accumulators from the stack: on every host, with no skip."""
    from workers.llvm_codegen import generate
    from workers.llvm_jit import compile_module
    from search_space import lower

    workload, target = matmul(512, 512, 512), Target.parse("llvm -threads=1")
    register = VECTOR_REGISTERS[target.vector_bits]
    config = fallback_config(workload, target)
    assembly = compile_module(generate(lower(workload, target, config), 1), target).assembly()
    fmas = [line for line in assembly.splitlines() if "vfmadd" in line]
    assert len(fmas) >= 16 and all(f"%{register}" in line for line in fmas), (register, fmas[:4])
    assert not [line for line in fmas if "(%rsp)" in line]
    assert "GOMP_parallel" not in assembly


def test_parallel_kernels_launch_through_openmp():
    from workers.llvm_codegen import generate
    from workers.llvm_jit import compile_module
    from search_space import lower

    workload, target = matmul(256, 256, 256), Target.parse("llvm -threads=2")
    space = get_space(workload, target)
    config = space.config(fallback_config(workload, target).to_dict() | {"parallel": "m"})
    assert "GOMP_parallel" in compile_module(generate(lower(workload, target, config), 2), target).assembly()
    inputs = workload.random_inputs()
    assert workload.max_error(build(workload, target, config)(*inputs), workload.reference(*inputs)) <= 1


FEWER_THREADS = """
from search_space import Target, dense, fallback_config, get_space
from workers import build
workload, target = dense(300, 200, 64, bias=True), Target.parse("llvm -threads=3")
config = get_space(workload, target).config(fallback_config(workload, target).to_dict() | {"parallel": "m"})
inputs = workload.random_inputs()
print(workload.max_error(build(workload, target, config)(*inputs), workload.reference(*inputs)))
"""


@pytest.mark.parametrize("limit", [1, 2])
def test_a_parallel_kernel_given_fewer_threads_than_it_asks_for_still_computes_every_share(limit):
    """A kernel built for three threads (38 blocks of 8 rows, 7 panels of W to pack) where libgomp runs one or
    two (OMP_THREAD_LIMIT, read when it loads; a container's limit, or a call from within a parallel region): the
    threads there share every block between them."""
    env = os.environ | {"OMP_THREAD_LIMIT": str(limit)}
    run = subprocess.run([sys.executable, "-c", FEWER_THREADS], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) <= 1


@pytest.mark.parametrize("epilogue", ["gelu", "gelu_erf"])
def test_gelu_epilogues_match_their_definitions_across_the_range(epilogue):
    """x·1 + 0 over [-9, 9]: the fused epilogue against NumPy's (SciPy's erf for the exact form), closely."""
    workload = dense(1, 512, 1, bias=True, epilogue=epilogue)
    x, w, bias = np.ones((1, 1), np.float32), np.linspace(-9, 9, 512, dtype=np.float32)[:, None], np.zeros(512, np.float32)
    got = build(workload, "llvm", fallback_config(workload, "llvm"))(x, w, bias)
    np.testing.assert_allclose(got, workload.reference(x, w, bias), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("a_strides, b_strides", [("544:1:17", ""), ("32:96:1", "32:1:96")],
                         ids=["A transposed", "heads, kᵀ"])
def test_views_in_every_family_match_the_reference(dtype, a_strides, b_strides):
    """The pair and quad dots read A's k in adjacent groups: from a transposed A, whose k runs down its columns,
    they multiply-add element by element; every family of the host computes the reference either way, but AMX,
    whose tile rows are A's rows, is not offered a transposed A."""
    workload = batch_matmul(2, 17, 17, 32, dtype, a_strides=a_strides, b_strides=b_strides)
    space = get_space(workload, "llvm")
    for isa in space.knobs["isa"].candidates:
        if isa in AMX and a_strides == "544:1:17":  # a tile row is A's k side by side: a transposed A has none
            with pytest.raises(ValueError, match="no valid value"):
                space.restrict({"isa": (isa,)})
            continue
        family = space.restrict({"isa": (isa,)})
        drawn = [space.get(space.index_of(dict(config.values))) for config in family.sample(3, 0)]
        for config in [space.nearest(dict(fallback_config(workload, "llvm").values) | {"isa": isa})] + drawn:
            inputs = workload.random_inputs(seed=config.index % 7)
            error = workload.max_error(build(workload, "llvm", config)(*inputs), workload.reference(*inputs))
            assert error <= 1, (isa, config)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_dense_prefetches_its_packed_weights_as_the_prefetch_knob_says(dtype):
    """A dense micro-kernel of a vector family prefetches the packed weights `prefetch` k steps on, a prefetcht0
    per cache line of a k step's row, and computes the same; of the GEMMs only dense, whose bound weights come from
    memory in a model, has the knob (products of activations find them in cache, just packed), and only from a
    packed W (conv2d, whose weights are bound too, has one of its own: tests/test_conv2d.py)."""
    from search_space import lower
    from workers.build import generated_assembly

    target = Target.parse("llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl -threads=1")
    workload = dense(20, 64, 70, bias=True, epilogue="relu", dtype=dtype)
    space = get_space(workload, target)
    assert space.knobs["prefetch"].candidates == (0, 4, 16, 32) and fallback_config(workload, target)["prefetch"] == 32
    assert all(config["pack_b"] for config in space.restrict({"prefetch": (4, 16, 32)}).sample(20, rng=0))
    assert "prefetch" not in get_space(matmul(20, 64, 70, dtype=dtype), target).knobs
    block = fallback_config(workload, target).to_dict() | {"tile_n": [-1, 2, 32], "unroll_k": 1}
    assembly = lambda ahead: generated_assembly(lower(workload, target, space.config(block | {"prefetch": ahead})),
                                                target)
    assert assembly(32).count("prefetcht0") >= 2 and "prefetcht0" not in assembly(0)  # a row: two cache lines
    host = get_space(workload, "llvm")
    for seed, ahead in enumerate(host.knobs["prefetch"].candidates):  # on an AMX host, "shared" too
        config = host.nearest(dict(fallback_config(workload, "llvm").values) | {"prefetch": ahead})
        inputs = workload.random_inputs(seed=seed)
        assert workload.max_error(build(workload, "llvm", config)(*inputs), workload.reference(*inputs)) <= 1, ahead
