"""The graphs torch.compile hands a backend: Dynamo's FX graphs of a model in inference mode (or with grad
enabled, as a training step runs it), with the real tensors they were traced on. Task extraction and the backend
both read these, so the workloads one finds are exactly the kernels the other runs."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx
from torch.utils._pytree import tree_map_only


@dataclass
class Captured:
    """One FX graph of the model and the example tensors of its placeholders, in order; which of the model's tensors
    were read as constants (`read`, in order), and those a rewrite's new tensor was computed from (`derived`), so
    that each match knows the model tensors its bound weights come from."""

    graph: fx.GraphModule
    inputs: list

    def __post_init__(self):
        placeholders = [node for node in self.graph.graph.nodes if node.op == "placeholder"]
        self.placeholder_values = dict(zip(placeholders, self.inputs))
        self.read: list[fx.Node] = []
        self.derived: dict[fx.Node, list[fx.Node]] = {}

    def sources(self, nodes) -> tuple[fx.Node, ...]:
        """The model's tensors (placeholders) these constants are or were computed from."""
        found = [source for node in nodes for source in self.derived.get(node, [node]) if source.op == "placeholder"]
        return tuple(dict.fromkeys(found))


def capture(model: torch.nn.Module, example_inputs: tuple, grad: bool = False) -> list[Captured]:
    """Run the model once under torch.compile with a backend that only records what it is given, in inference
    mode, or with grad enabled when `grad`."""
    graphs: list[Captured] = []

    def record(graph: fx.GraphModule, inputs: list):
        graphs.append(Captured(graph, list(inputs)))
        return graph.forward

    # copies: a tensor a compiled model already met at other sizes carries Dynamo's dynamic marks, which would
    # make this trace symbolic too
    example_inputs = tree_map_only(torch.Tensor, torch.clone, example_inputs)
    with torch.enable_grad() if grad else torch.inference_mode():
        torch.compile(model, backend=record, dynamic=False)(*example_inputs)
    return graphs


def example_value(node: fx.Node, captured: Captured):
    """The tensor (real for placeholders, fake elsewhere) a node stood for when the graph was traced."""
    if node.op == "placeholder":
        return captured.placeholder_values[node]
    if node.op == "get_attr":
        value = captured.graph
        for part in node.target.split("."):
            value = getattr(value, part)
        return value
    return node.meta.get("example_value")
