"""`tensortune bench model MODEL --profile`: where a model's time goes, before anything is changed to win it back.

Each tuned op of the model (a task, as extract_tasks finds it) is timed in ROUNDS rounds that take each way in turn:
in the model, its kernel's calls in forwards of the tensortune backend's model, each timed by the clock around it
(weights coming from memory, threads woken between PyTorch's operators; torch.profiler's events added up to 65 µs a
call, twice a small kernel's time); alone, its kernel with the config the backend picks, weights bound, warm; alone
as tuning times it (workers.task.MeasureOptions: single calls, weights rotated over copies that spill the caches,
activations written again before each call); alone, the PyTorch operators eager runs for it (dense's bias and
activation included); and for a dense or conv2d, oneDNN's packed linear or convolution, what Inductor's max-autotune
with freezing runs for it where it picks oneDNN, and for a float32 dense MKL's packed GEMM, max-autotune's other
choice where PyTorch has MKL (on an Intel Xeon it picked MKL's for BERT's float32 products over its C++ template,
0.50 ms against 1.19 for 128×768×768). The kernel in the model over the kernel alone, warm and as tuning times it,
are medians of the rounds' ratios: timed minutes apart on a shared Intel host, three of BERT's four dense ops had
differed by 24-36%; in the same rounds on a Zen 3, bert-layer's dense ops ran at 0.98-1.05 of their time alone.
Counted as often as a forward pass runs it, the rows are sorted by what tensortune loses alone against PyTorch. What
the kernels do not account for of tensortune's forwards is the time outside them, both timed in the same forwards;
eager's is an eager forward timed in each op's rounds less its operators' times alone. Beside the time in the model
is also the one tuning stored for the best config: how well tuning predicted the model. Part of tensortune's is its
own: the backend's Python work before each kernel call (the glue column), which in a model finds the caches cold
that the kernel before it filled with its weights. In each op's rounds runs also the peak kernel of the fastest
instruction family for its dtype (workers.peak): the fraction of that rate the op's kernel reaches alone, and the
forward tensortune would run were every op at it and the rest as it is, which bounds what faster kernels could win:
where eager's time over that forward is under a goal, no kernel reaches it."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
from rich.console import Console
from rich.table import Table

from db import Database
from db.served import is_served
from search_space import Target, Workload
from workers.reference import (alternating_samples, inference_call, int8_calls, median_ratio, torch_conv2d,
                               torch_epilogue, torch_operands)

from workers.peak import family_peak_calls, peak_rate
from workers.task import MeasureOptions, timed_call
from workers.timing import time_samples

# oneDNN's fused post-op (attribute, algorithm) for each epilogue
ONEDNN_EPILOGUES = {"none": ("none", ""), "relu": ("relu", ""), "gelu": ("gelu", "tanh"), "gelu_erf": ("gelu", "none")}
# the packed references, by key and column (each one's µs and the kernel's speedup alone over it)
PACKED = {"onednn": "oneDNN packed µs", "mkl": "MKL packed µs"}
PREFIX = "tensortune "  # the backend's names of its kernel calls: this and the workload's key
FORWARDS = 10  # forward passes whose kernels are told apart from the rest of the forward (`outside`)
ROUNDS = 3  # rounds each op is timed in, in the model and alone in turn
ROUND_FORWARDS = 2  # forward passes in which a round times the op's kernel calls


def torch_op(workload: Workload, inputs: list, threads: int) -> Callable:
    """What eager PyTorch runs for the workload, as a zero-argument call on `inputs` (NumPy arrays, in order): in
    int8, its quantized linear (workers.reference.int8_calls)."""
    import torch
    import torch.nn.functional as F

    if workload.dtype == "int8":
        return int8_calls(workload, threads, inputs, torch)["torch"]
    tensors = list(torch_operands(workload, inputs).values())
    if workload.op == "dense":
        x, w, *bias = tensors
        return lambda: torch_epilogue(workload.p["epilogue"])(F.linear(x, w, *bias))
    if workload.op == "conv2d":
        return lambda: torch_conv2d(workload.p, *tensors)
    return lambda: torch.matmul(*tensors)


def onednn_packed(workload: Workload, inputs: list) -> Callable | None:
    """The op as Inductor's max-autotune with freezing runs it where it picks oneDNN: the weight reordered once,
    the epilogue a fused post-op. Dense as `torch.ops.mkldnn._linear_pointwise` (its weight reordered for the batch
    size); conv2d as `_convolution_pointwise` on channels-last data (the layout Inductor keeps a convolutional
    network's activations in), its output channels-last too, the residual a fused binary add (max-autotune runs
    ResNet-18 as 12 such calls and 8 that add in place into the residual's buffer). None for other ops, int8, a
    PyTorch without oneDNN, and bfloat16 on a CPU where oneDNN has no bf16 path (one without AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT, such as a Zen 3: there Inductor picks no oneDNN op for bf16 either, and the reorder fails)."""
    import torch

    if (workload.op not in ("dense", "conv2d") or workload.dtype == "int8" or not torch.backends.mkldnn.is_available()
            or workload.dtype == "bfloat16" and not torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return None
    named = torch_operands(workload, inputs)
    p, bias = workload.p, named.get("bias")
    attribute, algorithm = ONEDNN_EPILOGUES[p["epilogue"]]
    if workload.op == "dense":
        x, packed = named["X"], torch.ops.mkldnn._reorder_linear_weight(named["W"], named["X"].shape[0])
        return lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, attribute, [], algorithm)
    x = named["data"].contiguous(memory_format=torch.channels_last)
    geometry = ([p["pad"]] * 2, [p["stride"]] * 2, [1, 1], 1)
    packed = torch.ops.mkldnn._reorder_convolution_weight(named["weight"], *geometry, list(x.shape))
    if "residual" not in named:
        return lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, bias, *geometry, attribute, [], algorithm)
    residual = named["residual"].contiguous(memory_format=torch.channels_last)
    unary = None if attribute == "none" else attribute  # (the binary form takes no "none")
    return lambda: torch.ops.mkldnn._convolution_pointwise.binary(x, residual, packed, bias, *geometry, "add", None,
                                                                   unary, [], algorithm)


def mkl_packed(workload: Workload, inputs: list) -> Callable | None:
    """A float32 dense as max-autotune with freezing runs it where PyTorch has MKL: MKL's packed GEMM
    (`torch.ops.mkl._mkl_linear`, the weight packed once for the batch size), then the epilogue as an operator of
    its own, which Inductor fuses into what follows. None for other ops and dtypes, and a PyTorch without MKL."""
    import torch

    if workload.op != "dense" or workload.dtype != "float32" or not torch.backends.mkl.is_available():
        return None
    named = torch_operands(workload, inputs)
    x, w, bias = named["X"], named["W"], named.get("bias")
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, x.shape[0])
    activation = torch_epilogue(workload.p["epilogue"])
    return lambda: activation(torch.ops.mkl._mkl_linear(x, packed, w, bias, x.shape[0]))


def in_model_seconds(forward: Callable[[], object]) -> dict:
    """Seconds per call of the backend's Python work before each tuned kernel (by workload key), the median over
    FORWARDS forwards of the compiled model, and each forward's seconds beside its kernels' seconds:
    {"glue": {key: s}, "forwards": [(forward s, kernels s), ...]}."""
    from frontend.backend import kernel_clock

    forward()  # compiled and warm before the clock
    forwards = []
    with kernel_clock() as seconds:
        for _ in range(FORWARDS):
            before, start = sum(map(sum, seconds.values())), time.perf_counter()
            forward()
            forwards.append((time.perf_counter() - start, sum(map(sum, seconds.values())) - before))
    return {"glue": {name[len(PREFIX):]: float(np.median(values)) for name, values in seconds.glue.items()},
            "forwards": forwards}


def kernel_in_model(forward: Callable[[], object], key: str) -> float | None:
    """The median seconds of a call of the workload's kernel over ROUND_FORWARDS forwards after one untimed (the
    ways timed alone before it leave other data in the caches than a forward does); None where the model runs no
    such kernel."""
    from frontend.backend import kernel_clock

    forward()
    with kernel_clock() as seconds:
        for _ in range(ROUND_FORWARDS):
            forward()
    return float(np.median(seconds[PREFIX + key])) if PREFIX + key in seconds else None


def profile_tasks(tasks, forward: Callable[[], object], eager: Callable[[], object], in_model: dict, db: str | None,
                  target: str) -> list[dict]:
    """Per task: µs per call in the model (its kernel in `forward`s, and the backend's Python work before it, of
    `in_model`) and alone, warm and as tuning times it ("rotated"), PyTorch's alone (and oneDNN's packed op's, for
    dense and conv2d; MKL's packed GEMM's, for a float32 dense: what max-autotune runs), the kernel's speedup alone
    over PyTorch and over each packed op (each the median of the rounds' ratios, `against_pytorch`), the ms per
    forward pass tensortune loses alone against PyTorch (negative: wins), and the ms of an `eager` forward timed in
    the op's rounds; the largest loss first."""
    from frontend.shapes import Kernels

    target_ = Target.parse(target)
    kernels = Kernels(db, target_)
    kernels.prepare(task.workload for task in tasks)
    as_tuned = tuned_seconds(db, target_, [task.workload for task in tasks])
    peaks = {dtype: fastest_peak(target_, dtype) for dtype in {task.workload.dtype for task in tasks}}
    rows = []
    for task in tasks:
        inputs = task.workload.random_inputs()
        kernel = kernels.get(task.workload)
        tuned, _ = inference_call(kernel, inputs)
        as_tuning = timed_call(kernel, inputs, MeasureOptions())  # weights rotated, activations just written
        calls = {"tensortune": tuned, "torch": torch_op(task.workload, inputs, target_.threads),
                 "onednn": onednn_packed(task.workload, inputs), "mkl": mkl_packed(task.workload, inputs),
                 "peak": peak[1] if (peak := peaks.get(task.workload.dtype)) else None}
        key, model, rotated, eagers = task.workload.key, [], [], []
        samples = {way: [] for way, call in calls.items() if call is not None}
        for _ in range(ROUNDS):
            # an eager forward beside the tensortune ones, as kernel_in_model times those: eager's side of the time
            # outside the tuned ops, in the minutes its operators are timed
            eagers.append(float(np.median(time_samples(eager, ROUND_FORWARDS, number=1))))
            model.append(kernel_in_model(forward, key))
            for way, values in alternating_samples({way: calls[way] for way in samples}, target_.threads, 1).items():
                samples[way] += values
            rotated.append(float(np.median(as_tuning.samples(MeasureOptions()))))
        samples |= {"model": model, "rotated": rotated}
        seconds = {way: float(np.median(values)) for way, values in samples.items() if way != "model"}
        in_model_us = round(float(np.median(model)) * 1e6, 1) if None not in model else None
        rows.append({"workload": key, "weight": task.weight, "in_model_us": in_model_us,
                     **{f"in_model_vs_{way}": median_ratio(samples, "model", name)[0] if in_model_us is not None
                        else None for way, name in (("alone", "tensortune"), ("rotated", "rotated"))},
                     "glue_us": round(in_model["glue"][key] * 1e6, 1) if key in in_model["glue"] else None,
                     "tuned_us": round(as_tuned[key] * 1e6, 1) if key in as_tuned else None,
                     **{f"{way}_us": round(seconds[way] * 1e6, 1) if way in seconds else None
                        for way in ("tensortune", "rotated", "torch", *PACKED)},
                     **against_pytorch(samples, task.weight),
                     **{f"speedup_vs_{way}": median_ratio(samples, way, "tensortune")[0] if way in samples else None
                        for way in PACKED},
                     "eager_forward_ms": round(float(np.median(eagers)) * 1e3, 3),
                     **at_peak(task.workload, samples, peak)})
    return sorted(rows, key=lambda row: -row["loss_ms"])


def against_pytorch(samples: dict[str, list[float]], weight: int) -> dict:
    """The ms per forward pass tensortune's kernel alone loses against PyTorch's operators (negative: wins) and
    PyTorch's time over the kernel's, each the median over the rounds of that round's pair: with one sample a way a
    round, a slow phase of the host that spans one way of a round and both of another made the medians of each way's
    samples put bert-layer's FFN up projection at 0.76x PyTorch and 1.3 ms a forward behind it, where three more
    runs had it 1.39-1.92x PyTorch (a Zen 4, whose slow phases halve whatever runs for a few seconds)."""
    kernel, torch = (np.array(samples[way]) for way in ("tensortune", "torch"))
    return {"loss_ms": round(float(np.median(kernel - torch)) * weight * 1e3, 3),
            "speedup_alone": median_ratio(samples, "torch", "tensortune")[0]}


def fastest_peak(target: Target, dtype: str) -> tuple[str, Callable, int] | None:
    """The fastest instruction family for the dtype on the target, its peak kernel's call and operations: the rate
    no kernel of the dtype beats, whichever family its config picked. None where no family has a peak."""
    calls = family_peak_calls(target, dtype)
    if not calls:
        return None
    rates = {family: peak_rate(*call) for family, call in calls.items()}
    family = max(rates, key=rates.get)
    return family, *calls[family]


def at_peak(workload: Workload, samples: dict[str, list[float]], peak: tuple | None) -> dict:
    """The op's operations at the peak rate of the fastest instruction family for its dtype (`peak`: the family,
    its kernel's call and operations), that kernel timed in the op's own rounds, in µs; and the fraction of that rate
    the op's kernel reaches alone, the median of the rounds' ratios. None for all three where no family has a peak."""
    if peak is None:
        return {"peak_family": None, "peak_us": None, "peak_fraction": None}
    family, _, operations = peak
    scale = workload.flops / operations
    return {"peak_family": family, "peak_us": round(float(np.median(samples["peak"])) * scale * 1e6, 3),
            "peak_fraction": median_ratio(samples, "peak", "tensortune", scale)[0]}


def tuned_seconds(db: str | None, target: Target, workloads: list[Workload]) -> dict[str, float]:
    """The median seconds a call of each workload's stored best took while tuning, by workload key: of those tuned on
    exactly this target (none from a tensortune service: it serves configs, not timings)."""
    if is_served(db):
        return {}
    database = Database(db)
    return {workload.key: best[0].result.median for workload in workloads if (best := database.best(workload, target))}


def outside(ops: list[dict], forwards: list[tuple[float, float]]) -> dict:
    """Each way's model time not spent in the tuned ops, in ms. Tensortune's: the median over the profiled forwards
    of a forward's time less its kernels' (the model timed apart from its kernels, in other seconds of a shared host,
    made it 0.72-2.75 ms of bert-layer's ~15 in three runs on a Zen 3, the same forwards 1.23-1.49), beside the median
    forward ("tensortune_forward"), every forward's pair ("tensortune_forwards"), and the backend's Python work
    before each kernel, part of it ("tensortune_glue"). Eager's: the median of the eager forwards timed in the ops'
    rounds ("eager_forward") less its operators' times alone in those rounds (the bench's eager time, minutes
    before them, made it -1.61 to 7.46 ms of bert-layer's ~20 in four runs on a Zen 3)."""
    per_forward = lambda key: sum(op["weight"] * (op[key] or 0.0) for op in ops) / 1e3
    eager = float(np.median([op["eager_forward_ms"] for op in ops]))
    walls, kernels = np.array(forwards).T * 1e3
    return {"tensortune": round(float(np.median(walls - kernels)), 3),
            "tensortune_forward": round(float(np.median(walls)), 3),
            "tensortune_forwards": [[round(float(w), 4), round(float(k), 4)] for w, k in zip(walls, kernels)],
            "tensortune_glue": round(per_forward("glue_us"), 3),
            "eager": round(eager - per_forward("torch_us"), 3), "eager_forward": round(eager, 3)}


def ceiling(model_row: dict, ops: list[dict]) -> dict | None:
    """The forward tensortune would run were each tuned op at its dtype's peak rate and the rest as it is (its time
    outside them, `outside`), and eager's time over it: the most that better kernels alone could give this model.
    None where an op has no peak."""
    if not ops or any(op["peak_us"] is None for op in ops):
        return None
    kernels = sum(op["weight"] * op["peak_us"] for op in ops) / 1e3
    forward = round(kernels + model_row["outside_ms"]["tensortune"], 3)  # the speedup is of the forward as given
    return {"kernels_ms": round(kernels, 3), "forward_ms": forward,
            "speedup": round(model_row["eager_ms"] / forward, 3)}


def print_profile(row: dict) -> None:
    ratio = lambda value: f"{value:.2f}" if value is not None else "-"  # noqa: E731
    at = f" at sequence length {row['seq_len']}" if row["seq_len"] else ""
    table = Table(title=f"{row['model']}{at}: each tuned op per call, in the model and alone beside PyTorch's "
                        f"operators for it (same run; a speedup is the kernel's alone over the other's), the largest "
                        f"loss per forward pass first", title_justify="left")
    for column in ("weight", "workload", "in model µs", "as tuned µs", "glue µs", "alone µs", "model / alone",
                   "rotated µs", "model / rotated", "PyTorch µs", "speedup alone", "of peak", "loss ms/forward",
                   *PACKED.values()):
        table.add_column(column)
    for op in row["profile"]:
        in_model, tuned, glue = (f"{op[key]:.1f}" if op.get(key) is not None else "-" for key in (
            "in_model_us", "tuned_us", "glue_us"))
        packed = (f"{op[f'{way}_us']:.1f} ({op[f'speedup_vs_{way}']:.2f}x)" if op.get(f"{way}_us") is not None else "-"
                  for way in PACKED)
        table.add_row(str(op["weight"]), Workload.from_key(op["workload"]).label, in_model, tuned, glue,
                      f"{op['tensortune_us']:.1f}",
                      ratio(op["in_model_vs_alone"]), f"{op['rotated_us']:.1f}", ratio(op["in_model_vs_rotated"]),
                      f"{op['torch_us']:.1f}",
                      f"{op['speedup_alone']:.2f}x",
                      f"{op['peak_fraction']:.0%}" if op["peak_fraction"] is not None else "-", f"{op['loss_ms']:+.3f}",
                      *packed)
    Console().print(table)
    print(f"outside the tuned ops: tensortune {row['outside_ms']['tensortune']:.2f} ms of "
          f"{row['outside_ms']['tensortune_forward']:.2f} (a forward less its kernels, in the same {FORWARDS} "
          f"forwards; of it {row['outside_ms']['tensortune_glue']:.2f} ms the backend's "
          f"Python work before each kernel, the glue column), eager {row['outside_ms']['eager']:.2f} ms of "
          f"{row['outside_ms']['eager_forward']:.2f} (a forward in the ops' rounds less its operators timed alone)")
    if row["ceiling"]:
        families = ", ".join(sorted({op["peak_family"] for op in row["profile"]}))
        print(f"at the peak rate ({families}, timed beside each op) the tuned ops would take "
              f"{row['ceiling']['kernels_ms']:.2f} ms a forward; with tensortune's time outside them, a "
              f"{row['ceiling']['forward_ms']:.2f} ms forward: {row['ceiling']['speedup']:.2f}x eager, the most that "
              f"faster kernels alone could give")
