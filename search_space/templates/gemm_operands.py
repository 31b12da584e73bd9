"""The operand buffers of the GEMM ops, shared by the CPU and CUDA templates: matmul's and batch_matmul's
A, B → C, dense's X, W (and bias, and in int8 the quantization's scales and zero point) → Y, named and typed as
`Workload.operand_shapes` and `Workload.operand_dtype` say."""
from __future__ import annotations

from ..program import Buffer
from ..workload import Workload

NAMES = {"matmul": ("A", "B", "C"), "dense": ("X", "W", "Y"), "batch_matmul": ("A", "B", "C")}


def input_buffers(workload: Workload) -> dict[str, Buffer]:
    """Every input, in call order, read through its strides where the workload gives them."""
    return {name: Buffer(name, shape, "input", workload.operand_dtype(name), workload.operand_strides(name))
            for name, shape in workload.operand_shapes()}


def gemm_operands(workload: Workload) -> tuple[Buffer, Buffer, Buffer | None, Buffer]:
    """(a, b, bias or None, c): the two inputs of the product, dense's bias, the output."""
    a, b, c = NAMES[workload.op]
    inputs = input_buffers(workload)
    return inputs[a], inputs[b], inputs.get("bias"), Buffer(c, workload.output_shape, "output", workload.output_dtype)
