"""Training through tuned kernels: under grad mode a trained linear layer takes its weight at each call, and the
gradients of linear layers and attention products run as tuned products (dY·W, dYᵀ·x, dC·bᵀ, aᵀ·dC), which
extract_tasks finds for a training step. Gradients and optimizer steps match eager PyTorch's."""
import copy
import logging
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frontend import extract_tasks
from search_space import batch_matmul, dense, matmul
from tests.compile_helpers import compiled
from tests.test_cli_model import MODEL_FILE, refused, run
from tests.test_frontend import frontend_lines

transformers = pytest.importorskip("transformers")


class Block(nn.Module):
    """A linear layer and its GELU, attention-like products of activations, a linear layer without bias."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 8, bias=False)

    def forward(self, x):
        h = F.gelu(self.up(x))
        return self.down((h @ h.transpose(-1, -2)).softmax(-1) @ h)


def test_a_training_step_adds_the_products_of_the_gradients_to_the_tasks():
    """The first layer's input needs no gradient: only its weight's (dYᵀ·x) is computed. The GELU is not fused
    under grad mode (autograd differentiates it in PyTorch), as it is for inference."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 6, 16)
    assert {task.workload: task.weight for task in extract_tasks(model, (x,), training=True)} == {
        dense(12, 32, 16, bias=True): 1, matmul(32, 16, 12): 1,  # up: forward, dW
        batch_matmul(2, 6, 6, 32, b_strides="192:1:32"): 1, batch_matmul(2, 6, 6, 32): 1,  # h·hᵀ (hᵀ read in place)
        batch_matmul(2, 6, 32, 6): 3, batch_matmul(2, 32, 6, 6): 1,  # and the products of the gradients
        dense(12, 8, 32): 1, matmul(12, 32, 8): 1, matmul(8, 32, 12): 1}  # down: forward, dX, dW
    assert dense(12, 32, 16, bias=True, epilogue="gelu_erf") in {task.workload for task in extract_tasks(model, (x,))}


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_optimizer_steps_through_tuned_kernels_match_eager(graph, tmp_path):
    """Three SGD steps: a weight bound once would be stale from the second step on."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 6, 16)
    reference, initial = copy.deepcopy(model), copy.deepcopy(model)
    forward = compiled(model, f"sqlite:///{tmp_path}/empty.db", graph)
    for trained, step in ((model, forward), (reference, reference)):
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            step(x).pow(2).mean().backward()
            optimizer.step()
    for (name, got), expected, first in zip(model.named_parameters(), reference.parameters(), initial.parameters()):
        assert not torch.allclose(got, first, rtol=1e-3, atol=1e-4), name  # the steps moved it
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), name


def tiny_bert():
    """BERT at 32 wide, 2 layers of 2 heads, in training mode without dropout (so eager's step is comparable),
    its attention PyTorch's scaled_dot_product_attention."""
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    return transformers.BertModel(config).train()


def loss(output) -> torch.Tensor:
    """One that reaches every parameter, the pooler's too."""
    return output.last_hidden_state.pow(2).sum() + output.pooler_output.sum()


def tuned_kernels_run(step) -> set[str]:
    """The workload keys of the tuned kernels `step` runs, as the profiler names their events."""
    with torch.profiler.profile() as profile:
        step()
    return {event.name.removeprefix("tensortune ") for event in profile.events()
            if event.name.startswith("tensortune ")}


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_a_bert_training_step_runs_every_task_on_tuned_kernels_and_matches_eager(graph, tmp_path, caplog):
    model, ids = tiny_bert(), torch.randint(0, 100, (2, 8))
    loss(model(ids)).backward()
    expected = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad()
    forward = compiled(model, f"sqlite:///{tmp_path}/empty.db", graph)
    with caplog.at_level(logging.INFO, logger="tensortune.frontend"):
        ran = tuned_kernels_run(lambda: loss(forward(ids)).backward())
    tasks = extract_tasks(model, (ids,), training=True)
    assert ran == {task.workload.key for task in tasks}
    assert {matmul(64, 32, 16), matmul(16, 32, 64), batch_matmul(4, 8, 16, 8)} <= {task.workload for task in tasks}
    assert not [line for line in frontend_lines(caplog) if "run in PyTorch" in line]
    for name, parameter in model.named_parameters():  # to 1e-4 of each gradient's largest (a key bias's is ~1e-11)
        scale = float(expected[name].abs().max())
        assert torch.allclose(parameter.grad, expected[name], rtol=0, atol=1e-4 * scale + 1e-9), name


def test_tune_model_tunes_a_training_steps_tasks_then_times_the_step(tmp_path):
    """Tiny's two linear layers: their forwards, the second's dX and both dW (its input needs no gradient)."""
    (tmp_path / "models.py").write_text(MODEL_FILE)
    tuned = run("tune-model", "models.py:tiny", "--training", "--trials", "10", "--target", "llvm -threads=1",
                "--db", f"sqlite:///{tmp_path}/t.db", "--rounds", "1", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert "10 trials over 5 tasks of models.py:tiny --training" in tuned.stdout
    assert re.search(r"training step: eager PyTorch [\d.]+ ms, tensortune [\d.]+ ms, .* max difference", tuned.stdout)


def test_training_is_refused_where_it_cannot_run(tmp_path, monkeypatch):
    (tmp_path / "models.py").write_text(MODEL_FILE)
    cast = refused("tune-model", "models.py:tiny", "--training", "--dtype", "bfloat16", cwd=tmp_path,
                   monkeypatch=monkeypatch)
    assert cast.exit_code == 2 and "--training runs in float32; --dtype bfloat16 is for inference" in cast.stderr
    profiled = refused("bench", "model", "models.py:tiny", "--training", "--profile", cwd=tmp_path,
                       monkeypatch=monkeypatch)
    assert profiled.exit_code == 2 and "--profile times inference" in profiled.stderr


def test_every_linear_form_trains_through_tuned_kernels_but_a_wider_product_by_a_weight_said_in_one_line(tmp_path,
                                                                                                          caplog):
    """addmm (scaled or not) becomes an mm of two activations; a 3-D activation by a [K, N] weight runs in PyTorch,
    named in the one line, and every parameter gets eager's gradient."""
    from tests.test_hf_models import LinearForms

    torch.manual_seed(0)
    model, x = LinearForms(), torch.randn(2, 5, 24)
    model(x).pow(2).sum().backward()
    expected = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad()
    with caplog.at_level(logging.WARNING, logger="tensortune.frontend"):
        compiled(model, f"sqlite:///{tmp_path}/empty.db")(x).pow(2).sum().backward()
    [said] = [line for line in frontend_lines(caplog) if "run in PyTorch" in line]
    assert said.startswith("tensortune: 1 of 4 ops run in PyTorch")
    assert said.endswith("dense M=10 N=16 K=40 epilogue=relu")
    for name, parameter in model.named_parameters():
        assert torch.allclose(parameter.grad, expected[name], rtol=1e-4, atol=1e-3), name


def test_training_at_another_sequence_length_runs_tuned_kernels_traced_symbolic(tmp_path, caplog):
    """The second length makes Dynamo trace the sequence symbolic: the trained layers and their gradients' products
    dispatch on the sizes they meet, nothing goes back to PyTorch, and the gradients are eager's."""
    model = tiny_bert()
    forward = compiled(model, f"sqlite:///{tmp_path}/empty.db")
    for length in (8, 12):
        ids = torch.randint(0, 100, (2, length))
        loss(model(ids)).backward()
        expected = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
        model.zero_grad()
        with caplog.at_level(logging.INFO, logger="tensortune.frontend"):
            ran = tuned_kernels_run(lambda: loss(forward(ids)).backward())
        # the tasks of the ids the compiled model met at its second size (and marked dynamic): static, as extracted
        assert ran == {task.workload.key for task in extract_tasks(model, (ids,), training=True)}
        for name, parameter in model.named_parameters():
            scale = float(expected[name].abs().max())
            assert torch.allclose(parameter.grad, expected[name], rtol=0, atol=1e-4 * scale + 1e-9), name
        model.zero_grad()
    assert not [line for line in frontend_lines(caplog) if "run in PyTorch" in line]
    assert [line for line in frontend_lines(caplog) if "new size batch_matmul B=4 M=12" in line]
