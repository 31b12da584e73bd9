"""Attention's softmax, with the scale and the additive mask before it, as one call of workers/llvm_softmax's kernel.

Between a graph's tuned products, softmax(s·c + mask) over the last dimension was Inductor's: a kernel whose
exponential (Sleef's) and scale (three divisions an element) made it 142-145 µs of a BERT layer's forward on a Zen 4
(12 × 128 × 128 scores, float32 or bfloat16, 2 threads), against 48-63 µs for this kernel alone. A softmax whose
input is `s / c`, `s · c`, `s + mask` or `s · c + mask` (c a number; the mask a tensor of the scores' dtype whose
last dimension is theirs, broadcast over the others as it likes) reads s, c and the mask itself, where nothing else
reads the nodes between. Only where nothing differentiates it (its gradient is PyTorch's), its last size is static,
and the target is a CPU; a mask only where the scores have at most four dimensions.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from search_space import Target
from workers.llvm_softmax import DTYPES, softmax_kernel
from workers.torch_arrays import dtype_name

from .patterns import ADD, MUL, argument, calls, same_shape, same_size
from .rewrites import value_of

SOFTMAX = {torch.softmax, torch.nn.functional.softmax, torch.special.softmax}
SAFE_SOFTMAX = {torch.ops.aten._safe_softmax.default}  # scaled_dot_product_attention's, written out with a mask
DIVIDE = {operator.truediv, torch.div, torch.true_divide}
LONGEST_ROW = 8192  # the kernel keeps a row's exponentials on its stack: 32 KiB at most


class SoftmaxOp(torch.nn.Module):
    """softmax(x·scale + bias) over the last dimension, `bias` an activation where `biased`; what Inductor needs of
    an opaque op (frontend.inductor.Opaque): called with its activations, or into a buffer Inductor allocated."""

    grads = ()  # nothing differentiates it
    memory_format = torch.contiguous_format

    def __init__(self, n: int, dtype: torch.dtype, scale: float, safe: bool, biased: bool, target: Target):
        super().__init__()
        self.dtype, self.scale, self.biased = dtype, float(scale), biased
        self.kernel = softmax_kernel(n, str(dtype).removeprefix("torch."), target, safe, biased)
        self.layouts: dict[tuple, tuple] = {}  # (x's shape, bias's shape and strides) → the call's sizes and strides

    def result_shape(self, x: torch.Tensor, *bias: torch.Tensor) -> tuple:
        return tuple(x.shape)

    def forward(self, x: torch.Tensor, *bias: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=self.dtype)
        self.into([x, *bias], out)
        return out

    def into(self, activations: list[torch.Tensor], out: torch.Tensor) -> None:
        x, *bias = activations
        x = x if x.is_contiguous() else x.contiguous()
        if not self.biased:
            self.kernel.call(x.data_ptr(), 0, out.data_ptr(), x.numel() // self.kernel.n, self.scale, 1, 1, 0, 0, 0)
            return
        mask = bias[0] if bias[0].stride(-1) == 1 else bias[0].contiguous()
        key = (x.shape, mask.shape, mask.stride())
        if (layout := self.layouts.get(key)) is None:
            layout = self.layouts[key] = row_layout(x.shape, mask)
        self.kernel.call(x.data_ptr(), mask.data_ptr(), out.data_ptr(), *layout[:1], self.scale, *layout[1:])

    def extra_repr(self) -> str:
        return f"n={self.kernel.n}, scale={self.scale}, biased={self.biased}, safe={self.kernel.safe}"


def row_layout(shape: torch.Size, mask: torch.Tensor) -> tuple[int, ...]:
    """The kernel's rows, then the row index's last two sizes and the mask's stride for each of the three (0 where
    it is broadcast): scores of shape [..., n] as [d0, d1, d2, n]."""
    sizes = [1] * (4 - len(shape)) + list(shape)
    strides = [0] * (4 - len(shape)) + list(mask.expand(shape).stride())
    return sizes[0] * sizes[1] * sizes[2], sizes[1], sizes[2], *strides[:3]


def is_softmax(node: fx.Node) -> bool:
    """A softmax over the last dimension in the scores' own dtype."""
    if not (calls(node, SOFTMAX, ("softmax",)) or calls(node, SAFE_SOFTMAX)):
        return False
    if argument(node, 3 if node.target is torch.nn.functional.softmax else 2, "dtype") is not None:
        return False
    value, dim = value_of(node), argument(node, 1, "dim")
    return value is not None and isinstance(dim, int) and dim in (-1, value.dim() - 1)


def binary(node, targets: set, methods: tuple[str, ...]) -> tuple | None:
    """The two operands of a call of one of `targets` (no keywords: no alpha, no rounding mode) whose result nothing
    but the softmax's chain reads."""
    if isinstance(node, fx.Node) and calls(node, targets, methods) and len(node.users) == 1 and len(node.args) == 2 \
            and not node.kwargs:
        return node.args
    return None


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def absorbed(node: fx.Node) -> tuple[fx.Node, float, fx.Node | None, list[fx.Node]]:
    """What the softmax at `node` reads through `s·c + mask` (or `s / c`): s, c, the mask and the nodes it replaces."""
    x, scale, mask, nodes = argument(node, 0, "input", "self"), 1.0, None, [node]
    result = value_of(node)
    if (operands := binary(x, ADD, ("add",))) is not None and result.dim() <= 4:
        values = [value_of(operand) for operand in operands]
        if all(value is not None and value.dtype == result.dtype for value in values):
            scores, bias = operands if same_shape(values[0].shape, result.shape) else operands[::-1]
            last = same_size(value_of(bias).shape[-1], result.shape[-1])
            if last and same_shape(value_of(scores).shape, result.shape):
                x, mask, nodes = scores, bias, [x, *nodes]
    if (operands := binary(x, DIVIDE, ("div",))) is not None and is_number(operands[1]) and operands[1]:
        x, scale, nodes = operands[0], 1.0 / operands[1], [x, *nodes]
    elif (operands := binary(x, MUL, ("mul",))) is not None and any(map(is_number, operands)):
        number, tensor = operands if is_number(operands[0]) else operands[::-1]
        if isinstance(tensor, fx.Node):
            x, scale, nodes = tensor, float(number), [x, *nodes]
    return x, scale, mask, nodes


def fuse_softmaxes(module: fx.GraphModule, target: Target) -> None:
    """Each softmax of the graph the kernel can compute replaced by a call of its SoftmaxOp (`softmax_N` modules)."""
    if target.kind != "llvm":
        return
    graph, count = module.graph, 0
    for node in list(graph.nodes):
        if not is_softmax(node):
            continue
        value = value_of(node)
        n = value.shape[-1]
        if value.requires_grad or dtype_name(value) not in DTYPES or not isinstance(n, int) or not 0 < n <= LONGEST_ROW:
            continue
        x, scale, mask, nodes = absorbed(node)
        if value_of(x) is None or value_of(x).dtype != value.dtype:
            continue
        name = f"softmax_{count}"
        count += 1
        module.add_submodule(name, SoftmaxOp(n, value.dtype, scale, calls(node, SAFE_SOFTMAX), mask is not None,
                                             target))
        with graph.inserting_before(node):
            call = graph.call_module(name, (x,) if mask is None else (x, mask))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        for replaced in reversed(nodes):
            graph.erase_node(replaced)
    if count:
        graph.lint()
        module.recompile()
