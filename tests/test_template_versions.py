"""Each template's VERSION guards the code its configs generate: records measured under another version are never
applied, so a change to the generated code that keeps the number would let old timings rank configs that now mean
other code. The code of fixed configs of fixed workloads, on fixed targets (never the host: CI runs on AMD and
Intel CPUs), is hashed and compared with the hash recorded for the template's version. Only the stages a record's
time holds count: a candidate is measured with its weights bound, so a constant stage (dense's and conv2d's weight
packing) runs once before the timing and may change without making any record stale."""
from __future__ import annotations

import dataclasses
import hashlib

import pytest

from search_space import InvalidConfig, Target, batch_matmul, conv2d, dense, get_space, lower, matmul, template_version
from search_space.templates import TEMPLATES, template
from workers import llvm_codegen
from workers.cuda_codegen import generate as cuda_source

CPU = Target.parse("llvm -mcpu=skylake-avx512 -mattr=+avx,+avx2,+avx512f,+fma -threads=4")
GPU = Target.parse("cuda -arch=sm_90")
GEMMS = (matmul(64, 48, 40), dense(96, 64, 32, bias=True, epilogue="gelu"), batch_matmul(2, 32, 48, 16))
WORKLOADS = {
    "gemm": (CPU, GEMMS),
    "conv2d": (CPU, (conv2d(1, 16, 14, 14, 32, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu"),
                     conv2d(2, 8, 16, 16, 16, 1, 1, 2, 0))),
    "gemm_cuda": (GPU, GEMMS),
}
# (template, VERSION) → the hash of its configs' generated code. Kept for every version, newest last; those of the
# versions before the newest of each template were taken with the fallback among the configs hashed.
HASHES = {
    ("gemm", 1): "5cfb38b3032cdde8553b38280ba0f31bb025096ce733bd444e50288a3c66f723",
    ("gemm", 2): "f91c5ba7245c361e8e1258a1c532f1209aaa889a89ff0f5be9be23bcca2c547b",
    ("conv2d", 1): "f583a62e94b75efd009e2c9db39fb0d26ea9f18981f4fd29e317123945473c82",
    ("conv2d", 2): "da50d62c2af4d89812c73c952a62cf22788cd7719362e4d8c663fc4f80285d05",
    ("conv2d", 3): "18c55060dbc1daf61724aea5d601146e2b8c4835dcc46f0c6fe3feb5afe3252d",
    ("conv2d", 4): "06d1ed3f5c4a3c33a22b51c0c7195e68783e43c528d84e8b4029bfc844c7cf81",
    ("gemm_cuda", 1): "973a7a6bce8e568bf995c5399c1fede2bfa1f97e9fe3d3a779ac6524559b3f37",
}


def code(workload, target: Target, index: int) -> str:
    """The code config `index` generates for the stages a measurement times (not the constant ones), LLVM IR before
    optimisation or CUDA C with its launches; what lowering says when it refuses the config."""
    space = get_space(workload, target)
    config = space.get(index)
    try:
        program = lower(workload, target, config)
    except InvalidConfig as error:
        return f"{workload.key} config {config.index}: invalid: {error}"
    program = dataclasses.replace(program, stages=tuple(stage for stage in program.stages if not stage.constant))
    if target.kind == "cuda":
        source = cuda_source(program)
        return source.code + repr(source.kernels)
    return str(llvm_codegen.generate(program, target.threads))


def code_hash(name: str) -> str:
    """The hash of the code of six fixed points of each workload's space (not the fallback: which config it is may
    change without changing what any config means)."""
    target, workloads = WORKLOADS[name]
    digest = hashlib.sha256()
    for workload in workloads:
        size = get_space(workload, target).size
        for index in (0, 1, size // 5, size // 3, size // 2, size - 1):
            digest.update(code(workload, target, index).encode())
    return digest.hexdigest()


def test_every_template_is_covered():
    assert {module.__name__.rsplit(".", 1)[1] for module in TEMPLATES.values()} == set(WORKLOADS)
    for name, (target, workloads) in WORKLOADS.items():
        for workload in workloads:
            assert template(workload, target).__name__.endswith(f".{name}")
            assert template_version(workload, target) == template(workload, target).VERSION >= 1


def test_a_dtype_whose_configs_changed_alone_is_versioned_apart():
    """bfloat16 convolutions gained the `isa` knob and grouped layouts, int8 GEMMs another multiply, bfloat16 GEMMs
    and convolutions the `fma-f32` family (new indices): their records are of another version, while float32's code
    (hashed above) and so its records are as they were (GEMMs' until dense's `prefetch` knob, version 2: int8's and
    bfloat16's went one ahead; convolutions' until the data was packed by rows, version 2: bfloat16's went two
    ahead, and until the taps that read padding were skipped, version 3, which int8's code, summing its padding's
    zero point, is not: it stayed at 2; the `prefetch` knob gave every dtype's configs new indices, one more each)."""
    workload = conv2d(1, 16, 14, 14, 32, 3, 3, 1, 1)
    assert [template_version(workload.in_dtype(dtype), CPU) for dtype in ("float32", "bfloat16", "int8")] == [4, 6, 3]
    assert "isa" in get_space(workload.in_dtype("bfloat16"), CPU).knobs
    gemm = GEMMS[1]  # int8's `widen` multiplies by pmaddwd
    assert [template_version(gemm.in_dtype(dtype), CPU) for dtype in ("float32", "int8", "bfloat16")] == [2, 3, 3]


def test_a_target_whose_configs_changed_alone_is_versioned_apart():
    """GEMM spaces offering AMX gained the `prefetch` knob, then its shared choice, so their configs' indices mean
    other knobs, and then their write-back looped over rows: records of AMX targets are three versions on, those of
    the same CPU narrowed off AMX (and of float32) as they were."""
    vector = "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512bf16,+avx512vnni"
    amx = Target.parse(f"llvm -mcpu=sapphirerapids -mattr={vector},+amx-tile,+amx-bf16,+amx-int8 -threads=4")
    narrowed = Target.parse(f"llvm -mcpu=sapphirerapids -mattr={vector} -threads=4")
    gemm = GEMMS[1]
    assert [template_version(gemm.in_dtype(dtype), amx) for dtype in ("float32", "bfloat16", "int8")] == [2, 6, 6]
    assert [template_version(gemm.in_dtype(dtype), narrowed) for dtype in ("float32", "bfloat16", "int8")] == [2, 3, 3]
    product = matmul(64, 48, 40, dtype="bfloat16")  # dense has the knob everywhere
    assert "shared" in get_space(product, amx).knobs["prefetch"].candidates
    assert "prefetch" not in get_space(product, narrowed).knobs
    assert "shared" not in get_space(gemm.in_dtype("bfloat16"), narrowed).knobs["prefetch"].candidates


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_generated_code_matches_the_hash_of_the_templates_version(name):
    target, (workload, *_) = WORKLOADS[name]
    version = template_version(workload, target)
    found = code_hash(name)
    recorded = HASHES.get((name, version))
    assert recorded == found, (
        f"the generated code of template {name} changed: bump its VERSION in search_space/templates/{name}.py and "
        f"record the new hash here: ({name!r}, {version + 1 if recorded else version}): {found!r}")
