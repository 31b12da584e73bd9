"""NumPy arrays and torch tensors of one memory, in every dtype tensortune computes in: torch.from_numpy and
Tensor.numpy refuse bfloat16, so it crosses as its bits."""
from __future__ import annotations

import numpy as np

from search_space import DTYPES


def torch_dtype(name: str):
    """The torch dtype of a workload's dtype name."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def dtype_name(tensor) -> str | None:
    """The workload dtype name of a tensor's dtype; None for one tensortune does not compute in."""
    return next((name for name in DTYPES if tensor.dtype == torch_dtype(name)), None)


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
