"""int8 kernels: uint8 × int8 summed in int32, exactly, for every config of the int8 spaces on awkward shapes; dense
and conv2d dequantized as PyTorch's quantized linear and convolution do; each instruction family (bytes widened, or VNNI's vpdpbusd) chosen
from the target's features, emitting its instructions on every host (assembly) and run where the host has it."""
import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from typer.testing import CliRunner

from db import Database
from frontend import extract_tasks
from frontend.quantized import traceable

from search_space import (NoTemplate, Target, Workload, batch_matmul, conv2d, dense, fallback_config, get_space,
                          matmul)
from search_space.templates.gemm import isas
from service.cli import app as cli
from workers import build
from workers.reference import head_to_head, inference_call, reference_calls
from tests.compile_helpers import compiled
from tests.test_cli_model import MODEL_FILE, run
from tests.isa_helpers import (HOST, PROPERTY, check, workloads, zen4)

AVX512_VNNI = zen4("avx512vnni")


@PROPERTY
@given(workloads("int8", ("matmul", "dense", "batch_matmul", "conv2d")), st.integers(0, 2**31 - 1))
def test_every_config_of_an_int8_space_computes_the_exact_reference(workload, pick):
    space = get_space(workload, HOST)
    check(workload, HOST, space.get(pick % space.size))


def test_the_operands_and_the_output_of_each_op():
    assert [(name, dense(2, 3, 4, bias=True, dtype="int8").operand_dtype(name)) for name, _ in
            dense(2, 3, 4, bias=True, dtype="int8").operand_shapes()] == [
        ("X", "uint8"), ("W", "int8"), ("bias", "float32"), ("x_scale", "float32"), ("x_zero", "int32"),
        ("w_scale", "float32")]
    assert dense(2, 3, 4, dtype="int8").output_dtype == "float32"
    assert matmul(2, 3, 4, dtype="int8").output_dtype == batch_matmul(1, 2, 3, 4, dtype="int8").output_dtype == "int32"
    assert dense(2, 3, 4, dtype="int8").weight_names() == ("W", "w_scale")
    conv = conv2d(1, 3, 8, 8, 5, 3, 3, 1, 1, bias=True, residual=True, dtype="int8")
    assert [(name, shape, conv.operand_dtype(name)) for name, shape in conv.operand_shapes()] == [
        ("data", (1, 3, 8, 8), "uint8"), ("weight", (5, 3, 3, 3), "int8"), ("bias", (5,), "float32"),
        ("residual", (1, 5, 8, 8), "float32"), ("x_scale", (1,), "float32"), ("x_zero", (1,), "int32"),
        ("w_scale", (5,), "float32")]
    assert conv.output_dtype == "float32" and conv.weight_names() == ("weight", "bias", "w_scale")
    assert Workload.from_key("matmul(M=4,N=4,K=4,dtype=int8)") == matmul(4, 4, 4, dtype="int8")


def test_sums_beyond_float32_precision_are_exact():
    """255 · 127 · 3072 = 99,486,720 > 2^24: a float32 sum would be off; the int32 sum is exact in both families
    (and an int32 sum one off fails the check)."""
    workload = matmul(8, 48, 3072, dtype="int8")
    a = np.full((8, 3072), 255, np.uint8)
    b = np.full((3072, 48), 127, np.int8)
    b[::2] = -128
    expected = workload.reference(a, b)
    assert expected[0, 0] == 255 * (127 - 128) * 1536 and expected.dtype == np.int32
    for isa in isas(HOST, "int8"):
        config = get_space(workload, HOST).nearest(dict(fallback_config(workload, HOST).values) | {"isa": isa})
        assert np.array_equal(build(workload, HOST, config)(a, b), expected), isa
    assert workload.max_error(expected + np.int32(1), expected) > 1 >= workload.max_error(expected, expected)
    big = matmul(8, 48, 3072, dtype="int8")
    a, b = big.random_inputs(seed=1)
    assert np.array_equal(build(big, HOST)(a, b), big.reference(a, b))


def test_a_bound_dense_dequantizes_each_call_with_its_own_scale_and_zero_point():
    """The weights' row sums are taken once, when W is bound; each call brings the activations' scale and zero
    point, as PyTorch's dynamic quantization does per batch."""
    workload = dense(17, 40, 99, bias=True, epilogue="relu", dtype="int8")
    x, w, bias, x_scale, x_zero, w_scale = workload.random_inputs(seed=5)
    bound = build(workload, HOST).bind(W=w, bias=bias, w_scale=w_scale)
    for scale, zero in ((x_scale, x_zero), (x_scale * 3, np.array([0], np.int32)), (x_scale, np.array([255], np.int32))):
        out = bound(x, scale, zero)
        assert workload.max_error(out, workload.reference(x, w, bias, scale, zero, w_scale)) <= 1
    assert np.any(out > 0) and np.all(out >= 0)  # relu, and not all zero


def test_dense_matches_pytorchs_quantized_linear():
    """The same uint8 activations and per-channel int8 weights through torch.ops.quantized.linear_dynamic's
    quantized arithmetic: PyTorch's dequantized float32 result is ours. The activations in 7 bits (a reduced range),
    as PyTorch's x86 reduce_range keeps them: without VNNI, fbgemm (vpmaddubsw) saturates sums of product pairs in
    int16."""
    workload = dense(16, 24, 64, bias=True, dtype="int8", reduce_range=True)
    x, w, bias, x_scale, x_zero, w_scale = workload.random_inputs(seed=7)
    assert x.max() <= 127 and x.max() > 100 and 0 <= x_zero[0] <= 127
    qw = torch._make_per_channel_quantized_tensor(torch.from_numpy(w), torch.from_numpy(w_scale.astype(np.float64)),
                                                  torch.zeros(24, dtype=torch.int64), 0)
    packed = torch.ops.quantized.linear_prepack(qw, torch.from_numpy(bias))
    qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(x), float(x_scale[0]), int(x_zero[0]))
    theirs = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(qx.dequantize(), float(x_scale[0]),
                                                                               int(x_zero[0]), packed)
    ours = build(workload, HOST)(x, w, bias, x_scale, x_zero, w_scale)
    assert np.allclose(ours, theirs.numpy(), atol=1e-4, rtol=1e-5)


def test_a_bound_conv2d_pads_with_each_calls_zero_point():
    """conv2d's padding is the zero point a call brings (the quantized 0.0): at x_zero 0 and 255 alike the padded
    border computes what a float32 convolution of the dequantized image with zero padding does; the weights'
    sums are taken once, when they are bound."""
    workload = conv2d(1, 5, 9, 8, 6, 3, 3, 2, 2, bias=True, epilogue="relu", dtype="int8")
    data, weight, bias, x_scale, x_zero, w_scale = workload.random_inputs(seed=4)
    bound = build(workload, HOST).bind(weight=weight, bias=bias, w_scale=w_scale)
    for zero in (0, 255, int(x_zero[0])):
        zero = np.array([zero], np.int32)
        out = bound(data, x_scale, zero)
        wide = conv2d(1, 5, 9, 8, 6, 3, 3, 2, 2, bias=True, epilogue="relu")
        dequantized = (data.astype(np.float32) - zero) * x_scale
        expected = wide.reference(dequantized, weight * w_scale[:, None, None, None], bias)
        assert np.allclose(out, expected, atol=1e-4, rtol=1e-5), zero
    assert np.any(out > 0) and np.all(out >= 0)


def test_conv2d_matches_pytorchs_quantized_convolution():
    """The same activations and per-channel weights through torch.ops.quantized.conv2d: its output, requantized
    to a step of s, is ours to within s/2 (7-bit activations, as for dense: fbgemm's AVX2 path saturates)."""
    workload = conv2d(1, 16, 10, 10, 24, 3, 3, 1, 1, bias=True, dtype="int8")
    data, weight, bias, x_scale, x_zero, w_scale = workload.random_inputs(seed=8)
    data, x_zero = data // 2, x_zero // 2
    ours = build(workload, HOST)(data, weight, bias, x_scale, x_zero, w_scale)
    qw = torch._make_per_channel_quantized_tensor(torch.from_numpy(weight),
                                                  torch.from_numpy(w_scale.astype(np.float64)),
                                                  torch.zeros(24, dtype=torch.int64), 0)
    packed = torch.ops.quantized.conv2d_prepack(qw, torch.from_numpy(bias), [1, 1], [1, 1], [1, 1], 1)
    qx = torch._make_per_tensor_quantized_tensor(torch.from_numpy(data), float(x_scale[0]), int(x_zero[0]))
    step = float(np.abs(ours).max()) / 100
    theirs = torch.ops.quantized.conv2d(qx, packed, step, 128).dequantize().numpy()
    assert np.abs(ours - theirs).max() <= step / 2 * 1.001 and np.abs(ours).max() > 0.1


def test_int8_is_refused_where_no_template_computes_it():
    with pytest.raises(NoTemplate, match="computes in float32, not int8"):
        get_space(dense(64, 64, 64, dtype="int8"), Target.parse("cuda -arch=sm_90"))


@pytest.mark.parametrize("workload", [dense(32, 64, 96, dtype="int8"), matmul(32, 64, 96, dtype="int8"),
                                      batch_matmul(2, 32, 64, 96, dtype="int8"),
                                      conv2d(1, 16, 14, 14, 16, 3, 3, 1, 1, True, True, "relu", dtype="int8"),
                                      conv2d(1, 8, 9, 9, 8, 3, 3, epilogue="gelu", dtype="int8")])
def test_pytorchs_int8_runs_beside_ours(workload):
    """bench kernels' and tune's reference: PyTorch in int8 on the same inputs (the weights prepacked)."""
    inputs = workload.random_inputs()
    ours, out = inference_call(build(workload, HOST), inputs)
    calls = reference_calls(workload, 1, inputs)
    seconds = head_to_head({"tensortune": ours} | calls, 1, rounds=1, min_repeat_ms=1, settle_seconds=0)
    assert set(seconds) == {"tensortune", "torch"} and all(s > 0 for s in seconds.values())
    assert workload.max_error(out, workload.reference(*inputs)) <= 1


def test_an_int8_workload_is_tuned_from_the_command_line_and_shown(tmp_path):
    tuned = CliRunner().invoke(cli, ["tune", "dense", "M=16", "N=32", "K=48", "dtype=int8", "--trials", "4", "--tuner",
                                     "random", "--target", "llvm -threads=1", "--db", f"sqlite:///{tmp_path}/t.db"])
    assert tuned.exit_code == 0, tuned.output
    assert "alternately with PyTorch int8's" in tuned.output
    shown = CliRunner().invoke(cli, ["show", "dense", "M=16", "N=32", "K=48", "dtype=int8", "--target", str(AVX512_VNNI)])
    assert shown.exit_code == 0 and "isa=avx512vnni" in shown.output and "dot4_vnni(X[" in shown.output, shown.output


def tiny_quantized(per_channel: bool = False) -> tuple[nn.Module, nn.Module]:
    """A float32 model and quantize_dynamic's int8 copy of it (weights scaled per tensor, or per channel)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig} if per_channel else {nn.Linear}
    return model, torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)


@pytest.mark.parametrize("per_channel, graph", [(False, "inductor"), (True, "eager")])
def test_a_dynamically_quantized_model_runs_on_int8_kernels(per_channel, graph, tmp_path, caplog):
    """extract_tasks finds its int8 dense layers (the relu fused), of a reduced range; compiled, each size it is
    called at runs on int8 kernels computing what the traceable model's quantized linear computes in PyTorch, and
    what PyTorch's own quantized model computes: the activations quantized to its 128 levels."""
    model, quantized = tiny_quantized(per_channel)
    x = torch.randn(4, 16)
    with torch.inference_mode():
        assert [task.workload for task in extract_tasks(quantized, (x,))] == [
            dense(4, 32, 16, bias=True, epilogue="relu", dtype="int8", reduce_range=True),
            dense(4, 8, 32, bias=True, dtype="int8", reduce_range=True)]
        exact = traceable(quantized)
        forward = compiled(exact, f"sqlite:///{tmp_path}/q.db", graph)
        for rows in (4, 6, 9):  # the third call's graph is symbolic in the rows
            x = torch.randn(rows, 16)
            ours = forward(x)
            assert ours.dtype == torch.float32 and torch.allclose(ours, exact(x), atol=1e-5), rows
            assert torch.allclose(ours, quantized(x), atol=1e-5), rows
            assert (ours - model(x)).abs().max() > 1e-4  # quantized, not float32's result
    assert "run in PyTorch" not in caplog.text


class ThreeHeads(nn.Module):
    """Q, K (no bias) and V of one activation, and a layer reading what they make."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.out = nn.Linear(16, 8), nn.Linear(16, 8, bias=False), nn.Linear(16, 24), nn.Linear(8, 16)

    def forward(self, x):
        return self.out(self.q(x) * self.k(x) + self.v(x)[..., :8])


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_int8_layers_quantizing_one_activation_are_one_dense(graph, tmp_path, caplog):
    """quantize_dynamic's Q, K and V: their activation quantized once, one int8 dense of their weights concatenated
    (N = 8 + 8 + 24, K's missing bias zero), computing what the traceable model's three layers compute in PyTorch."""
    torch.manual_seed(1)
    quantized = torch.ao.quantization.quantize_dynamic(ThreeHeads().eval(), {nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, 5, 16)
    with torch.inference_mode():
        assert sorted(task.workload.key for task in extract_tasks(quantized, (x,))) == sorted(
            [dense(10, 40, 16, bias=True, dtype="int8", reduce_range=True).key,
             dense(10, 16, 8, bias=True, dtype="int8", reduce_range=True).key])
        exact = traceable(quantized)
        forward = compiled(exact, f"sqlite:///{tmp_path}/q.db", graph)
        assert torch.allclose(forward(x), exact(x), atol=1e-5)
    assert "run in PyTorch" not in caplog.text


def test_only_symmetric_int8_weights_are_taken():
    layer = torch.ao.nn.quantized.dynamic.Linear(16, 8)
    layer.set_weight_bias(torch.quantize_per_tensor(torch.randn(8, 16), 0.1, 3, torch.qint8), None)
    with pytest.raises(ValueError, match="1: tensortune's int8 kernels take symmetric weights"):
        traceable(nn.Sequential(nn.ReLU(), layer))


def test_tune_model_and_bench_model_in_int8(tmp_path):
    """`--dtype int8`: the model's Linears quantized by quantize_dynamic, its int8 tasks tuned as a job of their own;
    bench model times PyTorch's int8 model against tensortune's and says how far each is from the float32 model."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    db = f"sqlite:///{tmp_path}/t.db"
    tuned = run("tune-model", "models.py:tiny", "--trials", "8", "--tuner", "random", "--dtype", "int8", "--target",
                "llvm -threads=1", "--db", db, "--rounds", "1", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert {job.workload for job in Database(db).children(1)} == {
        dense(4, 32, 16, bias=True, epilogue="relu", dtype="int8", reduce_range=True),
        dense(4, 8, 32, bias=True, dtype="int8", reduce_range=True)}
    timed = run("bench", "model", "models.py:tiny", "--json", "--dtype", "int8", "--db", db, "--target",
                "llvm -threads=1", "--rounds", "1", cwd=tmp_path)
    assert timed.returncode == 0, timed.stderr
    row = json.loads(timed.stdout.strip().splitlines()[-1])
    assert row["dtype"] == "int8" and row["tensortune_ms"] > 0 and "inductor_ms" not in row
    assert 0 < row["tensortune_float32_error"] <= 1.5 * row["eager_float32_error"], row
