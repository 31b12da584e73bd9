"""`torch.compile(model, backend="tensortune", options={"db": URL, "target": "llvm"})`; `db` is a database URL or
SQLite file, or a running `tensortune serve` (http://host:port), asked for a graph's configs in one request.

Registered through the `torch_dynamo_backends` entry point, so torch finds it without importing
tensortune first. Each graph Dynamo hands over has its tensortune patterns (frontend/patterns.py)
replaced by tuned ops, each running the kernel of the sizes it is called at (frontend/shapes.py): built
with the best stored config for the target, else one borrowed from the nearest tuned shape, else a predicted
one (tuner/predict.py), else the template's fallback, said in one line per graph (per new size at run time) on the `tensortune.frontend`
logger, which prints the bare line where logging is not configured. Sizes Dynamo traced symbolic (after
seeing them change) are dispatched on at run time; the kernels of static sizes are built with the graph.
Weights are bound (packed) once per size, and bound again where one was changed in place since
(frontend/bound_weights.py); Dynamo
is asked to guard on the identity of each of the model's tensors the graph reads (as it does for Inductor's
freezing), so another instance of the same module class, with weights of its own, is compiled anew rather than
run on the first instance's kernels.
Tensors reach the kernels by address, with no copy and no check (the sizes were checked when the size was
first met), and results are written straight into new torch tensors (under Inductor, into the buffers it
allocates). Under grad mode, a linear layer whose
weight is trained takes its weight and bias at each call, and the gradients of a tuned op are tuned products
too (dY·W and dYᵀ·x for a linear layer), through the custom operator's autograd formula (frontend/autograd.py);
an op needing gradients that tuned kernels cannot compute (its weights bound: conv2d, int8, a 3-D activation by a
[K, N] weight; or its inputs cast by autocast) stays in PyTorch, said in one line, so training always gets eager's
gradients. A softmax over the last dimension, with the scale and mask before it, is one kernel of tensortune's own
(frontend/softmax.py). The rest of the graph is compiled by Inductor, the tuned ops and softmaxes opaque custom
operators in it (frontend/inductor.py), unless option graph="eager" runs it op by op.
"""
from __future__ import annotations

import copy
import functools
import logging
import operator
import time
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
from torch import fx
from torch._dynamo.guards import GuardBuilder
from torch._dynamo.utils import get_static_address_type
from torch._guards import TracingContext
from torch.autograd import profiler

from search_space import Target

from . import inductor
from .autograd import gradients
from .bound_weights import bound_tensors, checking_weights, rebind
from .capture import Captured, example_value
from .frame_stack import on_runner_stack
from .patterns import Match, find_matches, traced
from .shapes import Kernels, Product, Run, ShapeDispatch
from .softmax import fuse_softmaxes

log = logging.getLogger("tensortune.frontend")


class Clock(defaultdict):
    """Seconds of each tuned kernel call, by its profiler event's name; `glue`, by the same names, the seconds of
    the Python work before each call (its sizes dispatched, activations checked, result allocated, addresses
    read): in a model the kernel before it leaves the caches cold for it (BERT-base bf16 on an Intel AMX host: 17-35
    µs a call, against 3-6 alone and hot)."""

    def __init__(self):
        super().__init__(list)
        self.glue: dict[str, list[float]] = defaultdict(list)


_CLOCK: ContextVar[Clock | None] = ContextVar("tensortune_kernel_clock", default=None)


@contextmanager
def kernel_clock() -> Iterator[Clock]:
    """Within it, the seconds of each tuned kernel call, by its profiler event's name, read by the clock around the
    call alone (a torch.profiler event adds the profiler's own cost, up to 65 µs a call, twice a small kernel's),
    and of the Python work before it."""
    seconds = Clock()
    token = _CLOCK.set(seconds)
    try:
        yield seconds
    finally:
        _CLOCK.reset(token)


class TunedOp(torch.nn.Module):
    """The kernels standing in for a chain of the graph's nodes, one per size it is called at, and the product
    kernels of its gradients where autograd wants those."""

    def __init__(self, match: Match, kernels: Kernels):
        super().__init__()
        self.form, self.label = match.form, match.label
        self.sizes = ShapeDispatch(match.form, match.weights, kernels)
        self.dtype, self.memory_format = self.sizes.result_dtype, match.form.memory_format
        self.grads = match.grads  # which activations' gradients `backward` computes
        self.products = ShapeDispatch(Product(match.form.dtype), {}, kernels) if any(self.grads) else None
        self.static = match.workload is not None
        if self.static:  # bind the kernel now, not at the first call
            self.sizes.run(match.shapes, match.strides)
        self.straight: Run | None | bool = None  # the run `into` calls straight, False where there is none

    def rebind(self, match: Match) -> None:
        """The weights of `match` (the same op, matched again on the model's weights as they are now) bound instead;
        the straight launch found again at the next call."""
        self.sizes.rebind(match.weights)
        self.straight = None

    def result_shape(self, *activations: torch.Tensor) -> tuple:
        """The result's shape in the model, from the activations' (symbolic sizes included)."""
        return tuple(self.form.result_shape(*(activation.shape for activation in activations)))

    def forward(self, *activations: torch.Tensor) -> torch.Tensor:
        return run_kernel(self.sizes, activations)

    def into(self, activations: list[torch.Tensor], out: torch.Tensor) -> None:
        """The kernel run into `out`, as Inductor's wrapper code calls it (frontend/inductor.py): activations laid
        as traced, a result buffer of the traced shape. Where the sizes are static and the kernel reads every
        activation where it lies, that is the same run at every call, and after the first one it is launched on
        their addresses with nothing asked of the tensors but those (each torch call on a tensor cost ~10 µs in a
        model, its caches cold after the kernel before: run_kernel's checks 35-50 µs a call in BERT-base bf16), timed
        under kernel_clock and torch.profiler as run_kernel times its."""
        if self.straight is None:
            run, ready = prepared(self.sizes, activations)
            self.straight = run if self.static and all(ready) else False
        if not self.straight:
            run_kernel(self.sizes, activations, out)
            return
        clock = _CLOCK.get()
        begin = time.perf_counter() if clock is not None else 0.0
        timed_launch(self.straight, [activation.data_ptr() for activation in activations] + [out.data_ptr()], clock,
                     begin)

    def backward(self, grad: torch.Tensor, *activations: torch.Tensor) -> list[torch.Tensor]:
        """The gradients of the activations `grads` names, in order, each product a tuned kernel."""
        grads = gradients(self.form, grad, self.grads, lambda a, b: run_kernel(self.products, (a, b)), *activations)
        return [gradient for gradient in grads if gradient is not None]

    def extra_repr(self) -> str:
        return self.label


def run_kernel(sizes: ShapeDispatch, activations, out: torch.Tensor | None = None) -> torch.Tensor:
    """The kernel of the activations' sizes run on them. Dtypes and ranks were checked when the graph was matched,
    and Dynamo guards them; floating-point activations in another dtype than the kernel's (float32 under
    autocast) are cast, as autocast casts them, int8's kept. The kernel reads each activation's memory in its form's
    order (row-major; channels_last for an nhwc convolution), so one that lies so is passed as it is; a
    batch_matmul's kernel is chosen by its operands' strides too, and reads the views it can where they lie. Under
    torch.profiler the kernel's time is an event named by its workload; under `kernel_clock` (bench model
    --profile) its seconds are kept, and those of the work here before it. The result goes into `out` where the
    caller allocated it (Inductor's wrapper code: frontend/inductor.py), in the result's shape and layout."""
    clock = _CLOCK.get()
    begin = time.perf_counter() if clock is not None else 0.0
    (run, ready), cast, laid = prepared(sizes, activations), sizes.cast, sizes.form.memory_format
    tensors = [a if in_place else (a.detach().to(cast) if cast is not None else a.detach()).contiguous(
        memory_format=laid) for a, in_place in zip(activations, ready)]
    if out is None:
        out = torch.empty(run.result, dtype=sizes.result_dtype, memory_format=laid)
    timed_launch(run, [t.data_ptr() for t in tensors] + [out.data_ptr()], clock, begin)
    return out


def timed_launch(run: Run, addresses: list[int], clock: Clock | None, begin: float) -> None:
    """The run launched: under `kernel_clock`, its seconds kept and those since `begin` (the Python work before it);
    under torch.profiler, within an event named by its workload."""
    if clock is not None:
        start = time.perf_counter()
        launch(run, addresses)
        clock[run.name].append(time.perf_counter() - start)
        clock.glue[run.name].append(start - begin)
    elif profiler._is_profiler_enabled:
        with torch.profiler.record_function(run.name):
            launch(run, addresses)
    else:
        launch(run, addresses)


def prepared(sizes: ShapeDispatch, activations) -> tuple[Run, list[bool]]:
    """The run of the activations' sizes (and strides, where the form reads views), and which activations it reads
    where they lie: those laid in its form's order, in its dtype."""
    shapes, cast, laid = tuple(activation.shape for activation in activations), sizes.cast, sizes.form.memory_format
    if sizes.form.views:
        run = sizes.run(shapes, tuple(a.stride() if cast is None or a.dtype == cast else None for a in activations))
        return run, list(run.in_place)
    return sizes.run(shapes), [a.is_contiguous(memory_format=laid) and (cast is None or a.dtype == cast)
                               for a in activations]


def launch(run: Run, addresses: list[int]) -> None:
    """The run's kernel on these addresses: once, or once for each of its offsets."""
    if not run.offsets:
        run.call(*addresses)
    for shift in run.offsets:
        run.call(*map(operator.add, addresses, shift))


def substitute(captured: Captured, matches: list[Match], kernels: Kernels) -> fx.GraphModule:
    """The graph with each match's nodes replaced by one call of its TunedOp (and the view it fused through,
    applied to the call's result). A result the graph returns lies as eager's did: a channels_last convolution's
    that eager returned NCHW is copied to NCHW (as Inductor keeps its outputs' strides)."""
    module, graph = captured.graph, captured.graph.graph
    replaced: dict[fx.Node, fx.Node] = {}  # a result an earlier match computes → its call
    for number, match in enumerate(matches):
        name = f"tensortune_{number}"
        module.add_submodule(name, op := TunedOp(match, kernels))
        with graph.inserting_before(match.nodes[-1]):
            activations = tuple(laid_out(graph, replaced.get(node, node), captured, op, match)
                                for node in match.activations)
        with graph.inserting_after(match.nodes[-1]):
            result = call = graph.call_module(name, activations)
        if match.view is not None:
            with graph.inserting_after(call):
                result = graph.create_node(match.view.op, match.view.target, (call, *match.view.args[1:]),
                                           match.view.kwargs)
            call.meta = dict(match.view.args[0].meta)  # what it computes as traced, as for the nodes it replaces
        result.meta = dict(match.nodes[-1].meta)
        eager = traced(match.nodes[-1], captured)
        match.nodes[-1].replace_all_uses_with(result)
        if match.form.layout_differs(eager):
            for output in [user for user in result.users if user.op == "output"]:
                with graph.inserting_before(output):
                    output.replace_input_with(result, graph.call_method("contiguous", (result,)))
        replaced[match.nodes[-1]] = result
        for node in reversed(match.nodes):
            graph.erase_node(node)
    graph.lint()
    module.recompile()
    return module


def laid_out(graph: fx.Graph, activation: fx.Node, captured: Captured, op: TunedOp, match: Match) -> fx.Node:
    """The activation cast to the kernel's dtype and laid in its memory format by the graph, where it is not (an
    image NCHW for a convolution that reads it channels_last, a transposed view for a dense, float32 under
    autocast): Inductor makes the copy in a kernel of its own, fused with the op that makes the activation where it
    can, and the tuned op then reads it where it lies, launched straight; run_kernel copied it at every call
    (ResNet-18's image: 216 µs a forward on a Zen 4 at 2 threads). Not for a form that reads views (it picks its
    kernel by their strides), where autograd differentiates the op, or at symbolic sizes."""
    value = example_value(activation, captured)
    if (op.form.views or match.needs_grad or not isinstance(value, torch.Tensor)
            or not all(isinstance(size, int) for size in value.shape)):
        return activation
    cast = op.sizes.cast if value.is_floating_point() and value.dtype != op.sizes.cast else None
    if cast is not None:
        activation = graph.call_method("to", (activation, cast))
    if not value.is_contiguous(memory_format=op.memory_format):
        activation = graph.call_method("contiguous", (activation,), {"memory_format": op.memory_format})
    return activation


def guard_model_tensors(captured: Captured) -> None:
    """Have Dynamo guard on the identity of the model's own tensors the graph takes as inputs (the parameters and
    buffers it marks static), all but those autograd trains (passed at each call, never bound). Without it Dynamo
    reuses a graph for another instance of the module class whose tensors match in shape, and its tuned ops compute
    with the first instance's weights. Outside a Dynamo compile (no tracing context), nothing."""
    context = TracingContext.try_get()
    if context is None:
        return
    grad = torch.is_grad_enabled()
    for node, value in captured.placeholder_values.items():
        source = getattr(node.meta.get("grapharg"), "source", None)
        if (source is not None and isinstance(value, torch.Tensor) and get_static_address_type(value) is not None
                and not (grad and value.requires_grad)):
            context.guards_context.dynamo_guards.add(source.make_guard(GuardBuilder.ID_MATCH))


GRAPH_MODES = ("inductor", "eager")


def compile_graph(graph: fx.GraphModule, example_inputs: list, db=None, target: str | Target = "llvm",
                  graph_mode: str = "eager"):
    """Substitute the graph's tuned ops, their kernels chosen from the stored configs of `db` for `target`:
    those of static sizes now (the ones with none stored named in one summary, not in apply_history_best's
    warning for each), the others at their first call. With graph_mode "inductor", Inductor compiles the rest
    of the graph around them; with "eager", the graph's own forward runs it op by op. Either is called a few
    frames into a frame-stack chunk that stays mapped (frontend.frame_stack), after a check that the weights its
    kernels bound are unchanged, which binds them again where they changed (frontend.bound_weights)."""
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"tensortune backend: option graph is {graph_mode!r}; it takes {' or '.join(GRAPH_MODES)}")
    # matched again where weights change in place (frontend.bound_weights): a copy that holds none of what the
    # rewrites add to `graph` (concatenated weights)
    pristine = fx.GraphModule(graph, copy.deepcopy(graph.graph))
    captured = Captured(graph, list(example_inputs))
    guard_model_tensors(captured)
    matches, untrained = [], []
    for match in find_matches(captured):
        (untrained if match.untrained else matches).append(match)
    if untrained:
        log.warning(f"tensortune: {len(untrained)} of {len(matches) + len(untrained)} ops run in PyTorch, as grad mode "
                    f"is on and tuned kernels do not compute their gradients (their weights are bound, or autocast "
                    f"casts their inputs): {'; '.join(dict.fromkeys(match.label for match in untrained))}")
    kernels = Kernels(db, Target.parse(target))
    kernels.prepare(workload for match in matches if match.workload is not None for workload in match.workloads)
    bound = bound_tensors(captured, matches)
    module = substitute(captured, matches, kernels)
    fuse_softmaxes(module, kernels.target)
    ops = [child for child in module.children() if isinstance(child, TunedOp)]  # in the matches' order
    rebinding = functools.partial(rebind, pristine, ops)
    if graph_mode == "inductor":
        return on_runner_stack(checking_weights(inductor.compile_around(module, example_inputs), bound, rebinding))
    # autograd reaches tuned gradients only through the custom operator; the module holds the ops it calls by id
    module.differentiated = inductor.to_operator_calls(module, lambda op: any(op.grads))
    return on_runner_stack(checking_weights(module.forward, bound, rebinding))


def tensortune(graph: fx.GraphModule, example_inputs: list, options: dict | None = None):
    """The torch.compile backend; options: `db` (default TENSORTUNE_DB, else ./tensortune.db), `target`
    (default `llvm`, this CPU with all its cores) and `graph` (default `inductor`, else `eager`)."""
    options = dict(options or {})
    unknown = set(options) - {"db", "target", "graph"}
    if unknown:
        raise ValueError(f"tensortune backend: unknown option(s) {', '.join(sorted(unknown))}; it takes db, target "
                         "and graph")
    return compile_graph(graph, example_inputs, options.get("db"), options.get("target", "llvm"),
                         options.get("graph", "inductor"))

