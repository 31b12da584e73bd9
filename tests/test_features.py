"""The cost model's features: each value in its documented slot, and enough to rank configs by speed."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from search_space import ConfigSpace, Knob
from search_space.features import MAX_BUFFERS, MAX_LOOPS, itervar_features, knob_features
from search_space.program import LOOP_KINDS, Buffer, Loop, Op, Program, Stage, var

DATA = Path(__file__).parent / "data"
FLOAT_BYTES = 4


def log(x: float) -> float:
    return math.log2(1.0 + x)


def small_matmul() -> Program:
    """C[6,10] += A[6,5]·B[5,10], B first packed to P; rows in parallel, 8 columns vectorized and a peeled
    serial tail of the last 2."""
    a, b = Buffer("A", (6, 5), "input"), Buffer("B", (5, 10), "input")
    c, packed = Buffer("C", (6, 10), "output"), Buffer("P", (5, 10), "packed")
    i, k, j, t, pk, pj = (var(name) for name in ("i", "k", "j", "t", "pk", "pj"))
    pack = Loop("pk", 5, "serial", (Loop("pj", 10, "serial", (packed.store((pk, pj), b[pk, pj]),)),))
    body = Loop("j", 8, "vectorized", (c.store((i, j), Op("fma", (a[i, k], packed[k, j], c[i, j]))),))
    tail = Loop("t", 2, "serial", (c.store((i, t + 8), Op("fma", (a[i, k], packed[k, t + 8], c[i, t + 8]))),))
    compute = Loop("i", 6, "parallel", (Loop("k", 5, "serial", (body, tail)),))
    return Program("small_matmul", (a, b, c, packed), (Stage("pack", (pack,)), Stage("compute", (compute,))))


def test_itervar_features_of_a_hand_checkable_program():
    """Worked out by hand from the loop extents and the buffers' row lengths: the hottest statement is the
    vectorized one (6·5·8 = 240 runs of 350 statement runs: 50 packing, 60 in the tail)."""
    # innermost first: extent, iterations of the loops outside it and inside it, kind, and for C (stored), A and
    # P (loaded): elements between its consecutive iterations, elements it and the loops inside it touch, and
    # iterations per element touched
    loops = [(8, 30, 1, "vectorized", [(1, 8, 1), (0, 1, 8), (1, 8, 1)]),
             (5, 6, 8, "serial", [(0, 8, 5), (1, 5, 8), (10, 40, 1)]),
             (6, 1, 40, "parallel", [(10, 48, 5), (5, 30, 8), (0, 40, 6)])]
    rows = []
    for extent, outside, inside, kind, buffers in loops:
        row = [log(extent), log(outside), log(inside)] + [float(kind == k) for k in LOOP_KINDS]
        for stride, touched, reuse in buffers + [(0, 0, 0)] * (MAX_BUFFERS - len(buffers)):
            row += [log(stride * FLOAT_BYTES), log(touched * FLOAT_BYTES), log(reuse)]
        rows += row
    rows += [0.0] * (len(rows) // len(loops)) * (MAX_LOOPS - len(loops))
    flops = 2 * 6 * 10 * 5
    # FLOPs, statement runs, the hot statement's work in its peeled tail (60 of 300), packed bytes, register
    # elements, parallel width, bytes prefetched ahead, the share of the threads (one) kept busy
    whole = [log(flops), log(350), 60 / 300, log(5 * 10 * FLOAT_BYTES), log(0), log(6), log(0), 1.0]
    np.testing.assert_allclose(itervar_features(small_matmul(), flops), rows + whole, rtol=1e-6)


def test_the_prefetch_lead_is_a_feature_in_bytes():
    """How far ahead a dense micro-kernel prefetches its packed weights is a whole-program feature: 32 k steps
    of a 32-lane float32 row, 4 KiB; none, 0. The cost model sees what the knob changes."""
    from search_space import Target, dense, fallback_config, get_space, lower

    target = Target.parse("llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f -threads=1")
    workload = dense(32, 768, 768)
    config = fallback_config(workload, target).to_dict() | {"tile_n": [-1, 8, 32]}
    lead = lambda ahead: itervar_features(lower(workload, target, get_space(workload, target).config(
        config | {"prefetch": ahead})), workload.flops)[-2]
    assert lead(32) == log(32 * 32 * FLOAT_BYTES) and lead(0) == 0


def test_an_amx_tile_nests_prefetch_is_the_same_feature():
    """AMX's `prefetch` in the same bytes: 16 k steps of 16 groups of a 32-column packed row (128 bytes), 32 KiB;
    "shared", the block's 384 group rows, 48 KiB, what follows them being fetched; none, 0."""
    from search_space import Target, dense, fallback_config, get_space, lower

    target = Target.parse("llvm -mcpu=sapphirerapids -mattr=+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512dq,+avx512vl,"
                          "+avx512bf16,+amx-tile,+amx-bf16 -threads=1")
    workload = dense(128, 768, 768, dtype="bfloat16")
    config = fallback_config(workload, target).to_dict()
    assert config["isa"] == "amx-bf16" and config["tile_n"][2] == 32 and config["tile_k"][1] == 768
    lead = lambda prefetch: itervar_features(lower(workload, target, get_space(workload, target).config(
        config | {"prefetch": prefetch})), workload.flops)[-2]
    assert lead(16) == log(16 * 16 * 128) and lead("shared") == log(384 * 128) and lead(0) == 0


def test_the_share_of_threads_kept_busy_is_a_feature():
    """The last whole-program feature: dense's N = 768 on 2 threads in blocks of 8 × 32 columns is three blocks,
    one thread's two to the other's one (0.75); of 4 × 32, six (1.0); of 8 × 64, 512 columns and a peeled 256
    (0.75); run serially, half the threads idle (0.5)."""
    from search_space import Target, dense, fallback_config, get_space, lower

    target = Target.parse("llvm -mcpu=znver4 -mattr=+avx,+avx2,+fma,+avx512f -threads=2")
    workload = dense(128, 768, 768)
    config = fallback_config(workload, target).to_dict() | {"parallel": "n"}
    busy = lambda **knobs: itervar_features(lower(workload, target, get_space(workload, target).config(
        config | knobs)), workload.flops, target.threads)[-1]
    assert busy(tile_n=[-1, 8, 32]) == 0.75 and busy(tile_n=[-1, 4, 32]) == 1.0
    assert busy(tile_m=[-1, 8, 6], tile_n=[-1, 8, 64]) == 0.75 and busy(parallel="none") == 0.5


def test_knob_features_are_split_factors_and_candidate_positions_in_knob_order():
    space = ConfigSpace([Knob("tile", "split", ((-1, 2, 4), (-1, 8, 1))), Knob("vec", "annotate", (4, 8, 16)),
                         Knob("order", "reorder", (("m", "n"), ("n", "m")))])
    config = space.config({"tile": [-1, 8, 1], "vec": 16, "order": ["n", "m"]})
    np.testing.assert_allclose(knob_features(space, config), [log(8), log(1), 2.0, 1.0], rtol=1e-6)


def test_a_model_fit_on_the_features_of_a_few_configs_ranks_the_rest_in_their_measured_order():
    """Recorded real measurements of matmul 512³ on znver4 (tests/data), so the speed order is known and the same
    on every run, whatever this host's load: a cost model fit on 64 of them puts nearly every pair of the other
    1,600 configs that are 4x apart or more the right way round, and its first choice is close to the best."""
    from tuner.cost_model import XGBCostModel
    from tuner.replay import ReplayData, knob_key

    data = ReplayData.load(DATA / "replay_matmul512.jsonl.gz")
    space = data.space
    configs = [space.get(index) for index in range(space.size)]
    gflops = np.array([data.results[knob_key(config.to_dict())].gflops for config in configs])
    shuffled = np.random.default_rng(0).permutation(len(configs))
    seen, unseen = shuffled[:64], shuffled[64:]
    model = XGBCostModel(data.workload, data.target, space)
    model.fit([configs[i] for i in seen], gflops[seen])
    predicted, measured = model.predict([configs[i] for i in unseen]), gflops[unseen]
    far_faster = measured[:, None] >= 4 * measured[None, :]
    ranked_faster = predicted[:, None] > predicted[None, :]
    assert far_faster.sum() > 10_000 and ranked_faster[far_faster].mean() > 0.9
    assert measured[np.argmax(predicted)] > 0.85 * measured.max()


def test_a_configs_features_are_lowered_once_a_process_whatever_space_holds_it_and_are_read_only():
    """Each seed of `bench tuner`, and each task of a model featuring the others' records as its history, would
    otherwise lower the same configs again (a 512-channel convolution's 9 replayed xgb runs: 3,924 programs, 993
    distinct)."""
    from search_space import get_space, lower
    from tuner.cost_model import features
    from tuner.replay import ReplayData

    data = ReplayData.load(DATA / "replay_batch12x128x128x64.jsonl.gz")
    whole = get_space(data.workload, data.target)
    config = data.space.get(700)
    same = whole.config(config.to_dict())
    assert config.index != same.index  # the replay's space is a restriction, with indices of its own
    x = features(data.workload, data.target, data.space, config, "itervar")
    assert features(data.workload, data.target, whole, same, "itervar") is x
    program = lower(data.workload, data.target, same)
    np.testing.assert_array_equal(x, itervar_features(program, data.workload.flops, data.target.threads))
    with pytest.raises(ValueError, match="read-only"):
        x[0] = 1.0
