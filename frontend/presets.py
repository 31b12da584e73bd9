"""Models to tune by name, with random weights (nothing is downloaded): in plain PyTorch, and Hugging Face
transformers' BERT-base and GPT-2 (the `[hf]` extra); and user models given as `path/to/file.py:function` returning
`(model, example_inputs)`. Models with a sequence length are made at any (`seq_len`)."""
from __future__ import annotations

import importlib.util
import inspect
import math
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn

from workers.torch_arrays import torch_dtype

from .quantized import quantize


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


def bert_layer(seq_len: int = 128) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomized(EncoderLayer()), (torch.randn(1, seq_len, 768),)


def bert_base(seq_len: int = 128) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomized(nn.Sequential(*(EncoderLayer() for _ in range(12)))), (torch.randn(1, seq_len, 768),)


def resnet18() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return _randomized(ResNet18()), (torch.randn(1, 3, 224, 224),)


def _transformers(preset: str):
    """Hugging Face transformers, or one line saying how to get it (it is the optional `[hf]` extra)."""
    try:
        import transformers
    except ImportError:
        raise ModelError(f'{preset} needs Hugging Face transformers: pip install -e ".[hf]"') from None
    return transformers


def hf_bert_base(seq_len: int = 128) -> tuple[nn.Module, tuple]:
    """transformers' BertModel with BertConfig()'s defaults (BERT-base), random weights, fed token ids and an
    attention mask of batch 1."""
    transformers = _transformers("hf-bert-base")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig()).eval()  # before the inputs: the same at every length
    ids = torch.randint(0, model.config.vocab_size, (1, seq_len))
    return model, (ids, torch.ones(1, seq_len, dtype=torch.long))


def hf_gpt2(seq_len: int = 128) -> tuple[nn.Module, tuple]:
    """transformers' GPT2LMHeadModel with GPT2Config()'s defaults (GPT-2 small), random weights, fed token ids of
    batch 1; no key/value cache is returned (one forward over the whole sequence, as in prefill)."""
    transformers = _transformers("hf-gpt2")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(use_cache=False)).eval()
    return model, (torch.randint(0, model.config.vocab_size, (1, seq_len)),)


PRESETS: dict[str, Callable[..., tuple[nn.Module, tuple]]] = {
    "bert-layer": bert_layer, "bert-base": bert_base, "resnet18": resnet18, "hf-bert-base": hf_bert_base,
    "hf-gpt2": hf_gpt2}


def takes_seq_len(make: Callable) -> bool:
    """Whether `make` can be called with `seq_len=` (a parameter of that name, or **kwargs)."""
    parameters = inspect.signature(make).parameters.values()
    return any(p.kind == p.VAR_KEYWORD or (p.name == "seq_len" and p.kind != p.POSITIONAL_ONLY) for p in parameters)


def _made(make: Callable, seq_len: int | None, what: str, fix: str = ""):
    """`make()`, or `make(seq_len=seq_len)`; ModelError naming `what` (and how to `fix` it) when it takes no seq_len."""
    if seq_len is None:
        return make()
    if not takes_seq_len(make):
        raise ModelError(f"{what} takes no seq_len, so it cannot be made at other sequence lengths{fix}")
    return make(seq_len=seq_len)


def load_model(spec: str, seq_len: int | None = None) -> tuple[nn.Module, tuple]:
    """A preset by name, or `path/to/file.py:function` called for `(model, example_inputs)`; with `seq_len`, made at
    that sequence length (called with `seq_len=` as a keyword argument)."""
    if spec in PRESETS:
        return _made(PRESETS[spec], seq_len, spec)
    if ":" not in spec:
        raise ModelError(f"unknown model {spec!r}: presets are {', '.join(PRESETS)}, or give path/to/file.py:function")
    path, _, name = spec.rpartition(":")
    try:
        source = importlib.util.spec_from_file_location(Path(path).stem, path)
        module = importlib.util.module_from_spec(source)
        source.loader.exec_module(module)
        made = _made(getattr(module, name), seq_len, f"{path}: {name}()",
                     f": give it a seq_len keyword argument, e.g. def {name}(seq_len=128)")
    except ModelError:
        raise
    except Exception as error:  # anything the user's file does wrong is reported as one line naming it
        raise ModelError(f"{path}: cannot get a model from {name}(): {type(error).__name__}: {error}") from None
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise ModelError(f"{path}: {name}() must return (model, example_inputs), got {type(made).__name__}")
    model, inputs = made
    return model.eval(), tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def load_model_at(spec: str, seq_lens: Sequence[int] = ()) -> tuple[nn.Module, dict[int | None, tuple]]:
    """One model and its example inputs at each of `seq_lens` (keyed None, as the spec makes them, when none is
    given): what is tuned and run at every length. The model is the one made at the first length; those made at
    the others give only their inputs (so weights a factory leaves unseeded are no matter)."""
    if not seq_lens:
        model, inputs = load_model(spec)
        return model, {None: inputs}
    model, first = load_model(spec, seq_lens[0])
    return model, {seq_lens[0]: first} | {length: load_model(spec, length)[1] for length in seq_lens[1:]}


def in_dtype(model: nn.Module, inputs_at: dict, dtype: str) -> tuple[nn.Module, dict]:
    """The model and its inputs in `dtype` (a workload dtype name): parameters, buffers and floating-point inputs cast,
    as `model.to(torch.bfloat16)` does, integer inputs (token ids, masks) kept; the model is cast in place. In int8,
    a copy with its Linears quantized by PyTorch's quantize_dynamic (frontend.quantized), the inputs as they are."""
    if dtype == "float32":
        return model, inputs_at
    if dtype == "int8":
        return quantize(model), inputs_at
    wanted = torch_dtype(dtype)
    cast = lambda value: value.to(wanted) if isinstance(value, torch.Tensor) and value.is_floating_point() else value
    return model.to(wanted), {length: tuple(map(cast, inputs)) for length, inputs in inputs_at.items()}


def in_channels_last(model: nn.Module, inputs_at: dict) -> tuple[nn.Module, dict]:
    """The model and its inputs in PyTorch's channels_last memory format, the one its performance guide advises
    for a convolutional network on a CPU: 4-D parameters, buffers and floating-point inputs laid channels last (the
    model in place). Its convolutions then read and write their activations so (conv2d's nhwc layout), and the
    pooling between them runs on channels-last data."""
    last = torch.channels_last
    lay = lambda value: (value.contiguous(memory_format=last) if isinstance(value, torch.Tensor) and value.dim() == 4
                         and value.is_floating_point() else value)
    return model.to(memory_format=last), {length: tuple(map(lay, inputs)) for length, inputs in inputs_at.items()}
