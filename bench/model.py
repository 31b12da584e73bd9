"""`tensortune bench model MODEL`: a whole model run by eager PyTorch, by torch.compile's default
(Inductor) and by torch.compile(backend="tensortune") with the best stored configs, timed in
alternating rounds in one run, with the largest difference from eager's output."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from search_space import Target
from workers.reference import head_to_head


def measure_model(name: str, model, inputs: tuple, db: str | None = None, target: str = "llvm", rounds: int = 5,
                  inductor: bool = True) -> dict:
    """Latencies (ms) of each way of running the model, their ratios to eager, and tensortune's max error."""
    import torch

    threads = Target.parse(target).threads
    torch.set_num_threads(threads)
    runs = {"eager": model}
    start = time.perf_counter()
    runs["tensortune"] = torch.compile(model, backend="tensortune", options={"db": db, "target": target})
    if inductor:
        runs["inductor"] = torch.compile(model)
    with torch.inference_mode():
        outputs = {way: run(*inputs) for way, run in runs.items()}  # compiles, and warms up
        compile_seconds = time.perf_counter() - start
        calls = {way: (lambda run=run: run(*inputs)) for way, run in runs.items()}
        seconds = head_to_head(calls, threads, rounds=rounds, min_repeat_ms=200)
    row = {"model": name, "threads": threads, "target": target, "compile_seconds": round(compile_seconds, 1),
           "max_error": max_difference(outputs["tensortune"], outputs["eager"])}
    for way, value in seconds.items():
        row[f"{way}_ms"] = round(value * 1e3, 3)
        row[f"{way}_speedup"] = round(seconds["eager"] / value, 3)
    return row


def max_difference(output, expected) -> float:
    """The largest absolute difference over every tensor of two outputs of one structure: a model may return a
    tensor, or tuples, lists, dicts, dataclasses or ModelOutputs (both) of them, nested."""
    differences = [float((got.double() - want.double()).abs().max())
                   for got, want in zip(tensors(output), tensors(expected), strict=True) if want.numel()]
    return max(differences, default=0.0)


def tensors(output) -> list:
    """The tensors of a model's output, in order; what else it holds (None, a number, a string) is no result."""
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        parts = output.values()
    elif dataclasses.is_dataclass(output) and not isinstance(output, type):
        parts = [getattr(output, field.name) for field in dataclasses.fields(output)]
    elif isinstance(output, (list, tuple)):
        parts = output
    else:
        return []
    return [tensor for part in parts for tensor in tensors(part)]


def run(models: dict[str, tuple], db: str | None, target: str, json_lines: bool, inductor: bool = True) -> list[dict]:
    """Time each of `models` (name → (model, example_inputs), as frontend.presets.load_model gives them)."""
    rows = []
    for name, (model, inputs) in models.items():
        row = measure_model(name, model, inputs, db, target, inductor=inductor)
        rows.append(row)
        if json_lines:
            print(json.dumps(row), flush=True)
    if not json_lines:
        table = Table(title="models: eager PyTorch, Inductor and tensortune (same run; speedup over eager)")
        for column in ("model", "threads", "eager ms", "Inductor ms", "tensortune ms", "tensortune speedup", "max error"):
            table.add_column(column)
        for r in rows:
            table.add_row(r["model"], str(r["threads"]), f"{r['eager_ms']:.2f}",
                          f"{r['inductor_ms']:.2f}" if "inductor_ms" in r else "-", f"{r['tensortune_ms']:.2f}",
                          f"{r['tensortune_speedup']:.2f}x", f"{r['max_error']:.1e}")
        Console().print(table)
    return rows
