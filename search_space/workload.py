"""Workloads: an operator with its shapes and dtype, its canonical key, FLOPs, inputs and NumPy reference.

A workload is a frozen value; its `key` is the one string that names it in the CLI, the
database and the REST API (docs/architecture.md), and `Workload.from_key` parses it back.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes  # registers numpy's "bfloat16"
import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

DTYPES = ("float32", "bfloat16", "int8")  # bfloat16: bf16 operands and output, summed in float32; int8: below
# int8: uint8 activations × int8 weights summed in int32 (exact). matmul and batch_matmul return the int32 sums; dense
# and conv2d dequantize them as PyTorch's quantized linear and convolution do, to float32: (Σ X·W − x_zero·Σ W) ·
# x_scale · w_scale[channel] + bias (+ residual), then the epilogue (the weights symmetric, zero point 0, scaled per
# output channel or all alike; conv2d's padding is x_zero, the quantized 0.0). A GEMM's `reduce_range` option says its
# activations (and x_zero) are in 0..127, as PyTorch's x86 quantization leaves them: a product pair of such a byte and
# a weight byte fits int16, which lets a kernel multiply bytes by AVX2's saturating pmaddubsw
INT8_OPERANDS = {"A": "uint8", "X": "uint8", "data": "uint8", "B": "int8", "W": "int8", "weight": "int8",
                 "x_zero": "int32"}  # the rest are float32
DEQUANTIZED = {"dense": "N", "conv2d": "K"}  # the ops int8 dequantizes, and the dimension of their output channels
INT8_EXTRAS = lambda op, p: [("x_scale", (1,)), ("x_zero", (1,)), ("w_scale", (p[DEQUANTIZED[op]],))]
MAX_DIM = 1 << 16
MAX_ELEMENTS = 1 << 28  # 1 GiB of float32 per operand
ACCUMULATION_EPS = float(np.finfo(np.float32).eps)  # every dtype's products are summed in float32
EPILOGUES = ("none", "relu", "gelu", "gelu_erf")  # gelu: the tanh form; gelu_erf: PyTorch's default
# conv2d's activations in memory: channels second (PyTorch's default), or last (its channels_last memory format)
LAYOUTS = ("nchw", "nhwc")


class WorkloadError(ValueError):
    """A workload that cannot exist: unknown op, bad or missing parameter, unsupported dtype."""


def aligned_empty(shape: tuple[int, ...], dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialised array whose first element starts on an `alignment`-byte boundary (a cache line)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(size + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + size].view(dtype).reshape(shape)


def aligned(array: np.ndarray) -> np.ndarray:
    """`array`'s values in an array of its own that starts on a cache line."""
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


@dataclass(frozen=True)
class OpSpec:
    """What an operator is: its integer parameters in key order, its options with defaults, its math."""

    name: str
    dims: tuple[str, ...]
    options: dict[str, object]
    operand_shapes: Callable[[dict], list[tuple[str, tuple[int, ...]]]]
    output_shape: Callable[[dict], tuple[int, ...]]
    flops: Callable[[dict], int]
    reference: Callable[..., np.ndarray]
    reduction: Callable[[dict], int]  # terms summed into each output element
    minimums: dict[str, int] = field(default_factory=dict)  # parameters that may be below 1 (conv2d's pad)
    weights: tuple[str, ...] = ()  # inputs that are a model's parameters: fixed, packed once by `kernel.bind`
    check: Callable[[dict], str | None] = lambda p: None  # what is wrong across parameters, if anything
    strided: dict[str, str] = field(default_factory=dict)  # operand → the option of its strides, if it may be a view


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh form (Hendrycks & Gimpel; what BERT/GPT-2 kernels fuse): what the `gelu` epilogue computes."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """GELU as defined, 0.5·x·(1 + erf(x/√2)): torch.nn.GELU's default, what the `gelu_erf` epilogue computes."""
    from scipy import special  # here: importing it costs every process that imports search_space 0.3 s

    return 0.5 * x * (1.0 + special.erf(x * np.float32(0.7071067811865476)))


def _epilogue(y: np.ndarray, epilogue: str) -> np.ndarray:
    return {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0), "gelu": gelu, "gelu_erf": gelu_erf}[epilogue](y)


def _dense_reference(p: dict, x, w, bias=None):
    y = x @ w.T
    if bias is not None:
        y = y + bias
    return _epilogue(y, p["epilogue"]).astype(x.dtype, copy=False)


def _dense_operands(p: dict):
    ops = [("X", (p["M"], p["K"])), ("W", (p["N"], p["K"]))]
    return ops + ([("bias", (p["N"],))] if p["bias"] else [])


def conv2d_output(p: dict) -> tuple[int, int]:
    """(OH, OW): where the R×S window fits in the padded input, every `stride` positions."""
    return ((p["H"] + 2 * p["pad"] - p["R"]) // p["stride"] + 1, (p["W"] + 2 * p["pad"] - p["S"]) // p["stride"] + 1)


def conv2d_activation(p: dict, n: int, c: int, h: int, w: int) -> tuple[int, int, int, int]:
    """An activation's shape as it lies in memory: (n, c, h, w), or (n, h, w, c) in the nhwc layout."""
    return (n, h, w, c) if p["layout"] == "nhwc" else (n, c, h, w)


def _conv2d_operands(p: dict):
    data = conv2d_activation(p, p["N"], p["C"], p["H"], p["W"])
    ops = [("data", data), ("weight", (p["K"], p["C"], p["R"], p["S"]))]
    return ops + ([("bias", (p["K"],))] if p["bias"] else []) + \
        ([("residual", conv2d_activation(p, p["N"], p["K"], *conv2d_output(p)))] if p["residual"] else [])


def _conv2d_reference(p: dict, data, weight, *extra):
    """im2col by a strided window view, contracted by BLAS; then bias, residual and the epilogue (in NCHW, the
    nhwc layout's activations transposed to it and the result back)."""
    if p["layout"] == "nhwc":
        nchw = lambda a: a.transpose(0, 3, 1, 2)
        bias, residual = extra[:int(p["bias"])], [nchw(a) for a in extra[int(p["bias"]):]]
        y = _conv2d_reference(p | {"layout": "nchw"}, nchw(data), weight, *bias, *residual)
        return np.ascontiguousarray(y.transpose(0, 2, 3, 1))
    pad = p["pad"]
    padded = np.pad(data, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else data
    windows = sliding_window_view(padded, (p["R"], p["S"]), axis=(2, 3))[:, :, ::p["stride"], ::p["stride"]]
    y = np.tensordot(windows, weight, axes=((1, 4, 5), (1, 2, 3))).transpose(0, 3, 1, 2)  # N, K, OH, OW
    extra = list(extra)
    if p["bias"]:
        y = y + extra.pop(0)[:, None, None]
    if p["residual"]:
        y = y + extra.pop(0)
    return np.ascontiguousarray(_epilogue(y, p["epilogue"]), dtype=data.dtype)


def parse_strides(text: str) -> tuple[int, ...]:
    """`"64:2304:1"` → (64, 2304, 1): an operand's element strides, as a key writes them."""
    return tuple(int(part) for part in text.split(":"))


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def spanned(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """The elements from a view's first to its last, the storage it needs."""
    return 1 + sum((size - 1) * stride for size, stride in zip(shape, strides))


def canonical_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """The option value for an operand of `shape` read through `strides`: "" where that is the contiguous layout
    (a dimension of size 1 has no stride that matters), else the strides joined by colons."""
    dense = contiguous_strides(shape)
    strides = tuple(d if size == 1 else s for size, s, d in zip(shape, strides, dense))
    return "" if strides == dense else ":".join(map(str, strides))


def _strides_problem(spec: OpSpec, p: dict) -> str | None:
    """What is wrong with an op's stride options: each is as many non-negative integers as its operand has
    dimensions, colon-separated, and spans no more than MAX_ELEMENTS."""
    shapes = dict(spec.operand_shapes(p))
    for name, option in spec.strided.items():
        text = p[option]
        if not text:
            continue
        if not re.fullmatch(r"\d+(:\d+)*", text) or len(parse_strides(text)) != len(shapes[name]):
            example = ":".join(map(str, contiguous_strides(shapes[name])))
            return (f"{option}={text!r} is not {len(shapes[name])} non-negative integers joined by ':' (the "
                    f"element strides of {name} {shapes[name]}, e.g. {example})")
        if spanned(shapes[name], parse_strides(text)) > MAX_ELEMENTS:
            return f"{option}={text} spans more than {MAX_ELEMENTS} elements"
    return None


def _conv2d_check(p: dict) -> str | None:
    if p["layout"] not in LAYOUTS:
        return f"unknown layout {p['layout']!r}; known: nchw (channels second), nhwc (channels last)"
    padded = (p["H"] + 2 * p["pad"], p["W"] + 2 * p["pad"])
    if p["R"] > padded[0] or p["S"] > padded[1]:
        return (f"kernel R×S={p['R']}×{p['S']} is larger than the padded input {padded[0]}×{padded[1]} "
                f"(H+2·pad × W+2·pad)")
    return None


OPS: dict[str, OpSpec] = {
    "matmul": OpSpec(
        "matmul", ("M", "N", "K"), {"reduce_range": False},
        lambda p: [("A", (p["M"], p["K"])), ("B", (p["K"], p["N"]))],
        lambda p: (p["M"], p["N"]),
        lambda p: 2 * p["M"] * p["N"] * p["K"],
        lambda p, a, b: a @ b,
        lambda p: p["K"],
    ),
    "dense": OpSpec(
        "dense", ("M", "N", "K"), {"bias": False, "epilogue": "none", "reduce_range": False},
        _dense_operands,
        lambda p: (p["M"], p["N"]),
        lambda p: 2 * p["M"] * p["N"] * p["K"],
        _dense_reference,
        lambda p: p["K"],
        weights=("W", "bias", "w_scale"),  # w_scale: int8's
    ),
    "batch_matmul": OpSpec(
        "batch_matmul", ("B", "M", "N", "K"), {"a_strides": "", "b_strides": "", "reduce_range": False},
        lambda p: [("A", (p["B"], p["M"], p["K"])), ("B", (p["B"], p["K"], p["N"]))],
        lambda p: (p["B"], p["M"], p["N"]),
        lambda p: 2 * p["B"] * p["M"] * p["N"] * p["K"],
        lambda p, a, b: np.matmul(a, b),
        lambda p: p["K"],
        # A and B may be views (attention's heads split from one activation, kᵀ): "" is the contiguous layout
        strided={"A": "a_strides", "B": "b_strides"},
    ),
    "conv2d": OpSpec(
        "conv2d", ("N", "C", "H", "W", "K", "R", "S", "stride", "pad"),
        {"bias": False, "residual": False, "epilogue": "none", "layout": "nchw"},
        _conv2d_operands,
        lambda p: conv2d_activation(p, p["N"], p["K"], *conv2d_output(p)),
        lambda p: 2 * p["N"] * p["K"] * math.prod(conv2d_output(p)) * p["C"] * p["R"] * p["S"],
        _conv2d_reference,
        lambda p: p["C"] * p["R"] * p["S"],
        minimums={"pad": 0},
        weights=("weight", "bias", "w_scale"),  # w_scale: int8's
        check=_conv2d_check,
    ),
}


def _check_dim(op: str, name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise WorkloadError(f"{op}: parameter {name} must be an integer, got {value!r}")
    if not minimum <= value <= MAX_DIM:
        raise WorkloadError(f"{op}: parameter {name}={value} is out of range; it must be in {minimum}..{MAX_DIM}")
    return int(value)


def _check_option(op: str, name: str, value, default):
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise WorkloadError(f"{op}: option {name} must be true or false, got {value!r}")
        return value
    if name == "epilogue" and value not in EPILOGUES:
        raise WorkloadError(f"{op}: unknown epilogue {value!r}; known: {', '.join(EPILOGUES)}")
    return str(value) if isinstance(default, str) else value


@dataclass(frozen=True)
class Workload:
    """One operator instance. Build it with `matmul(...)`, `dense(...)`, `batch_matmul(...)` or `Workload.make`."""

    op: str
    params: tuple[tuple[str, object], ...]
    dtype: str = "float32"
    spec: OpSpec = field(repr=False, compare=False, hash=False, default=None)

    @classmethod
    def make(cls, op: str, dtype: str = "float32", **params) -> Workload:
        """Validate and normalise; every error names the parameter and what would be right."""
        spec = OPS.get(op)
        if spec is None:
            raise WorkloadError(f"unknown op {op!r}; known ops: {', '.join(OPS)}")
        if dtype not in DTYPES:
            raise WorkloadError(f"{op}: unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        unknown = set(params) - set(spec.dims) - set(spec.options)
        if unknown:
            raise WorkloadError(f"{op}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                                f"{op} takes {', '.join(spec.dims + tuple(spec.options))}")
        missing = [d for d in spec.dims if d not in params]
        if missing:
            raise WorkloadError(f"{op}: missing parameter(s) {', '.join(missing)}; {op} needs {', '.join(spec.dims)}")
        values = {d: _check_dim(op, d, params[d], spec.minimums.get(d, 1)) for d in spec.dims}
        values |= {o: _check_option(op, o, params.get(o, default), default) for o, default in spec.options.items()}
        problem = spec.check(values) or _strides_problem(spec, values) or _range_problem(values, dtype)
        if problem:
            raise WorkloadError(f"{op}: {problem}")
        shapes = dict(spec.operand_shapes(values))
        values |= {option: canonical_strides(shapes[name], parse_strides(values[option]))
                   for name, option in spec.strided.items() if values[option]}
        workload = cls(op, tuple(values.items()), dtype, spec)
        for name, shape in workload.operand_shapes() + [("output", workload.output_shape)]:
            if int(np.prod(shape)) > MAX_ELEMENTS:
                raise WorkloadError(f"{op}: operand {name} of shape {shape} has more than {MAX_ELEMENTS} elements")
        return workload

    @classmethod
    def from_key(cls, key: str) -> Workload:
        """Parse `op(name=value,...,dtype=...)`, the canonical key."""
        match = re.fullmatch(r"\s*(\w+)\((.*)\)\s*", key)
        if not match:
            raise WorkloadError(f"not a workload key: {key!r}; expected op(NAME=VALUE,...)")
        return cls.make(match.group(1), **parse_params(match.group(2).split(",") if match.group(2) else []))

    @property
    def p(self) -> dict:
        return dict(self.params)

    @property
    def key(self) -> str:
        """Canonical key: required parameters in order, options only when not at their default, then dtype."""
        parts = [f"{d}={self.p[d]}" for d in self.spec.dims]
        for name, default in self.spec.options.items():
            value = self.p[name]
            if value != default:
                parts.append(f"{name}={str(value).lower() if isinstance(value, bool) else value}")
        return f"{self.op}({','.join(parts + [f'dtype={self.dtype}'])})"

    def __str__(self) -> str:
        return self.key

    @property
    def label(self) -> str:
        """The key for tables: spaces between parameters (a narrow column wraps there, never inside one), and
        no dtype when it is float32."""
        parts = self.key[len(self.op) + 1:-1].split(",")
        return " ".join([self.op] + [part for part in parts if part != "dtype=float32"])

    @property
    def flops(self) -> int:
        return self.spec.flops(self.p)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.spec.output_shape(self.p)

    def in_dtype(self, dtype: str) -> Workload:
        """The same operator and shapes in another dtype (int8's reduced range only in int8)."""
        return Workload.make(self.op, dtype, **{name: value for name, value in self.p.items()
                                                if dtype == "int8" or name != "reduce_range"})

    def operand_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Names and shapes of the inputs, in call order."""
        extras = INT8_EXTRAS(self.op, self.p) if self.dtype == "int8" and self.op in DEQUANTIZED else []
        return self.spec.operand_shapes(self.p) + extras

    def operand_strides(self, name: str) -> tuple[int, ...] | None:
        """The element strides the input called `name` is read through, where it is a view (its op's stride
        option is set); None where it is contiguous."""
        option = self.spec.strided.get(name)
        return parse_strides(self.p[option]) if option and self.p[option] else None

    def operand_dtype(self, name: str) -> str:
        """The dtype of the input called `name` (or of "output"): the workload's, except in int8."""
        if name == "output":
            return output_dtype(self.op, self.dtype)
        return INT8_OPERANDS.get(name, "float32") if self.dtype == "int8" else self.dtype

    @property
    def output_dtype(self) -> str:
        return self.operand_dtype("output")

    def weight_names(self) -> tuple[str, ...]:
        """The inputs a deployed model fixes (dense's W and bias, conv2d's weight and bias), in call order."""
        return tuple(name for name, _ in self.operand_shapes() if name in self.spec.weights)

    def random_inputs(self, seed: int = 0) -> tuple[np.ndarray, ...]:
        """Uniform in [-1, 1), drawn in float32 (not drawn in float64 and cast: 1.6x faster), rounded to the
        workload's dtype; integers uniform over their whole range (activations over their levels), scales that
        bring a dequantized product near 1. Each array starts on a cache line, as PyTorch's tensors do, so that
        kernels are timed on the inputs a model gives them: NumPy's own start on any 16-byte boundary, and an AMX
        tile whose rows straddle cache lines loads about three times slower."""
        rng = np.random.default_rng(seed)

        def draw(name: str, shape: tuple[int, ...]) -> np.ndarray:
            dtype = self.operand_dtype(name)
            if name == "x_zero":
                return rng.integers(0, _activation_levels(self), shape, dtype=np.int32)
            if name in ("x_scale", "w_scale"):
                return (rng.random(shape, dtype=np.float32) + 0.5) / np.float32(256 if name == "x_scale" else 128)
            if dtype == "uint8":
                return rng.integers(0, _activation_levels(self), shape, dtype=dtype)
            if dtype == "int8":
                return rng.integers(-128, 128, shape, dtype=dtype)
            return (rng.random(shape, dtype=np.float32) * 2 - 1).astype(dtype, copy=False)

        def operand(name: str, shape: tuple[int, ...]) -> np.ndarray:
            """Aligned, and a view of a storage of its own where the workload reads it through strides."""
            strides = self.operand_strides(name)
            if strides is None:
                return aligned(draw(name, shape))
            storage = aligned(draw(name, (spanned(shape, strides),)))
            return as_strided(storage, shape, tuple(s * storage.itemsize for s in strides))

        return tuple(operand(name, shape) for name, shape in self.operand_shapes())

    @property
    def tolerance(self) -> float:
        """Absolute error allowed per output element: float32 rounding grows with the reduction length
        (inputs are in [-1, 1]); kernels may sum in any order and fuse multiply-adds. A narrower output adds one
        unit in its last place: a kernel's float32 sum and the reference's may round to neighbours. An int32
        output is exact: half a unit."""
        if self.output_dtype == "int32":
            return 0.5
        output_ulp = float(ml_dtypes.finfo(self.dtype).eps) if self.dtype == "bfloat16" else 0.0
        return 8 * ACCUMULATION_EPS * max(16, self.spec.reduction(self.p)) + output_ulp

    def max_error(self, output: np.ndarray, expected: np.ndarray) -> float:
        """Largest error relative to the tolerance, scaled by the result's magnitude (not an integer's): ≤ 1
        passes."""
        if self.output_dtype == "int32":
            error = np.abs(np.asarray(output, np.int64) - np.asarray(expected, np.int64))
            return float(np.max(error, initial=0)) / self.tolerance
        output, expected = (np.asarray(a, np.float32) for a in (output, expected))
        error = np.abs(output - expected)  # in float32: exact enough, as the tolerance is many ulps
        error /= np.maximum(1.0, np.abs(expected))
        return float(np.max(error, initial=0.0)) / self.tolerance

    def reference(self, *inputs: np.ndarray) -> np.ndarray:
        """The NumPy result every kernel is checked against. NumPy has no fast bfloat16 arithmetic: a narrower
        dtype's inputs are widened to float32 (exactly), computed there, and the result rounded back. int8 sums
        in float64, exact for any reduction a workload may have (below 2^53)."""
        if self.dtype == "float32":
            return self.spec.reference(self.p, *inputs)
        if self.dtype == "int8":
            return _int8_reference(self, inputs)
        wide = self.spec.reference(self.p, *(np.asarray(a, np.float32) for a in inputs))
        return wide.astype(self.dtype)


def _range_problem(values: dict, dtype: str) -> str | None:
    if values.get("reduce_range") and dtype != "int8":
        return f"reduce_range=true narrows int8 activations to 0..127; it has no meaning in {dtype}"
    return None


def _activation_levels(workload: Workload) -> int:
    """How many uint8 levels an int8 workload's activations take: 128 in a reduced range, else 256."""
    return 128 if workload.p.get("reduce_range") else 256


def output_dtype(op: str, dtype: str) -> str:
    """The dtype an op of `dtype` returns: its own, but int8's int32 sums, which dense and conv2d dequantize to
    float32."""
    if dtype != "int8":
        return dtype
    return "float32" if op in DEQUANTIZED else "int32"


def _int8_reference(workload: Workload, inputs) -> np.ndarray:
    """The exact int32 sums; dense's and conv2d's dequantized: the product of the activation less its zero point
    (conv2d's padding is then 0) and the weights, in float64, scaled per output channel, the bias and residual
    added, rounded once to float32."""
    named = {name: np.asarray(a, np.float64) for (name, _), a in zip(workload.operand_shapes(), inputs)}
    p = workload.p
    if workload.op not in DEQUANTIZED:
        return workload.spec.reference(p, *named.values()).astype(np.int32)
    activation, weight = list(named.values())[:2]
    plain = p | {name: False for name in ("bias", "residual") if name in p} | {"epilogue": "none"}
    sums = workload.spec.reference(plain, activation - named["x_zero"], weight)
    channels_last = workload.op == "dense" or p["layout"] == "nhwc"  # the output's channel axis: last, else 1
    per_channel = (lambda v: v) if channels_last else (lambda v: v[:, None, None])
    y = sums * per_channel(named["x_scale"] * named["w_scale"]) + per_channel(named.get("bias", np.zeros(1)))
    return _epilogue(y + named.get("residual", 0.0), p["epilogue"]).astype(np.float32)


def parse_params(pairs: list[str]) -> dict:
    """`["M=64", "bias=true"]` → `{"M": 64, "bias": "true"}`; integers become ints, the rest stay strings."""
    params = {}
    for pair in pairs:
        name, sep, value = pair.strip().partition("=")
        if not sep or not name:
            raise WorkloadError(f"parameter {pair!r} is not NAME=VALUE")
        params[name.strip()] = int(value) if re.fullmatch(r"-?\d+", value.strip()) else value.strip()
    return params


def matmul(M: int, N: int, K: int, dtype: str = "float32", reduce_range: bool = False) -> Workload:
    """C[M,N] = A[M,K] · B[K,N]."""
    return Workload.make("matmul", dtype, M=M, N=N, K=K, reduce_range=reduce_range)


def dense(M: int, N: int, K: int, bias: bool = False, epilogue: str = "none", dtype: str = "float32",
          reduce_range: bool = False) -> Workload:
    """Y[M,N] = epilogue(X[M,K] · W[N,K]ᵀ + bias): the BERT linear layer."""
    return Workload.make("dense", dtype, M=M, N=N, K=K, bias=bias, epilogue=epilogue, reduce_range=reduce_range)


def batch_matmul(B: int, M: int, N: int, K: int, dtype: str = "float32", a_strides: str = "",
                 b_strides: str = "", reduce_range: bool = False) -> Workload:
    """C[b] = A[b] · B[b]: attention scores and context; A [B, M, K] and B [B, K, N] read through element strides
    "batch:row:column" where they are views (q and kᵀ split from one activation's heads)."""
    return Workload.make("batch_matmul", dtype, B=B, M=M, N=N, K=K, a_strides=a_strides, b_strides=b_strides,
                         reduce_range=reduce_range)


def conv2d(N: int, C: int, H: int, W: int, K: int, R: int, S: int, stride: int = 1, pad: int = 0, bias: bool = False,
           residual: bool = False, epilogue: str = "none", dtype: str = "float32", layout: str = "nchw") -> Workload:
    """out[N,K,OH,OW] = epilogue(data[N,C,H,W] ⊛ weight[K,C,R,S] (+ bias[K]) (+ residual[N,K,OH,OW])): a ResNet layer;
    with layout="nhwc" data, residual and out lie channels last, data[N,H,W,C] (PyTorch's channels_last)."""
    return Workload.make("conv2d", dtype, N=N, C=C, H=H, W=W, K=K, R=R, S=S, stride=stride, pad=pad, bias=bias,
                         residual=residual, epilogue=epilogue, layout=layout)
