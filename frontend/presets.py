"""Models to tune by name, written in plain PyTorch with random weights (nothing is downloaded), and
user models given as `path/to/file.py:function` returning `(model, example_inputs)`."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Callable

import torch
from torch import nn


class ModelError(ValueError):
    """A model spec that names no preset, or a file that cannot give a model."""


class EncoderLayer(nn.Module):
    """A BERT-base encoder layer (post-norm): self-attention with `heads` heads, then a GELU feed-forward."""

    def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.output, self.norm1 = nn.Linear(hidden, hidden), nn.LayerNorm(hidden)
        self.up, self.act, self.down, self.norm2 = nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden), nn.LayerNorm(hidden)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        batch, sequence, hidden = x.shape
        return x.view(batch, sequence, self.heads, hidden // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        context = torch.matmul(scores.softmax(-1), v).transpose(1, 2).reshape(x.shape)
        x = self.norm1(x + self.output(context))
        return self.norm2(x + self.down(self.act(self.up(x))))


class BasicBlock(nn.Module):
    """ResNet's two 3×3 convolutions with BatchNorm, and the shortcut (a strided 1×1 when the shape changes)."""

    def __init__(self, channels: int, out: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out)
        self.conv2, self.bn2 = nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or channels != out:
            self.shortcut = nn.Sequential(nn.Conv2d(channels, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    """torchvision's ResNet-18, layer for layer (torchvision's wheels do not load against the CPU torch here)."""

    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
        self.layers = nn.Sequential(*(nn.Sequential(BasicBlock(c, k, s), BasicBlock(k, k, 1)) for c, k, s in widths))
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def _randomized(model: nn.Module) -> nn.Module:
    """Eval mode, with BatchNorm statistics that are not the identity (so folding them is tested)."""
    generator = torch.Generator().manual_seed(0)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.1, 0.1, generator=generator)
            module.running_var.uniform_(0.5, 1.5, generator=generator)
            module.weight.data.uniform_(0.5, 1.5, generator=generator)
            module.bias.data.uniform_(-0.1, 0.1, generator=generator)
    return model.eval()


def bert_layer() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomized(EncoderLayer()), (torch.randn(1, 128, 768),)


def bert_base() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomized(nn.Sequential(*(EncoderLayer() for _ in range(12)))), (torch.randn(1, 128, 768),)


def resnet18() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomized(ResNet18()), (torch.randn(1, 3, 224, 224),)


PRESETS: dict[str, Callable[[], tuple[nn.Module, tuple]]] = {
    "bert-layer": bert_layer, "bert-base": bert_base, "resnet18": resnet18}


def load_model(spec: str) -> tuple[nn.Module, tuple]:
    """A preset by name, or `path/to/file.py:function` called for `(model, example_inputs)`."""
    if spec in PRESETS:
        return PRESETS[spec]()
    if ":" not in spec:
        raise ModelError(f"unknown model {spec!r}: presets are {', '.join(PRESETS)}, or give path/to/file.py:function")
    path, _, name = spec.rpartition(":")
    try:
        source = importlib.util.spec_from_file_location(Path(path).stem, path)
        module = importlib.util.module_from_spec(source)
        source.loader.exec_module(module)
        made = getattr(module, name)()
    except Exception as error:  # anything the user's file does wrong is reported as one line naming it
        raise ModelError(f"{path}: cannot get a model from {name}(): {type(error).__name__}: {error}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise ModelError(f"{path}: {name}() must return (model, example_inputs), got {type(made).__name__}")
    model, inputs = made
    return model.eval(), tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
