"""The reference libraries a kernel is compared with, on the same inputs: NumPy (OpenBLAS) and,
when installed, PyTorch CPU. Timing them in alternating rounds with the kernel makes any
passing load on the machine hit all contenders alike."""
from __future__ import annotations

import contextlib
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from search_space import Workload
from search_space.workload import aligned_empty

from .kernel import Kernel
from .timing import calls_per_sample, time_samples
from .torch_arrays import torch_tensor


MAX_COPIES = 64  # of the weights a timing rotates over: smaller weights than 1/32 of the cache stay partly warm


@dataclass
class WeightCopies:
    """The weights a rotation last copied, and their copies: kept for the next candidate, which reads the same
    weights (a worker makes a workload's inputs once: workers.task._reference). Copying them anew for each took 0.12
    s of a candidate's 0.5 (BERT's 3072×768 float32 weights, 27 copies beside them in 256 MiB; an Intel host with
    300 MiB of L3). Holding the weights keeps their ids from being reused while they are compared by identity.

    Every touch of the sets goes round them in one order, from `start`, the set touched longest ago: a kernel binds
    them in that order (packing reads each), its rotation times them in it and then turns `start` past the sets it
    timed (`turn`). So each timed call reads a set that all the others were touched after, as an untimed round of
    calls before the timing once ensured, at the cost of that round (28 calls of a BERT dense on that Intel host)."""

    weights: dict[str, np.ndarray] = field(default_factory=dict)
    copies: list[dict[str, np.ndarray]] = field(default_factory=list)
    start: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, weights: dict[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
        """`count` sets of the weights, the set touched longest ago first: the arrays themselves and copies of them
        (read, never written, by the kernels bound to them), those of the last call where it was given the same
        arrays."""
        with self.lock:
            if self.weights.keys() != weights.keys() or any(self.weights[name] is not array
                                                              for name, array in weights.items()):
                self.weights, self.copies = dict(weights), []  # the old copies freed before new ones are made
                self.start = 1  # copying read the arrays themselves after each copy was written
            while len(self.copies) < count - 1:
                self.copies.append({name: array.copy() for name, array in weights.items()})
            sets, first = [weights] + self.copies[:count - 1], self.start % count
            return sets[first:] + sets[:first]

    def turn(self, by: int) -> None:
        """The first `by` sets in the order `of` gives have just been touched, in that order."""
        with self.lock:
            self.start += by


WEIGHT_COPIES = WeightCopies()


def inference_calls(kernel: Kernel, inputs, weight_bytes: int = 0) -> tuple[list[Callable], np.ndarray]:
    """Zero-argument calls of the kernel and its output array; the workload's weights are bound (packed
    once), as an inference deployment does, so only the activations' work is timed. Each call reads a copy of
    the weights of its own, as many copies as hold `weight_bytes` (one at least, MAX_COPIES at most; one call
    where there are no weights), made once for a run of candidates on the same weights and bound in the order of
    WeightCopies.of, the copy touched longest ago first, the calls in that order too. The arrays are checked once,
    here, and each call is the unchecked one the torch backend makes (`address_call`): checking a call's NumPy arrays
    took 9-20 µs more a call, which no model pays (BERT's 12×128×128×64 attention product 200 µs a call checked, 180
    not, on an Intel AMX host)."""
    workload = kernel.workload
    out = aligned_empty(workload.output_shape, workload.output_dtype)
    named = dict(zip((name for name, _ in workload.operand_shapes()), inputs))
    weights = {name: named[name] for name in workload.weight_names()}
    activations = activation_arrays(workload, inputs)
    bound = [kernel]
    if weights:
        copies = min(MAX_COPIES, max(1, -(-weight_bytes // sum(array.nbytes for array in weights.values()))))
        bound = [kernel.bind(**copy) for copy in WEIGHT_COPIES.of(weights, copies)]
    if not isinstance(kernel, Kernel):  # a GPU kernel: its call copies the arrays there and back, by no address
        return [lambda b=b: b(*activations, out=out) for b in bound], out
    bound[0].check(*activations, out=out)
    addresses = [array.ctypes.data for array in activations + [out]]
    return [lambda call=b.address_call(), _keepalive=(activations, out): call(*addresses) for b in bound], out


def activation_arrays(workload: Workload, inputs) -> list[np.ndarray]:
    """The inputs that are no weights: what the op before computes in a model, in call order."""
    weights = set(workload.weight_names())
    return [array for (name, _), array in zip(workload.operand_shapes(), inputs) if name not in weights]


def torch_operands(workload: Workload, inputs) -> dict:
    """The inputs as tensors, by operand name, as a PyTorch model holds them: sharing their memory, but an nhwc
    conv2d's as `model.to(memory_format=torch.channels_last)` leaves them, the activations (data, residual)
    NCHW-shaped views of the [N, H, W, C] memory and the weight a channels_last copy. PyTorch's convolution
    reorders an NCHW weight at every call: a 512-channel 3×3 convolution of a 7×7 channels_last image took 3.9-4.4
    ms so, 2.4-2.7 with the weight channels_last (2 threads, a Zen 4)."""
    import torch

    def as_held(name: str, tensor):
        if workload.op != "conv2d" or workload.p["layout"] != "nhwc" or name not in ("data", "residual", "weight"):
            return tensor
        return tensor.contiguous(memory_format=torch.channels_last) if name == "weight" else tensor.permute(0, 3, 1, 2)
    return {name: as_held(name, torch_tensor(array)) for (name, _), array in zip(workload.operand_shapes(), inputs)}


def inference_call(kernel: Kernel, inputs) -> tuple[Callable, np.ndarray]:
    """The one call of `inference_calls` with the weights bound once, and its output array."""
    (call,), out = inference_calls(kernel, inputs)
    return call, out


def reference_calls(workload: Workload, threads: int, inputs, pytorch: bool = True) -> dict[str, Callable]:
    """Zero-argument calls computing the workload with NumPy and (when importable) PyTorch: the core product
    of matmul and dense; all of conv2d, its fused parts done by PyTorch as separate operators. NumPy has no
    bfloat16 or int8 arithmetic worth timing: such a workload's reference is PyTorch's in its dtype (oneDNN's
    bfloat16; `int8_calls`), and without PyTorch NumPy's float32 on the same shape. `pytorch=False` leaves
    PyTorch out where NumPy has a reference (float32): importing it costs seconds (3.7 s of a 10 s `tune` on a
    Zen 3), and a service process would hold it for nothing."""
    p = workload.p
    torch = None
    if pytorch or workload.dtype != "float32":
        with contextlib.suppress(ImportError):
            import torch
    if workload.dtype != "float32" and torch is None:
        wide = workload.in_dtype("float32")
        return reference_calls(wide, threads, [np.asarray(a, np.float32) for a in inputs])
    if workload.dtype == "int8":
        return int8_calls(workload, threads, inputs, torch)
    if workload.dtype != "float32":
        calls = {}
    elif workload.op == "dense":
        x, w = inputs[:2]
        calls = {"numpy": lambda: np.matmul(x, w.T)}
    elif workload.op == "conv2d":
        calls = {"numpy": lambda: workload.reference(*inputs)}
    else:
        calls = {"numpy": lambda: np.matmul(*inputs)}
    if torch is None:
        return calls
    torch.set_num_threads(threads)
    tensors = list(torch_operands(workload, inputs).values())
    if workload.op == "dense":
        calls["torch"] = lambda: torch.nn.functional.linear(tensors[0], tensors[1])
    elif workload.op == "conv2d":
        calls["torch"] = lambda: torch_conv2d(p, *tensors)
    else:
        calls["torch"] = lambda: torch.matmul(*tensors)
    return calls


def int8_calls(workload: Workload, threads: int, inputs, torch) -> dict[str, Callable]:
    """PyTorch's int8 products: dense by its quantized linear and conv2d by its quantized convolution (uint8
    activations, int8 weights scaled per channel, prepacked; their outputs requantized to uint8, ours dequantized to
    float32), matmul by `torch._int_mm` (int8 × int8 → int32: A shifted by 128 into int8, the same work),
    batch_matmul by it once per batch."""
    torch.set_num_threads(threads)
    named, held = dict(zip((name for name, _ in workload.operand_shapes()), inputs)), torch_operands(workload, inputs)
    if workload.op in ("dense", "conv2d"):
        activation, weight = held["X" if workload.op == "dense" else "data"], inputs[1]
        with warnings.catch_warnings():  # PyTorch 2.13 deprecates its quantized tensors, though its ops take them
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            weights = torch._make_per_channel_quantized_tensor(
                torch.from_numpy(weight), torch.from_numpy(named["w_scale"].astype(np.float64)),
                torch.zeros(len(weight), dtype=torch.int64), 0)
            x = torch._make_per_tensor_quantized_tensor(activation, float(named["x_scale"][0]), int(named["x_zero"][0]))
            if workload.op == "conv2d":
                return {"torch": quantized_conv2d(workload.p, x, weights, held, torch)}
        packed = torch.ops.quantized.linear_prepack(weights, None)
        return {"torch": lambda: torch.ops.quantized.linear(x, packed, 0.05, 128)}
    signed = lambda a: torch.from_numpy((a.astype(np.int16) - 128).astype(np.int8)) if a.dtype == np.uint8 else \
        torch.from_numpy(a)
    a, b = signed(inputs[0]), signed(inputs[1])
    if workload.op == "matmul":
        return {"torch": lambda: torch._int_mm(a, b)}
    return {"torch": lambda: [torch._int_mm(a[i], b[i]) for i in range(len(a))]}


def quantized_conv2d(p: dict, x, weights, held: dict, torch) -> Callable:
    """PyTorch's int8 convolution as a quantized model runs it: channels-last activations (fbgemm's own layout: its
    fastest), the bias and a relu fused (quantized::conv2d_relu), the residual added to the requantized output by
    quantized::add (or add_relu); another epilogue on the dequantized output, an operator of its own."""
    ops = torch.ops.quantized
    bias = held.get("bias")
    packed = ops.conv2d_prepack(weights, bias, [p["stride"]] * 2, [p["pad"]] * 2, [1, 1], 1)
    x = x.contiguous(memory_format=torch.channels_last)
    relu = p["epilogue"] == "relu"
    conv = lambda: (ops.conv2d_relu if relu and not p["residual"] else ops.conv2d)(x, packed, 0.05, 128)
    if p["residual"]:
        residual = torch.quantize_per_tensor(held["residual"], 0.05, 128, torch.quint8)
        residual = residual.contiguous(memory_format=torch.channels_last)
        add = ops.add_relu if relu else ops.add
        call = lambda: add(conv(), residual, 0.05, 128)
    else:
        call = conv
    if p["epilogue"] in ("none", "relu"):
        return call
    return lambda: torch_epilogue(p["epilogue"])(call().dequantize())


def reference_name(name: str, workload: Workload) -> str:
    """How a table names a reference of `reference_calls`: `NumPy`, `PyTorch`, or `PyTorch bfloat16`."""
    library = {"numpy": "NumPy", "torch": "PyTorch"}[name]
    return library if name == "numpy" or workload.dtype == "float32" else f"{library} {workload.dtype}"


def torch_conv2d(p: dict, data, weight, *extra):
    """conv2d as PyTorch's eager model code runs it: the convolution (oneDNN, bias included), then the
    residual add and the epilogue as operators of their own."""
    import torch.nn.functional as F

    extra = list(extra)
    out = F.conv2d(data, weight, extra.pop(0) if p["bias"] else None, p["stride"], p["pad"])
    if p["residual"]:
        out = out + extra.pop(0)
    return torch_epilogue(p["epilogue"])(out)


def torch_epilogue(name: str) -> Callable:
    """The PyTorch operator an epilogue stands for: eager runs it after the product, as an operator of its own."""
    import torch.nn.functional as F

    return {"none": lambda y: y, "relu": F.relu, "gelu": lambda y: F.gelu(y, approximate="tanh"),
            "gelu_erf": F.gelu}[name]


def head_to_head(calls: dict[str, Callable], threads: int, rounds: int = 5, min_repeat_ms: float = 20.0,
                 settle_seconds: float = 0.2) -> dict[str, float]:
    """Median seconds per call of each contender, timed in alternating rounds (`alternating_samples`)."""
    samples = alternating_samples(calls, threads, rounds, min_repeat_ms, settle_seconds)
    return {name: float(np.median(values)) for name, values in samples.items()}


def alternating_samples(calls: dict[str, Callable], threads: int, rounds: int, min_repeat_ms: float = 20.0,
                        settle_seconds: float = 0.2) -> dict[str, list[float]]:
    """Seconds per call of each contender, one sample a round, in `rounds` rounds that time every contender in turn.

    Each sample waits `settle_seconds` first: a thread pool keeps spinning for a while after its
    last call (OpenBLAS's for ~0.1 s), and on two cores a spinning pool of the previous
    contender halves the next one (measured here: 112 vs 186 GFLOPS for the same kernel). Each
    contender's calls per sample are counted in its first round and kept: counting anew every
    round cost as much again as the samples themselves."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    numbers: dict[str, int] = {}
    with threadpool_limits(threads):
        for _ in range(rounds):
            for name, call in calls.items():
                time.sleep(settle_seconds)
                if name not in numbers:
                    call()  # warm-up, so that the count is of warm calls
                    numbers[name] = calls_per_sample(call, min_repeat_ms)
                samples[name] += time_samples(call, repeat=1, number=numbers[name])
    return samples


def median_ratio(samples: dict[str, list[float]], numerator: str, denominator: str, scale: float = 1.0
                 ) -> tuple[float, list[float]]:
    """The median of the rounds' ratios of `numerator`'s seconds to `denominator`'s (`alternating_samples`), times
    `scale`, and their quartiles, each to 3 places: a slow phase of the host that spans a round slows both sides of
    its ratio alike, where a ratio of two medians may take its sides from rounds of different phases; a ratio whose
    middle half straddles 1 is no lead."""
    ratios = np.divide(samples[numerator], samples[denominator]) * scale
    low, median, high = (round(float(value), 3) for value in np.percentile(ratios, (25, 50, 75)))
    return median, [low, high]
