"""The graph around the tuned kernels, compiled by Inductor.

Each tuned op (a module with `result_shape` and `forward`, called by `call_module`) becomes a call of one
opaque custom operator, `tensortune::tuned(op_id, activations)` (`tuned_differentiable` where autograd wants
the op's gradients), which Inductor leaves alone and schedules
between the kernels it generates for the rest of the graph: layer norms, softmax, adds and reshapes fuse
around the tuned kernels. The op id is the key of a process-wide registry that holds each op weakly: the
compiled graph holds its ops, so they live exactly as long as Dynamo keeps that graph.

Inductor lowers `tuned` (not its differentiable twin, whose calls autograd must see) to a call that its wrapper
code makes straight to the op, `extern_kernels.tensortune_tuned(*activations, op_id, out=buffer)`, into a buffer it
allocates as it allocates its own (reusing a dead one of the same size), and the op launches its kernel (straight,
where it can: TunedOp.into): the dispatcher's round trip back to Python cost 40 µs a call in BERT-base bf16 on an
Intel AMX host (its caches cold after each kernel; 1.9 ms a forward for its 48 dense calls).
"""
from __future__ import annotations

import itertools
import weakref
from typing import Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import fx
from torch._inductor import ir, lowering
from torch._inductor.compile_fx import compile_fx
from torch._inductor.select_algorithm import extern_kernels
from torch._inductor.virtualized import V

from .autograd import differentiate

# the tuned op of a graph whose activations need no gradient, and of one whose activations do (with an autograd
# formula: under no_grad, dispatching through it costs 4.8 µs a call against 1.6)
OPERATOR, DIFFERENTIABLE = "tuned", "tuned_differentiable"
KERNEL = "tensortune_tuned"  # what Inductor's wrapper code calls for `tuned`: extern_kernels.tensortune_tuned


@runtime_checkable
class Opaque(Protocol):
    """What Inductor needs of a tuned op: its result's shape (from fake tensors, sizes maybe symbolic), dtype and
    memory format, its result (from real tensors: new, or into a buffer Inductor allocated), and which activations'
    gradients it computes."""

    dtype: torch.dtype
    memory_format: torch.memory_format
    grads: tuple[bool, ...]

    def result_shape(self, *activations: torch.Tensor) -> tuple: ...

    def forward(self, *activations: torch.Tensor) -> torch.Tensor: ...

    def into(self, activations: list[torch.Tensor], out: torch.Tensor) -> None: ...


class Registry:
    """The tuned ops the graphs compiled in this process call, by id. It holds them weakly: each compiled graph
    holds its own ops, so an op lives as long as Dynamo keeps a graph that calls it, and no longer."""

    def __init__(self):
        self.ops: weakref.WeakValueDictionary[int, Opaque] = weakref.WeakValueDictionary()
        self.ids = itertools.count()

    def add(self, op: Opaque) -> int:
        op_id = next(self.ids)
        self.ops[op_id] = op
        return op_id

    def __getitem__(self, op_id: int) -> Opaque:
        try:
            return self.ops[op_id]
        except KeyError:
            raise RuntimeError(f"tensortune: tuned op {op_id} is gone, yet a compiled graph calls it") from None


REGISTRY = globals().get("REGISTRY") or Registry()  # the one the operator reads, kept if the module runs again


LIBRARY = globals().get("LIBRARY") or torch.library.Library("tensortune", "FRAGMENT")  # kept alive, and on reload


def define_operators():
    """Define the custom operators `tensortune::tuned(op_id, activations)` and its differentiable twin, once per
    process: a module run again (importlib.reload) keeps the first definitions, whose functions read this module's
    REGISTRY. They are plain `torch.library` kernels, not `torch.library.custom_op`s, whose Python wrappers cost
    another 1.4 µs a call (3.3 under no_grad) in a model that makes dozens. The autograd formula is
    frontend/autograd.py's."""
    if hasattr(torch.ops.tensortune, OPERATOR):
        return

    def forward(op_id: int, activations: list[torch.Tensor]) -> torch.Tensor:
        return REGISTRY[op_id].forward(*activations)

    def fake(op_id: int, activations: list[torch.Tensor]) -> torch.Tensor:
        op = REGISTRY[op_id]
        return torch.empty(op.result_shape(*activations), dtype=op.dtype, device=activations[0].device,
                           memory_format=op.memory_format)

    for name in (OPERATOR, DIFFERENTIABLE):
        LIBRARY.define(f"{name}(int op_id, Tensor[] activations) -> Tensor")
        LIBRARY.impl(name, forward, "CPU")
        torch.library.register_fake(f"{LIBRARY.ns}::{name}", fake, lib=LIBRARY)
    differentiate(LIBRARY, DIFFERENTIABLE, REGISTRY)
    lower_operator()


def run_into(*arguments, out: torch.Tensor) -> None:
    """What Inductor's wrapper code calls for a tuned op: its activations, then its id; the result written into
    `out`, a buffer Inductor allocated with the result's shape and strides."""
    *activations, op_id = arguments
    REGISTRY[op_id].into(activations, out)


def lower_operator():
    """Lower `tensortune::tuned` in Inductor to a direct call of `run_into` on its activations, realized with the
    strides they were traced with (a batch_matmul's kernel is chosen by them), into a buffer Inductor allocates with
    the strides of the op's fake result. Once per process, as define_operators."""
    operator = getattr(torch.ops.tensortune, OPERATOR).default
    setattr(extern_kernels, KERNEL, run_into)
    lowering.add_layout_constraint(operator, lowering.constrain_to_fake_tensors)  # as for any custom op, by default

    @lowering.register_lowering(operator, type_promotion_kind=None)
    def lower(op_id: int, activations: list):
        result = V.graph.current_node.meta["val"]
        inputs = [ir.ExternKernel.realize_input(activation) for activation in activations]
        return ir.TensorBox.create(ir.ExternKernelOut(ir.FallbackKernel.tensor_to_layout(result), inputs, [op_id],
                                                      python_kernel_name=f"extern_kernels.{KERNEL}"))


define_operators()


def to_operator_calls(module: fx.GraphModule, which: Callable[[Opaque], bool] = lambda op: True) -> list[Opaque]:
    """Replace each `call_module` of a tuned op (of those `which` picks) by a call of a custom operator, the
    differentiable one where autograd wants the op's gradients; the ops, in graph order."""
    graph, ops = module.graph, []
    for node in list(graph.nodes):
        if node.op != "call_module" or not isinstance(op := module.get_submodule(node.target), Opaque) or not which(op):
            continue
        with graph.inserting_before(node):
            operator = getattr(torch.ops.tensortune, DIFFERENTIABLE if any(op.grads) else OPERATOR).default
            call = graph.call_function(operator, (REGISTRY.add(op), list(node.args)))
        call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        module.delete_submodule(node.target)
        ops.append(op)
    graph.lint()
    module.recompile()
    return ops


def as_constants(module: fx.GraphModule) -> None:
    """Make the tensors given to a Dynamo graph after tracing (the weights frontend/rewrites.py concatenates)
    plain attributes, constants of the graph: AOTAutograd lifts every parameter and buffer to an input, and
    knows where each comes from only for those Dynamo registered."""
    registered = getattr(module, "_param_name_to_source", None)
    if registered is None:  # not Dynamo's graph: every parameter and buffer may be lifted
        return
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if name not in registered:
            owner, _, attribute = name.rpartition(".")
            holder = module.get_submodule(owner)
            delattr(holder, attribute)
            setattr(holder, attribute, tensor.detach())


def compile_around(module: fx.GraphModule, example_inputs: Sequence):
    """What Inductor's compile_fx makes of the graph with its tuned ops as custom operator calls, holding them.
    Inductor's caches stay off for it: a cached graph would call op ids of another compile (or process). Its wrapper
    code is Python, whatever Inductor's cpp_wrapper says: it calls the tuned ops, which are Python."""
    ops = to_operator_calls(module)
    as_constants(module)
    with torch._inductor.config.patch(fx_graph_cache=False, cpp_wrapper=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        compiled = compile_fx(module, list(example_inputs))

    def run(*args, _ops=tuple(ops)):
        return compiled(*args)

    run._boxed_call = getattr(compiled, "_boxed_call", False)
    return run
