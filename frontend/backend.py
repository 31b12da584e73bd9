"""`torch.compile(model, backend="tensortune", options={"db": URL, "target": "llvm"})`.

Registered through the `torch_dynamo_backends` entry point, so torch finds it without importing
tensortune first. Each graph Dynamo hands over has its tensortune patterns (frontend/patterns.py)
replaced by kernels built with the best stored config for the target (the template's fallback when none
is stored, said in one line per graph on the `tensortune.frontend` logger, which prints the bare line
where logging is not configured); weights are bound (packed) when the graph is compiled, so
the compiled model assumes them fixed, as inference does. Tensors reach the kernels by address, with no
copy and no check (the graph's shapes are static), and results are written straight into new torch
tensors. The kernels have no backward: an op whose result needs a gradient (grad mode on and an input,
weight included, requiring grad) stays in PyTorch, said in one line, so training gets eager's gradients.
"""
from __future__ import annotations

import logging

import torch
from torch import fx

from db import Database, apply_history_best
from search_space import Target, Workload, fallback_config
from workers import build

from .capture import Captured
from .patterns import Match, find_matches

log = logging.getLogger("tensortune.frontend")


class TunedOp(torch.nn.Module):
    """One kernel standing in for a chain of the graph's nodes."""

    def __init__(self, match: Match, kernel):
        super().__init__()
        self.workload, self.shape = match.workload, match.shape
        self.kernel = kernel.bind(**match.weights) if match.weights else kernel
        self.call = self.kernel.address_call()
        weights = set(match.workload.weight_names())
        self.input_shapes = [shape for name, shape in match.workload.operand_shapes() if name not in weights]

    def forward(self, *activations: torch.Tensor) -> torch.Tensor:
        """The graph is static: the pattern checked each activation's dtype and shape, and Dynamo guards them."""
        tensors = [a.detach().reshape(shape).contiguous() for a, shape in zip(activations, self.input_shapes)]
        out = torch.empty(self.workload.output_shape, dtype=torch.float32)
        self.call(*(t.data_ptr() for t in tensors), out.data_ptr())
        return out.view(self.shape)

    def extra_repr(self) -> str:
        return self.workload.key


def substitute(captured: Captured, matches: list[Match], kernels: dict) -> fx.GraphModule:
    """The graph with each match's nodes replaced by one call of its TunedOp."""
    module, graph = captured.graph, captured.graph.graph
    replaced: dict[fx.Node, fx.Node] = {}  # a result an earlier match computes → its call
    for number, match in enumerate(matches):
        name = f"tensortune_{number}"
        module.add_submodule(name, TunedOp(match, kernels[match.workload]))
        with graph.inserting_after(match.nodes[-1]):
            call = graph.call_module(name, tuple(replaced.get(node, node) for node in match.activations))
        match.nodes[-1].replace_all_uses_with(call)
        replaced[match.nodes[-1]] = call
        for node in reversed(match.nodes):
            graph.erase_node(node)
    graph.lint()
    module.recompile()
    return module


def fallback_summary(untuned: list[Workload], total: int, target: Target) -> str:
    return (f"tensortune: {len(untuned)} of {total} kernels have no stored config for {target.label} and run a "
            f"fallback config, which may be much slower: {'; '.join(workload.label for workload in untuned)}")


def needs_grad(match: Match) -> bool:
    """Whether autograd must differentiate the match's result, as Dynamo traced it: grad mode was on and an
    input or weight required grad. Dynamo guards both, so a call that differs compiles the graph anew."""
    return getattr(match.nodes[-1].meta.get("example_value"), "requires_grad", False)


def compile_graph(graph: fx.GraphModule, example_inputs: list, db=None, target: str | Target = "llvm"):
    """Build the graph's kernels with the best stored configs of `db` for `target`, then substitute them. The
    kernels with none stored are named in one summary, not in apply_history_best's warning for each."""
    captured = Captured(graph, list(example_inputs))
    matches = find_matches(captured)
    grads = [needs_grad(match) for match in matches]
    differentiated = [match for match, grad in zip(matches, grads) if grad]
    matches = [match for match, grad in zip(matches, grads) if not grad]
    if differentiated:
        log.warning(f"tensortune: {len(differentiated)} of {len(grads)} ops run in PyTorch, as grad mode is on and "
                    f"their inputs require grad (tensortune kernels are inference-only: call the model under "
                    f"torch.inference_mode() or torch.no_grad()): "
                    f"{'; '.join(dict.fromkeys(match.workload.label for match in differentiated))}")
    target = Target.parse(target)
    with Database(db) as database, apply_history_best(database) as history:
        stored = {workload: history.query(workload, target) for workload in dict.fromkeys(m.workload for m in matches)}
    untuned = [workload for workload, config in stored.items() if config is None]
    if untuned:
        log.warning(fallback_summary(untuned, len(stored), target))
    kernels = {workload: build(workload, target, config if config is not None else fallback_config(workload, target))
               for workload, config in stored.items()}
    return substitute(captured, matches, kernels).forward


def tensortune(graph: fx.GraphModule, example_inputs: list, options: dict | None = None):
    """The torch.compile backend; options: `db` (default TENSORTUNE_DB, else ./tensortune.db) and `target`
    (default `llvm`, this CPU with all its cores)."""
    options = dict(options or {})
    unknown = set(options) - {"db", "target"}
    if unknown:
        raise ValueError(f"tensortune backend: unknown option(s) {', '.join(sorted(unknown))}; it takes db and target")
    return compile_graph(graph, example_inputs, options.get("db"), options.get("target", "llvm"))

