"""A compiled graph refuses to run on weights that changed after its tuned kernels bound them.

Tuned ops bind packed copies of the model's weights (fused, cast, a BatchNorm folded in) when the graph is compiled,
as TVM binds a model's params at build and Inductor's freezing folds them. A weight changed in place afterwards
(`load_state_dict`, an optimizer step, `weight.mul_(2)`) keeps its identity, so Dynamo's guards pass, and the kernels
would go on computing with the old values. PyTorch counts every in-place change of a tensor (`_version`); the
graph reads the counters of the tensors its ops bound before each call and raises WeightsChanged, naming one, rather
than return a result from stale weights."""
from __future__ import annotations

import functools
import re
from typing import Callable, NamedTuple

import torch

from .capture import Captured
from .patterns import Match


class WeightsChanged(RuntimeError):
    """A model tensor a tuned kernel bound was changed in place after the graph was compiled."""


class Bound(NamedTuple):
    position: int  # among the graph's inputs
    name: str  # its state_dict key (else Dynamo's name for it)
    version: int  # its in-place change count when bound


def bound_tensors(captured: Captured, matches: list[Match]) -> list[Bound]:
    """The model tensors the matches' weights were bound from, where the graph takes them as inputs. A tensor made in
    inference mode counts no changes, and cannot be changed outside it: none of those."""
    positions = {node: position for position, node in enumerate(captured.placeholder_values)}
    sources = dict.fromkeys(source for match in matches for source in match.sources)
    bound = []
    for node in sources:
        value = captured.placeholder_values[node]
        if isinstance(value, torch.Tensor) and not value.is_inference():
            source = getattr(node.meta.get("grapharg"), "source", None)
            bound.append(Bound(positions[node], state_dict_key(source.name) if source is not None else node.name,
                               value._version))
    return bound


def state_dict_key(source: str) -> str:
    """The model's state_dict key of Dynamo's source name for one of its tensors (`L['self']._modules['0']
    ._parameters['weight']`: `0.weight`), or the source name where it is not one."""
    key = re.fullmatch(r"L\['\w+'\]((?:\._(?:modules|parameters|buffers)\['[^']+'\])+)", source)
    return ".".join(re.findall(r"\['([^']+)'\]", key.group(1))) if key else source


def checking_weights(fn: Callable, bound: list[Bound]) -> Callable:
    """`fn`, raising WeightsChanged before a call where a bound tensor has changed since (`fn` itself where none is
    bound). Dynamo calls a backend's graph with its inputs as arguments."""
    if not bound:
        return fn

    @functools.wraps(fn)
    def checked(*inputs):
        for position, name, version in bound:
            if inputs[position]._version != version:
                raise WeightsChanged(
                    f"tensortune: the model's tensor {name} was changed in place after the model was compiled "
                    f"(load_state_dict, an optimizer step, an in-place op), and its tuned kernels hold a copy of the "
                    f"old values; call torch._dynamo.reset() and run the compiled model again, to compile it with the "
                    f"new ones")
        return fn(*inputs)

    return checked
