"""`extract_tasks(model, example_inputs)`: the tuning tasks of a PyTorch model, found in the graphs the
tensortune backend will compile, so that what is tuned is exactly what runs."""
from __future__ import annotations

from collections import Counter

import torch

from tuner.scheduler import TuningTask

from .capture import capture
from .patterns import find_matches


class NothingToTune(ValueError):
    """The model has no operator tensortune computes."""


def extract_tasks(model: torch.nn.Module, example_inputs: tuple) -> list[TuningTask]:
    """One task per distinct workload, weighted by how often one forward pass runs it, with the module
    paths that produce it (the model's class name for its own code, which has no path); most weighted work
    (weight × FLOPs) first."""
    counts: Counter = Counter()
    paths: dict = {}
    for captured in capture(model, example_inputs):
        for match in find_matches(captured):
            counts[match.workload] += 1
            paths.setdefault(match.workload, []).append(match.path or type(model).__name__)
    if not counts:
        raise NothingToTune(f"{type(model).__name__} has no dense, matmul, batch_matmul or conv2d for tensortune to tune")
    tasks = [TuningTask(workload, weight, tuple(paths[workload])) for workload, weight in counts.items()]
    return sorted(tasks, key=lambda task: -task.weight * task.workload.flops)
