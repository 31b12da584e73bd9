"""The instruction families of the low-precision GEMMs, one test each over both: bfloat16's (`fma`: halves widened
and FMAs, any CPU; `fma-f32`: the same on float32 copies of both operands, any CPU; `avx512bf16`: AVX-512 BF16's
pair dot) and int8's (`widen`: bytes widened and integer
multiply-adds, by pmaddwd on x86; `avx512vnni`: AVX-512 VNNI's byte-quad dot; `pmaddubsw`, for activations of a reduced
range: tests/test_reduced_range.py). Each is offered only where the target has it,
emits its instructions on every host (assembly for a Zen 4, whatever this host is), and runs and computes its
dtype's reference, and has its peak measured, where the host has it."""
import pytest

from search_space import Target, batch_matmul, conv2d, dense, fallback_config, get_space, host_target, lower, matmul
from search_space.templates.gemm import isas
from workers.build import generated_assembly
from workers.llvm_codegen import generate
from workers.llvm_jit import emit_assembly
from workers.peak import (BYTE_DOT_OPS, FAMILIES, ITERATIONS, byte_dot_peak_call, byte_dot_peak_module, chains,
                          family_peaks, has_byte_dot_peak, peak_call, peak_program)
from tests.isa_helpers import HOST, assert_every_width_emits, assert_refused_without, check, configs_using, zen4

ONE = Target.parse("llvm -threads=1")
AVX2 = Target.parse("llvm -mcpu=znver3 -mattr=+avx,+avx2,+fma -threads=1")
# special family → its dtype, its instruction, its IR op; the dtype's family for any CPU, and an instruction of it
SPECIAL = {"avx512bf16": ("bfloat16", "vdpbf16ps", "dot2_bf16", "fma", "vfmadd"),
           "avx512vnni": ("int8", "vpdpbusd", "dot4_vnni", "widen", "vpmaddwd")}
ANY_CPU = {"bfloat16": ("fma", "fma-f32"), "int8": ("widen",)}  # the families on every CPU
ODD_SHAPES = lambda dtype: [dense(33, 100, 77, bias=True, epilogue="gelu", dtype=dtype),
                            batch_matmul(3, 17, 42, 31, dtype=dtype), matmul(64, 64, 3072, dtype=dtype),
                            conv2d(1, 19, 9, 11, 21, 3, 3, 2, 1, bias=True, residual=True, epilogue="relu", dtype=dtype)]


def on_host(family: str):
    return pytest.mark.skipif(family not in host_target().features,
                              reason=f"the host has no {family}: its family is checked as assembly only")


@pytest.mark.parametrize("family", list(SPECIAL))
def test_the_special_family_is_offered_only_where_the_target_has_it(family):
    dtype, _, _, generic, _ = SPECIAL[family]
    target, workload = zen4(family), dense(64, 768, 768, dtype=dtype)
    assert isas(target, dtype) == ANY_CPU[dtype] + (family,) and fallback_config(workload, target)["isa"] == family
    narrowed = Target.parse(str(target).replace(f",+{family}", ""))
    assert get_space(workload, narrowed).knobs["isa"].candidates == ANY_CPU[dtype]
    assert family not in Target.parse(f"llvm -mattr=-{family}").features  # the host, narrowed
    assert family not in get_space(workload, Target.parse(f"llvm -mattr=-{family}")).knobs["isa"].candidates
    assert "isa" not in get_space(dense(64, 768, 768), target).knobs  # float32 spaces are as they were


def assert_generic_family_emits(workload, target: Target, config, family: str) -> None:
    """The config in the generic family, on the target without the special one, emits the generic instruction and
    not the special one (with the feature, LLVM may fuse int8's pmaddwd and adds into VNNI's dot itself)."""
    _, instruction, _, generic, generic_instruction = SPECIAL[family]
    narrowed = Target.parse(str(target).replace(f",+{family}", ""))
    widened = get_space(workload, narrowed).config(config.to_dict() | {"isa": generic})
    assembly = generated_assembly(lower(workload, narrowed, widened), narrowed)
    assert instruction not in assembly and generic_instruction in assembly


@pytest.mark.parametrize("family", list(SPECIAL))
def test_each_family_emits_its_instructions_on_any_host(family):
    """The fallback of a target with the feature uses the special instruction on 512-bit vectors; the generic family
    never does; configs of every vector width emit it."""
    dtype, instruction, dot, generic, generic_instruction = SPECIAL[family]
    target, workload = zen4(family), dense(64, 768, 768, dtype=dtype)
    special = fallback_config(workload, target)
    assembly = generated_assembly(lower(workload, target, special), target)
    assert sum(instruction in line and "zmm" in line for line in assembly.splitlines()) >= 32
    assert_generic_family_emits(workload, target, special, family)
    assert_every_width_emits(batch_matmul(3, 17, 42, 31, dtype=dtype), target, family, instruction)
    assert_refused_without(workload, target, dot, family)


@pytest.mark.parametrize("vec", [4, 8])
def test_widened_bytes_are_multiplied_in_16_bit_pairs_on_avx2(vec):
    """On an AVX2 CPU (a Zen 3) int8's `widen` multiplies by pmaddwd, no 32-bit multiply (vpmulld) in its dot; a
    target without x86's vectors splits each quad into bytes (exactness: test_int8's sums beyond float32)."""
    target, workload = AVX2, matmul(64, 64, 256, dtype="int8")
    [config] = configs_using(workload, target, "widen", 1, vec=vec, pack_b=True)
    assembly = generated_assembly(lower(workload, target, config), target)
    compute = assembly[assembly.index("micro_kernel"):]
    assert "vpmaddwd" in compute and "vpmulld" not in compute
    assert "pmadd" not in str(generate(lower(workload, target, config), 1, ("fma",)))


@pytest.mark.parametrize("family", list(SPECIAL))
def test_a_convolution_reads_its_channels_in_the_familys_groups(family):
    """conv2d in bfloat16 / int8: the fallback of a target with the feature runs its dot on 512-bit vectors, every
    vector width emits it, the generic family never does, and a target without the feature is refused it."""
    dtype, instruction, dot, generic, generic_instruction = SPECIAL[family]
    target, workload = zen4(family), conv2d(1, 64, 14, 14, 64, 3, 3, 1, 1, bias=True, dtype=dtype)
    special = fallback_config(workload, target)
    assert get_space(workload, target).knobs["isa"].candidates == ANY_CPU[dtype] + (family,) == isas(target, dtype)
    assembly = generated_assembly(lower(workload, target, special), target)
    assert special["isa"] == family and sum(instruction in line and "zmm" in line for line in assembly.splitlines()) >= 32
    assert_generic_family_emits(workload, target, special, family)
    assert_every_width_emits(ODD_SHAPES(dtype)[-1], target, family, instruction)
    assert_refused_without(workload, target, dot, family)


@pytest.mark.parametrize("family", [pytest.param(f, marks=on_host(f)) for f in SPECIAL])
def test_the_special_family_computes_the_reference(family):
    for workload in ODD_SHAPES(SPECIAL[family][0]):
        for config in configs_using(workload, ONE, family):
            check(workload, ONE, config)


@pytest.mark.parametrize("family", list(SPECIAL))
def test_the_peak_of_each_family_is_measured_with_its_instruction(family):
    """Emitted on any host; run where the host has it, where its operations per call are the FMA peak's times
    its operations per lane over the FMA's (two)."""
    assert SPECIAL[family][1] in generated_assembly(peak_program(1, 16, family, 24), zen4(family))
    call, fma_flops = peak_call(ONE)
    call()
    if family in host_target().features:
        call, ops = peak_call(ONE, family)
        call()
        assert ops == fma_flops * FAMILIES[family][-1] // 2


def test_the_peak_kernels_carry_as_many_chains_as_the_registers_hold_and_spill_none():
    """24 accumulators on AVX-512's 32 registers (on 12, a Zen 5's bf16 pair dot ran 8% under its rate), 12 on
    AVX2's 16; none of them, nor an operand, goes to the stack."""
    assert (chains(zen4()), chains(AVX2)) == (24, 12)
    kernels = [(zen4(family) if family in SPECIAL else zen4(), family) for family in FAMILIES] + [(AVX2, "fma")]
    for target, family in kernels:
        assembly = generated_assembly(peak_program(1, target.vector_bits // 32, family, chains(target)), target)
        assert "(%rsp)" not in assembly, (target, family)
    for target in (zen4(), AVX2):
        for family in ("widen", "pmaddubsw"):
            assert "(%rsp)" not in emit_assembly(byte_dot_peak_module(target, family), target), (target, family)


@pytest.mark.parametrize("family, products, words", [("widen", 0, 2), ("pmaddubsw", 1, 1)])
def test_the_byte_dots_peaks_are_measured_with_their_instructions(family, products, words):
    """int8's `widen` peak kernel multiplies by two pmaddwd a chain and iteration, `pmaddubsw`'s by one pmaddubsw and
    one pmaddwd, on AVX2 and AVX-512 CPUs (none hoisted out of the loop); where the host runs the family by them,
    bench kernels' int8 peaks include it."""
    for target in (AVX2, zen4()):
        assert has_byte_dot_peak(target, family)
        assembly = emit_assembly(byte_dot_peak_module(target, family), target)
        assert (assembly.count("vpmaddubsw"), assembly.count("vpmaddwd")) == (products * chains(target),
                                                                              words * chains(target))
    assert not has_byte_dot_peak(Target.parse("llvm -mcpu=znver3 -mattr=-avx,-avx2,-fma -threads=1"), family)
    if has_byte_dot_peak(ONE, family):
        call, ops = byte_dot_peak_call(ONE, family)
        call()
        assert ops == BYTE_DOT_OPS * ONE.vector_bits // 32 * chains(ONE) * ITERATIONS
        assert family_peaks(ONE, "int8")[family] > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_a_matmuls_operand_is_packed_in_groups_by_vector_shuffles(dtype):
    """B's g rows loaded as vectors and interleaved into the groups at once: no element is moved on its own (a
    batch_matmul packs at every call)."""
    workload = batch_matmul(12, 128, 128, 64, dtype=dtype)
    _, pack = micro_kernel_and_packing(workload, zen4(), fallback_config(workload, zen4()))
    assert any("zmm" in line for line in pack) and not {"movw", "movb", "movzwl", "movzbl"} & mnemonics(pack)


def micro_kernel_and_packing(workload, target: Target, config) -> tuple[str, list[str]]:
    """The assembly of the config's micro-kernel, and the instruction lines of its packing of B."""
    assembly = generated_assembly(lower(workload, target, config), target)
    start = assembly.index(f"pack_{dict(dense='W', conv2d='weight').get(workload.op, 'B')}:")
    pack = assembly[start:assembly.index(".Lfunc_end", start)]
    return (assembly[assembly.index("micro_kernel"):],
            [line for line in pack.splitlines() if line.startswith("\t") and not line.startswith("\t.")])


def mnemonics(lines: list[str]) -> set[str]:
    return {line.split()[0] for line in lines}


@pytest.mark.parametrize("target", [AVX2, zen4(), zen4("avx512bf16")], ids=["avx2", "avx512", "avx512bf16"])
def test_the_widened_family_multiplies_float32_copies_of_its_operands(target):
    """`fma-f32`, on every CPU: B widened as it is packed, by whole vectors (dense's weights and a batch_matmul's kᵀ
    read in place, transposed: no element moved on its own), A into a float32 copy, a convolution's data and
    weights packed in float32; the micro-kernel widens nothing (no shift left: `fma`'s widens by them)."""
    convolution = conv2d(1, 64, 14, 14, 64, 3, 3, 1, 1, dtype="bfloat16")
    for workload in (dense(128, 768, 768, dtype="bfloat16"),
                     batch_matmul(12, 128, 128, 64, "bfloat16", b_strides="8192:1:64"), convolution):
        for config in configs_using(workload, target, "fma-f32", 1, vec=target.vector_bits // 32):
            kernel, pack = micro_kernel_and_packing(workload, target, config)
            assert "vfmadd" in kernel and "vpslld" not in kernel, config
            assert workload is convolution or "vpslld" in mnemonics(pack) and not {"movw", "movzwl"} & mnemonics(pack)
            paired = get_space(workload, target).config(config.to_dict() | {"isa": "fma"})
            assert "vpslld" in micro_kernel_and_packing(workload, target, paired)[0]


def test_the_widened_family_computes_the_reference():
    """On this host, one thread and two, odd shapes: dense with bias and GELU, batch_matmul, matmul with a long k,
    a strided convolution with a residual."""
    for workload in ODD_SHAPES("bfloat16"):
        for target in (ONE, HOST):
            for config in configs_using(workload, target, "fma-f32", 2):
                check(workload, target, config)
