"""A compiled model whose bound weights were changed in place refuses to run on the stale copies, names the tensor,
and computes with the new weights once compiled again; tensors no kernel bound (a training BatchNorm's statistics,
trained weights) change freely."""
import copy
import re

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from frontend.bound_weights import WeightsChanged, state_dict_key


def compiled_on_empty_db(model: nn.Module, tmp_path, graph: str = "inductor"):
    return torch.compile(model, backend="tensortune", options={"db": f"sqlite:///{tmp_path}/empty.db", "graph": graph})


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()


@pytest.mark.parametrize("graph", ["inductor", "eager"])
def test_load_state_dict_after_compiling_is_refused_then_compiled_anew(graph, tmp_path):
    model, x = mlp(), torch.randn(4, 16)
    compiled = compiled_on_empty_db(model, tmp_path, graph)
    with torch.inference_mode():
        assert_close(compiled(x), model(x))
    torch.manual_seed(1)
    model.load_state_dict(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).state_dict())
    with torch.inference_mode(), pytest.raises(WeightsChanged, match=r"tensor \d\.(weight|bias) was changed in place"):
        compiled(x)
    torch._dynamo.reset()
    with torch.inference_mode():
        assert_close(compiled(x), model(x))


class Attention(nn.Module):
    """Three linears reading one activation: compiled as one dense of their weights concatenated (a copy)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        return self.q(x) * self.k(x) + self.v(x)


def assert_refused_after(change, model: nn.Module, x: torch.Tensor, name: str, tmp_path) -> None:
    """The model compiled computes as it does, then raises WeightsChanged naming `name` once `change(model)` ran."""
    compiled = compiled_on_empty_db(model, tmp_path)
    with torch.inference_mode():
        assert_close(compiled(x), model(x))
    with torch.no_grad():
        change(model)
    with torch.inference_mode(), pytest.raises(WeightsChanged, match=rf"tensor {re.escape(name)} was"):
        compiled(x)


def test_a_change_to_one_of_fused_weights_is_seen(tmp_path):
    torch.manual_seed(0)
    assert_refused_after(lambda model: model.k.weight.mul_(2), Attention().eval(), torch.randn(4, 16), "k.weight",
                         tmp_path)


class ConvNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_a_folded_batch_norm_is_bound_and_a_training_one_is_not(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    assert_refused_after(lambda model: model.bn.running_var.mul_(2), ConvNorm().eval(), x, "bn.running_var", tmp_path)
    torch._dynamo.reset()
    training = ConvNorm().train()
    twin, compiled = copy.deepcopy(training), compiled_on_empty_db(training, tmp_path)
    with torch.no_grad():
        for _ in range(3):  # the statistics change at every call: the convolution's weight alone is bound
            assert_close(compiled(x), twin(x))


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


def test_state_dict_keys_from_dynamo_sources():
    assert state_dict_key("L['self']._modules['encoder']._modules['0']._parameters['weight']") == "encoder.0.weight"
    assert state_dict_key("L['fn']._buffers['running_mean']") == "running_mean"
    assert state_dict_key("G['table']") == "G['table']"
