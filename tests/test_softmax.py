"""Attention's softmax as one kernel (workers/llvm_softmax.py), and the graphs whose softmax, scale and mask it
takes (frontend/softmax.py)."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frontend.capture import capture
from frontend.softmax import SoftmaxOp, fuse_softmaxes
from search_space import Target
from tests.compile_helpers import compiled
from workers.llvm_softmax import softmax_kernel, vector_width

HOST = Target.parse("llvm")


def narrowed(*prefixes: str, threads: int = 2) -> Target:
    """The host target without the vector features starting with `prefixes`, on `threads` threads."""
    features = tuple(f for f in HOST.features if not f.startswith(prefixes))
    return dataclasses.replace(HOST, features=features, threads=threads)


# every vector width this host has (16, 8 and 4 lanes on AVX-512), on one thread and on three (rows split unevenly)
TARGETS = sorted({vector_width(t.features): t for t in (narrowed("avx512"), narrowed("avx", "fma"), HOST)}.items())
TARGETS = [t for _, t in TARGETS] + [narrowed(threads=1), narrowed(threads=3)]


def softmax(x: torch.Tensor, scale: float, target: Target, mask: torch.Tensor | None = None, safe=False):
    """The kernel on `x` (its last dimension), as SoftmaxOp calls it."""
    op = SoftmaxOp(x.shape[-1], x.dtype, scale, safe, mask is not None, target)
    return op(x, *(() if mask is None else (mask,)))


def close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """float32 to 1e-6; bfloat16 to one unit in the last place of a value ≤ 1 (2⁻⁸), both rounded from float32."""
    return got.dtype == expected.dtype and torch.allclose(got.float(), expected.float(), rtol=0,
                                                          atol=1e-6 if got.dtype == torch.float32 else 2 ** -8)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"{vector_width(t.features)}-lanes-{t.threads}-threads")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_kernel_computes_torchs_softmax_at_any_row_length(target, dtype):
    """Rows shorter than a vector, of whole vectors, and with a tail; scaled; large values (no overflow)."""
    torch.manual_seed(0)
    for shape in [(3, 1), (2, 5, 7), (1, 12, 16, 16), (4, 33), (2, 3, 9, 129), (5, 1000)]:
        x = (torch.randn(shape) * 30).to(dtype)
        expected = torch.softmax(x.float() * 0.125, -1).to(dtype)
        assert close(softmax(x, 0.125, target), expected), shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("mask_shape", [(2, 1, 1, 40), (1, 1, 6, 40), (6, 40), (2, 3, 6, 40)],
                         ids=["keys", "rows", "2-d", "whole"])
def test_a_mask_broadcast_any_way_is_added_and_hides_what_it_hides(dtype, mask_shape):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 40).to(dtype)
    mask = torch.randn(mask_shape).to(dtype)
    mask[..., 30:] = float("-inf")
    got = softmax(x, 0.5, narrowed(), mask)
    assert close(got, torch.softmax(x.float() * 0.5 + mask.float(), -1).to(dtype))
    assert (got[..., 30:] == 0).all()


def test_a_row_hidden_whole_is_nan_as_torch_gives_it_or_zeros_where_safe():
    """torch.softmax gives a row of −inf NaN; aten's _safe_softmax, what scaled_dot_product_attention gives, zeros.
    A NaN in a row makes that row NaN and no other."""
    x, mask = torch.randn(2, 1, 4, 24), torch.zeros(2, 1, 1, 24)
    mask[1] = float("-inf")
    x[0, 0, 2, 5] = float("nan")
    plain, safe = softmax(x, 1.0, HOST, mask), softmax(x, 1.0, HOST, mask, safe=True)
    expected = torch.softmax(x + mask, -1)
    assert torch.equal(plain.isnan(), expected.isnan()) and plain[1].isnan().all()
    assert (safe[1] == 0).all() and torch.equal(safe[0].nan_to_num(), plain[0].nan_to_num())
    assert torch.allclose(plain[0].nan_to_num(), expected[0].nan_to_num(), atol=1e-6)


def test_each_kernel_is_built_once_a_process():
    assert softmax_kernel(96, "float32", HOST, False, True) is softmax_kernel(96, "float32", HOST, False, True)
    with pytest.raises(ValueError, match="dtype int8"):
        softmax_kernel(96, "int8", HOST, False, False)


class Scores(nn.Module):
    """softmax(q·kᵀ / √d)·v, as BERT's layers write it, with an optional additive mask."""

    def forward(self, q, k, v, *mask):
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.matmul((scores + mask[0] if mask else scores).softmax(-1), v)


def ops_of(module: nn.Module) -> list[SoftmaxOp]:
    return [child for child in module.children() if isinstance(child, SoftmaxOp)]


@pytest.mark.parametrize("masked", [False, True], ids=["scaled", "scaled-and-masked"])
def test_the_softmax_takes_the_scale_and_the_mask_before_it(masked):
    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 8, 16), torch.randn(2, 3, 8, 16), torch.randn(2, 3, 8, 16))
    inputs += (torch.randn(2, 1, 1, 8),) if masked else ()
    [captured] = capture(Scores(), inputs)
    fuse_softmaxes(captured.graph, HOST)
    [op] = ops_of(captured.graph)
    assert op.scale == 0.25 and op.biased == masked
    names = [str(node.target) for node in captured.graph.graph.nodes if node.op != "placeholder"]
    assert not any(name in ("softmax", "<built-in function truediv>", "<built-in function add>") for name in names)
    assert torch.allclose(captured.graph(*captured.inputs)[0], Scores()(*inputs), atol=1e-6)


class Unfusable(nn.Module):
    """Softmaxes the kernel does not take: over another dimension, into another dtype, and one whose scaled scores
    something else reads too (the scaling stays, the softmax reads its result)."""

    def forward(self, x):
        scaled = x * 0.5
        return x.softmax(1), torch.softmax(x, -1, dtype=torch.float64), scaled.softmax(-1) + scaled


def test_a_softmax_the_kernel_cannot_compute_stays_pytorchs():
    x = torch.randn(2, 4, 8)
    [captured] = capture(Unfusable(), (x,))
    fuse_softmaxes(captured.graph, HOST)
    [op] = ops_of(captured.graph)
    assert op.scale == 1.0
    assert sum(node.target == "softmax" for node in captured.graph.graph.nodes) == 1
    results = zip(captured.graph(*captured.inputs), Unfusable()(x))
    assert all(torch.allclose(got, expected, atol=1e-6) for got, expected in results)
    fuse_softmaxes(captured.graph, Target.parse("cuda -arch=sm_80"))  # not a CPU: nothing more replaced
    assert len(ops_of(captured.graph)) == 1


def test_a_softmax_whose_gradient_is_needed_stays_pytorchs():
    x = torch.randn(2, 4, 8, requires_grad=True)
    [captured] = capture(Unfusable(), (x,), grad=True)
    fuse_softmaxes(captured.graph, HOST)
    assert ops_of(captured.graph) == []


class Attention(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, mask)


@pytest.mark.parametrize("graph", ["eager", "inductor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_a_compiled_attention_computes_sdpa_with_its_hidden_row_zero(graph, dtype, tmp_path):
    """scaled_dot_product_attention written out (frontend/rewrites.py): its boolean mask a bias, its softmax the
    safe one, here the kernel, in both graph modes."""
    torch.manual_seed(0)
    hidden = torch.zeros(2, 1, 5, 7, dtype=torch.bool)
    hidden[:, :, 1], hidden[1, :, :, 4:] = True, True
    inputs = tuple(torch.randn(shape).to(dtype) for shape in [(2, 3, 5, 16), (2, 3, 7, 16), (2, 3, 7, 8)])
    inputs += (~hidden,)
    with torch.inference_mode():
        expected = Attention()(*inputs)
        got = compiled(Attention(), f"sqlite:///{tmp_path}/empty.db", graph)(*inputs)
    assert not expected.isnan().any() and (got[:, :, 1] == 0).all()
    assert torch.allclose(got.float(), expected.float(), atol=1e-5 if dtype == torch.float32 else 2e-2)
