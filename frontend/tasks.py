"""`extract_tasks(model, example_inputs)`: the tuning tasks of a PyTorch model, found in the graphs the
tensortune backend will compile, so that what is tuned is exactly what runs; `extract_tasks_at`: those of a model
run at several input sizes (sequence lengths), tuned together. With `training`, those of a training step: the
forward's workloads as grad mode makes them (trained linear layers take their weights at each call), and the
products of their gradients."""
from __future__ import annotations

from collections import Counter
from typing import Iterable

import torch

from tuner.scheduler import TuningTask

from .capture import capture
from .patterns import find_matches
from .quantized import traceable


class NothingToTune(ValueError):
    """The model has no operator tensortune computes."""


def extract_tasks(model: torch.nn.Module, example_inputs: tuple, training: bool = False) -> list[TuningTask]:
    """One task per distinct workload, weighted by how often one forward pass (and backward, when `training`)
    runs it, with the module paths that produce it (the model's class name for its own code, which has no path);
    most weighted work (weight × FLOPs) first."""
    return extract_tasks_at(model, [example_inputs], training)


def extract_tasks_at(model: torch.nn.Module, input_sets: Iterable[tuple], training: bool = False) -> list[TuningTask]:
    """`extract_tasks` of the model run once on each of `input_sets` (its example inputs at several sequence
    lengths): the workloads of every run, the weights of one that several runs share summed. A model quantized by
    quantize_dynamic is read as frontend.quantized.traceable makes it."""
    counts: Counter = Counter()
    paths: dict = {}
    model = traceable(model)
    for example_inputs in input_sets:
        for captured in capture(model, example_inputs, grad=training):
            for match in find_matches(captured):
                for number, workload in enumerate(match.workloads):  # the forward's, then its gradients'
                    counts[workload] += match.calls if number == 0 else 1
                    paths.setdefault(workload, []).append(match.path or type(model).__name__)
    if not counts:
        raise NothingToTune(f"{type(model).__name__} has no dense, matmul, batch_matmul or conv2d for tensortune to tune")
    tasks = [TuningTask(workload, weight, tuple(paths[workload])) for workload, weight in counts.items()]
    return sorted(tasks, key=lambda task: -task.weight * task.workload.flops)
