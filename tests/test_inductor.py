"""The graph around the tuned kernels: compiled by Inductor, each kernel an opaque custom operator in it
(frontend/inductor.py), or kept eager when the backend's `graph` option says so."""
import gc
import importlib
import re
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._inductor.utils import run_and_get_code

from frontend import inductor
from frontend.backend import tensortune
from frontend.capture import capture
from frontend.shapes import Run
from search_space import Target, dense, fallback_config
from workers import build

TUNED_CALL = "extern_kernels.tensortune_tuned("


class Block(nn.Module):
    """linear → layer norm → gelu → linear, a residual add and a softmax: two dense ops, the add and the softmax
    one call of the softmax kernel (frontend/softmax.py), and the elementwise work between them that Inductor fuses
    into one kernel."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 16)

    def forward(self, x):
        return torch.softmax(x + self.down(F.gelu(self.norm(self.up(x)))), dim=-1)


def block() -> Block:
    torch.manual_seed(0)
    return Block().eval()


def fused_kernels(code: list[str]) -> list[str]:
    """The names of the kernels Inductor generated (it names each after the operations fused into it)."""
    return re.findall(r"^(cpp_fused_\w+) = async_compile", "\n".join(code), re.MULTILINE)


def run_compiled(model, x, path, **options):
    """The model's output under torch.compile(backend="tensortune") and the code Inductor generated for it
    (run_and_get_code resets Dynamo first, so the backend compiles afresh)."""
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{path}/empty.db", **options})
    with torch.inference_mode():
        return run_and_get_code(compiled, x)


def assert_close(got, expected):
    assert got.shape == expected.shape
    assert float((got - expected).abs().max()) <= 1e-5


def test_the_graph_around_the_tuned_ops_is_compiled_by_inductor(tmp_path):
    model, x = block(), torch.randn(2, 5, 16)
    got, code = run_compiled(model, x, tmp_path)
    with torch.inference_mode():
        assert_close(got, model(x))
    assert sum(source.count(TUNED_CALL) for source in code) == 3
    kernels = fused_kernels(code)
    assert any("layer_norm" in name and "gelu" in name for name in kernels), kernels
    assert not any("softmax" in name for name in kernels), kernels


class Attention(nn.Module):
    """One head of attention over one linear layer's output split in three: its products read q, kᵀ and v where
    they lie, views of that output."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).split(16, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v


def test_inductors_wrapper_calls_each_tuned_op_into_a_buffer_it_allocates(tmp_path):
    """Not through the dispatcher (40 µs a call in BERT-base with cold caches): the wrapper code calls the op
    straight, its views passed as they lie and its result written into a buffer Inductor allocated."""
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 6, 16)
    got, code = run_compiled(model, x, tmp_path)
    with torch.inference_mode():
        assert_close(got, model(x))
    calls = re.findall(r"extern_kernels\.tensortune_tuned\((.*), \d+, out=(buf\d+)\)", code[0])
    assert len(calls) == 4, code[0]  # the softmax's too
    assert all(re.search(rf"{out} = empty_strided_cpu\(", code[0]) for _, out in calls)
    assert sum("reinterpret_tensor(" in activations for activations, _ in calls) == 2  # q and kᵀ, then v
    assert "torch.ops.tensortune" not in code[0]
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db"})
    with torch.inference_mode(), torch.profiler.profile() as profile:
        compiled(x)
    events = {event.key for event in profile.key_averages()}
    assert "tensortune::tuned" not in events
    assert sum(event.startswith("tensortune ") for event in events) == 3  # each kernel's own event


class Transposed(nn.Module):
    """A linear layer reading its input transposed, a view the dense kernel cannot read in place, then one reading
    the contiguous result."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(5, 12), nn.Linear(12, 7)

    def forward(self, x):
        return self.second(torch.relu(self.first(x.transpose(1, 2))))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
def test_a_static_op_reading_its_activations_in_place_is_launched_straight(dynamic, tmp_path):
    """After its first call, an op of static sizes whose kernel reads every activation where it lies is launched on
    the addresses alone, with nothing else asked of the tensors; an activation it cannot read so (a transposed view
    for a dense) the graph copies first (frontend.backend.laid_out), so that op is launched so too; any op of
    symbolic sizes keeps to run_kernel's checks (and copies). Each computes what eager does, call after call."""
    torch.manual_seed(0)
    model = Transposed().eval()
    torch._dynamo.reset()
    gc.collect()  # the registry then holds this test's ops alone
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db"},
                             dynamic=dynamic)
    with torch.inference_mode():
        for _ in range(3):
            x = torch.randn(2, 5, 9)
            assert_close(compiled(x), model(x))
    straight = {op.form.K: op.straight for op in inductor.REGISTRY.ops.values()}  # the first's K is 5, the second's 12
    if dynamic:
        assert straight == {5: False, 12: False}
    else:
        assert isinstance(straight[5], Run) and isinstance(straight[12], Run)


class TwoConvolutions(nn.Module):
    """Two convolutions, so both read and write channels_last, of an image that lies NCHW."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


@pytest.mark.parametrize("autocast", [False, True], ids=["nchw-image", "autocast"])
def test_an_activation_the_kernel_reads_otherwise_is_laid_out_by_the_graph(autocast, tmp_path):
    """An NCHW image for a convolution that reads channels_last, a float32 activation for a bfloat16 kernel under
    autocast: the graph makes the copy (Inductor, in a kernel of its own), and every op is launched straight."""
    torch.manual_seed(0)
    model = TwoConvolutions().eval()
    torch._dynamo.reset()
    gc.collect()  # the registry then holds this test's ops alone
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db"})
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        for _ in range(2):
            x = torch.randn(1, 3, 9, 9)
            got, expected = compiled(x), model(x)
            assert got.dtype == expected.dtype and torch.allclose(got.float(), expected.float(),
                                                                  atol=1e-5 if not autocast else 5e-2)
    ops = list(inductor.REGISTRY.ops.values())
    assert len(ops) == 2 and all(isinstance(op.straight, Run) for op in ops)


def test_a_graph_whose_ops_need_gradients_calls_the_differentiable_operator(tmp_path):
    """An inference graph's tuned ops call `tuned`, which has no autograd formula (under no_grad, dispatching
    through one costs three times as much); a training graph's call `tuned_differentiable`, whose gradients are
    tuned products too, computed by `tuned_differentiable_backward`."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 5, 16)  # in training mode: its weights need gradients
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db"})
    _, code = run_and_get_code(lambda: compiled(x).sum().backward())
    assert sum(source.count("torch.ops.tensortune.tuned_differentiable.default(") for source in code) == 2
    assert sum(source.count("torch.ops.tensortune.tuned_differentiable_backward.default(") for source in code) == 2
    assert not any(TUNED_CALL in source for source in code)
    assert model.up.weight.grad is not None and model.down.weight.grad is not None


def test_a_cpp_wrapper_asked_of_inductor_leaves_the_tuned_graphs_python(tmp_path):
    """Inductor's cpp_wrapper, set for the user's other graphs, would have no way to call the tuned ops."""
    model, x = block(), torch.randn(2, 5, 16)
    with torch._inductor.config.patch(cpp_wrapper=True):
        got, code = run_compiled(model, x, tmp_path)
    with torch.inference_mode():
        assert_close(got, model(x))
    assert sum(source.count(TUNED_CALL) for source in code) == 3


def test_the_eager_graph_option_runs_the_rest_op_by_op(tmp_path):
    model, x = block(), torch.randn(2, 5, 16)
    got, code = run_compiled(model, x, tmp_path, graph="eager")
    with torch.inference_mode():
        assert_close(got, model(x))
    assert code == []  # Inductor generated nothing


def test_symbolic_sizes_run_the_tuned_ops_in_inductor(tmp_path):
    """Dynamo traces with symbolic sizes from the first call (dynamic=True), and the graph serves every length."""
    model = block()
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db"},
                             dynamic=True)
    first, second = torch.randn(2, 5, 16), torch.randn(2, 9, 16)
    with torch.inference_mode():
        got, code = run_and_get_code(compiled, first)
        assert_close(got, model(first))
        assert_close(compiled(second), model(second))
    assert sum(source.count(TUNED_CALL) for source in code) == 3
    assert re.search(r"buf\d+ = empty_strided_cpu\(\(s\d+, s\d+, 32\)", code[0])  # the first op's symbolic result


class Gated(nn.Module):
    """Two linear layers reading one activation: frontend/rewrites.py gives the graph one dense of their weights
    concatenated, a tensor Dynamo never saw, which AOTAutograd must not take for a parameter of the model."""

    def __init__(self):
        super().__init__()
        self.value, self.gate = nn.Linear(16, 24), nn.Linear(16, 24)

    def forward(self, x):
        return self.value(x) * torch.sigmoid(self.gate(x))


def test_weights_the_graph_was_given_after_dynamo_are_constants_to_inductor(tmp_path):
    torch.manual_seed(0)
    model, x = Gated().eval(), torch.randn(2, 5, 16)
    got, code = run_compiled(model, x, tmp_path)
    with torch.inference_mode():
        assert_close(got, model(x))
    assert sum(source.count(TUNED_CALL) for source in code) == 1


@pytest.mark.parametrize("options, message", [
    ({"graph": "jit"}, "tensortune backend: option graph is 'jit'; it takes inductor or eager"),
    ({"graphs": "eager"}, "tensortune backend: unknown option(s) graphs; it takes db, target and graph"),
])
def test_bad_graph_options_are_refused(options, message):
    [captured] = capture(nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    with pytest.raises(ValueError) as raised:
        tensortune(captured.graph, captured.inputs, options)
    assert str(raised.value) == message


class RowDispatchedDense(nn.Module):
    """A linear layer on tensortune kernels, one built at the first sight of each row count, called as the
    backend's TunedOp calls them: by address."""

    dtype, grads, memory_format = torch.float32, (False,), torch.contiguous_format

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight.detach().numpy(), linear.bias.detach().numpy()
        self.calls = {}

    def result_shape(self, x: torch.Tensor) -> tuple:
        return (*x.shape[:-1], self.weight.shape[0])

    def into(self, activations: list[torch.Tensor], out: torch.Tensor) -> None:
        self.forward(*activations, out=out)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        x = x.contiguous()
        rows = x.numel() // x.shape[-1]
        if rows not in self.calls:
            workload, target = dense(rows, *self.weight.shape, bias=True), Target.parse("llvm")
            kernel = build(workload, target, fallback_config(workload, target))
            self.calls[rows] = kernel.bind(W=self.weight, bias=self.bias).address_call()
        out = torch.empty(self.result_shape(x)) if out is None else out
        self.calls[rows](x.data_ptr(), out.data_ptr())
        return out


def dense_ops_around(model: Block, made: list):
    """A torch.compile backend: the model's linear layers as RowDispatchedDense called by `call_module` (the
    form the tensortune backend substitutes), then compile_around; `made` gets weak references to the ops."""
    def backend(module, example_inputs):
        linears = iter([model.up, model.down])
        for node in [n for n in module.graph.nodes if n.op == "call_function" and n.target is torch._C._nn.linear]:
            op = RowDispatchedDense(next(linears))
            made.append(weakref.ref(op))
            module.add_submodule(f"dense_{len(made)}", op)
            with module.graph.inserting_after(node):
                node.replace_all_uses_with(module.graph.call_module(f"dense_{len(made)}", (node.args[0],)))
            module.graph.erase_node(node)
        module.recompile()
        return inductor.compile_around(module, example_inputs)
    return backend


def test_tuned_ops_take_symbolic_sizes_and_live_as_long_as_their_graph():
    """Dynamo traces with symbolic sizes from the first call (dynamic=True): the fake implementation's shape
    arithmetic takes them, and each length runs its own kernel. The module, run again, keeps its registry."""
    model, made = block(), []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=dense_ops_around(model, made), dynamic=True)
    with torch.inference_mode():
        for length in (5, 9):
            x = torch.randn(2, length, 16)
            got, code = run_and_get_code(compiled, x) if length == 5 else (compiled(x), code)
            assert_close(got, model(x))
        importlib.reload(inductor)
        x = torch.randn(3, 4, 16)
        assert_close(compiled(x), model(x))
    assert sum(source.count(TUNED_CALL) for source in code) == 2
    assert re.search(r"buf\d+ = empty_strided_cpu\(\(s\d+, s\d+, 32\)", code[0])  # the first op's symbolic result
    ops = [ref() for ref in made[-2:]]  # Dynamo restarts its first trace once (Inductor makes the layer norm's eps
    assert [set(op.calls) for op in ops] == [{10, 18, 12}] * 2  # a tensor): the last two are the ops it runs
    assert set(ops) <= set(inductor.REGISTRY.ops.values())
    del ops, compiled
    torch._dynamo.reset()
    gc.collect()
    assert [ref() for ref in made] == [None] * len(made)  # the registry held them for their graph, and no longer
