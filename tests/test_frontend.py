"""PyTorch models through tensortune: the tasks found in their graphs, and torch.compile(backend="tensortune")
computing what eager PyTorch computes, on the presets and on models written here."""
import inspect
import logging
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from db import Database
from frontend import NothingToTune, extract_tasks
from frontend.backend import TunedOp, compile_graph
from frontend.capture import capture
from frontend.presets import PRESETS, ModelError, load_model
from search_space import (InvalidConfig, Target, Workload, batch_matmul, conv2d, dense, fallback_config, get_space,
                          host_target, matmul)
from tests.db_helpers import measurement


class Mixed(nn.Module):
    """Each mapped pattern once, and the cases that must not fuse."""

    def __init__(self):
        super().__init__()
        self.fused, self.shared, self.tanh = nn.Linear(24, 40), nn.Linear(40, 16), nn.Linear(16, 8, bias=False)
        self.conv, self.norm = nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8)

    def forward(self, x, image):
        h = torch.relu(self.fused(x))  # bias + relu fused
        s = self.shared(h)
        t = nn.functional.gelu(s, approximate="tanh") + s  # s is read twice: gelu is not fused
        y = self.tanh(t)  # (2, 5, 8)
        scores = torch.matmul(y, y.transpose(-1, -2))  # batch_matmul(2, 5, 5, 8), yᵀ read in place
        flat = torch.mm(scores[0], y[0])  # matmul(5, 8, 5)
        z = self.norm(self.conv(image))
        return flat.sum() + torch.relu(z + z.mean()).sum()  # the add's other side has another shape: no residual


def mixed():
    torch.manual_seed(0)
    model = Mixed().eval()
    model.norm.running_mean.uniform_(-0.5, 0.5)
    model.norm.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(2, 5, 24), torch.randn(1, 3, 9, 11))


class Functional(nn.Module):
    """Functional calls as models write them, unlike nn.Linear and nn.Conv2d: bias and weight by keyword, no
    bias, a weight that is a plain attribute, one computed in forward, and one the caller passes."""

    def __init__(self):
        super().__init__()
        self.fc, self.conv = nn.Linear(24, 16), nn.Conv2d(3, 4, 3)
        self.plain = torch.randn(12, 16)  # neither a parameter nor a buffer

    def forward(self, x, given, image):
        h = F.linear(x, self.fc.weight, bias=self.fc.bias)
        h = F.linear(h, weight=self.plain, bias=None)
        h = F.linear(h, self.plain.t() * 0.5)  # computed at each call: PyTorch runs it
        features = F.conv2d(image, self.conv.weight, bias=self.conv.bias, padding=1)
        return F.linear(h, given), features  # `given` is the caller's, another at each call: PyTorch runs it


def functional_inputs():
    return torch.randn(2, 5, 24), torch.randn(8, 16), torch.randn(1, 3, 6, 6)


def functional():
    torch.manual_seed(0)
    return Functional().eval(), functional_inputs()


def compiled_output(model, inputs, db, target="llvm"):
    torch._dynamo.reset()  # compile afresh: Dynamo's caches, shared by the whole test process, could reuse (or give
    # up on, past its recompile limit) the code of a model an earlier test compiled, and never call the backend
    with torch.inference_mode():
        expected = model(*inputs)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            got = torch.compile(model, backend="tensortune", options={"db": db, "target": target})(*inputs)
    return expected, got, [str(w.message) for w in warned]


def test_tasks_are_the_mapped_patterns_with_their_weights_and_modules():
    tasks = {t.workload: t for t in extract_tasks(*mixed())}
    assert set(tasks) == {dense(10, 40, 24, bias=True, epilogue="relu"), dense(10, 16, 40, bias=True),
                          dense(10, 8, 16), batch_matmul(2, 5, 5, 8, b_strides="40:1:8"), matmul(5, 8, 5),
                          conv2d(1, 3, 9, 11, 8, 3, 3, 2, 1, bias=True)}
    assert tasks[dense(10, 40, 24, bias=True, epilogue="relu")].paths == ("fused",)
    assert all(t.weight == 1 for t in tasks.values())


def test_functional_calls_bind_the_model_tensors_only():
    tasks = {t.workload: t.paths for t in extract_tasks(*functional())}
    assert tasks == {dense(10, 16, 24, bias=True): ("Functional",), dense(10, 12, 16): ("Functional",),
                     conv2d(1, 3, 6, 6, 4, 3, 3, 1, 1, bias=True): ("Functional",)}


def test_bert_layer_tasks():
    tasks = extract_tasks(*load_model("bert-layer"))
    weights = {t.workload.key: t.weight for t in tasks}
    assert weights == {dense(128, 2304, 768, bias=True).key: 1, dense(128, 768, 768, bias=True).key: 1,  # Q, K, V fused
                       dense(128, 3072, 768, bias=True, epilogue="gelu_erf").key: 1,
                       dense(128, 768, 3072, bias=True).key: 1,
                       # q, kᵀ and v read in place: heads of 64 in the fused QKV's rows of 2304
                       batch_matmul(12, 128, 128, 64, a_strides="64:2304:1", b_strides="64:1:2304").key: 1,
                       batch_matmul(12, 128, 64, 128, b_strides="64:2304:1").key: 1}
    assert [t.paths for t in tasks[:2]] == [("up",), ("down",)]  # the most weighted work first
    fused = next(t for t in tasks if t.workload == dense(128, 2304, 768, bias=True))
    assert fused.paths == ("EncoderLayer",)  # the parent of query, key and value: the model's own module
    assert [t.paths for t in tasks if t.workload.op == "batch_matmul"] == [("EncoderLayer",)] * 2  # the model's code


def test_resnet18_tasks_fold_batch_norm_and_fuse_the_shortcut():
    tasks = {t.workload.key: t for t in extract_tasks(*load_model("resnet18"))}
    # channels last, as a graph of several convolutions runs
    block = conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu", layout="nhwc").key
    assert tasks[block].weight == 2 and sum(t.weight for t in tasks.values()) == 21  # 20 convolutions and the fc
    shortcut = conv2d(1, 64, 56, 56, 128, 1, 1, 2, 0, bias=True, layout="nhwc")
    assert shortcut.key in tasks  # its add went to the block


PLAIN_PRESETS = [name for name in PRESETS if not name.startswith("hf-")]  # small Hugging Face models: test_hf_models.py


@pytest.mark.parametrize("make", [mixed, *(PRESETS[name] for name in PLAIN_PRESETS)], ids=["mixed", *PLAIN_PRESETS])
def test_the_compiled_model_computes_what_eager_does(make, tmp_path, caplog):
    model, inputs = make()
    expected, got, warned = compiled_output(model, inputs, f"sqlite:///{tmp_path}/empty.db")
    assert got.shape == expected.shape
    scale = max(1.0, float(expected.abs().max()))
    assert float((got - expected).abs().max()) <= 1e-4 * scale
    [summary] = [record.getMessage() for record in caplog.records if record.name == "tensortune.frontend"]
    untuned = re.fullmatch(r"tensortune: (\d+) of \1 kernels have no stored config for .+ and run a fallback config, "
                           r"which may be much slower: (.+)", summary)
    assert untuned and len(set(untuned[2].split("; "))) == int(untuned[1])  # each kernel named once
    assert not [w for w in warned if w.startswith("Cannot find config")]  # nor once more for each


class Block(nn.Module):
    """A ResNet basic block after a stem and its max pool: convolutions with BatchNorm, the shortcut and relus."""

    def __init__(self):
        super().__init__()
        self.stem, self.norm = nn.Conv2d(3, 16, 5, 2, 2), nn.BatchNorm2d(16)
        self.first, self.second = nn.Conv2d(16, 16, 3, 1, 1), nn.Conv2d(16, 16, 3, 1, 1, bias=False)

    def forward(self, image):
        x = F.max_pool2d(torch.relu(self.norm(self.stem(image))), 3, 2, 1)
        return torch.relu(self.second(torch.relu(self.first(x))) + x)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "channels_last"])
def test_a_graph_of_convolutions_runs_them_channels_last(memory_format, tmp_path):
    """Three convolutions, in a model and image laid NCHW (as PyTorch makes them) or channels_last (bench model
    --channels-last): each reads and writes its activations channels last (the nhwc layout), and the result, the
    last convolution's, lies as eager's does, with its numbers."""
    torch.manual_seed(0)
    model = Block().eval().to(memory_format=memory_format)
    model.norm.running_var.uniform_(0.5, 2.0)
    image = torch.randn(1, 3, 21, 18).contiguous(memory_format=memory_format)
    layouts = {task.workload.key: task.workload.p["layout"] for task in extract_tasks(model, (image,))}
    assert len(layouts) == 3 and set(layouts.values()) == {"nhwc"}, layouts
    expected, got, _ = compiled_output(model, (image,), f"sqlite:///{tmp_path}/empty.db")
    assert got.stride() == expected.stride() and expected.is_contiguous(memory_format=memory_format)
    assert float((got - expected).abs().max()) <= 1e-4 * max(1.0, float(expected.abs().max()))


def test_a_lone_convolution_reads_its_input_as_it_lies():
    for memory_format, layout in ((torch.contiguous_format, "nchw"), (torch.channels_last, "nhwc")):
        image = torch.randn(1, 3, 9, 11).contiguous(memory_format=memory_format)
        [task] = extract_tasks(nn.Conv2d(3, 8, 3, 2, 1).eval(), (image,))
        assert task.workload == conv2d(1, 3, 9, 11, 8, 3, 3, 2, 1, bias=True, layout=layout)


def test_each_shape_runs_the_config_stored_for_it(tmp_path):
    """Each shape's best stored config is the other shape's runner-up: a kernel built with the other's, or
    with the fallback, is seen."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 24)).eval(), torch.randn(16, 32)
    first, second, target = dense(16, 48, 32, bias=True), dense(16, 24, 48, bias=True), host_target()
    size = min(get_space(workload, target).size for workload in (first, second))
    best = {first: size // 3, second: size // 2}
    assert best[first] != fallback_config(first, target).index and best[second] != fallback_config(second, target).index
    database = Database(f"sqlite:///{tmp_path}/tuned.db")
    for workload, other in ((first, second), (second, first)):
        database.record(*measurement(workload, target, best[workload], 1e-6))
        database.record(*measurement(workload, target, best[other], 1e-3))
    [captured] = capture(model, (x,))
    with torch.inference_mode():
        forward = compile_graph(captured.graph, captured.inputs, database.url, str(target))
        assert torch.allclose(forward(*captured.inputs)[0], model(x), atol=1e-5)
    assert built_configs(graph_of(forward)) == best


def graph_of(forward) -> fx.GraphModule:
    """The module whose forward compile_graph returned (through frontend.frame_stack's wrapper, where it wraps)."""
    return inspect.unwrap(forward).__self__


def tuned_ops(graph: fx.GraphModule) -> list[TunedOp]:
    return [op for op in graph.modules() if isinstance(op, TunedOp)]


def built_configs(graph: fx.GraphModule) -> dict:
    """The config each workload's kernel runs, over the sizes the graph's tuned ops have met."""
    return {workload: kernel.kernel.config.index
            for op in tuned_ops(graph) for workload, kernel in op.sizes.bound.items()}


def recording_compile(model, db: str):
    """torch.compile with the tensortune backend, and the list of the graphs it compiles (each recompilation
    adds one), so the tests can look at their tuned ops."""
    graphs = []

    def backend(graph, example_inputs):
        forward = compile_graph(graph, example_inputs, db)
        graphs.append(graph_of(forward))
        return forward
    torch._dynamo.reset()  # as compiled_output does
    return torch.compile(model, backend=backend), graphs


def frontend_lines(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == "tensortune.frontend"]


class Sequences(nn.Module):
    """Each form once, on inputs whose batch and sequence sizes change: a linear over [batch, sequence, 16], a
    Conv1D-style addmm through a view to a relu, attention-like batch matmuls, a 2-D product and a convolution
    over [batch, 3, sequence, 8]."""

    def __init__(self):
        super().__init__()
        self.fc, self.conv = nn.Linear(16, 24), nn.Conv2d(3, 4, 3, padding=1)
        self.weight, self.bias = nn.Parameter(torch.randn(24, 16)), nn.Parameter(torch.randn(16))

    def forward(self, x, image):
        h = self.fc(x)
        scores = torch.matmul(h, h.transpose(-1, -2))
        context = torch.matmul(scores.softmax(-1), h)
        y = torch.relu(torch.addmm(self.bias, context.view(-1, 24), self.weight).view(x.shape[0], x.shape[1], 16))
        gram = torch.mm(y[0].t(), y[0])
        return y, gram, self.conv(image)


SIZES = [(2, 5), (2, 7), (2, 9), (3, 7)]  # (batch, sequence): three sequence lengths, then another batch size


def test_every_size_runs_tuned_kernels(tmp_path, caplog):
    """The first call compiles a static graph; another sequence length makes Dynamo trace the sizes symbolic,
    another batch size once more: each graph has every op tuned, each op builds the kernel of each size it meets
    once (said in one line per workload), and no op goes back to PyTorch."""
    torch.manual_seed(0)
    model = Sequences().eval()
    compiled, graphs = recording_compile(model, f"sqlite:///{tmp_path}/empty.db")
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger="tensortune.frontend"):
        for batch, length in SIZES + SIZES[-1:]:  # the last size once more: its kernels are known
            x, image = torch.randn(batch, length, 16), torch.randn(batch, 3, length, 8)
            for got, expected in zip(compiled(x, image), model(x, image)):
                assert torch.allclose(got, expected, atol=1e-4)
    assert len(graphs) == 3 and [len(tuned_ops(graph)) for graph in graphs] == [6, 6, 6]
    sizes_met = [[len(op.sizes.runs) for op in tuned_ops(graph)] for graph in graphs]
    assert sizes_met == [[1] * 6, [2] * 6, [1] * 6]  # the static graph's, lengths 7 and 9, then batch 3
    calls = [node for node in graphs[1].graph.nodes if node.op == "call_module"]
    shapes = [graphs[1].get_submodule(node.target).result_shape(*(arg.meta["example_value"] for arg in node.args))
              for node in calls]  # from the traced (fake) activations: symbolic where the sequence length is in it
    assert [re.sub(r"s\d+", "s", str(shape)) for shape in shapes] == [
        "(2, s, 24)", "(2, s, s)", "(2, s, 24)", "(2*s, 16)", "(16, 16)", "(2, 4, s, 8)"]
    lines = frontend_lines(caplog)
    assert not [line for line in lines if "run in PyTorch" in line]
    new = [line for line in lines if line.startswith("tensortune: new size ")]
    assert len(new) == 18  # six workloads at each of the three sizes the symbolic graphs met
    assert "tensortune: new size dense M=21 N=16 K=24 bias=true epilogue=relu has no stored config" in "".join(new)


def test_a_new_size_borrows_the_config_of_the_nearest_tuned_shape(tmp_path, caplog):
    """Only dense M=128 is tuned: the graph built for 77 rows (static) and the kernel built for 90 (symbolic)
    run its config, and say so."""
    torch.manual_seed(0)
    model, target = nn.Linear(32, 48).eval(), host_target()
    tuned, asked = dense(128, 48, 32, bias=True), dense(77, 48, 32, bias=True)
    space, smaller = get_space(tuned, target), get_space(asked, target)
    index = next(i for i in range(space.size // 3, space.size) if fits(smaller, space.get(i)))
    database = Database(f"sqlite:///{tmp_path}/tuned.db")
    database.record(*measurement(tuned, target, index, 1e-6))
    compiled, graphs = recording_compile(model, database.url)
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger="tensortune.frontend"):
        for rows in (77, 90):
            x = torch.randn(rows, 32)
            assert torch.allclose(compiled(x), model(x), atol=1e-5)
    [op] = [op for graph in graphs for op in tuned_ops(graph) if dense(90, 48, 32, bias=True) in op.sizes.bound]
    built = [kernel.kernel.config for graph in graphs for op in tuned_ops(graph) for kernel in op.sizes.bound.values()]
    assert [config.to_dict() for config in built] == [space.get(index).to_dict()] * 2
    lines = frontend_lines(caplog)
    assert ("tensortune: 1 kernels run the config of the nearest tuned shape of their op: dense M=77 N=48 K=32 "
            "bias=true (from dense M=128 N=48 K=32 bias=true)") in lines
    assert ("tensortune: new size dense M=90 N=48 K=32 bias=true runs the config of dense M=128 N=48 K=32 "
            "bias=true, the nearest tuned shape") in lines


def fits(space, config) -> bool:
    try:
        space.config(config.to_dict())
        return True
    except InvalidConfig:
        return False


def test_a_size_the_weights_fix_that_varies_runs_in_pytorch_said_in_one_line(tmp_path, caplog):
    """Dynamo makes a linear's K static (the weight fixes it), so the graph is traced here with the input's K
    symbolic, as a K that varies would be: both linears reading it run in PyTorch, named in one line; the one
    reading their sum is tuned."""
    torch.manual_seed(0)
    model, inputs = Branches().eval(), (torch.randn(4, 16), torch.randn(4, 16))
    [captured] = capture(model, inputs)
    fake_mode = FakeTensorMode(shape_env=ShapeEnv())
    for node, value in captured.placeholder_values.items():
        if any(value.shape == given.shape and torch.equal(value, given) for given in inputs):  # copies of them
            node.meta["example_value"] = fake_mode.from_tensor(
                value, symbolic_context=StatelessSymbolicContext([DimDynamic.DYNAMIC] * 2))
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger="tensortune.frontend"):
        forward = compile_graph(captured.graph, captured.inputs, f"sqlite:///{tmp_path}/empty.db")
        assert torch.allclose(forward(*captured.inputs)[0], model(*inputs), atol=1e-5)
    assert [op.label for op in tuned_ops(graph_of(forward))] == ["dense M=4 N=8 K=32 bias=true"]
    [said] = [line for line in frontend_lines(caplog) if "run in PyTorch" in line]
    assert said == ("tensortune: 2 op(s) run in PyTorch (the size its weight fixes (K) changes between calls): "
                    "left (linear); right (linear)")


class Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.left, self.right, self.out = nn.Linear(16, 32), nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x, z):  # not one input read by both: they would become one dense (frontend/rewrites.py)
        return self.out(self.left(x) + self.right(z))


def test_functional_calls_compute_what_eager_does_at_every_call(tmp_path):
    """The second call passes another weight of the same shape (made as the first, so that Dynamo reuses the
    graph): a kernel that bound the first one is wrong."""
    model, first = functional()
    second = functional_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db"})
    with torch.inference_mode():
        for inputs in (first, second):
            for got, expected in zip(compiled(*inputs), model(*inputs)):
                assert torch.allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_each_instance_of_a_module_class_runs_its_own_weights(graph, tmp_path):
    """Two instances of one class, their weights alike in shape but not in value: Dynamo would reuse the first
    one's graph for the second (its code and shapes match), whose tuned ops bound the first one's weights. The
    backend has it guard on the weights' identity, so each instance is compiled for its own."""
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 8)).eval() for _ in range(2)]
    x = torch.randn(2, 5, 24)
    torch._dynamo.reset()
    options = {"db": f"sqlite:///{tmp_path}/empty.db", "graph": graph}
    with torch.inference_mode():
        compiled = [torch.compile(model, backend="tensortune", options=options) for model in models]
        assert float((models[0](x) - models[1](x)).abs().max()) > 0.1
        for _ in range(2):  # and again, each instance on its own graph
            for model, run in zip(models, compiled):
                assert torch.allclose(run(x), model(x), atol=1e-5)


def test_fallbacks_are_one_readable_line_on_stderr(tmp_path):
    """What a torch.compile user sees with nothing tuned: the kernels named in one line, no file:line and no
    warning per kernel with its target string."""
    script = ("import torch\n"
              "model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()\n"
              f"options = {{'db': 'sqlite:///{tmp_path}/empty.db', 'target': 'llvm -threads=1'}}\n"
              "with torch.inference_mode():\n"
              "    torch.compile(model, backend='tensortune', options=options)(torch.randn(4, 16))\n")
    stderr = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stderr
    label = Target.parse("llvm -threads=1").label
    assert stderr.splitlines() == [f"tensortune: 2 of 2 kernels have no stored config for {label} and run a fallback "
                                   "config, which may be much slower: dense M=4 N=32 K=16 bias=true epilogue=relu; "
                                   "dense M=4 N=8 K=32 bias=true"]


def test_the_backend_is_found_by_name_without_importing_tensortune():
    listed = subprocess.run([sys.executable, "-c", "import torch._dynamo; print(torch._dynamo.list_backends())"],
                            capture_output=True, text=True, check=True).stdout
    assert "'tensortune'" in listed


def test_a_model_with_nothing_to_tune_says_so():
    with pytest.raises(NothingToTune, match="Sequential has no dense, matmul, batch_matmul or conv2d"):
        extract_tasks(nn.Sequential(nn.ReLU()), (torch.randn(4),))


@pytest.mark.parametrize("spec, message", [
    ("gpt-7", "unknown model 'gpt-7': presets are bert-layer, bert-base, resnet18"),
    ("missing.py:make", "missing.py: cannot get a model from make(): FileNotFoundError"),
])
def test_bad_model_specs_are_one_clear_line(spec, message):
    with pytest.raises(ModelError) as error:
        load_model(spec)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_file_function_that_returns_the_wrong_thing_is_named(tmp_path):
    (tmp_path / "models.py").write_text("import torch\ndef wrong():\n    return 3\ndef right():\n"
                                        "    return torch.nn.Linear(4, 4), torch.randn(2, 4)\n")
    with pytest.raises(ModelError, match=r"models.py: wrong\(\) must return \(model, example_inputs\), got int"):
        load_model(f"{tmp_path}/models.py:wrong")
    model, inputs = load_model(f"{tmp_path}/models.py:right")
    assert [t.workload for t in extract_tasks(model, inputs)] == [Workload.make("dense", M=2, N=4, K=4, bias=True)]


def test_the_bench_transformer_block_is_one_qkv_dense_two_attention_products_and_three_denses():
    """bench/transformer_block.py, the plain-PyTorch model issue-style figures are taken on, as tune-model loads it:
    Q, K and V fused (N = 3 × 512), SDPA's two products over 8 heads, the output and the GELU feed-forward."""
    model, inputs = load_model("bench/transformer_block.py:make", seq_len=32)
    assert {task.workload: task.weight for task in extract_tasks(model, inputs)} == {
        dense(32, 1536, 512, bias=True): 1, dense(32, 512, 512, bias=True): 1,
        dense(32, 2048, 512, bias=True, epilogue="gelu_erf"): 1, dense(32, 512, 2048, bias=True): 1,
        batch_matmul(8, 32, 32, 64, a_strides="64:1536:1", b_strides="64:1:1536"): 1,
        batch_matmul(8, 32, 64, 32, b_strides="64:1536:1"): 1}


def test_the_kernel_clock_times_each_tuned_call_by_its_workload_and_only_within_it(tmp_path):
    """bench model --profile's in-model and glue columns: each kernel call's seconds by the clock around it, named
    as the profiler names its event, and the seconds of the backend's work before it under the same names; nothing
    is kept once the clock is off, and torch.profiler still sees the events."""
    from frontend.backend import kernel_clock

    torch._dynamo.reset()
    model, inputs = mixed()
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/c.db"})
    keys = {f"tensortune {task.workload.key}" for task in extract_tasks(model, inputs)}
    with torch.inference_mode():
        compiled(*inputs)
        with kernel_clock() as seconds:
            for _ in range(3):
                compiled(*inputs)
        for timed in (seconds, seconds.glue):
            assert set(timed) == keys and all(len(values) == 3 and min(values) > 0 for values in timed.values())
        kept = [{name: list(values) for name, values in timed.items()} for timed in (seconds, seconds.glue)]
        with torch.profiler.profile() as profile:
            compiled(*inputs)
    assert [seconds, seconds.glue] == kept
    assert keys <= {event.key for event in profile.key_averages()}
