"""The operand buffers of the GEMM ops, shared by the CPU and CUDA templates: matmul's and batch_matmul's
A, B → C, dense's X, W (and bias) → Y, named as `Workload.operand_shapes` names them."""
from __future__ import annotations

from ..program import Buffer
from ..workload import Workload

NAMES = {"matmul": ("A", "B", "C"), "dense": ("X", "W", "Y"), "batch_matmul": ("A", "B", "C")}


def gemm_operands(workload: Workload) -> tuple[Buffer, Buffer, Buffer | None, Buffer]:
    """(a, b, bias or None, c): the two inputs of the product, dense's bias, the output."""
    a, b, c = NAMES[workload.op]
    shapes = dict(workload.operand_shapes())
    buffer = lambda name, shape, scope: Buffer(name, shape, scope, workload.dtype)
    bias = buffer("bias", shapes["bias"], "input") if "bias" in shapes else None
    return buffer(a, shapes[a], "input"), buffer(b, shapes[b], "input"), bias, buffer(c, workload.output_shape, "output")
