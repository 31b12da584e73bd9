"""PyTorch models through tensortune: the tasks found in their graphs, and torch.compile(backend="tensortune")
computing what eager PyTorch computes, on the presets and on models written here."""
import re
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from db import Database
from frontend import NothingToTune, extract_tasks
from frontend.backend import TunedOp, compile_graph
from frontend.capture import capture
from frontend.presets import PRESETS, ModelError, load_model
from search_space import (Target, Workload, batch_matmul, conv2d, dense, fallback_config, get_space, host_target,
                          matmul)
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
        scores = torch.matmul(y, y.transpose(-1, -2))  # batch_matmul(2, 5, 5, 8)
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
                          dense(10, 8, 16), batch_matmul(2, 5, 5, 8), matmul(5, 8, 5),
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
    assert weights == {dense(128, 768, 768, bias=True).key: 4, dense(128, 3072, 768, bias=True, epilogue="gelu_erf").key: 1,
                       dense(128, 768, 3072, bias=True).key: 1, batch_matmul(12, 128, 128, 64).key: 1,
                       batch_matmul(12, 128, 64, 128).key: 1}
    assert tasks[0].workload == dense(128, 768, 768, bias=True)  # the most weighted work first
    assert set(tasks[0].paths) == {"query", "key", "value", "output"}
    assert [t.paths for t in tasks if t.workload.op == "batch_matmul"] == [("EncoderLayer",)] * 2  # the model's code


def test_resnet18_tasks_fold_batch_norm_and_fuse_the_shortcut():
    tasks = {t.workload.key: t for t in extract_tasks(*load_model("resnet18"))}
    block = conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu").key
    assert tasks[block].weight == 2 and sum(t.weight for t in tasks.values()) == 21  # 20 convolutions and the fc
    assert conv2d(1, 64, 56, 56, 128, 1, 1, 2, 0, bias=True).key in tasks  # a shortcut: its add went to the block


@pytest.mark.parametrize("make", [mixed, *PRESETS.values()], ids=["mixed", *PRESETS])
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
    built = {op.workload: op.kernel.kernel.config.index for op in forward.__self__.modules() if isinstance(op, TunedOp)}
    assert built == best


def test_an_op_whose_shape_varies_runs_in_pytorch_and_is_named_once(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU()).eval()
    compiled = torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/v.db"})
    with torch.inference_mode(), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("default")
        for rows in (4, 6, 9, 6, 11):
            x = torch.randn(rows, 16)
            assert torch.allclose(compiled(x), model(x), atol=1e-5)
    varying = [str(w.message) for w in warned if "changes size between calls" in str(w.message)]
    assert len(varying) == 1 and varying[0].startswith("0 (linear) runs in PyTorch")


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
