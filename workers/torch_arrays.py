"""NumPy arrays and torch tensors of one memory, in every dtype tensortune computes in: torch.from_numpy and
Tensor.numpy refuse bfloat16, so it crosses as its bits."""
from __future__ import annotations

import numpy as np

FLOATING = ("float32", "bfloat16")  # the dtypes a model's floating-point operators compute in on tensortune kernels


def torch_dtype(name: str):
    """The torch dtype of a buffer's dtype name (a floating-point workload's dtype is its buffers')."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "uint8": torch.uint8, "int8": torch.int8,
            "int32": torch.int32}[name]


def dtype_name(tensor) -> str | None:
    """The floating-point workload dtype name of a tensor's dtype; None for one tensortune does not compute a model's
    floating-point operators in."""
    return next((name for name in FLOATING if tensor.dtype == torch_dtype(name)), None)


def torch_tensor(array: np.ndarray):
    """A tensor sharing the array's memory."""
    import torch

    if array.dtype == np.dtype("bfloat16"):
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def numpy_array(tensor) -> np.ndarray:
    """An array sharing a CPU tensor's memory (a contiguous, detached tensor's)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view("bfloat16")
    return tensor.numpy()
