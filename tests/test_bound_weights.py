"""A compiled model whose bound weights were changed in place (load_state_dict, an optimizer step, an in-place op)
computes with the new weights: its tuned ops bind them again, fused and folded as at compile time; tensors no
kernel bound (a training BatchNorm's statistics, trained weights) change freely; a graph that no longer matches as
it did refuses to run."""
import copy
import logging

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from frontend import bound_weights
from frontend.backend import TunedOp
from frontend.bound_weights import WeightsChanged


def compiled_on_empty_db(model: nn.Module, tmp_path, graph: str = "inductor"):
    return torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db", "graph": graph})


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


def assert_follows(change, model: nn.Module, x: torch.Tensor, tmp_path, graph: str = "inductor") -> None:
    """The model compiled computes as it does, before `change(model)` and after it, with no compile between."""
    compiled = compiled_on_empty_db(model, tmp_path, graph)
    with torch.inference_mode():
        assert_close(compiled(x), model(x))
        before = model(x)
    with torch.no_grad():
        change(model)
    compiles = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch.inference_mode():
        assert not torch.allclose(model(x), before)
        for _ in range(2):  # bound again once, then as bound
            assert_close(compiled(x), model(x))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == compiles


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_load_state_dict_after_compiling_is_followed(graph, tmp_path):
    assert_follows(lambda model: model.load_state_dict(mlp(seed=1).state_dict()), mlp(), torch.randn(4, 16),
                   tmp_path, graph)


class Attention(nn.Module):
    """Three linears reading one activation: compiled as one dense of their weights concatenated (a copy)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x)


def test_a_change_to_one_of_fused_weights_is_followed(tmp_path):
    torch.manual_seed(0)
    assert_follows(lambda model: model.k.weight.mul_(2), Attention().eval(), torch.randn(4, 16), tmp_path)


class ConvNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_a_folded_batch_norm_is_followed_and_a_training_one_is_not_bound(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    assert_follows(lambda model: model.bn.running_var.mul_(2), ConvNorm().eval(), x, tmp_path)
    torch._dynamo.reset()
    training = ConvNorm().train()
    twin, compiled = copy.deepcopy(training), compiled_on_empty_db(training, tmp_path)
    rebound = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TunedOp, "rebind", lambda op, match: rebound.append(op))
        with torch.no_grad():
            for _ in range(3):  # the statistics change at every call: the convolution's weight alone is bound
                assert_close(compiled(x), twin(x))
    assert rebound == []


def test_weights_trained_between_calls_are_passed_not_bound(tmp_path):
    model, twin, x = mlp().train(), mlp().train(), torch.randn(4, 16)
    compiled = compiled_on_empty_db(model, tmp_path)
    steps = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    for _ in range(3):
        for step, run in zip(steps, (compiled, twin)):
            step.zero_grad()
            run(x).square().sum().backward()
            step.step()
    assert_close(compiled(x), twin(x))


def test_a_graph_that_no_longer_matches_as_it_did_refuses_to_run(tmp_path, monkeypatch):
    """A change Dynamo's guards do not see that would change the matches (none is known: matching reads no weight's
    values) is refused rather than bound to the wrong ops: here the second matching is made to find one op fewer."""
    model, x = mlp(), torch.randn(4, 16)
    compiled = compiled_on_empty_db(model, tmp_path)
    with torch.inference_mode():
        compiled(x)
    matched = bound_weights.find_matches
    monkeypatch.setattr(bound_weights, "find_matches", lambda captured: matched(captured)[1:])
    with torch.no_grad():
        model[0].weight.mul_(2)
    with torch.inference_mode(), pytest.raises(WeightsChanged, match="no longer matches as it did"):
        compiled(x)


def test_weights_made_in_inference_mode_are_not_watched_and_a_warning_says_so(tmp_path, caplog):
    """PyTorch counts no in-place changes of an inference tensor: the compile says that a change to such weights
    goes unseen (the two layers' weights and biases), naming the ops that bound them; a model made outside inference
    mode gets no such warning."""
    x = torch.randn(4, 16)
    with torch.inference_mode():
        made_inside = mlp()
    for model, warned in ((made_inside, True), (mlp(1), False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, "tensortune.frontend"), torch.inference_mode():
            assert_close(compiled_on_empty_db(model, tmp_path)(x), model(x))
        said = [record.getMessage() for record in caplog.records if "made in inference mode" in record.getMessage()]
        assert len(said) == warned and all("4 of the weights" in line and "dense M=4 N=32 K=16" in line and
                                           "dense M=4 N=8 K=32" in line for line in said)
