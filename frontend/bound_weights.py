"""A compiled graph whose bound weights were changed in place binds them again before its next call.

Tuned ops bind packed copies of the model's weights (fused, cast, a BatchNorm folded in) when the graph is compiled,
as TVM binds a model's params at build. A weight changed in place afterwards (`load_state_dict`, an optimizer step,
`weight.mul_(2)`) keeps its identity, so Dynamo's guards pass, and the kernels would go on computing with the old
values (Inductor's freezing does). PyTorch counts every in-place change of a tensor (`_version`): before each call
the graph reads the counters of the tensors its ops bound, and where one moved it matches its graph again, as Dynamo
gave it, on the tensors as they are now, and each tuned op binds its match's weights, fused, cast and folded as at
compile time. A graph that no longer matches as it did (Dynamo's guards on the tensors' shapes and dtypes leave that
to a change they do not see) raises WeightsChanged rather than compute with stale weights.
"""
from __future__ import annotations

import copy
import functools
import logging
import threading
from typing import Callable, NamedTuple, Protocol, Sequence

from torch import fx

from .capture import Captured
from .patterns import Match, find_matches

log = logging.getLogger("tensortune.frontend")


class WeightsChanged(RuntimeError):
    """The model's tensors a tuned kernel bound were changed in place after the graph was compiled, and the graph no
    longer matches as it did."""


class Rebindable(Protocol):
    label: str

    def rebind(self, match: Match) -> None: ...


class Bound(NamedTuple):
    position: int  # among the graph's inputs
    version: int  # its in-place change count when bound


def bound_tensors(captured: Captured, matches: list[Match]) -> list[Bound]:
    """The model tensors the matches' weights were bound from, where the graph takes them as inputs. A tensor made in
    inference mode counts no changes (it can be changed only inside that mode): none of those, and a warning says
    that a change to them goes unseen."""
    positions = {node: position for position, node in enumerate(captured.placeholder_values)}
    sources = dict.fromkeys(source for match in matches for source in match.sources)
    values = {node: captured.placeholder_values[node] for node in sources}
    unwatched = {node for node, value in values.items() if value.is_inference()}
    if unwatched:
        ops = dict.fromkeys(match.label for match in matches if unwatched.intersection(match.sources))
        log.warning(f"tensortune: {len(unwatched)} of the weights the tuned kernels bound were made in inference mode, "
                    f"where PyTorch counts no in-place changes: one changed after this compile (load_state_dict "
                    f"under torch.inference_mode) goes unseen and the kernels keep the old values; make the model "
                    f"outside inference mode, or call torch._dynamo.reset() after such a change (the ops that bound "
                    f"them: {'; '.join(ops)})")
    return [Bound(positions[node], value._version) for node, value in values.items() if node not in unwatched]


def rebind(pristine: fx.GraphModule, ops: Sequence[Rebindable], inputs: Sequence) -> None:
    """Each op bound again to the weights of its match in (a copy of) the graph as Dynamo gave it, before rewrites
    and substitution, matched again on `inputs`, the tensors as they are now."""
    captured = Captured(fx.GraphModule(pristine, copy.deepcopy(pristine.graph)), list(inputs))
    matches = [match for match in find_matches(captured) if not match.untrained]
    if [match.label for match in matches] != [op.label for op in ops]:
        raise WeightsChanged(f"tensortune: the model's tensors were changed in place after the model was compiled, "
                             f"and its graph no longer matches as it did ({', '.join(op.label for op in ops)}); call "
                             f"torch._dynamo.reset() and run the compiled model again, to compile it anew")
    for op, match in zip(ops, matches):
        op.rebind(match)


def checking_weights(fn: Callable, bound: list[Bound], rebinding: Callable[[Sequence], None]) -> Callable:
    """`fn`, before each call of which the weights are bound again (`rebinding(inputs)`) where a bound tensor has
    changed since (`fn` itself where none is bound). Dynamo calls a backend's graph with its inputs as arguments."""
    if not bound:
        return fn
    lock = threading.Lock()

    def changed(inputs) -> bool:
        return any(inputs[position]._version != version for position, version in bound)

    @functools.wraps(fn)
    def checked(*inputs):
        if changed(inputs):
            with lock:
                if changed(inputs):
                    rebinding(inputs)
                    bound[:] = [tensor._replace(version=inputs[tensor.position]._version) for tensor in bound]
        return fn(*inputs)

    return checked
