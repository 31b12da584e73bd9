"""int8's dequantization, shared by the dense and conv2d templates: the int32 sum Σ X·W of uint8 activations with
zero point x_zero is corrected by x_zero · Σ W per output channel (summed once, when the weights are bound) and
scaled to float32."""
from __future__ import annotations

from typing import Callable

from ..program import Buffer, Const, Load, Loop, Op, Value, var


def negated_sums(sums: Buffer, channels: int, reduction: list[tuple[str, int]], weight: Callable[..., Load]) -> list:
    """sums[n] = −Σ weight(n, *reduction's variables) over the reduction's loops, for each of `channels`."""
    n = var("n")
    body = (sums.store(n, Op("add", (sums[n], Op("mul", (Const(-1), weight(n, *(var(x) for x, _ in reduction))))))),)
    for name, extent in reversed(reduction):
        body = (Loop(name, extent, "serial", body),)
    return [Loop("n", channels, "serial", (sums.store(n, Const(0)),) + body)]


def dequantized(value: Value, inputs: dict[str, Buffer], sums: Buffer, channel) -> Value:
    """float(sum − x_zero · Σ W[channel]) · x_scale · w_scale[channel]: `sums` holds the negated weight sums."""
    scale = Op("mul", (inputs["x_scale"][0], inputs["w_scale"][channel]))
    corrected = Op("fma", (inputs["x_zero"][0], sums[channel], value))
    return Op("mul", (Op("float", (corrected,)), scale))
