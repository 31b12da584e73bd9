"""The fused epilogues as program values: what a template applies to each output element as it is written."""
from __future__ import annotations

from ..program import Const, Op, Value

GELU_C, GELU_A = 0.7978845608, 0.044715
SQRT_HALF = 0.7071067811865476


def epilogue(kind: str, value: Value) -> Value:
    """`none`, `relu`, `gelu` in its tanh form, 0.5·x·(1 + tanh(c·(x + a·x³))), or `gelu_erf`, PyTorch's default
    GELU, 0.5·x·(1 + erf(x/√2)) (search_space.workload.gelu and gelu_erf)."""
    if kind == "relu":
        return Op("max", (value, Const(0.0)))
    if kind == "gelu":
        inner = Op("mul", (Const(GELU_C), Op("fma", (Op("mul", (Const(GELU_A), value)), Op("mul", (value, value)), value))))
        return Op("mul", (Op("mul", (Const(0.5), value)), Op("add", (Const(1.0), Op("tanh", (inner,))))))
    if kind == "gelu_erf":
        return Op("mul", (Op("mul", (Const(0.5), value)), Op("add", (Const(1.0), Op("erf", (Op("mul", (
            Const(SQRT_HALF), value)),))))))
    return value
