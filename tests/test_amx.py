"""AMX's tile products as the GEMM template's `amx-bf16` and `amx-int8` families: offered only where the target has
AMX (narrowing the host with `-mattr=-amx-tile` takes them away on any host), every config's tiles fit the eight
tile registers, configs of odd shapes compile to tile products on any host (assembly for a Sapphire Rapids), and, where
the host has AMX, they compute their dtype's reference and the tile peak is measured above the AVX-512 dot's."""
import re
import warnings

import numpy as np
import pytest

from search_space import (InvalidConfig, Target, batch_matmul, conv2d, dense, fallback_config, get_space, host_target,
                          lower, matmul)
from search_space.program import ITEMSIZE, Buffer, Const, Loop, Op, format_program, var
from search_space.templates.gemm import AMX_ROWS, FAMILIES as GEMM_FAMILIES, GENERIC, TILE, isas
from search_space.workload import aligned
from workers import UnalignedInputWarning, build
from workers.build import generated_assembly
from workers.kernel import tile_reads
from workers.llvm_codegen import CodegenError, _zeroing_before_tiles, generate
from workers.llvm_amx import CHUNK, GROUP, REGISTERS as TILE_REGISTERS, STEP, register_groups
from workers.llvm_jit import emit_assembly
from workers.peak import peak_gflops, tile_peak_module
from tests.isa_helpers import check, configs_using

VECTOR = "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx512bf16,+avx512vnni"


def sapphire(*amx: str, threads: int = 1) -> Target:
    """A Sapphire Rapids with AVX-512 and the AMX features `amx`: compiled to assembly on any host, never run here."""
    return Target.parse(f"llvm -mcpu=sapphirerapids -mattr={VECTOR}{''.join(',+' + f for f in amx)} -threads={threads}")


SAPPHIRE = sapphire("amx-tile", "amx-bf16", "amx-int8")
ONE = Target.parse("llvm -threads=1")
# AMX family → its dtype, its instruction, the AVX-512 family below it
FAMILIES = {"amx-bf16": ("bfloat16", "tdpbf16ps", "avx512bf16"), "amx-int8": ("int8", "tdpbusd", "avx512vnni")}
# tails of rows, columns and k; the last shape's rows end in a block of 6: a turn and a half of the write-back's loop
ODD_SHAPES = lambda dtype: [dense(33, 100, 77, bias=True, epilogue="gelu", dtype=dtype), matmul(64, 64, 3072, dtype=dtype),
                            batch_matmul(3, 17, 42, 31, dtype=dtype), dense(1, 40, 70, dtype=dtype),
                            dense(102, 200, 97, bias=True, dtype=dtype)]
on_amx_host = pytest.mark.skipif("amx-tile" not in host_target().features,
                                 reason="the host has no AMX: its families are checked as assembly only")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_amx_family_is_offered_only_where_the_target_has_amx(family):
    dtype, _, below = FAMILIES[family]
    workload = dense(128, 768, 768, dtype=dtype)
    generic = tuple(isa for isa in GEMM_FAMILIES[dtype] if isa in GENERIC)  # every CPU's
    assert isas(SAPPHIRE, dtype) == generic + (below, family)
    assert fallback_config(workload, SAPPHIRE)["isa"] == family
    for narrowed in (sapphire(family), sapphire("amx-tile"), Target.parse("llvm -mattr=-amx-tile")):  # the last: the host's
        assert family not in get_space(workload, narrowed).knobs["isa"].candidates
    float32 = get_space(dense(128, 768, 768), SAPPHIRE)
    assert "isa" not in float32.knobs and max(r for _, _, r in float32.knobs["tile_m"].candidates) == 16
    # conv2d has no tile family: the vector ones only
    assert get_space(conv2d(1, 64, 14, 14, 64, 3, 3, 1, 1, dtype=dtype), SAPPHIRE).knobs["isa"].candidates == \
        generic + (below,)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_amx_block_runs_in_register_groups_under_one_tile_configuration(family):
    """Blocks of up to 4 × 4 whole tiles on a packed B; each group of C's tiles the code generator runs at a time fits
    the eight tile registers beside its smaller side's tiles and one of the other's, the groups cover the block once,
    and a block larger than the registers is one pass: one tile configuration written, not one per group."""
    tiled = list(get_space(dense(200, 300, 768, dtype=FAMILIES[family][0]), SAPPHIRE).restrict({"isa": (family,)}))
    for config in tiled:
        rows, columns = (-(-config[knob][2] // TILE) for knob in ("tile_m", "tile_n"))
        groups = register_groups(rows, columns)
        assert all(len(r) * len(c) + min(len(r), len(c)) + 1 <= TILE_REGISTERS for r, c in groups) and config["pack_b"]
        assert sorted((i, j) for r, c in groups for i in r for j in c) == [(i, j) for i in range(rows) for j in range(columns)]
    assert {(config["tile_m"][2], config["tile_n"][2]) for config in tiled} >= {(16, 64), (32, 32), (64, 64)}
    workload = dense(64, 64, 64, dtype=FAMILIES[family][0])
    block = get_space(workload, SAPPHIRE).config(fallback_config(workload, SAPPHIRE).to_dict() | {
        "tile_m": [-1, 1, 64], "tile_n": [-1, 1, 64], "tile_k": [-1, 64]})
    assembly = generated_assembly(lower(workload, SAPPHIRE, block), SAPPHIRE)
    assert assembly.count("ldtilecfg") == 1 and assembly.count(FAMILIES[family][1]) == 16


def functions(assembly: str) -> dict[str, str]:
    """The assembly of each function, by name."""
    parts = re.split(r"^([A-Za-z_][\w.]*):$", assembly, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_stage_configures_the_tiles_once_and_a_tail_pass_its_own(family):
    """The function that runs a stage's tile nests (each thread's share where the stage is parallel) writes the tile
    configuration once and releases the tiles at its end; a pass of whole tiles writes none, nor does the block that
    calls it, however many blocks there are; a pass of a tail's shape (100 rows: 4 past the last whole tile) writes
    its own and then the stage's again."""
    dtype = FAMILIES[family][0]
    for threads, parallel, stage in ((1, "none", "compute"), (2, "m", "compute.chunk0")):
        target = sapphire("amx-tile", "amx-bf16", "amx-int8", threads=threads)
        for rows, tail_passes in ((128, 0), (100, 1)):
            workload = dense(rows, 768, 768, dtype=dtype)
            config = get_space(workload, target).config(fallback_config(workload, target).to_dict() | {
                "parallel": parallel})
            code = functions(generated_assembly(lower(workload, target, config), target))
            passes = {name: text for name, text in code.items() if name.startswith("tiles.")}
            assert code[stage].count("ldtilecfg") == 1 and code[stage].count("tilerelease") == 1
            assert sorted(text.count("ldtilecfg") for text in passes.values()) == [0] * (len(passes) - tail_passes) + \
                [2] * tail_passes
            assert not any("ldtilecfg" in text for name, text in code.items() if name.startswith("micro_kernel"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_amx_configs_compile_to_tile_products_on_any_host(family):
    """Whole tiles and every tail (rows, columns, a k step of fewer groups, an odd k) compile to tile products."""
    dtype, instruction, below = FAMILIES[family]
    assembly = generated_assembly(lower(dense(64, 768, 768, dtype=dtype), SAPPHIRE, fallback_config(
        dense(64, 768, 768, dtype=dtype), SAPPHIRE)), SAPPHIRE)
    assert assembly.count(instruction) >= 4 and "ldtilecfg" in assembly and "tilerelease" in assembly
    for workload in ODD_SHAPES(dtype):
        for config in configs_using(workload, SAPPHIRE, family, count=4):
            assert instruction in generated_assembly(lower(workload, SAPPHIRE, config), SAPPHIRE)
    vector = get_space(dense(64, 768, 768, dtype=dtype), SAPPHIRE).config(
        fallback_config(dense(64, 768, 768, dtype=dtype), SAPPHIRE).to_dict() | {"isa": below, "tile_m": [-1, 8, 8],
                                                                                  "tile_n": [-1, 8, 32], "prefetch": 0})
    assert instruction not in generated_assembly(lower(dense(64, 768, 768, dtype=dtype), SAPPHIRE, vector), SAPPHIRE)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_c_tiles_start_as_zero_tiles_where_the_block_was_just_zeroed(family):
    """The micro-kernel zeroes its block of C and then accumulates tiles into it: the tiles start as `tilezero`
    and the zeroing is left out (a tile load of what vector stores have just written waits for them), in every
    k-block, whatever the k-blocks; a zeroing that does not cover the whole block is kept."""
    dtype = FAMILIES[family][0]
    for workload, k_block in ((dense(64, 768, 768, dtype=dtype), 768), (dense(64, 768, 768, dtype=dtype), 256),
                              (batch_matmul(3, 17, 42, 31, dtype=dtype), 31)):
        config = get_space(workload, SAPPHIRE).config(fallback_config(workload, SAPPHIRE).to_dict() | {
            "tile_k": [-1, k_block]})
        assembly = generated_assembly(lower(workload, SAPPHIRE, config), SAPPHIRE)
        assert "tilezero" in assembly and "memset" not in assembly
    acc, a, bp = Buffer("acc", (16, 16), "register"), Buffer("A", (16, 64), "input", dtype), Buffer("Bp", (32, 16, 2), "packed", dtype)
    r, c, q = var("r"), var("c"), var("q")
    product = acc.store((r, c), Op("dot2_amx", (a[r, 2 * q], bp[q, c, 0], a[r, 2 * q + 1], bp[q, c, 1], acc[r, c])))
    nest = Loop("q", 32, "tile", (Loop("r", 16, "tile", (Loop("c", 16, "tile", (product,)),)),))
    zeroing = lambda rows: Loop("r", rows, "unrolled", (Loop("c", 16, "vectorized", (acc.store((r, c), Const(0.0)),)),))
    assert _zeroing_before_tiles(zeroing(16), nest) == "acc"
    assert _zeroing_before_tiles(zeroing(15), nest) is None and _zeroing_before_tiles(zeroing(16), zeroing(16)) is None

@pytest.mark.parametrize("family", list(FAMILIES))
def test_tile_products_prefetch_the_packed_b_as_the_prefetch_knob_says(family):
    """An AMX config's `prefetch` k steps ahead: each step of its passes prefetches a B tile's rows into L2
    (`prefetcht1`), one per row; 0 prefetches nothing, nor does a vector family but in dense."""
    workload = dense(64, 768, 768, dtype=FAMILIES[family][0])
    space = get_space(workload, SAPPHIRE)
    assert space.knobs["prefetch"].candidates == (0, 4, 16, 32, "shared")
    assert fallback_config(workload, SAPPHIRE)["prefetch"] == "shared"
    assembly = lambda ahead: generated_assembly(lower(workload, SAPPHIRE, space.config(
        fallback_config(workload, SAPPHIRE).to_dict() | {"prefetch": ahead})), SAPPHIRE)
    assert assembly(16).count("prefetcht1") >= 16 and "prefetcht1" not in assembly(0)
    product = matmul(64, 768, 768, dtype=FAMILIES[family][0])
    assert {config["prefetch"] for config in configs_using(product, SAPPHIRE, FAMILIES[family][2], count=6)} == {0}


@pytest.mark.parametrize("threads", [1, 2])
def test_row_blocks_sharing_a_panel_each_prefetch_a_share_of_the_next(threads):
    """`prefetch` "shared" (the fallback's): the micro-kernel of row block s0 of the M/mr that read a packed panel
    prefetches the s0-th share of the bytes after its rows, spread over its k steps: 128×3072×768 in 2 × 2 tiles is
    four row blocks over 384 k groups of 32 columns (48 KB), a share of 192 lines, 8 a step of 24; never in a vector
    family. The fallback runs a panel's four row blocks one after another (the innermost loop), so the next panel's
    four shares are fetched while it is read."""
    target = sapphire("amx-tile", "amx-bf16", "amx-int8", threads=threads)
    workload = dense(128, 3072, 768, dtype="bfloat16")
    space = get_space(workload, target)
    config = fallback_config(workload, target)
    program = lower(workload, target, config)
    assert config["prefetch"] == "shared" and "prefetch share s0 of 4 of what follows" in format_program(program)
    assert (config["tile_m"], config["tile_n"][1:]) == ((-1, 4, 32), (1, 32))
    assert re.search(r"for mi in range\(4\):\n +micro_kernel", format_program(program))
    assert generated_assembly(program, target).count("prefetcht1") == 8 and "prefetcht1" not in generated_assembly(
        lower(workload, target, space.config(config.to_dict() | {"prefetch": 0})), target)
    assert all(config["prefetch"] != "shared" for config in configs_using(workload, target, "avx512bf16", count=12))
    # a config wanted with k steps ahead (borrowed from a vector family, say) is fitted among the sizes
    assert space.nearest(config.to_dict() | {"prefetch": 20})["prefetch"] == 16
    vector = config.to_dict() | {"isa": "avx512bf16", "tile_m": [-1, 8, 8], "tile_n": [-1, 8, 32]}
    assert space.config(vector | {"prefetch": 0})["isa"] == "avx512bf16"  # valid but for the prefetch
    with pytest.raises(InvalidConfig):
        space.config(vector)


def test_an_amx_blocks_write_back_runs_its_rows_in_a_loop():
    """AMX's C block lies in memory between tile products, so its write-back (here bias and GELU) runs AMX_ROWS rows
    a turn of a loop: 32 rows in 8 turns. A vector family's block is registers: its rows stay unrolled."""
    workload = dense(128, 3072, 768, bias=True, epilogue="gelu", dtype="bfloat16")
    tiles = lower(workload, SAPPHIRE, fallback_config(workload, SAPPHIRE))
    assert "for ro in range(8):\n" in format_program(tiles) and AMX_ROWS == 4
    vector = lower(workload, SAPPHIRE, configs_using(workload, SAPPHIRE, "avx512bf16", count=1)[0])
    assert "for ro" not in format_program(vector) and "unrolled for r in range(" in format_program(vector)


def test_a_tile_product_without_amx_is_refused_by_the_code_generator():
    workload = dense(64, 768, 768, dtype="bfloat16")
    program = lower(workload, SAPPHIRE, fallback_config(workload, SAPPHIRE))
    with pytest.raises(CodegenError, match="dot2_amx needs amx-bf16, amx-tile"):
        generate(program, 1, ("avx", "avx2", "fma", "avx512f", "avx512bf16"))


@on_amx_host
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_amx_family_computes_the_reference(family):
    for workload in ODD_SHAPES(FAMILIES[family][0]):
        for config in configs_using(workload, ONE, family, count=4):
            check(workload, ONE, config)
    # 4 × 4 tiles through 2·CHUNK + 2 k steps: register groups taking CHUNK steps in turn, twice, then the 2 left
    steps = 2 * CHUNK + 2
    workload = dense(64, 64, steps * STEP * GROUP // ITEMSIZE[FAMILIES[family][0]], dtype=FAMILIES[family][0])
    check(workload, ONE, get_space(workload, ONE).config(fallback_config(workload, ONE).to_dict() | {
        "tile_m": [-1, 1, 64], "tile_n": [-1, 1, 64], "tile_k": [-1, workload.p["K"]], "isa": family}))
    # each row block prefetching its share of what follows, also past the last panel and in a tail's block
    for workload in (ODD_SHAPES(FAMILIES[family][0])[-1], dense(128, 256, 768, dtype=FAMILIES[family][0])):
        for config in configs_using(workload, ONE, family, count=2, prefetch="shared"):
            check(workload, ONE, config)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_tile_peak_is_measured_with_tile_products(family):
    """Emitted on any host; measured where AMX is, above the AVX-512 dot's peak on the same threads."""
    assert FAMILIES[family][1] in emit_assembly(tile_peak_module(family), SAPPHIRE)
    if "amx-tile" in host_target().features:
        assert peak_gflops(ONE, family) > 2 * peak_gflops(ONE, FAMILIES[family][2])


def test_a_batch_matmul_reading_views_runs_tile_products_where_a_rows_lie_along_k():
    """q read in place from a fused QKV result (its rows 96 wide) by kᵀ: tile products, compiled; an A whose k runs
    down its columns (a transposed view) has no tile row to load, so no AMX config is offered for it, and its
    fallback compiles to no tile product."""
    heads = batch_matmul(2, 17, 17, 32, "bfloat16", a_strides="32:96:1", b_strides="32:1:96")
    assert "tdpbf16ps" in generated_assembly(lower(heads, SAPPHIRE, fallback_config(heads, SAPPHIRE)), SAPPHIRE)
    transposed = batch_matmul(2, 17, 17, 32, "bfloat16", a_strides="544:1:17")
    assert {config["isa"] for config in get_space(transposed, SAPPHIRE)} == {"fma", "fma-f32", "avx512bf16"}
    assert "tdpbf16ps" not in generated_assembly(lower(transposed, SAPPHIRE, fallback_config(transposed, SAPPHIRE)),
                                                 SAPPHIRE)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_inputs_an_amx_config_tile_loads_are_its_activations_not_its_packed_weights(family):
    """Which inputs an UnalignedInputWarning can be about: A's rows go to tile loads as they lie; the weights are
    packed first; the vector family below has no tile loads."""
    workload = dense(64, 64, 128, bias=True, dtype=FAMILIES[family][0])
    for isa, read in ((family, {"X"}), (FAMILIES[family][2], set())):
        (config,) = configs_using(workload, SAPPHIRE, isa, count=1)
        assert tile_reads(lower(workload, SAPPHIRE, config)) & {"X", "W", "bias"} == read


@on_amx_host
def test_an_amx_kernel_warns_once_of_an_activation_off_a_cache_line_and_still_computes_it():
    """X 16 bytes off a cache line: one UnalignedInputWarning naming it, the right result, then silence; an aligned
    X, a kernel narrowed off AMX, never a warning."""
    workload = dense(64, 64, 128, dtype="bfloat16")
    x, w = workload.random_inputs()
    raw = np.empty(x.nbytes + 2 * 64, np.uint8)
    shifted = raw[(-raw.ctypes.data) % 64 + 16:][:x.nbytes].view(x.dtype).reshape(x.shape)
    shifted[...] = x
    (config,) = configs_using(workload, ONE, "amx-bf16", count=1)
    kernel = build(workload, ONE, config)
    with pytest.warns(UnalignedInputWarning, match="input X starts 16 bytes past a cache line"):
        out = kernel(shifted, w)
    assert workload.max_error(out, workload.reference(x, w)) <= 1
    narrowed = Target.parse("llvm -threads=1 -mattr=-amx-tile")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnalignedInputWarning)
        kernel(shifted, w)
        build(workload, ONE, config).bind(W=w)(aligned(x))
        build(workload, narrowed, fallback_config(workload, narrowed))(shifted, w)
