"""`tensortune bench model MODEL [--seq-lens ...]`: a whole model run by eager PyTorch, by torch.compile's default
(Inductor), by Inductor's max-autotune with frozen weights, and by torch.compile(backend="tensortune") with the best
stored configs, timed in alternating rounds in one run, with the largest difference from eager's output. At several
sequence lengths each way is compiled once and called at every length, as a server would, and every length is
warmed up (compiled) before any is timed. In bfloat16 every way runs the model cast to it, and eager's and
tensortune's largest differences from the float32 model's output say what the cast costs. In int8 eager is the
model quantize_dynamic quantized (PyTorch's int8 linears), tensortune the same model on int8 kernels. With
`training`, each way runs a training step: the forward with grad enabled, then the backward of every output
summed (the model's own mode kept: a model in eval mode steps without dropout). Every way is called a few frames into
a frame-stack chunk that stays mapped, so that none pays for the depth it is called at (frontend.frame_stack)."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Callable, ContextManager

import numpy as np
from rich.console import Console
from rich.table import Table

from search_space import Target
from workers.reference import alternating_samples, median_ratio

INDUCTOR_WAYS = ("inductor", "inductor_max_autotune")
# ROUNDS rounds (`--rounds`), each way's sample in a round at least SAMPLE_MS of calls after SETTLE_SECONDS' pause.
# Every way runs on PyTorch's one OpenMP pool, which the next way takes over, so the pause is short, and many short
# rounds are affordable: on an Intel host whose neighbours slowed it in phases, bert-layer's eager/tensortune ratio
# ranged 0.67-1.30 over twelve runs of 5 rounds of 200 ms (0.2 s pauses), 1.07-1.19 over twelve of 25 rounds of
# 40 ms (0.04 s pauses), for the same time.
ROUNDS, SAMPLE_MS, SETTLE_SECONDS = 25, 40.0, 0.04


@dataclasses.dataclass(frozen=True)
class Way:
    """A way of running the model, and what must hold while it compiles (its first call at each length)."""

    run: Callable
    compiling: Callable[[], ContextManager] = nullcontext


def ways(model, db: str | None, target: str, inductor: bool, max_autotune: bool) -> dict[str, Way]:
    """Eager; with `inductor`, torch.compile's default and, with `max_autotune` too, mode="max-autotune" with
    Inductor's freezing (weights folded in as constants, as for inference); and tensortune (a model quantized by
    quantize_dynamic made traceable first: frontend.quantized)."""
    import torch

    from frontend.quantized import traceable

    found = {"eager": Way(model)}
    if inductor:
        found["inductor"] = Way(torch.compile(model))
    if inductor and max_autotune:
        found["inductor_max_autotune"] = Way(torch.compile(model, mode="max-autotune"),
                                             lambda: torch._inductor.config.patch(freezing=True))
    found["tensortune"] = Way(torch.compile(traceable(model), backend="tensortune", options={"db": db, "target": target}))
    return found


def measure_at_lengths(name: str, model, inputs_at: dict, db: str | None = None, target: str = "llvm",
                       rounds: int = ROUNDS, inductor: bool = True, max_autotune: bool = False,
                       profile: bool = False, dtype: str = "float32", training: bool = False) -> list[dict]:
    """One row per entry of `inputs_at` (sequence length → example inputs, as frontend.presets.load_model_at gives
    them): each way's latency (ms) and its ratio to eager, tensortune's against the faster Inductor way, the
    seconds each way took to compile (its first calls), and tensortune's largest difference from eager; with
    `profile`, its tuned ops' times in the model (the tensortune way's own kernels) and alone beside PyTorch's
    (bench.profile), and each way's time outside them. In another `dtype` than float32 the model is cast to it (in
    place) after its float32 outputs are taken, and the row holds eager's and tensortune's differences from them.
    With `training`, a training step is timed (`train_step`), Inductor's max-autotune left out (its freezing is
    for inference)."""
    import torch

    from frontend import extract_tasks
    from frontend.frame_stack import call_on_runner_stack
    from frontend.presets import in_dtype

    from .profile import ceiling, in_model_seconds, outside, profile_tasks

    threads = Target.parse(target).threads
    torch.set_num_threads(threads)
    torch._dynamo.reset()  # the compiled entries of earlier models count toward the limit below
    with torch.inference_mode():
        wide = {length: model(*inputs) for length, inputs in inputs_at.items()} if dtype != "float32" else {}
    model, inputs_at = in_dtype(model, inputs_at, dtype)
    # Dynamo does not trace quantize_dynamic's modules: Inductor would run an int8 model as eager does
    runs = ways(model, db, target, inductor and dtype != "int8", max_autotune and not training)
    step = (lambda run, inputs: train_step(model, run, inputs)) if training else (lambda run, inputs: run(*inputs))
    call = lambda run, inputs: call_on_runner_stack(step, (run, inputs))  # noqa: E731
    grad_mode = torch.enable_grad if training else torch.inference_mode
    outputs, compile_seconds = {}, {}
    # Dynamo's recompile limit (8) counts every way's graphs together, a static one and a dynamic one each
    # (and extract_tasks's capture, one per length, when profiling)
    graphs = len(runs) * (len(inputs_at) + 1) + (len(inputs_at) if profile else 0)
    recompiles = torch._dynamo.config.patch(recompile_limit=max(8, graphs))
    with recompiles, grad_mode():
        for way, how in runs.items():
            start = time.perf_counter()
            with how.compiling():
                outputs[way] = {length: call(how.run, inputs) for length, inputs in inputs_at.items()}
            compile_seconds[way] = round(time.perf_counter() - start, 1)
        rows = []
        for length, inputs in inputs_at.items():
            calls = {way: (lambda run=how.run: call(run, inputs)) for way, how in runs.items()}
            samples = alternating_samples(calls, threads, rounds, SAMPLE_MS, SETTLE_SECONDS)
            rows.append(timing_row(name, length, threads, target, samples, compile_seconds,
                                   max_difference(outputs["tensortune"][length], outputs["eager"][length]))
                        | {"rounds": rounds} | ({"training": True} if training else {}))
            if wide:
                rows[-1] |= {"dtype": dtype, **{f"{way}_float32_error": max_difference(outputs[way][length], wide[length])
                                                for way in ("eager", "tensortune")}}
        for row, inputs in zip(rows if profile else [], inputs_at.values()):  # after timing: it adds graphs
            forward = {way: (lambda run=runs[way].run, inputs=inputs: run(*inputs)) for way in ("tensortune", "eager")}
            in_model = in_model_seconds(forward["tensortune"])
            row["profile"] = profile_tasks(extract_tasks(model, inputs), forward["tensortune"], forward["eager"],
                                           in_model, db, target)
            row["outside_ms"] = outside(row["profile"], in_model["forwards"])
            row["ceiling"] = ceiling(row, row["profile"])
    return rows


def timing_row(name: str, length: int | None, threads: int, target: str, samples: dict[str, list[float]],
               compile_seconds: dict[str, float], max_error: float) -> dict:
    """Each way's samples (ms, a round each) and their median, and its speedup over eager (and tensortune's over the
    faster Inductor way): the median of the rounds' ratios, and their quartiles (`median_ratio`)."""
    row = {"model": name, "seq_len": length, "threads": threads, "target": target,
           "compile_seconds": {way: value for way, value in compile_seconds.items() if way != "eager"},
           "max_error": max_error}
    row["samples_ms"] = {way: [round(value * 1e3, 6) for value in values] for way, values in samples.items()}
    seconds = {way: float(np.median(values)) for way, values in samples.items()}
    for way, value in seconds.items():
        row[f"{way}_ms"] = round(value * 1e3, 3)
        row[f"{way}_speedup"], row[f"{way}_speedup_spread"] = median_ratio(samples, "eager", way)
    inductors = [way for way in INDUCTOR_WAYS if way in seconds]
    if inductors:
        row["fastest_inductor"] = min(inductors, key=seconds.get)
        row["tensortune_vs_inductor"], row["tensortune_vs_inductor_spread"] = median_ratio(
            samples, row["fastest_inductor"], "tensortune")
    return row


def measure_model(name: str, model, inputs: tuple, db: str | None = None, target: str = "llvm", rounds: int = ROUNDS,
                  inductor: bool = True) -> dict:
    """`measure_at_lengths` at the one size of `inputs`."""
    return measure_at_lengths(name, model, {None: inputs}, db, target, rounds, inductor)[0]


def train_step(model, run: Callable, inputs: tuple):
    """One training step's forward and backward, every floating output summed as the loss, the gradients set
    anew; the forward's output."""
    model.zero_grad(set_to_none=True)
    output = run(*inputs)
    sum(tensor.sum() for tensor in tensors(output) if tensor.requires_grad).backward()
    return output


def max_difference(output, expected) -> float:
    """The largest absolute difference over every tensor of two outputs of one structure: a model may return a
    tensor, or tuples, lists, dicts, dataclasses or ModelOutputs (both) of them, nested."""
    differences = [float((got.detach().double() - want.detach().double()).abs().max())
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


def run(models: dict[str, tuple], db: str | None, target: str, json_lines: bool, inductor: bool = True,
        max_autotune: bool = False, profile: bool = False, dtype: str = "float32", training: bool = False,
        rounds: int = ROUNDS) -> list[dict]:
    """Time each of `models` (name → (model, inputs by sequence length), as frontend.presets.load_model_at gives
    them) in `rounds` alternating rounds: one row per model and length, each naming the malloc every way ran under
    (bench.allocator); with `profile`, each row also holds its tuned ops' times beside PyTorch's (bench.profile) and
    each way's time outside them."""
    from .allocator import allocator
    from .profile import print_profile

    rows, malloc = [], allocator()
    Console(stderr=json_lines).print(f"allocator: {malloc}", highlight=False)
    for name, (model, inputs_at) in models.items():
        for row in measure_at_lengths(name, model, inputs_at, db, target, rounds, inductor, max_autotune, profile,
                                      dtype, training):
            row["allocator"] = malloc
            rows.append(row)
            if json_lines:
                print(json.dumps(row), flush=True)
    if not json_lines:
        print_table(rows)
        for row in rows if profile else []:
            print_profile(row)
    return rows


def print_table(rows: list[dict]) -> None:
    table = Table(title="models: eager PyTorch, Inductor (default; max-autotune with freezing) and tensortune, "
                        "same run; speedup over eager, and tensortune over the faster Inductor: the median of the "
                        "rounds' ratios (their middle half)")
    for column in ("model", "seq", "threads", "eager ms", "Inductor ms", "max-autotune ms", "tensortune ms",
                   "speedup", "vs Inductor", "max error"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["model"] + (" (training step)" if r.get("training") else ""), str(r["seq_len"] or "-"), str(r["threads"]), f"{r['eager_ms']:.2f}",
                      *(f"{r[key]:.2f}" if key in r else "-" for key in ("inductor_ms", "inductor_max_autotune_ms")),
                      f"{r['tensortune_ms']:.2f}", with_spread(r, "tensortune_speedup"),
                      with_spread(r, "tensortune_vs_inductor") if "tensortune_vs_inductor" in r else "-",
                      f"{r['max_error']:.1e}")
    Console().print(table)
    for r in rows:
        if "dtype" in r:
            at = f" at seq {r['seq_len']}" if r["seq_len"] else ""
            print(f"{r['model']}{at} in {r['dtype']}: largest difference from the float32 model's output, eager "
                  f"{r['eager_float32_error']:.1e}, tensortune {r['tensortune_float32_error']:.1e}")


def with_spread(row: dict, key: str) -> str:
    """A ratio of the row (`median_ratio`) with its middle half: `1.28x (1.05-1.41)`."""
    low, high = row[f"{key}_spread"]
    return f"{row[key]:.2f}x ({low:.2f}-{high:.2f})"
