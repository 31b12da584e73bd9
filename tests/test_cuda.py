"""The GPU path without a GPU: the CUDA template's configs lowered, their CUDA C compiled by the real NVRTC
for sm_80 and sm_90, and the lowered program run by the CPU emulator against NumPy. Tests marked `gpu`
launch kernels and skip, with the reason, where CuPy sees no GPU (`pytest -m gpu` on a GPU host)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from search_space import (InvalidConfig, NoTemplate, Target, TargetError, Workload, batch_matmul, dense,
                          fallback_config, get_space, lower, matmul)
from search_space.gpu_device import NoGpu, host_gpu, limits
from search_space.program import Barrier, Buffer, If, Loop, Program, Stage, launch, var, walk
from search_space.templates.gemm_cuda import _resources
from workers import build
from workers.cuda_codegen import generate
from workers.gpu_emulator import EmulationError, emulate
from workers.nvrtc import CudaCompileError, check_limits, compile_cuda

SM_90 = Target.parse("cuda -arch=sm_90")
ARCHES = ("sm_80", "sm_90")


def _no_gpu() -> str:
    try:
        host_gpu()
    except NoGpu as error:
        return str(error)
    return ""


NO_GPU = _no_gpu()


def needs_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(bool(NO_GPU), reason=f"needs a CUDA GPU: {NO_GPU}")(test))

workloads = st.one_of(
    st.builds(matmul, st.integers(1, 40), st.integers(1, 40), st.integers(1, 48)),
    st.builds(dense, st.integers(1, 40), st.integers(1, 40), st.integers(1, 48), st.booleans(),
              st.sampled_from(["none", "relu", "gelu", "gelu_erf"])),
    st.builds(batch_matmul, st.integers(1, 3), st.integers(1, 24), st.integers(1, 24), st.integers(1, 40)))


def emulated_error(workload: Workload, config) -> float:
    inputs = workload.random_inputs()
    return workload.max_error(emulate(lower(workload, SM_90, config), *inputs), workload.reference(*inputs))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads, data=st.data())
def test_random_configs_compile_for_sm80_and_sm90_and_emulate_to_numpy(workload, data):
    space = get_space(workload, SM_90)
    config = space.get(data.draw(st.integers(0, space.size - 1), label="config"))
    source = generate(lower(workload, SM_90, config))
    for arch in ARCHES:
        cubin = compile_cuda(source.code, arch)
        assert set(cubin.usage) == {name for name, _ in source.kernels}
    assert emulated_error(workload, config) <= 1


@pytest.mark.parametrize("workload", [matmul(64, 64, 64), matmul(33, 20, 97), batch_matmul(2, 17, 12, 40),
                                      dense(19, 24, 64, bias=True, epilogue="gelu")])
def test_every_barrier_is_emitted_as_syncthreads_and_no_other_sync(workload):
    """NVRTC compiles a warp-level sync as readily as a block-wide one and the emulator never sees the source, so
    without a GPU only reading the source shows it: one `__syncthreads();` per barrier of the lowered program."""
    space = get_space(workload, SM_90)
    fallback = fallback_config(workload, SM_90).to_dict()
    configs = space.sample(6, 0) + [space.config(fallback | {"double_buffer": db}) for db in (True, False)]
    for config in configs:
        program = lower(workload, SM_90, config)
        barriers = sum(isinstance(stmt, Barrier) for stage in program.stages for stmt, _, _ in walk(stage.body))
        syncs = [line.strip() for line in generate(program).code.splitlines() if "sync" in line.lower()]
        assert barriers and syncs == ["__syncthreads();"] * barriers, config


@pytest.mark.parametrize("workload, knobs", [
    (matmul(70, 90, 130), {"split_k": 2, "double_buffer": True, "vec": 2}),
    (matmul(33, 20, 97), {"split_k": 4, "double_buffer": False}),
    (dense(19, 24, 64, bias=True, epilogue="gelu_erf"), {"split_k": 2, "vec": 4, "pad": 1}),
    (batch_matmul(2, 17, 12, 40), {"split_k": 2, "double_buffer": True}),
    (dense(64, 64, 64, bias=True, epilogue="relu"), {"vec": 4, "pad": 0}),
])
def test_split_k_and_double_buffering_compute_the_reference(workload, knobs):
    space = get_space(workload, SM_90)
    config = space.config(fallback_config(workload, SM_90).to_dict() | knobs)
    program = lower(workload, SM_90, config)
    assert len(program.stages) == (2 if config["split_k"] > 1 else 1)
    assert emulated_error(workload, config) <= 1


def rewritten(stmts, change) -> list:
    """The statements with each one that change(stmt) answers (a list, not None) replaced by that list: a
    kernel with a bug put in."""
    out = []
    for stmt in stmts:
        replacement = change(stmt)
        if replacement is not None:
            out += rewritten(replacement, change)
            continue
        if isinstance(stmt, Loop):
            stmt = dataclasses.replace(stmt, body=tuple(rewritten(stmt.body, change)))
        elif isinstance(stmt, If):
            stmt = dataclasses.replace(stmt, then=tuple(rewritten(stmt.then, change)),
                                       orelse=tuple(rewritten(stmt.orelse, change)))
        out.append(stmt)
    return out


def broken(workload: Workload, knobs: dict, change):
    program = lower(workload, SM_90, get_space(workload, SM_90).config(fallback_config(workload, SM_90).to_dict() | knobs))
    stages = tuple(Stage(s.name, tuple(rewritten(s.body, change)), s.constant) for s in program.stages)
    return dataclasses.replace(program, stages=stages), workload.random_inputs()


def test_the_emulator_catches_a_missing_barrier_as_a_race():
    program, inputs = broken(matmul(32, 32, 64), {"double_buffer": True},
                             lambda s: [] if isinstance(s, Barrier) else None)
    with pytest.raises(EmulationError, match="shared-memory race on"):
        emulate(program, *inputs)


def test_the_emulator_catches_a_missing_trailing_barrier_as_a_write_after_read_race():
    """Single-buffered, the barrier after the compute keeps the next k tile's loads from overwriting shared memory
    that other threads still read; lockstep emulation gets the right answer without it, so only the write-after-read
    check can tell (dropping every barrier, as above, is caught by read-after-write alone)."""
    def drop_trailing_barrier(stmt):
        if isinstance(stmt, Loop) and stmt.var == "kt" and isinstance(stmt.body[-1], Barrier):
            return [dataclasses.replace(stmt, body=stmt.body[:-1])]
        return None

    program, inputs = broken(matmul(32, 32, 64), {"double_buffer": False}, drop_trailing_barrier)
    with pytest.raises(EmulationError, match=r"race on As: .* writes an element another thread read .*"
                                             r"\(write-after-read\)"):
        emulate(program, *inputs)


def test_the_emulator_catches_a_missing_edge_guard_as_out_of_bounds():
    program, inputs = broken(matmul(30, 32, 32), {}, lambda s: list(s.then) if isinstance(s, If) else None)
    with pytest.raises(EmulationError, match=r"index 0 is \d+ \(extent 30\)"):
        emulate(program, *inputs)


def test_the_emulator_refuses_a_barrier_in_divergent_code():
    x, y = Buffer("x", (64,), "input"), Buffer("y", (64,), "output")
    body = Loop("t", 64, "threadIdx.x", (If(var("t"), "<", 32, (Barrier(),)), y.store(var("t"), x[var("t")])))
    with pytest.raises(EmulationError, match="a barrier reached by 32 of 64 threads"):
        emulate(Program("divergent", (x, y), (Stage("copy", (body,)),)), np.ones(64, np.float32))


def test_every_config_fits_the_device_and_one_beyond_is_invalid():
    workload = matmul(512, 512, 512)
    space, device = get_space(workload, SM_90), limits("sm_90")
    for config in space.sample(200, 0):
        threads, shared, registers = _resources(config["tile_m"], config["tile_n"], config["tile_k"],
                                                config["double_buffer"], config["pad"])
        assert not device.problems(threads, shared, registers)
        assert launch(lower(workload, SM_90, config).stages[0]).block == threads
    too_many_threads = fallback_config(workload, SM_90).to_dict() | {"tile_m": [-1, 32, 4], "tile_n": [-1, 32, 4]}
    with pytest.raises(InvalidConfig, match="violate a constraint"):
        space.config(too_many_threads)


def test_registers_as_compiled_are_checked_against_the_block_size():
    workload = dense(64, 64, 64, bias=True, epilogue="gelu")
    space = get_space(workload, SM_90)  # 8 x 8 threads with 8 x 8 accumulators each: ~100 registers a thread
    kernel = build(workload, SM_90, space.config(fallback_config(workload, SM_90).to_dict() | {
        "tile_m": [-1, 8, 8], "tile_n": [-1, 8, 8]}))
    name, shape = kernel.source.kernels[0]
    check_limits(kernel.cubin, {name: shape.block})  # as built: it fits
    assert kernel.cubin.usage[name].registers * 1024 > 65536
    with pytest.raises(InvalidConfig, match="registers"):
        check_limits(kernel.cubin, {name: 1024})


def test_nvrtc_errors_carry_the_compiler_log():
    with pytest.raises(CudaCompileError, match='identifier "oops" is undefined'):
        compile_cuda('extern "C" __global__ void k(float* x) { x[0] = oops; }', "sm_90")


def test_an_architecture_needs_no_device_and_the_host_gpu_is_named_or_refused():
    assert str(Target.parse("cuda -arch=sm_90")) == "cuda -arch=sm_90"
    with pytest.raises(TargetError, match="unknown CUDA architecture 'sm_1'"):
        Target.parse("cuda -arch=sm_1")
    if NO_GPU:
        with pytest.raises(TargetError, match="no CUDA GPU on this host|needs CuPy") as error:
            Target.parse("cuda")
        assert "\n" not in str(error.value) and "cuda -arch=sm_90" in str(error.value)
    else:
        assert Target.parse("cuda").arch == host_gpu().arch


@needs_gpu
@pytest.mark.parametrize("workload", [matmul(100, 130, 70), dense(128, 768, 768, bias=True, epilogue="gelu"),
                                      batch_matmul(12, 128, 128, 64)])
def test_kernels_on_the_gpu_match_numpy(workload):
    import cupy

    target = Target.parse("cuda")
    inputs = workload.random_inputs()
    expected = workload.reference(*inputs)
    for config in [fallback_config(workload, target)] + get_space(workload, target).sample(4, 0):
        kernel = build(workload, target, config)
        assert workload.max_error(kernel(*inputs), expected) <= 1  # NumPy in, NumPy out
        on_device = kernel(*[cupy.asarray(a) for a in inputs])
        assert isinstance(on_device, cupy.ndarray) and workload.max_error(on_device.get(), expected) <= 1


@needs_gpu
def test_a_cuda_kernels_inference_calls_compute_the_reference():
    """`bench predict` times a GPU target's configs through `inference_calls` too: a GPU kernel has no addresses to
    be called by, so its calls are its own (NumPy in, NumPy out), each on a copy of the weights."""
    from workers.reference import inference_calls

    workload, target = dense(64, 256, 128, bias=True), Target.parse("cuda")
    inputs = workload.random_inputs()
    calls, out = inference_calls(build(workload, target, fallback_config(workload, target)), inputs, 3 * 256 * 129 * 4)
    assert len(calls) == 3
    for call in calls:
        out[...] = 0
        call()
        assert workload.max_error(out, workload.reference(*inputs)) <= 1


@needs_gpu
def test_a_cuda_candidate_is_measured_on_the_gpu():
    from workers import MeasureInput, MeasureOptions, measure

    workload = matmul(256, 256, 256)
    target = Target.parse("cuda")
    space = get_space(workload, target)
    results = measure([MeasureInput(workload, target, c) for c in [fallback_config(workload, target), space.get(0)]],
                      MeasureOptions(repeat=3, min_repeat_ms=5))
    assert results[0].ok and len(results[0].samples) == 3 and results[0].gflops > 100, results[0].error
    assert results[1].outcome.value in ("ok", "invalid_config"), results[1].error


def test_the_cuda_template_refuses_views_by_name():
    """Only the CPU template reads batch_matmul operands through strides; the CUDA one says so, not computes
    something else from a contiguous copy."""
    with pytest.raises(NoTemplate, match=r"the batch_matmul template for cuda reads contiguous operands only, not "
                                         r"views \(batch_matmul\(B=2,M=8,N=8,K=16,b_strides=16:1:32"):
        get_space(batch_matmul(2, 8, 8, 16, b_strides="16:1:32"), SM_90)
