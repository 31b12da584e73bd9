"""Models whose linear layers `torch.ao.quantization.quantize_dynamic` quantized, on tensortune's int8 kernels.

Dynamo does not trace torch.ao's quantized modules: torch.compile of such a model hands a backend no graph at
all. `traceable(model)` gives the model back with each dynamically quantized Linear replaced by a
`QuantizedLinear`, plain PyTorch that Dynamo traces: the activation quantized per call over its range (zero
included) to uint8, as dynamic quantization does, over 128 levels as PyTorch's quantized Linear asks
(`reduce_range`: the activations of the user's quantized model, and int8 dense of a reduced range, which AVX2 CPUs
multiply by bytes, `pmaddubsw`), then `tensortune::quantized_linear`, a custom operator the backend matches as an
int8 dense, its weights, their scales and the bias bound. Where it is not matched it runs in PyTorch,
exactly. The quantization is an operator too, `tensortune::quantize_activation`, composite (Inductor compiles the
PyTorch it is made of): layers quantizing one activation are seen to, and the backend quantizes it once and fuses
their products (Q, K and V) into one dense.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

LEVELS = 127  # steps of a uint8 activation in a reduced range, 0..127


@torch.library.custom_op("tensortune::quantized_linear", mutates_args=())
def quantized_linear(x: torch.Tensor, x_scale: torch.Tensor, x_zero: torch.Tensor, weight: torch.Tensor,
                     w_scale: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """(x − x_zero) · weightᵀ · x_scale · w_scale + bias for uint8 x and int8 weight [N, K]: the int8 dense workload,
    summed in float64 (exact), rounded once to float32."""
    sums = (x.double() - x_zero.double()) @ weight.double().T
    y = sums * (x_scale.double() * w_scale.double())
    return (y + bias.double() if bias is not None else y).float()


@quantized_linear.register_fake
def _(x, x_scale, x_zero, weight, w_scale, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=torch.float32)


def _quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x as uint8 with its scale and zero point, one pair for the whole tensor: its range widened to hold 0 (so
    that zero padding stays exact), spread over 128 levels."""
    low, high = torch.clamp(x.min(), max=0.0), torch.clamp(x.max(), min=0.0)
    scale = torch.clamp((high - low) / LEVELS, min=torch.finfo(torch.float32).eps)
    zero = torch.clamp(torch.round(-low / scale), 0, LEVELS)
    quantized = torch.clamp(torch.round(x / scale) + zero, 0, LEVELS).to(torch.uint8)
    return quantized, scale.reshape(1).float(), zero.reshape(1).to(torch.int32)


_OPERATORS = torch.library.Library("tensortune", "FRAGMENT")
_OPERATORS.define("quantize_activation(Tensor x) -> (Tensor, Tensor, Tensor)")
_OPERATORS.impl("quantize_activation", _quantize_activation, "CompositeImplicitAutograd")
quantize_activation = torch.ops.tensortune.quantize_activation.default


class QuantizedLinear(nn.Module):
    """A dynamically quantized Linear as Dynamo can trace it: int8 weights scaled per output channel (zero point
    0), float32 bias, float32 in and out."""

    def __init__(self, weight: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("w_scale", w_scale.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())

    @classmethod
    def of(cls, module: nn.Module, name: str) -> QuantizedLinear:
        """The same layer as `module`, a torch.ao dynamically quantized Linear; ValueError naming it when its
        weights are not symmetric int8."""
        weight = module.weight()
        if weight.dtype != torch.qint8:
            raise ValueError(f"{name}: tensortune's int8 kernels take qint8 weights, not {weight.dtype}")
        if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
            scales, zeros = torch.full((weight.shape[0],), weight.q_scale()), torch.tensor([weight.q_zero_point()])
        else:
            scales, zeros = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
        if bool((zeros != 0).any()):
            raise ValueError(f"{name}: tensortune's int8 kernels take symmetric weights (zero point 0)")
        return cls(weight.int_repr(), scales, module.bias())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quantized, scale, zero = quantize_activation(x)
        return quantized_linear(quantized, scale, zero, self.weight, self.w_scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}"


def traceable(model: nn.Module) -> nn.Module:
    """The model with its dynamically quantized Linears as QuantizedLinear (a copy; the model itself when it has
    none)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    names = [name for name, module in model.named_modules() if type(module) is DynamicLinear]
    if not names:
        return model
    model = copy.deepcopy(model)
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, leaf, QuantizedLinear.of(getattr(owner, leaf), name))
    return model


def quantize(model: nn.Module) -> nn.Module:
    """PyTorch's dynamic int8 quantization of the model's Linears (a copy), as a user would run it."""
    return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
