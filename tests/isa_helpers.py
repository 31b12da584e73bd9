"""Checks shared by the tests of each low-precision instruction family (bfloat16's pair dot, int8's VNNI)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from search_space import Target, Workload, batch_matmul, conv2d, dense, fallback_config, get_space, lower, matmul
from workers import build
from workers.build import generated_assembly
from workers.llvm_codegen import CodegenError, generate


HOST = Target.parse("llvm -threads=2")
PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
SIZES = st.one_of(st.sampled_from([1, 2, 3, 4, 5, 7, 13, 16, 17, 31, 32, 64, 97]), st.integers(1, 200))


def zen4(*features: str) -> Target:
    """A Zen 4 with AVX-512 and `features`: compiled to assembly on any host, never run here."""
    extra = "".join(f",+{feature}" for feature in features)
    return Target.parse(f"llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl{extra} -threads=1")


@st.composite
def workloads(draw, dtype: str, ops: tuple[str, ...]):
    """Awkward shapes of `ops` in `dtype`, dense and conv2d with their epilogues."""
    op = draw(st.sampled_from(ops))
    m, n, k = draw(SIZES), draw(SIZES), draw(SIZES)
    if op == "matmul":
        return matmul(m, n, k, dtype=dtype)
    if op == "dense":
        return dense(m, n, k, bias=draw(st.booleans()), epilogue=draw(st.sampled_from(["none", "relu", "gelu"])),
                     dtype=dtype)
    if op == "conv2d":
        return conv2d(1, draw(st.sampled_from([1, 3, 8, 17])), 9, 7, draw(st.sampled_from([1, 8, 17])), 3, 3,
                      draw(st.integers(1, 2)), 1, bias=True, residual=draw(st.booleans()), epilogue="relu", dtype=dtype)
    return batch_matmul(draw(st.integers(1, 3)), min(m, 64), min(n, 64), min(k, 64), dtype=dtype)


def check(workload: Workload, target: Target, config, seed: int = 3) -> np.ndarray:
    """Build, run on random inputs, and compare with the workload's reference: the output, checked."""
    inputs = workload.random_inputs(seed=seed)
    out = build(workload, target, config)(*inputs)
    assert out.dtype == np.dtype(workload.output_dtype) and out.shape == workload.output_shape
    error = workload.max_error(out, workload.reference(*inputs))
    assert error <= 1, (workload.key, config, error)
    return out


def configs_using(workload: Workload, target: Target, isa: str, count: int = 6, **knobs) -> list:
    """Random configs of the space whose `isa` knob is `isa` and other `knobs` as given (drawn from that sub-space,
    indexed in the whole)."""
    space = get_space(workload, target)
    drawn = space.restrict({"isa": (isa,)} | {name: (value,) for name, value in knobs.items()}).sample(count, rng=0)
    assert len(drawn) == count
    return [space.config(config.to_dict()) for config in drawn]


def assert_every_width_emits(workload: Workload, target: Target, isa: str, instruction: str) -> None:
    """Configs of `isa` on an odd shape vectorize at 16, 8 and 4 lanes (AVX-512 VL's 128 and 256 bits too), and
    each emits the family's instruction."""
    configs = [config for vec in (4, 8, 16) for config in configs_using(workload, target, isa, 2, vec=vec)]
    assert all(instruction in generated_assembly(lower(workload, target, config), target) for config in configs)


def assert_refused_without(workload: Workload, target: Target, dot: str, feature: str) -> None:
    """The fallback's program, generated for a target without `feature`, is refused with a message naming it."""
    program = lower(workload, target, fallback_config(workload, target))
    with pytest.raises(CodegenError, match=f"{dot} on 16 lanes needs {feature}"):
        generate(program, 1, ("avx", "avx2", "fma", "avx512f"))
