"""`tensortune bench kernels`: the best config found per shape beside NumPy (OpenBLAS), PyTorch CPU and
the peak FMA rate, all measured in this run, at 1 thread and at all cores. With `--dtype bfloat16` the shapes
are in bfloat16, beside PyTorch's bfloat16 (oneDNN) and the peak of the instruction family each best config
uses. With `--dtype int8`, the shapes in uint8 × int8 beside PyTorch's int8 (quantized linear and convolution, `_int_mm`)
and the peak of the family each best config uses (GFLOPS are then integer operations a second); dense's activations
in 0..127, as a dynamically quantized model's are (frontend.quantized).

The search here is the template's fallback and seeds (the register blocks an analytic model of the target
picks, which the tuner measures first too), a random sample of the space, then greedy descent over one-knob
neighbours of the fastest few so far: no cost model (that is the tuner's job), just enough to show what the
template can express.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Column, Table

from search_space import (Config, InvalidConfig, Target, TargetError, Workload, batch_matmul, conv2d, dense,
                          fallback_config, get_space, matmul, seed_configs)
from search_space.templates import TEMPLATES
from workers import build, openblas
from workers.reference import alternating_samples, head_to_head, inference_call, median_ratio, reference_calls
from workers.task import MeasureOptions, timed_call

from .model import with_spread
from workers.peak import RUNS_AS, family_peak_call, family_peaks, launch_microseconds

MIN_REPEAT_MS = {True: 10.0, False: 30.0}  # by --quick
# ResNet-18's distinct convolutions at batch 1: C, H = W, K, R = S, stride (padding R // 2)
RESNET18 = [(3, 224, 64, 7, 2), (64, 56, 64, 3, 1), (64, 56, 128, 3, 2), (64, 56, 128, 1, 2), (128, 28, 128, 3, 1),
            (128, 28, 256, 3, 2), (128, 28, 256, 1, 2), (256, 14, 256, 3, 1), (256, 14, 512, 3, 2),
            (256, 14, 512, 1, 2), (512, 7, 512, 3, 1)]


def resnet_conv(c: int, h: int, k: int, r: int, stride: int, **fused) -> Workload:
    return conv2d(1, c, h, h, k, r, r, stride, r // 2, **fused)


SHAPES = [
    matmul(1024, 1024, 1024), matmul(512, 512, 512),
    dense(128, 768, 768), dense(128, 3072, 768), dense(128, 768, 3072),
    batch_matmul(12, 128, 128, 64), batch_matmul(12, 128, 64, 128),
    *(resnet_conv(*layer) for layer in RESNET18),
    # a basic block's second convolution: bias (folded BatchNorm), the shortcut added, then relu; PyTorch runs
    # the add and the relu as operators of their own
    *(resnet_conv(*layer, bias=True, residual=True, epilogue="relu") for layer in RESNET18 if layer[4] == 1 and layer[3] == 3),
]


@dataclass
class Measured:
    kernel: object  # the built Kernel (or CudaKernel): the finalists and the winner are timed again without rebuilding
    seconds: float

    @property
    def config(self) -> Config:
        return self.kernel.config


def try_config(workload: Workload, target: Target, config: Config, inputs, expected, min_repeat_ms: float) -> Measured:
    """Build, check and time one config (on the CPU or, for a cuda target, on the GPU with CUDA events)."""
    kernel = build(workload, target, config)
    options = MeasureOptions(repeat=3, min_repeat_ms=min_repeat_ms, cache="warm")  # as the references run
    timed = timed_call(kernel, inputs, options)
    error = workload.max_error(timed.output(), expected)
    if error > 1:
        raise AssertionError(f"config {config.index} of {workload.key} computes a wrong result ({error:.1f}x tolerance)")
    samples = timed.samples(options)
    return Measured(kernel, float(np.median(samples)))


FINALISTS = 4  # the fastest configs of a search, timed again against each other
LEADERS = 3  # the descent steps from the neighbours of this many of the fastest configs so far
FIGURES = ("GFLOPS", "NumPy", "PyTorch", "ratio", "peak", "config")  # the table's columns after the workload
UNBOUNDED = 10_000  # a console width no table here reaches


def search(workload: Workload, target: Target, trials: int, seed: int, min_repeat_ms: float,
           transplanted: Sequence[Config] = ()) -> tuple[Measured, int]:
    """Fallback, seeds and the `transplanted` configs (the shape's best at fewer threads), a random third of the
    budget, then greedy one-knob descent from the fastest few (from the fastest alone, one timing that came out
    lucky steers the whole descent); the fastest few are then timed again in alternating rounds, since one timing
    on a shared 2-core VM can be off by a third (the same stem convolution measured 108 and 154 GFLOPS). The final
    figures come from `head_to_head`."""
    space, rng = get_space(workload, target), random.Random(seed)
    inputs = workload.random_inputs()
    expected = workload.reference(*inputs)
    seen: set[int] = set()
    measured: list[Measured] = []

    def trial(config: Config) -> None:
        seen.add(config.index)
        try:
            measured.append(try_config(workload, target, config, inputs, expected, min_repeat_ms))
        except InvalidConfig:  # a GPU kernel that, as compiled, would not launch
            pass

    def fastest(n: int) -> list[Measured]:
        return sorted(measured, key=lambda m: m.seconds)[:n]

    first = {config.index: config
             for config in [fallback_config(workload, target), *seed_configs(workload, target), *transplanted]}
    for config in list(first.values())[:trials]:  # on AVX2 the fallback can be a seed
        trial(config)
    for config in space.sample(max(0, trials // 3 - len(seen)), rng, exclude=seen):
        trial(config)
    while len(seen) < trials:
        fresh = {c.index: c for m in fastest(LEADERS) for c in space.neighbours(m.config) if c.index not in seen}
        if not fresh:
            break
        for config in rng.sample(sorted(fresh.values(), key=lambda c: c.index), min(len(fresh), trials - len(seen), 8)):
            trial(config)
    return fastest_again(workload, target, fastest(FINALISTS), inputs), len(seen)


def fastest_again(workload: Workload, target: Target, finalists: list[Measured], inputs) -> Measured:
    """The finalist fastest when they are timed in alternating rounds (a CPU kernel; a GPU one keeps its events'
    figure, which a shared CPU does not disturb)."""
    if target.kind != "llvm" or len(finalists) < 2:
        return finalists[0]
    calls = {str(m.config.index): inference_call(m.kernel, inputs)[0] for m in finalists}
    seconds = head_to_head(calls, target.threads, rounds=3, min_repeat_ms=MIN_REPEAT_MS[False])
    return min(finalists, key=lambda m: seconds[str(m.config.index)])


def bench_shape(workload: Workload, target: Target, trials: int, seed: int, quick: bool,
                peaks: dict[str, float] | None = None, transplanted: Sequence[Config] = ()) -> dict:
    """Search one shape, then time the best config in alternating rounds with the references and with the peak
    kernel of its instruction family (where `peaks` has one). Its ratio to the faster reference, and its fraction of
    the peak, are each the median of the rounds' ratios (`median_ratio`), with their middle half: a shared host's
    neighbours slow a timing by up to a half, in phases of seconds (an Intel AMX host: its tile-product peak 1018
    GFLOPS in one minute, 2232 in another), and a phase that spans a round slows both sides of its ratio alike."""
    start = time.perf_counter()
    best, tried = search(workload, target, trials, seed, MIN_REPEAT_MS[quick], transplanted)
    inputs = workload.random_inputs()
    ours, _ = inference_call(best.kernel, inputs)
    family = best.config.to_dict().get("isa", "fma")
    calls = {"tensortune": ours} | reference_calls(workload, target.threads, inputs)
    if (runs_as := RUNS_AS.get(family, family)) in (peaks or {}):  # none for int8's `widen` where it splits bytes
        calls["peak"], peak_flops = family_peak_call(target, runs_as)
    samples = alternating_samples(calls, target.threads, 3 if quick else 7, MIN_REPEAT_MS[quick])
    seconds = {name: float(np.median(values)) for name, values in samples.items()}
    gflops = {name: workload.flops / s / 1e9 for name, s in seconds.items()}
    faster = np.min([samples[name] for name in ("numpy", "torch") if name in samples], axis=0)  # in each round
    ratio, ratio_spread = median_ratio(samples | {"reference": faster}, "reference", "tensortune")
    fraction, fraction_spread = (median_ratio(samples, "peak", "tensortune", workload.flops / peak_flops)
                                 if "peak" in samples else (None, None))
    return {
        "workload": workload.key, "threads": target.threads, "gflops": round(gflops["tensortune"], 2),
        "numpy_gflops": round(gflops["numpy"], 2) if "numpy" in gflops else None,
        "torch_gflops": round(gflops["torch"], 2) if "torch" in gflops else None,
        "ratio": ratio, "ratio_spread": ratio_spread,
        "samples_ms": {name: [round(value * 1e3, 6) for value in values] for name, values in samples.items()},
        "config": {"index": best.config.index, "knobs": best.config.to_dict()},
        "compile_ms": round(best.kernel.compile_seconds * 1e3, 1), "candidates": tried,
        "search_seconds": round(time.perf_counter() - start, 1), "target": str(target),
        "family": family, "peak_gflops": round(peak_flops / seconds["peak"] / 1e9, 2) if "peak" in seconds else None,
        "peak_fraction": fraction, "peak_fraction_spread": fraction_spread,
    }


def in_dtype(workload: Workload, dtype: str) -> Workload:
    """The shape in `dtype`; an int8 dense of a reduced range, as a quantized model's Linear is."""
    shaped = workload.in_dtype(dtype)
    if shaped.op != "dense" or dtype != "int8":
        return shaped
    return Workload.make("dense", dtype, **shaped.p | {"reduce_range": True})


def run(quick: bool = False, json_lines: bool = False, trials: int | None = None, only: str | None = None,
        seed: int = 0, dtype: str = "float32", target: str = "llvm") -> list[dict]:
    """At 1 thread and at the target's threads (all cores unless it says), on the target's CPU and features (the
    host's, or those a user names or narrows: `llvm -mattr=-amx-tile`)."""
    trials = trials or (10 if quick else 60)
    host = Target.parse(target)
    thread_counts = sorted({1, host.threads})
    every = [in_dtype(w, dtype) for w in SHAPES if dtype in TEMPLATES[w.op, "llvm"].DTYPES]
    shapes = [w for w in every if not only or only in w.key]
    if quick:
        shapes = [w for w in shapes if w in (every[1], every[2], every[5])] or shapes
    console = Console(stderr=json_lines)
    console.print(f"BLAS: {openblas.description()}")
    if (note := openblas.forced_note()) is not None:
        console.print(f"[yellow]{note}[/yellow]", highlight=False)
    from db.matching import fitted_ways  # here: the GPU benchmark, which imports `search`, runs without SQLAlchemy

    rows, one_thread = [], replace(host, threads=1)
    for threads in thread_counts:
        target = replace(host, threads=threads)
        peaks, launch = family_peaks(target, dtype), launch_microseconds(target)
        rates = ", ".join(f"{family} {peak:.1f}" for family, peak in peaks.items())
        console.print(f"{threads} thread(s): peak rate (GFLOPS) {rates}; a kernel launch from Python costs {launch:.1f} µs")
        for workload in shapes:
            alone = [get_space(workload, one_thread).get(r["config"]["index"]) for r in rows
                     if r["workload"] == workload.key and r["threads"] == 1]
            transplanted = [fitted for config in alone  # as a tuner starts from a 1-thread record
                            for fitted in fitted_ways(get_space(workload, target), config, one_thread, target)]
            row = bench_shape(workload, target, trials, seed, quick, peaks, transplanted)
            row["launch_us"] = round(launch, 2)
            rows.append(row)
            if json_lines:
                print(json.dumps(row), flush=True)
            else:
                console.print(f"{workload.key} @ {threads}t: {row['gflops']:.1f} GFLOPS, ratio {row['ratio']}")
    if not json_lines:
        print_table(rows)
    return rows


def print_table(rows: list[dict]) -> None:
    """A table per target. A workload's label wraps at its spaces where the console is too narrow for it (a fused
    conv2d's at 80 columns takes a few lines, and rows then stand a blank line apart), never cut; so does a ratio's
    middle half, below its median."""
    console = Console()
    for target in dict.fromkeys(r["target"] for r in rows):
        table = Table("workload", *(Column(name, no_wrap=name != "ratio") for name in FIGURES), box=box.SIMPLE_HEAD,
                      title=f"tensortune kernels vs references (same run) on {Target.parse(target).label}")
        for r in rows:
            if r["target"] == target:
                table.add_row(Workload.from_key(r["workload"]).label, f"{r['gflops']:.1f}",
                              f"{r['numpy_gflops']:.1f}" if r["numpy_gflops"] else "-",
                              f"{r['torch_gflops']:.1f}" if r["torch_gflops"] else "-", with_spread(r, "ratio"),
                              f"{r['peak_fraction']:.0%}" if r["peak_fraction"] else "-", str(r["config"]["index"]))
        unwrapped = console.measure(table, options=console.options.update_width(UNBOUNDED)).maximum
        table.leading = int(unwrapped > console.width)
        console.print(table)


def main() -> None:
    """`python -m bench.kernels [--target cuda]`: the benchmark without the CLI (and so without SQL, Ray or
    XGBoost), for a bare GPU host with NumPy, llvmlite and CuPy."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llvm", help="llvm (1 thread and its threads) or a cuda target")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", dest="json_lines")
    parser.add_argument("--trials", type=int)
    parser.add_argument("--only")
    parser.add_argument("--seed", type=int, default=0)
    args = vars(parser.parse_args())
    target = args.pop("target")
    if target.split()[0] == "cuda":
        from search_space.gpu_device import NoGpu

        from .kernels_cuda import run as run_cuda
        try:
            run_cuda(target=target, **args)
        except (TargetError, NoGpu) as error:
            parser.exit(1, f"error: {error}\n")
    else:
        run(target=target, **args)


if __name__ == "__main__":
    main()
