"""`torch.compile(model, backend="tensortune", options={"db": URL, "target": "llvm"})`; `db` is a database URL or
SQLite file, or a running `tensortune serve` (http://host:port), asked for a graph's configs in one request.

Registered through the `torch_dynamo_backends` entry point, so torch finds it without importing
tensortune first. Each graph Dynamo hands over has its tensortune patterns (frontend/patterns.py)
replaced by tuned ops, each running the kernel of the sizes it is called at (frontend/shapes.py): built
with the best stored config for the target, else one borrowed from the nearest tuned shape, else a predicted
one (tuner/predict.py), else the template's fallback, said in one line per graph (per new size at run time) on the `tensortune.frontend`
logger, which prints the bare line where logging is not configured. Sizes Dynamo traced symbolic (after
seeing them change) are dispatched on at run time; the kernels of static sizes are built with the graph.
Weights are bound (packed) once per size, so the compiled model assumes them fixed, as inference does.
Tensors reach the kernels by address, with no copy and no check (the sizes were checked when the size was
first met), and results are written straight into new torch tensors. The kernels have no backward: an op
whose result needs a gradient (grad mode on and an input, weight included, requiring grad) stays in
PyTorch, said in one line, so training gets eager's gradients. The rest of the graph is compiled by
Inductor, the tuned ops opaque custom operators in it (frontend/inductor.py), unless option graph="eager"
runs it op by op.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
from torch import fx
from torch.autograd import profiler

from search_space import Target

from . import inductor
from workers.torch_arrays import FLOATING, torch_dtype

from .capture import Captured
from .patterns import Match, find_matches
from .shapes import Kernels, ShapeDispatch

log = logging.getLogger("tensortune.frontend")


class TunedOp(torch.nn.Module):
    """The kernels standing in for a chain of the graph's nodes, one per size it is called at."""

    def __init__(self, match: Match, kernels: Kernels):
        super().__init__()
        self.form, self.label, self.dtype = match.form, match.label, torch_dtype(match.form.result_dtype)
        # floating-point activations are cast to the kernel's dtype (autocast's float32 to bfloat16); int8's kept
        self.cast = match.form.dtype in FLOATING
        self.sizes = ShapeDispatch(match.form, match.weights, kernels)
        if match.workload is not None:  # static sizes: bind the kernel now, not at the first call
            self.sizes.run(match.shapes)

    def result_shape(self, *activations: torch.Tensor) -> tuple:
        """The result's shape in the model, from the activations' (symbolic sizes included)."""
        return tuple(self.form.result_shape(*(activation.shape for activation in activations)))

    def forward(self, *activations: torch.Tensor) -> torch.Tensor:
        """Dtypes and ranks were checked when the graph was matched, and Dynamo guards them; activations in another
        dtype than the kernel's (float32 under autocast) are cast, as autocast casts them. Under torch.profiler
        the kernel's time is an event named by its workload (bench model --profile reads them)."""
        run = self.sizes.run(tuple(activation.shape for activation in activations))
        tensors = [(a.detach().to(self.dtype) if self.cast else a.detach()).reshape(shape).contiguous()
                   for a, shape in zip(activations, run.inputs)]
        out = torch.empty(run.output, dtype=self.dtype)
        with torch.profiler.record_function(run.name) if profiler._is_profiler_enabled else nullcontext():
            run.call(*(t.data_ptr() for t in tensors), out.data_ptr())
        return out.view(run.result)

    def extra_repr(self) -> str:
        return self.label


def substitute(captured: Captured, matches: list[Match], kernels: Kernels) -> fx.GraphModule:
    """The graph with each match's nodes replaced by one call of its TunedOp (and the view it fused through,
    applied to the call's result)."""
    module, graph = captured.graph, captured.graph.graph
    replaced: dict[fx.Node, fx.Node] = {}  # a result an earlier match computes → its call
    for number, match in enumerate(matches):
        name = f"tensortune_{number}"
        module.add_submodule(name, TunedOp(match, kernels))
        with graph.inserting_after(match.nodes[-1]):
            result = call = graph.call_module(name, tuple(replaced.get(node, node) for node in match.activations))
        if match.view is not None:
            with graph.inserting_after(call):
                result = graph.create_node(match.view.op, match.view.target, (call, *match.view.args[1:]),
                                           match.view.kwargs)
            call.meta = dict(match.view.args[0].meta)  # what it computes as traced, as for the nodes it replaces
        result.meta = dict(match.nodes[-1].meta)
        match.nodes[-1].replace_all_uses_with(result)
        replaced[match.nodes[-1]] = result
        for node in reversed(match.nodes):
            graph.erase_node(node)
    graph.lint()
    module.recompile()
    return module


def needs_grad(match: Match) -> bool:
    """Whether autograd must differentiate the match's result, as Dynamo traced it: grad mode was on and an
    input or weight required grad. Dynamo guards both, so a call that differs compiles the graph anew."""
    return getattr(match.nodes[-1].meta.get("example_value"), "requires_grad", False)


GRAPH_MODES = ("inductor", "eager")


def compile_graph(graph: fx.GraphModule, example_inputs: list, db=None, target: str | Target = "llvm",
                  graph_mode: str = "eager"):
    """Substitute the graph's tuned ops, their kernels chosen from the stored configs of `db` for `target`:
    those of static sizes now (the ones with none stored named in one summary, not in apply_history_best's
    warning for each), the others at their first call. With graph_mode "inductor", Inductor compiles the rest
    of the graph around them; with "eager", the graph's own forward runs it op by op."""
    if graph_mode not in GRAPH_MODES:
        raise ValueError(f"tensortune backend: option graph is {graph_mode!r}; it takes {' or '.join(GRAPH_MODES)}")
    captured = Captured(graph, list(example_inputs))
    matches = find_matches(captured)
    grads = [needs_grad(match) for match in matches]
    differentiated = [match for match, grad in zip(matches, grads) if grad]
    matches = [match for match, grad in zip(matches, grads) if not grad]
    if differentiated:
        log.warning(f"tensortune: {len(differentiated)} of {len(grads)} ops run in PyTorch, as grad mode is on and "
                    f"their inputs require grad (tensortune kernels are inference-only: call the model under "
                    f"torch.inference_mode() or torch.no_grad()): "
                    f"{'; '.join(dict.fromkeys(match.label for match in differentiated))}")
    kernels = Kernels(db, Target.parse(target))
    kernels.prepare(match.workload for match in matches if match.workload is not None)
    module = substitute(captured, matches, kernels)
    return inductor.compile_around(module, example_inputs) if graph_mode == "inductor" else module.forward


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

