"""Graph rewrites before matching, so that the matchers of patterns.py find more of a model's work.

scaled_dot_product_attention becomes its two batch matmuls with the scale, mask and softmax between them;
linear layers reading one activation become one dense with their weights concatenated (Q, K and V), and so do
int8 linear layers quantizing one activation (frontend.quantized: it is then quantized once); baddbmm
becomes a bmm with its scaling and add beside it, and so does an addmm autograd differentiates (an mm: its
trained weight is an operand, passed at each call). Each rewritten graph computes what the original does when
PyTorch runs it, so a node no matcher takes stays correct. New nodes get their `example_value` by running
their op on the inputs' fake values in the graph's fake mode (sizes may be symbolic: nothing here asks the
shape environment, which would add guards Dynamo no longer checks). Rewriting twice changes nothing more.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx
from torch._subclasses import FakeTensor

from workers.torch_arrays import dtype_name, torch_tensor

from .capture import Captured
from .patterns import (ADDMM, LINEAR, QUANTIZED_LINEAR, Scan, argument, calls, constant, fused_activation,
                       requires_grad, same_shape)
from .quantized import quantize_activation

ATTENTION = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
VIEW_METHODS = {"view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "unflatten", "expand",
                "narrow", "select", "t", "__getitem__"}  # of a tensor whose result may be a view of it
VIEW_FUNCTIONS = {torch.transpose, torch.permute, torch.reshape, torch.unsqueeze, torch.squeeze, torch.flatten,
                  torch.narrow, torch.select, torch.t, operator.getitem}
BADDBMM = {torch.baddbmm}


class Editor:
    """Inserts calls into a graph with the meta the matchers read: a fake example value and the module stack."""

    def __init__(self, captured: Captured, mode):
        self.captured, self.graph, self.mode = captured, captured.graph.graph, mode
        self.biases: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}  # of each boolean attention mask, by dtype

    def call(self, target, args: tuple, like: fx.Node, kwargs: dict | None = None, stack: dict | None = None):
        """A call of `target` inserted at the graph's insertion point, with `like`'s module stack (or `stack`),
        differentiable as far as `like` was."""
        node = self.graph.call_function(target, args, kwargs or {})
        node.meta["nn_module_stack"] = stack if stack is not None else like.meta.get("nn_module_stack", {})
        node.meta["stack_trace"] = like.meta.get("stack_trace")
        fake_args, fake_kwargs = fx.node.map_arg((args, kwargs or {}), lambda arg: arg.meta["example_value"])
        grad = getattr(like.meta.get("example_value"), "requires_grad", False)
        with self.mode, torch.set_grad_enabled(grad):
            node.meta["example_value"] = target(*fake_args, **fake_kwargs)
        return node

    def attribute(self, name: str, value: torch.Tensor, sources: list[fx.Node]) -> fx.Node:
        """A tensor the graph module holds from now on, read by a get_attr node, computed from the model's tensors
        `sources` read."""
        self.captured.graph.register_buffer(name, value)
        node = self.graph.get_attr(name)
        self.captured.derived[node] = sources
        node.meta["example_value"] = self.mode.from_tensor(value, static_shapes=True)
        return node

    def replace(self, old: fx.Node, new: fx.Node):
        old.replace_all_uses_with(new)
        self.graph.erase_node(old)

    def refresh_views(self, node: fx.Node):
        """Trace anew the views read from `node` (and from them) after it changed: a fused layer's part is a view
        of the fused result where the layer's result was a tensor of its own, and the batch_matmul matcher reads
        the strides of attention's heads split from it."""
        for reader in node.users:
            method = reader.op == "call_method" and reader.target in VIEW_METHODS
            if not (method or reader.op == "call_function" and reader.target in VIEW_FUNCTIONS):
                continue
            args, kwargs = fx.node.map_arg((reader.args, reader.kwargs), lambda arg: arg.meta["example_value"])
            with self.mode:
                reader.meta["example_value"] = getattr(args[0], reader.target)(*args[1:], **kwargs) if method else \
                    reader.target(*args, **kwargs)
            self.refresh_views(reader)


def value_of(node) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def number(value):
    """A number argument, or its example value where Dynamo made it a graph input (a SymFloat)."""
    return value.meta.get("example_value") if isinstance(value, fx.Node) else value


@torch.library.custom_op("tensortune::attention_bias", mutates_args=())
def attention_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask as the bias SDPA's math adds to the scores: 0 where kept, -inf where masked. An
    operator of its own, so that Inductor makes it once a forward, a buffer every layer's softmax reads at vector
    speed: written out, the mask's expression (transformers builds it from aranges) fused into each softmax and was
    computed anew in each of its passes (BERT-base's 12 × 200 × 200 scores on a Zen 3: 2.1 ms a softmax so, 0.57
    from a float bias)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), -math.inf)


@attention_bias.register_fake
def _(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return mask.new_empty(mask.shape, dtype=dtype)


def expand_attention(node: fx.Node, edit: Editor):
    """softmax(q·kᵀ·scale + mask)·v written out, so both products become batch_matmul tasks. Only what the
    matmul matcher can take: no dropout, q, k and v of one dtype it computes in and of equal batch dimensions (GQA and broadcast
    heads stay fused). The softmax is aten's _safe_softmax where a mask may mask a whole row: SDPA gives
    such a row zeros, not NaN."""
    q, k, v = argument(node, 0, "query"), argument(node, 1, "key"), argument(node, 2, "value")
    mask, dropout = argument(node, 3, "attn_mask"), argument(node, 4, "dropout_p", default=0.0)
    causal, scale = argument(node, 5, "is_causal", default=False), argument(node, 6, "scale")
    values = [value_of(operand) for operand in (q, k, v)]
    if dropout != 0 or argument(node, 7, "enable_gqa", default=False) or causal not in (False, True):
        return
    if any(value is None or dtype_name(value) is None or value.dtype != values[0].dtype for value in values):
        return
    batch = [value.shape[:-2] for value in values]
    if not (same_shape(*batch[:2]) and same_shape(*batch[1:])) or not isinstance(values[0].shape[-1], int):
        return
    mask_value = value_of(mask)
    if mask is not None and (causal or mask_value is None or mask_value.dtype not in (torch.bool, values[0].dtype)):
        return  # SDPA raises on a mask with is_causal; other mask types stay fused
    if not isinstance(number(scale), (int, float, torch.SymFloat, type(None))):
        return
    scale = 1 / math.sqrt(values[0].shape[-1]) if scale is None else scale
    with edit.graph.inserting_before(node):
        scores = edit.call(torch.matmul, (q, edit.call(torch.transpose, (k, -2, -1), node)), node)
        scores = edit.call(operator.mul, (scores, scale), node) if scale != 1 else scores
        if causal:  # the top-left lower triangle, as SDPA aligns it when L ≠ S
            above = edit.call(torch.triu, (edit.call(torch.full_like, (scores, -math.inf), node), 1), node)
            scores = edit.call(torch.add, (scores, above), node)
        elif mask_value is not None and mask_value.dtype == torch.bool:
            key = (mask, values[0].dtype)
            if key not in edit.biases:  # one bias a mask, made before its first reader
                edit.biases[key] = edit.call(torch.ops.tensortune.attention_bias.default, key, node)
            scores = edit.call(torch.add, (scores, edit.biases[key]), node)
        elif mask is not None:
            scores = edit.call(torch.add, (scores, mask), node)
        softmax = torch.ops.aten._safe_softmax.default if mask is not None else torch.softmax
        result = edit.call(torch.matmul, (edit.call(softmax, (scores, -1), node), v), node)
    edit.replace(node, result)


def split_scaled_product(node: fx.Node, edit: Editor, product):
    """beta·input + alpha·(first @ second), baddbmm's or addmm's, as the `product` (bmm or mm) the matmul
    matcher takes, the rest beside it. With beta 0 the input is not read, as they ignore its NaN and inf."""
    base, first, second = (argument(node, 0, "input"), argument(node, 1, "batch1", "mat1"),
                           argument(node, 2, "batch2", "mat2"))
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    first_value, result = value_of(first), value_of(node)
    if len(node.args) != 3 or set(node.kwargs) - {"beta", "alpha"} or first_value is None or result is None:
        return
    if dtype_name(first_value) is None or not all(isinstance(factor, (int, float)) for factor in (beta, alpha)):
        return
    if result.dtype != first_value.dtype:
        return  # under autocast: the product written here would be traced in the operands' dtype
    with edit.graph.inserting_before(node):
        result = edit.call(product, (first, second), node)
        result = edit.call(operator.mul, (result, alpha), node) if alpha != 1 else result
        if beta != 0:
            base = edit.call(operator.mul, (base, beta), node) if beta != 1 else base
            result = edit.call(torch.add, (base, result), node)
    edit.replace(node, result)


def fusable_linears(x: fx.Node, captured: Captured) -> list[tuple[fx.Node, np.ndarray, np.ndarray | None]]:
    """The linear layers reading `x` that one dense may compute together: model-owned weights (and bias, if
    any), no gradient needed (the fused weights are a copy), no relu or gelu epilogue of their own to lose."""
    found, scan = [], Scan(captured)
    for user in x.users:
        if not calls(user, LINEAR) or argument(user, 0, "input") is not x:
            continue
        weight, bias_node = constant(argument(user, 1, "weight"), captured), argument(user, 2, "bias")
        bias = constant(bias_node, captured) if bias_node is not None else None
        if weight is None or weight.ndim != 2 or (bias_node is not None and (bias is None or bias.ndim != 1)):
            continue
        value = value_of(user)
        if value is None or value.requires_grad or fused_activation(user, scan)[1] or dtype_name(value) != str(weight.dtype):
            continue  # under autocast (the result in another dtype than the weight), the fused linear would not be
        found.append((user, weight, bias))
    # one K (else the model fails anyway) and one dtype
    return found if len({(weight.shape[1], weight.dtype) for _, weight, _ in found}) == 1 else []


def common_stack(nodes: list[fx.Node]) -> dict:
    """The module stack the nodes share: their common parent module (encoder.layer.0.attention.self)."""
    stacks = [node.meta.get("nn_module_stack") or {} for node in nodes]
    return {key: entry for key, entry in stacks[0].items() if all(stack.get(key) == entry for stack in stacks)}


def view_safe(reader: fx.Node, width: int) -> bool:
    """Whether `reader` reads a slice [..., :width] of a wider row-major tensor as it read the whole tensor:
    every reader but a view (a view only when it splits the last dimension, or keeps it) and as_strided, and
    the graph's output, which the caller may view as it likes."""
    if reader.op in ("output", "call_module") or (reader.op, reader.target) == ("call_method", "as_strided"):
        return False
    if (reader.op, reader.target) != ("call_method", "view"):
        return True
    product = 1
    for size in reversed(value_of(reader).shape):
        if product == width or not isinstance(size, int):
            break
        product *= size
    return product == width


def fuse_linears(x: fx.Node, edit: Editor) -> bool:
    """One F.linear for the layers of fusable_linears; whether there were two or more."""
    members = fusable_linears(x, edit.captured)
    if len(members) < 2:
        return False
    fuse(members, edit, lambda nodes, weight, bias: edit.call(
        F.linear, (x, weight) + ((bias,) if bias is not None else ()), nodes[0], stack=common_stack(nodes)))
    return True


def constants_read(nodes: list[fx.Node], captured: Captured) -> list[fx.Node]:
    """The nodes' arguments that were read as the model's constant tensors (their weights, biases and scales)."""
    read = set(captured.read)
    arguments = (arg for node in nodes for arg in (*node.args, *node.kwargs.values()))
    return [arg for arg in arguments if isinstance(arg, fx.Node) and arg in read]


def fuse(members: list[tuple[fx.Node, np.ndarray, np.ndarray | None]], edit: Editor, product) -> None:
    """The members' (node, weight, bias) as one `product(nodes, weight, bias)` of their weights and biases (zero where
    a member has none) concatenated, split back along N for their readers. The parts stay views of the fused result
    where every reader takes a view (HF's `.view(b, s, heads, d).transpose(1, 2)` does, and the batch_matmul kernel
    reads such views in place), and are made contiguous where a reader could fail on one (a view merging the last
    dimension)."""
    order = {node: index for index, node in enumerate(edit.graph.nodes)}
    members = sorted(members, key=lambda member: order[member[0]])
    nodes = [node for node, _, _ in members]
    widths = [weight.shape[0] for _, weight, _ in members]
    weight = torch_tensor(np.concatenate([weight for _, weight, _ in members]))
    bias_dtype = np.float32 if members[0][1].dtype == np.int8 else members[0][1].dtype  # int8's biases are float32
    biases = [bias if bias is not None else np.zeros(width, bias_dtype) for (_, _, bias), width in zip(members, widths)]
    has_bias = any(bias is not None for _, _, bias in members)
    sources = constants_read(nodes, edit.captured)
    with edit.graph.inserting_before(nodes[0]):
        bias = edit.attribute(f"fused_{nodes[0].name}_bias", torch_tensor(np.concatenate(biases)),
                              sources) if has_bias else None
        fused = product(nodes, edit.attribute(f"fused_{nodes[0].name}_weight", weight, sources), bias)
        split = edit.call(torch.split, (fused, widths), nodes[0], {"dim": -1})
        parts = [edit.call(operator.getitem, (split, index), node) for index, node in enumerate(nodes)]
        parts = [part if all(view_safe(reader, width) for reader in node.users) else
                 edit.call(torch.Tensor.contiguous, (part,), node) for part, node, width in zip(parts, nodes, widths)]
    for node, part in zip(nodes, parts):
        edit.replace(node, part)
        edit.refresh_views(part)


def quantize_once(graph: fx.Graph) -> list[fx.Node]:
    """Each activation quantized by one `tensortune::quantize_activation` (the later ones' readers read the first's
    results, each result one node); those quantizations."""
    first: dict[fx.Node, fx.Node] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not quantize_activation:
            continue
        kept = first.setdefault(node.args[0], node)
        if kept is not node:
            node.replace_all_uses_with(kept)
            graph.erase_node(node)
    for node in first.values():
        results: dict[int, fx.Node] = {}
        for reader in list(node.users):
            if calls(reader, {operator.getitem}) and results.setdefault(reader.args[1], reader) is not reader:
                reader.replace_all_uses_with(results[reader.args[1]])
                graph.erase_node(reader)
    return list(first.values())


def fuse_quantized_linears(quantize: fx.Node, edit: Editor) -> None:
    """One tensortune::quantized_linear for the int8 layers reading this quantization's results whose weights the
    model holds and that have no epilogue of their own, their weights, scales and biases concatenated."""
    results = tuple(next((user for user in quantize.users if calls(user, {operator.getitem}) and user.args[1] == i),
                         None) for i in range(3))
    members, scales, scan = [], {}, Scan(edit.captured)
    for user in results[0].users if results[0] is not None else ():
        if not calls(user, QUANTIZED_LINEAR) or tuple(user.args[:3]) != results:
            continue
        weight, scales[user] = (constant(user.args[i], edit.captured, integer=True) for i in (3, 4))
        bias = constant(user.args[5], edit.captured) if user.args[5] is not None else None
        if weight is None or scales[user] is None or (user.args[5] is not None and bias is None) or \
                fused_activation(user, scan)[1]:
            continue
        members.append((user, weight, bias))
    if len(members) < 2:
        return
    # the scales in the order `fuse` concatenates the weights: the graph's
    w_scale = lambda nodes: edit.attribute(f"fused_{nodes[0].name}_w_scale",
                                           torch_tensor(np.concatenate([scales[node] for node in nodes])),
                                           constants_read(nodes, edit.captured))
    fuse(members, edit, lambda nodes, weight, bias: edit.call(
        nodes[0].target, (*results, weight, w_scale(nodes), bias), nodes[0], stack=common_stack(nodes)))


def rewrite(captured: Captured) -> None:
    """Rewrite the captured graph in place (see the module docstring); nothing where it has no fake values."""
    graph = captured.graph.graph
    fakes = [node.meta.get("example_value") for node in graph.nodes]
    # the fake mode Dynamo traced with, not the backend's TracingContext's, whose fakes may not mix with these
    mode = next((value.fake_mode for value in fakes if isinstance(value, FakeTensor)), None)
    if mode is None:
        return
    edit = Editor(captured, mode)
    for node in list(graph.nodes):
        if calls(node, ATTENTION):
            expand_attention(node, edit)
        elif calls(node, BADDBMM, ("baddbmm",)):
            split_scaled_product(node, edit, torch.bmm)
        elif calls(node, ADDMM, ("addmm",)) and requires_grad(node):  # trained (GPT-2's Conv1D): its weight an operand
            split_scaled_product(node, edit, torch.mm)
    while any(fuse_linears(node, edit) for node in list(graph.nodes)):
        pass  # a fused layer's parts may feed fusable layers of their own
    for quantize in quantize_once(graph):
        fuse_quantized_linears(quantize, edit)
    graph.lint()
    captured.graph.recompile()
