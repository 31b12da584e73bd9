"""Which parts of a captured graph become tensortune workloads.

Every form of linear layer → dense: linear; addmm with a model-owned [K, N] weight and bias (GPT-2's
Conv1D), its weight bound transposed; matmul / mm by a model-owned 2-D [K, N] weight; each with a following
relu or gelu (F.gelu, or GPT-2's tanh form written out) that nothing else reads, seen through one view. A
2-D matmul of two activations → matmul; 3-D and 4-D matmul / bmm with equal batch dimensions →
batch_matmul (batch × heads flattened); conv2d with an eval-mode BatchNorm folded in, then a residual add
and a relu → conv2d; frontend.quantized's int8 linear → dense int8. Under grad mode a linear layer's weight
and bias are activations (trained_linear), and a 2-D product by a weight is a product of two activations. A
match computes in the dtype its product's result was traced in, float32 or bfloat16: a model cast to bfloat16,
or float32 operands under torch.autocast("cpu", dtype=torch.bfloat16), whose weights are bound cast and whose
activations are cast at each call, as autocast casts them. Everything else stays in PyTorch, said in one line per
reason. A match names the graph nodes it replaces, the activations its kernel takes at run time, the weights it
binds once (BatchNorm already folded into them), and its form: the op's static parameters, and how the
activations' shapes give the workload and the result's shape (frontend/shapes.py). Sizes may be symbolic (Dynamo traces them so once it has seen them
change): then the workload is known only at run time, and only a size the weights fix (a linear's K, a
convolution's C) must not vary.
"""
from __future__ import annotations

import logging
import math
import operator
import re
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import fx
from torch._dynamo.utils import get_static_address_type
from torch.fx.experimental.symbolic_shapes import is_concrete_int, statically_known_true

from search_space import Workload, WorkloadError
from workers.torch_arrays import dtype_name, numpy_array

from .capture import Captured, example_value
from .quantized import quantize_activation, quantized_linear
from .autograd import gradient_workloads
from .shapes import Conv2d, Dense, Form, Product, Shape, Size, workload_at


LINEAR = {F.linear, torch._C._nn.linear}
ADDMM = {torch.addmm}
MATMUL = {torch.matmul, operator.matmul, torch.bmm, torch.mm}
CONV = {F.conv2d, torch.conv2d}
BATCH_NORM = {F.batch_norm}
ADD = {operator.add, torch.add, operator.iadd}
RELU = {F.relu, torch.relu, torch.relu_}
GELU = {F.gelu, torch._C._nn.gelu}
MUL = {operator.mul, torch.mul, operator.imul}
POW = {operator.pow, torch.pow}
TANH = {torch.tanh}
VIEW = {torch.reshape}
QUANTIZED_LINEAR = {torch.ops.tensortune.quantized_linear.default, quantized_linear}


log = logging.getLogger("tensortune.frontend")


class VaryingShape(ValueError):
    """A size the kernel needs fixed (one the weights fix) changes between calls: Dynamo traced it symbolic."""


def module_path(node: fx.Node) -> str:
    """The module that produced a node, as the model names it ("" for the model's own code)."""
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack.values()))[0] if stack else ""
    return re.sub(r"^L\['\w+'\]\.?", "", path)  # Dynamo's name for the compiled object itself


def op_name(node: fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))


@dataclass
class Scan:
    """A graph being searched, and the nodes earlier matches already compute."""

    captured: Captured
    taken: set = field(default_factory=set)


@dataclass
class Match:
    """A chain of graph nodes one kernel computes: `nodes[-1]` is its result (after `view`, when there is one).
    Its workload is known when the graph's sizes are static, as they always are where extract_tasks captures;
    building it raises WorkloadError for a workload that cannot be."""

    form: Form
    nodes: list[fx.Node]
    activations: list[fx.Node]  # the kernel's non-weight inputs, in its order
    shapes: tuple[Shape, ...]  # theirs, as traced
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    view: fx.Node | None = None  # one of `nodes`, a reshape between the kernel and its fused epilogue
    grads: tuple[bool, ...] = ()  # the activations whose gradients tuned products compute (find_matches sets it)
    strides: tuple | None = None  # the activations' strides as traced, where the form reads views
    sources: tuple[fx.Node, ...] = ()  # the model's tensors its weights are bound from (find_matches sets it)
    workload: Workload | None = field(init=False)

    def __post_init__(self):
        static = all(isinstance(size, int) for shape in self.shapes for size in shape)
        self.workload = workload_at(self.form, self.shapes, self.strides) if static else None

    @property
    def path(self) -> str:
        return module_path(self.nodes[0])

    @property
    def needs_grad(self) -> bool:
        """Whether autograd differentiates the result: grad mode was on and an input or weight required grad.
        Dynamo guards both, so a call that differs compiles the graph anew."""
        return requires_grad(self.nodes[-1])

    @property
    def untrained(self) -> bool:
        """Whether autograd needs its gradients and tuned kernels do not compute them: PyTorch must run it."""
        return self.needs_grad and not any(self.grads)

    @property
    def workloads(self) -> list[Workload]:
        """What its kernels run at its (static) sizes: its workload, then the products of its gradients."""
        return [self.workload] + (gradient_workloads(self.form, self.shapes, self.grads) if any(self.grads) else [])

    @property
    def calls(self) -> int:
        """How many calls of its (static) workload's kernel one run makes: a batch_matmul reading views calls it
        for each index of the leading batch sizes that do not flatten."""
        return len(self.form.calls(self.shapes, self.strides)) if self.form.views else 1

    @property
    def label(self) -> str:
        """The workload's label, or the op's name where its sizes vary."""
        return self.workload.label if self.workload is not None else op_label(self.nodes[0])


def op_label(node: fx.Node) -> str:
    return f"{module_path(node) or node.name} ({op_name(node)})"


def calls(node: fx.Node, targets: set, methods: tuple[str, ...] = ()) -> bool:
    return (node.op == "call_function" and node.target in targets) or (node.op == "call_method" and node.target in methods)


def argument(node: fx.Node, position: int, *names: str, default=None):
    """A call's argument, given by position or by keyword (`names`: what the overloads call it)."""
    if len(node.args) > position:
        return node.args[position]
    return next((node.kwargs[name] for name in names if name in node.kwargs), default)


def traced(node, captured: Captured) -> torch.Tensor | None:
    """A node's value as traced, when it is a tensor of a dtype tensortune computes in."""
    if not isinstance(node, fx.Node):
        return None
    value = node.meta.get("example_value", example_value(node, captured))
    return value if isinstance(value, torch.Tensor) and dtype_name(value) is not None else None


def shape_of(node: fx.Node, captured: Captured, value: torch.Tensor | None = None) -> Shape | None:
    """The shape of a node's value as traced (an int for each static size, a SymInt for each that varies), when
    it is a float32 or bfloat16 tensor (or is `value`); None for anything else."""
    value = traced(node, captured) if value is None else value
    return None if value is None else tuple(int(size) if is_concrete_int(size) else size for size in value.shape)


def requires_grad(node) -> bool:
    """Whether a node's value, as traced, requires grad."""
    return isinstance(node, fx.Node) and bool(getattr(node.meta.get("example_value"), "requires_grad", False))


def differentiable(match: Match, captured: Captured) -> bool:
    """Whether tuned kernels compute the match's gradients: it binds no weights (a bound copy would go stale at
    an optimizer's first step: trained weights are activations, passed at each call) and casts none of its
    activations (under autocast their gradients would come back in the kernel's dtype, not theirs)."""
    return not match.weights and all(dtype_name(traced(node, captured)) == match.form.dtype
                                     for node in match.activations)


def result_dtype(node: fx.Node, captured: Captured, activations: list[fx.Node]) -> str | None:
    """The dtype a product computes in: its result's as traced, when its activations have a dtype tensortune
    computes in too; None otherwise."""
    value = traced(node, captured)
    if value is None or any(traced(activation, captured) is None for activation in activations):
        return None
    return dtype_name(value)


def weights_in(dtype: str, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Weights as a kernel of `dtype` binds them (a float32 model's under autocast: rounded to bfloat16)."""
    return {name: np.ascontiguousarray(array, dtype) for name, array in weights.items()}


def typed(match: Match, captured: Captured) -> Match | None:
    """The match when its result (after a fused epilogue) was traced in its dtype, as the graph after it reads
    it; else None, and PyTorch computes it."""
    value = traced(match.nodes[-1], captured)
    return match if value is not None and dtype_name(value) == match.form.result_dtype else None


def same_size(first: Size, second: Size) -> bool:
    """Whether two traced sizes are equal at every call. Asks nothing of Dynamo's shape environment that would
    add a guard, which it no longer checks once the graph is handed over."""
    return statically_known_true(first == second)


def weight_fixed(size: Size, value: int, name: str) -> bool:
    """Whether an activation's size is the one its weight fixes; VaryingShape where it varies between calls."""
    if isinstance(size, int):
        return size == value
    if same_size(size, value):
        return True
    raise VaryingShape(f"the size its weight fixes ({name}) changes between calls")


def constant(node, captured: Captured, integer: bool = False) -> np.ndarray | None:
    """A tensor the model holds (a parameter, buffer or tensor attribute) that the graph reads, as NumPy, in
    float32 or bfloat16 (or int8, when `integer`); None for anything else, a tensor the caller passes above all:
    binding it would keep its first value."""
    if not isinstance(node, fx.Node) or node.op not in ("placeholder", "get_attr"):
        return None
    value = example_value(node, captured)
    if not isinstance(value, torch.Tensor) or isinstance(value, torch._subclasses.FakeTensor):
        return None
    if dtype_name(value) is None and not (integer and value.dtype == torch.int8):
        return None
    if node.op == "placeholder" and get_static_address_type(value) is None:  # Dynamo marks the model's own tensors
        return None
    captured.read.append(node)
    return numpy_array(value.detach().contiguous())


def sole_reader(node: fx.Node, scan: Scan, accept) -> fx.Node | None:
    """The node's only reader when `accept(reader)` holds and no earlier match took it: then the intermediate
    may be fused away."""
    users = list(node.users)
    if len(users) != 1 or users[0] in scan.taken or not accept(users[0]):
        return None
    return users[0]


def sole_user(node: fx.Node, scan: Scan, targets: set, methods: tuple[str, ...] = ()) -> fx.Node | None:
    """The node's only reader when it is a call of one of `targets` (or `methods`)."""
    return sole_reader(node, scan, lambda user: calls(user, targets, methods))


def scales(node: fx.Node, operand: fx.Node, targets: set, methods: tuple[str, ...], factor: float) -> bool:
    """Whether `node` combines `operand` with the number `factor`, in either order (0.5 * x, x.add(1.0))."""
    if not calls(node, targets, methods) or len(node.args) != 2 or node.kwargs:
        return False
    first, second = node.args
    other = second if first is operand else first if second is operand else None
    return isinstance(other, (int, float)) and math.isclose(other, factor, rel_tol=1e-6)


def written_tanh_gelu(x: fx.Node, scan: Scan) -> list[fx.Node]:
    """GPT-2's gelu_new written out, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as Dynamo traces transformers'
    NewGELUActivation: its nodes, the result last, when they alone read `x`; else []. It is the tanh form the
    `gelu` epilogue computes, not PyTorch's exact GELU (they differ by up to 4.7e-4)."""
    if len(x.users) != 3 or any(user in scan.taken for user in x.users):
        return []
    half = next((user for user in x.users if scales(user, x, MUL, ("mul", "__mul__"), 0.5)), None)
    cube = next((user for user in x.users if calls(user, POW, ("pow", "__pow__")) and len(user.args) == 2
                 and user.args[0] is x and user.args[1] == 3), None)
    if half is None or cube is None:
        return []
    cubic = sole_reader(cube, scan, lambda user: scales(user, cube, MUL, ("mul", "__mul__"), 0.044715))
    inner = cubic and sole_reader(cubic, scan, lambda user: calls(user, ADD, ("add", "__add__")) and not user.kwargs
                                  and set(user.args) == {x, cubic})
    scaled = inner and sole_reader(inner, scan, lambda user: scales(user, inner, MUL, ("mul", "__mul__"),
                                                                    math.sqrt(2 / math.pi)))
    tanh = scaled and sole_reader(scaled, scan, lambda user: calls(user, TANH, ("tanh",)) and user.args == (scaled,))
    plus_one = tanh and sole_reader(tanh, scan, lambda user: scales(user, tanh, ADD, ("add", "__add__"), 1.0))
    result = plus_one and sole_reader(plus_one, scan, lambda user: calls(user, MUL, ("mul", "__mul__"))
                                      and not user.kwargs and set(user.args) == {half, plus_one})
    if result is None or list(half.users) != [result]:
        return []
    return [half, cube, cubic, inner, scaled, tanh, plus_one, result]


def activation_epilogue(node: fx.Node, scan: Scan) -> tuple[str, list[fx.Node]]:
    """A relu or gelu that alone reads `node`: its epilogue name (gelu's exact form or its tanh form) and its
    nodes, the result last."""
    user = sole_user(node, scan, RELU, ("relu",))
    if user is not None:
        return "relu", [user]
    user = sole_user(node, scan, GELU)
    if user is not None:
        approximate = user.kwargs.get("approximate", user.args[1] if len(user.args) > 1 else "none")
        return ("gelu" if approximate == "tanh" else "gelu_erf"), [user]
    written = written_tanh_gelu(node, scan)
    return ("gelu", written) if written else ("none", [])


def fused_activation(node: fx.Node, scan: Scan) -> tuple[str, list[fx.Node], fx.Node | None]:
    """activation_epilogue of `node`, or of a view that alone reads it (Conv1D's addmm is 2-D, and its result
    is viewed back to [batch, sequence, N] before the activation): the epilogue, its nodes (the view first,
    when there is one) and the view."""
    epilogue, nodes = activation_epilogue(node, scan)
    view = sole_user(node, scan, VIEW, ("view", "reshape"))
    if nodes or view is None:
        return epilogue, nodes, None
    epilogue, nodes = activation_epilogue(view, scan)
    return (epilogue, [view] + nodes, view) if nodes else ("none", [], None)


def dense_match(node: fx.Node, scan: Scan, x, weight: np.ndarray, bias: np.ndarray | None) -> Match | None:
    """Y = epilogue(x · weightᵀ + bias) for `node`, weight [N, K] and x of rank 2 or more (leading sizes
    flattened into M); None when x is not an operand of K columns."""
    shape, dtype = shape_of(x, scan.captured), result_dtype(node, scan.captured, [x])
    if shape is None or dtype is None or len(shape) < 2 or not weight_fixed(shape[-1], weight.shape[1], "K"):
        return None
    epilogue, activation, view = fused_activation(node, scan)
    weights = weights_in(dtype, {"W": weight} | ({"bias": bias} if bias is not None else {}))
    form = Dense(weight.shape[0], weight.shape[1], bias is not None, epilogue, dtype)
    return typed(Match(form, [node] + activation, [x], (shape,), weights, view), scan.captured)


def trained_linear(node: fx.Node, scan: Scan, x, weight_node: fx.Node, bias_node) -> Match | None:
    """A linear layer autograd differentiates: dense with its weight and bias passed at each call, as activations
    (an optimizer changes them between calls), and no epilogue fused (autograd differentiates the activation
    function where PyTorch, or Inductor, computes it)."""
    captured = scan.captured
    activations = [x, weight_node] + ([bias_node] if bias_node is not None else [])
    shapes = [shape_of(activation, captured) for activation in activations]
    dtype = result_dtype(node, captured, activations)
    if None in shapes or dtype is None or len(shapes[0]) < 2 or len(shapes[1]) != 2:
        return None
    (n, k), static = shapes[1], all(isinstance(size, int) for size in shapes[1])
    if not static or not weight_fixed(shapes[0][-1], k, "K"):
        return None
    form = Dense(n, k, bias_node is not None, "none", dtype)
    return typed(Match(form, [node], activations, tuple(shapes)), captured)


def match_linear(node: fx.Node, scan: Scan) -> Match | None:
    captured = scan.captured
    x, weight_node, bias_node = argument(node, 0, "input"), argument(node, 1, "weight"), argument(node, 2, "bias")
    if requires_grad(node):
        return trained_linear(node, scan, x, weight_node, bias_node)
    weight = constant(weight_node, captured)
    bias = constant(bias_node, captured) if bias_node is not None else None
    if weight is None or weight.ndim != 2 or (bias_node is not None and bias is None):
        return None
    return dense_match(node, scan, x, weight, bias)


def match_addmm(node: fx.Node, scan: Scan) -> Match | None:
    """bias + x · weight with the weight stored [K, N] (GPT-2's Conv1D): dense, the weight bound transposed."""
    captured = scan.captured
    bias_node, x, weight_node = argument(node, 0, "input"), argument(node, 1, "mat1"), argument(node, 2, "mat2")
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return None
    weight, bias = constant(weight_node, captured), constant(bias_node, captured)
    if weight is None or bias is None or weight.ndim != 2:
        return None
    if bias.shape not in ((weight.shape[1],), (1, weight.shape[1])):
        return None  # one bias per row, or per element, is no dense bias
    return dense_match(node, scan, x, np.ascontiguousarray(weight.T), bias.reshape(-1))


def match_matmul(node: fx.Node, scan: Scan) -> Match | None:
    captured = scan.captured
    a, b = argument(node, 0, "input"), argument(node, 1, "other", "mat2")
    weight, left, right = constant(b, captured), shape_of(a, captured), shape_of(b, captured)
    trained = requires_grad(node) and left is not None and len(left) == 2  # then a product of two activations
    if weight is not None and weight.ndim == 2 and not trained:  # x · W by a model-owned [K, N] weight: a linear layer
        return dense_match(node, scan, a, np.ascontiguousarray(weight.T), None)
    dtype = result_dtype(node, captured, [a, b])
    if left is None or right is None or dtype is None or len(left) != len(right) or len(left) not in (2, 3, 4):
        return None
    if not all(same_size(first, second) for first, second in zip((*left[:-2], left[-1]), (*right[:-2], right[-2]))):
        return None  # batch sizes (and K) that are not equal at every call: broadcast batches stay in PyTorch
    strides = tuple(tuple(traced(x, captured).stride()) for x in (a, b))
    return typed(Match(Product(dtype, views=True), [node], [a, b], (left, right), strides=strides), captured)


def match_quantized_linear(node: fx.Node, scan: Scan) -> Match | None:
    """frontend.quantized's int8 linear: dense int8, the uint8 activation and its scale and zero point passed at
    each call, the int8 weight, its scales and the bias bound; of a reduced range where the activation is
    frontend.quantized's quantization (128 levels)."""
    captured = scan.captured
    x, x_scale, x_zero, weight_node, w_scale_node, bias_node = node.args
    weight, w_scale = constant(weight_node, captured, integer=True), constant(w_scale_node, captured)
    bias = constant(bias_node, captured) if bias_node is not None else None
    value = x.meta.get("example_value") if isinstance(x, fx.Node) else None
    if weight is None or w_scale is None or (bias_node is not None and bias is None) or value is None:
        return None
    shape = shape_of(x, captured, value)
    if len(shape) < 2 or not weight_fixed(shape[-1], weight.shape[1], "K"):
        return None
    epilogue, activation, view = fused_activation(node, scan)
    weights = {"W": weight, "w_scale": w_scale} | ({"bias": bias} if bias is not None else {})
    form = Dense(weight.shape[0], weight.shape[1], bias is not None, epilogue, "int8", quantized_activation(x))
    return typed(Match(form, [node] + activation, [x, x_scale, x_zero], (shape, (1,), (1,)), weights, view), captured)


def quantized_activation(x) -> bool:
    """Whether x is the uint8 result of frontend.quantized's quantization (in 0..127)."""
    source = x.args[0] if isinstance(x, fx.Node) and calls(x, {operator.getitem}) and x.args[1] == 0 else None
    return isinstance(source, fx.Node) and calls(source, {quantize_activation})


def match_conv2d(node: fx.Node, scan: Scan) -> Match | None:
    captured = scan.captured
    x, weight_node, bias_node = argument(node, 0, "input"), argument(node, 1, "weight"), argument(node, 2, "bias")
    stride, padding = argument(node, 3, "stride", default=1), argument(node, 4, "padding", default=0)
    dilation, groups = argument(node, 5, "dilation", default=1), argument(node, 6, "groups", default=1)
    weight, shape = constant(weight_node, captured), shape_of(x, captured)
    bias = constant(bias_node, captured) if bias_node is not None else None
    square = lambda v: v if isinstance(v, int) else (v[0] if len(set(v)) == 1 else None)
    stride, padding, dilation = square(stride), square(padding), square(dilation)
    if weight is None or shape is None or len(shape) != 4 or None in (stride, padding) or dilation != 1 or groups != 1:
        return None
    k, c, r, s = weight.shape
    if not weight_fixed(shape[1], c, "C"):
        return None
    nodes = [node]
    norm = sole_user(node, scan, BATCH_NORM)
    folded = fold_batch_norm(norm, weight, bias, captured) if norm is not None else None
    if folded is not None:
        (weight, bias), nodes = folded, nodes + [norm]
    residual = None
    add = sole_user(nodes[-1], scan, ADD, ("add", "__add__"))
    if add is not None:
        other = add.args[1] if add.args[0] is nodes[-1] else add.args[0]
        if same_shape(shape_of(other, captured), shape_of(nodes[-1], captured)):
            nodes.append(add)
            residual = other
    relu = sole_user(nodes[-1], scan, RELU, ("relu",))
    nodes += [relu] if relu is not None else []
    activations = [x] + ([residual] if residual is not None else [])
    dtype = result_dtype(node, captured, activations)
    if dtype is None:
        return None
    form = Conv2d(c, k, r, s, stride, padding, bias is not None, residual is not None,
                  "relu" if relu is not None else "none", dtype, layout_of(traced(x, captured)))
    weights = weights_in(dtype, {"weight": weight} | ({"bias": bias} if bias is not None else {}))
    return typed(Match(form, nodes, activations, tuple(shape_of(node, captured) for node in activations), weights),
                 captured)


def layout_of(x: torch.Tensor) -> str:
    """nhwc where x lies channels_last (and not also contiguous, as a 1×1 image or a single channel does), else
    nchw: the convolution then reads it, and returns its result, as it lies."""
    last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    return "nhwc" if last else "nchw"


def same_shape(first: Shape | None, second: Shape | None) -> bool:
    return (first is not None and second is not None and len(first) == len(second)
            and all(same_size(a, b) for a, b in zip(first, second)))


def fold_batch_norm(node: fx.Node, weight: np.ndarray, bias: np.ndarray | None, captured: Captured):
    """(weight, bias) of the convolution with an inference-mode BatchNorm folded in, computed in float32 and kept
    in the weight's dtype; None when it cannot be. Its tensors are read only where it folds (a training BatchNorm
    changes its statistics at every call: they are no bound weights)."""
    args = list(node.args) + [None] * (8 - len(node.args))
    read = lambda i, name: constant(args[i] if args[i] is not None else node.kwargs.get(name), captured)
    training, eps = node.kwargs.get("training", args[5]), node.kwargs.get("eps", args[7] if args[7] is not None else 1e-5)
    if training or (mean := read(1, "running_mean")) is None or (var := read(2, "running_var")) is None:
        return None
    gamma, beta = read(3, "weight"), read(4, "bias")
    wide = lambda array, default=0.0: np.asarray(array, np.float32) if array is not None else default
    scale = wide(gamma, 1.0) / np.sqrt(wide(var) + np.float32(eps))
    shift = wide(beta) - wide(mean) * scale
    folded_bias = wide(bias) * scale + shift
    return (wide(weight) * scale[:, None, None, None]).astype(weight.dtype), np.asarray(folded_bias, weight.dtype)


MATCHERS = ((LINEAR, (), match_linear), (ADDMM, ("addmm",), match_addmm),
            (MATMUL, ("matmul", "bmm", "__matmul__"), match_matmul), (CONV, (), match_conv2d),
            (QUANTIZED_LINEAR, (), match_quantized_linear))


def find_matches(captured: Captured) -> list[Match]:
    """Every node chain of the graph a tensortune kernel computes, in graph order. The ops PyTorch runs instead
    (a size that must be fixed varies, or no workload can have these sizes) are named in one line per reason."""
    from .rewrites import rewrite  # imported here: rewrites builds on this module

    rewrite(captured)
    found, scan, refused = [], Scan(captured), {}
    for node in captured.graph.graph.nodes:
        if node in scan.taken:
            continue
        for targets, methods, matcher in MATCHERS:
            if calls(node, targets, methods):
                read = len(captured.read)
                try:
                    match = matcher(node, scan)
                except (WorkloadError, VaryingShape) as error:
                    refused.setdefault(str(error), []).append(op_label(node))
                    match = None
                if match is not None:
                    if match.weights:
                        match.sources = captured.sources(captured.read[read:])
                    if match.needs_grad and differentiable(match, captured):
                        match.grads = tuple(requires_grad(node) for node in match.activations)
                    found.append(match)
                    scan.taken.update(match.nodes)
                break
    for reason, ops in refused.items():
        log.warning(f"tensortune: {len(ops)} op(s) run in PyTorch ({reason}): {'; '.join(ops)}")
    return channels_last(found)


def channels_last(found: list[Match]) -> list[Match]:
    """A graph of two or more convolutions runs them all in the nhwc layout, as Inductor's layout optimization runs
    a convolutional network: the first converts its input once, and what lies between them (pools, adds) stays
    channels_last (ResNet-18's max pool on the stem's result: 960-1,070 µs on NCHW, 90 channels last, on a Zen 4 at
    2 threads). A lone convolution reads its input as it lies."""
    if sum(isinstance(match.form, Conv2d) for match in found) < 2:
        return found
    return [replace(match, form=replace(match.form, layout="nhwc")) if isinstance(match.form, Conv2d) else match
            for match in found]
