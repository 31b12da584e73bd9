"""conv2d: the workload (key, validation, reference), its CPU template on the cases ResNet needs (every config
on awkward shapes: tests/test_kernels.py), weights packed once by bind, and the op through tune, the database,
the API, the AutoTVM log, show and the cost model's features."""
import itertools
import json

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from db import Database, apply_history_best, export_log, import_log
from search_space import Target, Workload, WorkloadError, conv2d, fallback_config, get_space, host_target, lower
from search_space.program import If, Loop, walk
from search_space.target import lacked_features
from service.api import create_app
from service.cli import app
from tests.isa_helpers import zen4
from tests.test_kernels import TARGETS
from tuner.cost_model import features
from tuner.tune import tune
from workers import build
from workers.reference import torch_conv2d, torch_operands
from workers.task import MeasureOptions

RESNET_BLOCK = dict(N=1, C=64, H=56, W=56, K=64, R=3, S=3, stride=1, pad=1)


def naive(p: dict, data, weight, bias=None, residual=None):
    """The definition, one output element at a time (float64), for small shapes."""
    n, k, oh, ow = Workload.make("conv2d", **p).output_shape
    padded = np.pad(data.astype(np.float64), ((0, 0), (0, 0), (p["pad"],) * 2, (p["pad"],) * 2))
    out = np.zeros((n, k, oh, ow))
    for b, o, y, x in itertools.product(range(n), range(k), range(oh), range(ow)):
        window = padded[b, :, y * p["stride"]:y * p["stride"] + p["R"], x * p["stride"]:x * p["stride"] + p["S"]]
        out[b, o, y, x] = np.sum(window * weight[o])
    out += 0 if bias is None else bias[:, None, None]
    out += 0 if residual is None else residual
    return np.maximum(out, 0) if p.get("epilogue") == "relu" else out


def test_the_key_names_every_parameter_and_the_fused_options():
    fused = conv2d(**RESNET_BLOCK, bias=True, residual=True, epilogue="relu")
    assert fused.key == ("conv2d(N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1,bias=true,residual=true,"
                         "epilogue=relu,dtype=float32)")
    assert Workload.from_key(fused.key) == fused
    assert conv2d(1, 3, 224, 224, 64, 7, 7, 2, 3).output_shape == (1, 64, 112, 112)
    assert fused.flops == 2 * 64 * 56 * 56 * 64 * 9
    assert [name for name, _ in fused.operand_shapes()] == ["data", "weight", "bias", "residual"]
    assert fused.weight_names() == ("weight", "bias")


@pytest.mark.parametrize("make, message", [
    (lambda: conv2d(1, 3, 4, 4, 8, 7, 7, 1, 1), "kernel R×S=7×7 is larger than the padded input 6×6"),
    (lambda: conv2d(1, 3, 8, 8, 8, 3, 3, stride=0), "parameter stride=0 is out of range; it must be in 1.."),
    (lambda: conv2d(1, 3, 8, 8, 8, 3, 3, pad=-1), "parameter pad=-1 is out of range; it must be in 0.."),
    (lambda: conv2d(1, 0, 8, 8, 8, 3, 3), "parameter C=0 is out of range"),
    (lambda: conv2d(1, 3, 8, 8, 8, 3, 3, epilogue="tanh"), "unknown epilogue 'tanh'"),
    (lambda: conv2d(1, 3, 8, 8, 8, 3, 3, layout="chwn"), "unknown layout 'chwn'; known: nchw (channels second), nhwc"),
    (lambda: Workload.make("conv2d", N=1, C=3, H=8, W=8, K=8, R=3, S=3), "missing parameter(s) stride, pad"),
])
def test_bad_convolutions_say_what_is_wrong(make, message):
    with pytest.raises(WorkloadError) as error:
        make()
    assert message in str(error.value)


@pytest.mark.parametrize("p", [
    dict(N=2, C=3, H=7, W=9, K=5, R=3, S=2, stride=2, pad=1, bias=True, residual=True, epilogue="relu"),
    dict(N=1, C=4, H=5, W=5, K=3, R=1, S=1, stride=2, pad=0),
    dict(N=1, C=2, H=6, W=4, K=4, R=5, S=3, stride=3, pad=2, bias=True),
])
def test_the_reference_is_the_definition(p):
    workload = Workload.make("conv2d", **p)
    inputs = workload.random_inputs(seed=3)
    expected = naive(p, *inputs)
    assert workload.reference(*inputs).shape == expected.shape
    np.testing.assert_allclose(workload.reference(*inputs), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("workload", [
    conv2d(2, 3, 9, 7, 17, 7, 7, 2, 3, bias=True, residual=True, epilogue="relu"),  # the stem: C=3, 7×7, s2
    conv2d(1, 5, 11, 8, 10, 1, 1, 2, 0, residual=True),  # a strided 1×1 on odd sizes
    conv2d(2, 24, 6, 5, 33, 3, 3, 1, 1, bias=True, epilogue="gelu"),  # channels filling no vector
], ids=lambda w: w.key)
def test_the_cases_resnet_needs_on_every_target(workload):
    for target in TARGETS:
        space = get_space(workload, target)
        inputs = workload.random_inputs()
        expected = workload.reference(*inputs)
        for config in [fallback_config(workload, target), *space.sample(3, 7)]:
            error = workload.max_error(build(workload, target, config)(*inputs), expected)
            assert error <= 1, f"{workload.key} on {target} config {config}: error {error:.2f}x tolerance"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("p", [
    dict(N=2, C=5, H=11, W=9, K=19, R=3, S=3, stride=2, pad=1, bias=True, residual=True, epilogue="relu"),
    dict(N=1, C=32, H=14, W=14, K=48, R=1, S=1, stride=2, pad=0, bias=True),  # channel blocks of whole vectors
], ids=["stem-like", "pointwise"])
def test_the_nhwc_layout_is_the_nchw_convolution_with_channels_last(p, dtype):
    """data, residual and output lie [N, H, W, C]: the same numbers as the NCHW workload's, transposed; the key
    says so; every config tried computes the reference, on each target."""
    last, first = conv2d(**p, dtype=dtype, layout="nhwc"), conv2d(**p, dtype=dtype)
    assert last.key == first.key.replace(",dtype=", ",layout=nhwc,dtype=") and Workload.from_key(last.key) == last
    n, k, oh, ow = first.output_shape
    assert last.output_shape == (n, oh, ow, k) and last.operand_shapes()[0][1] == (p["N"], p["H"], p["W"], p["C"])
    inputs = last.random_inputs()
    transposed = [a.transpose(0, 3, 1, 2).copy() if name in ("data", "residual") else a
                  for (name, _), a in zip(last.operand_shapes(), inputs)]
    expected = last.reference(*inputs)
    np.testing.assert_array_equal(expected, first.reference(*transposed).transpose(0, 2, 3, 1))
    assert fallback_config(last, "llvm")["write"] == "channels"  # whole vectors of channels: its contiguous runs
    # PyTorch, the reference timed beside it, is given them as a channels_last model holds them, the weight too
    held = torch_operands(last, inputs)
    assert all(held[name].is_contiguous(memory_format=torch.channels_last) and held[name].shape == want
               for name, want in zip(("data", "weight"), (first.operand_shapes()[0][1], first.operand_shapes()[1][1])))
    assert held["data"].data_ptr() == inputs[0].ctypes.data  # the activations' memory itself
    if dtype != "int8":  # (PyTorch's float convolutions; its int8 one takes quantized tensors)
        np.testing.assert_allclose(torch_conv2d(last.p, *held.values()).float().permute(0, 2, 3, 1).numpy(),
                                   expected, rtol=0.05, atol=0.05)
    for target in TARGETS:
        for config in [fallback_config(last, target), *get_space(last, target).sample(3, 5)]:
            error = last.max_error(build(last, target, config)(*inputs), expected)
            assert error <= 1, f"{last.key} on {target} config {config}: error {error:.2f}x tolerance"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_the_micro_kernel_prefetches_the_packed_weights_as_the_prefetch_knob_says(dtype):
    """A config's `prefetch` channel steps on: each step prefetches its packed weights' row from there, a prefetcht0
    per cache line, at the edges too, and computes the same; the fallback prefetches 32 steps on where the weights
    are past an L2's size (ResNet-18's last layers), nothing where they are small, nor in int8. The code is read for
    a Zen 4 and run for it, or for this host where it lacks AVX-512."""
    from workers.build import generated_assembly

    streamed = fallback_config(conv2d(1, 512, 7, 7, 512, 3, 3, 1, 1, dtype=dtype), "llvm")["prefetch"]
    assert streamed == (0 if dtype == "int8" else 32)
    assert fallback_config(conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, dtype=dtype), "llvm")["prefetch"] == 0
    target = zen4()
    workload = Workload.make("conv2d", dtype=dtype, N=1, C=8, H=7, W=7, K=40, R=3, S=3, stride=1, pad=1, bias=True)
    space = get_space(workload, target)
    assert space.knobs["prefetch"].candidates == (0, 4, 16, 32)
    block = fallback_config(workload, target).to_dict() | {"tile_k": [-1, 32], "vec": 16, "unroll_c": 1}
    assembly = lambda ahead: generated_assembly(lower(workload, target, space.config(block | {"prefetch": ahead})),
                                                target)
    assert assembly(16).count("prefetcht0") >= 2 and "prefetcht0" not in assembly(0)  # a step's row: two lines
    runs, block = (target, block) if not lacked_features(target, host_target().features) else (
        Target.parse("llvm -threads=1"), block | {"tile_k": [-1, 8], "vec": 8})  # 7 × 1 vectors fit AVX2's registers
    inputs = workload.random_inputs()
    for ahead in space.knobs["prefetch"].candidates:
        for owr in (2, 7):  # blocks with edges of their own, and one block a row
            config = get_space(workload, runs).nearest(block | {"prefetch": ahead, "tile_ow": (-1, owr)})
            assert config["prefetch"] == ahead and config["tile_ow"] == (-1, owr)
            assert workload.max_error(build(workload, runs, config)(*inputs), workload.reference(*inputs)) <= 1


def test_bind_packs_the_weights_once():
    """After bind, the caller's weight array is never read again: changing it in place changes nothing."""
    workload = conv2d(1, 16, 9, 9, 24, 3, 3, 1, 1, bias=True)
    data, weight, bias = workload.random_inputs()
    expected = workload.reference(data, weight, bias)
    bound = build(workload, "llvm").bind(weight=weight, bias=bias)
    assert workload.max_error(bound(data), expected) <= 1
    weight *= 3
    assert workload.max_error(bound(data), expected) <= 1
    assert workload.max_error(build(workload, "llvm")(data, weight, bias), expected) > 1  # unbound: reads it


def test_a_strided_pointwise_convolution_packs_only_the_pixels_it_reads():
    workload = conv2d(1, 64, 56, 56, 128, 1, 1, 2, 0)
    program = lower(workload, "llvm", fallback_config(workload, "llvm"))
    packed = {b.name: b.shape for b in program.scope("packed")}
    assert packed["Dp"][2:4] == (28, 28)


@pytest.mark.parametrize("layer, axis", [((1, 3, 224, 224, 64, 7, 7, 2, 3), "h"), ((1, 512, 7, 7, 512, 3, 3, 1, 1), "k"),
                                         ((2, 64, 56, 56, 64, 3, 3, 1, 1), "n")])
def test_the_fallback_splits_images_else_the_larger_operand_across_threads(layer, axis):
    """The stem's data (padded) outweighs its weights 17 to 1, and the last layer's weights its data 57 to 1."""
    assert fallback_config(conv2d(*layer), "llvm -threads=2")["parallel"] == axis


@pytest.mark.parametrize("axis", ["h", "k", "n", "none"])
def test_threads_that_split_rows_or_channels_pack_the_datas_rows_between_them(axis):
    """Each thread packs a share of the padded data's rows (mostly those it computes from), not one thread all of
    them, where threads split output rows or channels; each image's thread its image where they split images. Odd
    sizes, so that the shares differ and the padding has rows of its own; every way computes the reference."""
    workload = conv2d(2, 3, 9, 7, 17, 7, 7, 2, 3, bias=True)
    target = Target.parse("llvm -threads=2")
    config = get_space(workload, target).nearest(dict(fallback_config(workload, target).values) | {"parallel": axis})
    pack = next(stage for stage in lower(workload, target, config).stages if stage.name == "pack_data")
    shared = {"h": ["y"], "k": ["y"], "n": ["n"], "none": []}[axis]  # the top-level loops the threads split
    assert [loop.var for loop in pack.body if loop.kind == "parallel"] == shared
    inputs = workload.random_inputs()
    assert workload.max_error(build(workload, target, config)(*inputs), workload.reference(*inputs)) <= 1


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", ["k", "h", "n", "none"])
@pytest.mark.parametrize("tap", [(0, None), (2, None), (None, 0), (None, 2)], ids=["top", "bottom", "left", "right"])
def test_the_taps_that_read_padding_are_skipped_not_multiplied_by_zero(tap, axis, dtype):
    """A 7×7 image, 3×3 taps, padding 1: an infinite weight at a tap's row (or column) that the edge row (column)
    of the output reads in the padding leaves that row finite, as the convolution with the tap zeroed there; every
    other row reads the image through it and is not finite. In blocks of 2, 3 and 7 output positions (a loop of
    blocks, a tail, one block), threads over each axis; and where a serial loop runs over the rows, the first row
    it computes is a whole one, the top one last (its weights stream from memory unbroken)."""
    workload = Workload.make("conv2d", dtype=dtype, N=2, C=8, H=7, W=7, K=16, R=3, S=3, stride=1, pad=1, bias=True)
    target = Target.parse("llvm -threads=2")
    row, column = tap
    data, weight, bias = workload.random_inputs()
    infinite, zeroed = weight.copy(), weight.astype(np.float32)
    infinite[:, :, row if row is not None else slice(None), column if column is not None else slice(None)] = np.inf
    zeroed[:, :, row if row is not None else slice(None), column if column is not None else slice(None)] = 0
    edge = {0: 0, 2: 6}[row if row is not None else column]
    along = (lambda out, i: out[:, :, i, :]) if row is not None else (lambda out, i: out[:, :, :, i])
    expected = along(workload.reference(data, zeroed.astype(weight.dtype), bias), edge)
    for owr in (2, 3, 7):
        config = get_space(workload, target).nearest(dict(fallback_config(workload, target).values)
                                                     | {"parallel": axis, "tile_ow": (-1, owr)})
        out = build(workload, target, config)(data, infinite, bias).astype(np.float32)
        assert np.abs(along(out, edge) - expected).max() <= 1e-2 * np.abs(expected).max(), config
        assert not np.isfinite(along(out, 6 - edge)).any(), config
        compute = next(stage for stage in lower(workload, target, config).stages if stage.name == "compute")
        first = next(stmt.lhs for stmt, *_ in walk(compute.body) if isinstance(stmt, If) and "oh" in stmt.lhs.names)
        assert first.const == (0 if axis == "h" else 1)


def test_int8_sums_the_padding_its_zero_point_holds():
    """int8's padding is the zero point, summed like the data and taken off with the weights' sums: no tap skipped."""
    workload = Workload.make("conv2d", dtype="int8", N=1, C=8, H=7, W=7, K=16, R=3, S=3, stride=1, pad=1)
    compute = lower(workload, "llvm", fallback_config(workload, "llvm")).stages[-1].body
    assert {(stmt.var, stmt.extent) for stmt, *_ in walk(compute) if isinstance(stmt, Loop) and stmt.var in "rs"} == {
        ("r", 3), ("s", 3)}  # every micro-kernel over the whole 3×3, and none chosen by row or column
    assert not [stmt for stmt, *_ in walk(compute) if isinstance(stmt, If) and stmt.op == "=="]
    inputs = workload.random_inputs()
    assert workload.max_error(build(workload, "llvm", fallback_config(workload, "llvm"))(*inputs),
                              workload.reference(*inputs)) <= 1


def test_a_row_all_of_whose_taps_read_padding_is_its_bias():
    """pad 2 around a 1-row image with 1-row taps: the output's top and bottom rows read nothing but padding."""
    workload = conv2d(1, 4, 1, 5, 8, 1, 3, 1, 2, bias=True)
    inputs = workload.random_inputs()
    out = build(workload, "llvm", fallback_config(workload, "llvm"))(*inputs)
    bias = inputs[2]
    assert out.shape[2] == 5 and np.array_equal(out[0, :, 0, 0], bias) and np.array_equal(out[0, :, 4, 4], bias)
    assert workload.max_error(out, workload.reference(*inputs)) <= 1


def test_conv2d_tunes_into_the_database_and_is_applied(tmp_path):
    url = f"sqlite:///{tmp_path}/conv.db"
    workload, target = conv2d(1, 8, 10, 10, 16, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu"), \
        Target.parse("llvm -threads=1")
    result = tune(workload, target, 8, "xgb", url, measure=MeasureOptions(repeat=2, min_repeat_ms=1.0))
    assert len(result.measured) == 8 and result.best is not None
    best = Database(url).best(workload, target)[0]
    assert best.input.config.index == result.best[0].config.index
    with apply_history_best(url):
        kernel = build(workload, target)
    assert kernel.config.index == best.input.config.index
    x = features(workload, target, get_space(workload, target), best.input.config, "itervar")
    assert np.all(np.isfinite(x)) and np.count_nonzero(x) > 10
    shown = CliRunner().invoke(app, ["best", "conv2d", *[f"{k}={v}" for k, v in workload.p.items()],
                                     "--target", str(target), "--db", url, "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["config"]["index"] == best.input.config.index
    client = TestClient(create_app(Database(url)))
    served = client.get("/api/best", params={"workload": workload.key, "target": str(target)}).json()
    assert served["config"]["index"] == best.input.config.index
    job = client.post("/api/jobs", json={"workload": {"op": "conv2d", "params": workload.p}, "target": str(target),
                                         "trials": 4, "tuner": "random"})
    assert job.status_code == 201 and job.json()["workload"] == workload.key
    assert export_log(Database(url), tmp_path / "log.json") == 8
    copy = Database(f"sqlite:///{tmp_path}/copy.db")
    assert import_log(copy, tmp_path / "log.json").imported == 8
    assert copy.best(workload, target)[0].input.config == best.input.config


def test_show_prints_the_blocked_loop_nest():
    shown = CliRunner().invoke(app, ["show", "conv2d", *[f"{k}={v}" for k, v in RESNET_BLOCK.items()]])
    assert shown.exit_code == 0
    assert "# stage pack_weight (constant" in shown.output and "# stage pack_data" in shown.output
    assert "fma(Dp[" in shown.output and "Wk[" in shown.output
