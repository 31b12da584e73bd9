"""PyTorch models: their tuning tasks, the `tensortune` torch.compile backend, and model presets.

Needs the `[torch]` extra (pip install -e ".[torch]"); nothing else in tensortune imports this package.
"""
from .backend import tensortune
from .quantized import traceable
from .tasks import NothingToTune, extract_tasks

__all__ = ["NothingToTune", "extract_tasks", "tensortune", "traceable"]
