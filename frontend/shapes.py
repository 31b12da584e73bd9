"""Shape dispatch: each tuned op runs the kernel of the sizes it is called at.

A match's form (Dense, Product, Conv2d) holds what its sizes do not change, and gives the workload and the
result's shape from its activations' shapes: from static sizes when a graph is matched, from SymInts when a
graph is traced symbolic (result shapes only), from a call's sizes at run time.

Dynamo traces a model with static sizes first, and with symbolic ones once it has seen a size change (another
sequence length, another batch size): a tuned op then meets its sizes only at run time. Its first call at a
size builds that workload's kernel with the best config stored for it, else with the config of the nearest
stored shape of the same op and options (db.HistoryBest.query_nearest), else with a config predicted from the
records of the op's other shapes (tuner/predict.py), else with the template's fallback, and says which in one
line per workload; every later call at that size is one dict lookup. The kernels of a
graph's static sizes are built with the graph, their fallbacks named together in one line.
"""
from __future__ import annotations

import logging
import math
import operator
import threading
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Union

import numpy as np
import torch

from db import Database, HistoryBest, ServedBest
from db.history import StoredConfig
from db.served import is_served
from search_space import Target, Workload
from search_space.program import ITEMSIZE
from search_space.workload import canonical_strides, contiguous_strides, conv2d_output, output_dtype
from tuner import predict  # noqa: F401  registers predicted configs: a shape with no tuned neighbour gets one
from workers import build
from workers.torch_arrays import FLOATING, torch_dtype
from workers.untuned import untuned_config

log = logging.getLogger("tensortune.frontend")

Size = Union[int, torch.SymInt]  # an int where the graph's size is static, a SymInt where it varies between calls
Shape = tuple[Size, ...]


class _Result:
    """A form's result dtype: its op's output in its dtype (search_space.workload.output_dtype)."""

    op: ClassVar[str]
    views = False  # whether its kernels read views of its activations in place, chosen by their strides too
    memory_format = torch.contiguous_format  # how its activations and result lie, each in its own memory

    def layout_differs(self, eager: torch.Tensor | None) -> bool:
        """Whether its result lies otherwise than `eager`, the traced result of the nodes it replaces: never but for
        a convolution run channels_last where eager's was not."""
        return False

    @property
    def result_dtype(self) -> str:
        return output_dtype(self.op, self.dtype)


@dataclass(frozen=True)
class Dense(_Result):
    """x · Wᵀ (+ bias, then an epilogue) by a bound weight W [N, K]: M is every leading size of x."""

    op: ClassVar[str] = "dense"

    N: int
    K: int
    bias: bool = False
    epilogue: str = "none"
    dtype: str = "float32"
    reduce_range: bool = False  # int8's: x quantized to 128 levels (frontend.quantized)

    def workload(self, x: tuple[int, ...], *quantization) -> Workload:
        """From x's shape (in int8, x's scale and zero point follow it, of shape (1,))."""
        return Workload.make("dense", self.dtype, M=math.prod(x[:-1]), N=self.N, K=self.K, bias=self.bias,
                             epilogue=self.epilogue, reduce_range=self.reduce_range)

    def result_shape(self, x: Shape, *quantization) -> Shape:
        return (*x[:-1], self.N)


@dataclass(frozen=True)
class Product(_Result):
    """a · b of two activations: matmul when 2-D, else batch_matmul over the leading (batch × heads) sizes. With
    `views`, a batch_matmul reads its operands in place (attention's q, kᵀ and v, views of one activation's heads:
    no copy of each a layer): its kernel's batch is the trailing batch sizes that flatten to one stride in every
    operand, and it is called once for each index of the leading ones that do not (a batch of several sequences:
    [batch, heads] of q do not flatten, its heads do)."""

    op: ClassVar[str] = "matmul"  # batch_matmul's result dtype is matmul's

    dtype: str = "float32"
    views: bool = False

    def workload(self, a: tuple[int, ...], b: tuple[int, ...], strides: tuple = (None, None)) -> Workload:
        """At these shapes, each operand read through its `strides` where they are given and `read_in_place`."""
        (m, k), n = a[-2:], b[-1]
        if len(a) == 2:
            return Workload.make("matmul", self.dtype, M=m, N=n, K=k)
        outer, (a_strides, b_strides) = split_batch((a, b), strides)
        return Workload.make("batch_matmul", self.dtype, B=math.prod(a[outer:-2]), M=m, N=n, K=k,
                             a_strides=a_strides or "", b_strides=b_strides or "")

    def read_in_place(self, shapes: tuple, strides: tuple) -> tuple[bool, ...]:
        """Which operands `workload` reads where they lie: a batch_matmul's whose strides are known and not
        negative, a matmul's that are contiguous."""
        if len(shapes[0]) == 2:
            return tuple(stride is not None and canonical_strides(shape, stride) == ""
                         for shape, stride in zip(shapes, strides))
        return tuple(option is not None for option in split_batch(shapes, strides)[1])

    def calls(self, shapes: tuple, strides: tuple) -> list[tuple[int, ...]]:
        """The element offsets of the operands (as `read_in_place` passes them) and of the result for each call
        of the kernel, one call for each index of the leading batch sizes `split_batch` loops over."""
        outer = split_batch(shapes, strides)[0] if len(shapes[0]) > 2 else 0
        result = self.result_shape(*shapes)
        laid = [stride if in_place else contiguous_strides(shape)
                for shape, stride, in_place in zip(shapes, strides, self.read_in_place(shapes, strides))]
        laid.append(contiguous_strides(result))
        return [tuple(sum(i * s for i, s in zip(index, stride)) for stride in laid)
                for index in np.ndindex(*result[:outer])]

    def result_shape(self, a: Shape, b: Shape) -> Shape:
        return (*a[:-1], b[-1])


@dataclass(frozen=True)
class Conv2d(_Result):
    """A square-strided, square-padded convolution by a bound weight [K, C, R, S] of x [N, C, H, W], then an
    optional residual (an activation of the result's shape) and epilogue. In the nhwc layout its activations and
    result are channels_last, as PyTorch's convolution of a channels_last x returns."""

    op: ClassVar[str] = "conv2d"

    C: int
    K: int
    R: int
    S: int
    stride: int
    pad: int
    bias: bool = False
    residual: bool = False
    epilogue: str = "none"
    dtype: str = "float32"
    layout: str = "nchw"

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.layout == "nhwc" else torch.contiguous_format

    def layout_differs(self, eager: torch.Tensor | None) -> bool:
        return eager is not None and not eager.is_contiguous(memory_format=self.memory_format)

    def workload(self, x: tuple[int, ...], *residual) -> Workload:
        return Workload.make("conv2d", self.dtype, N=x[0], C=self.C, H=x[2], W=x[3], K=self.K, R=self.R, S=self.S,
                             stride=self.stride, pad=self.pad, bias=self.bias, residual=self.residual,
                             epilogue=self.epilogue, layout=self.layout)

    def result_shape(self, x: Shape, *residual) -> Shape:
        sizes = {"H": x[2], "W": x[3], "R": self.R, "S": self.S, "stride": self.stride, "pad": self.pad}
        return (x[0], self.K, *conv2d_output(sizes))


Form = Union[Dense, Product, Conv2d]


def workload_at(form: Form, shapes: tuple, strides: tuple | None = None) -> Workload:
    """The form's workload at these activation shapes, and strides where it reads views."""
    return form.workload(*shapes, strides=strides) if form.views else form.workload(*shapes)


def split_batch(shapes: tuple, strides: tuple) -> tuple[int, tuple[str | None, ...]]:
    """(outer, options): the fewest leading batch sizes a batch_matmul's calls loop over for every operand's other
    batch sizes to flatten to one stride, and each operand's stride option (`batch:row:column`) then; None for an
    operand that is copied, its strides not known (an activation to cast) or negative."""
    read = [stride is not None and min(stride) >= 0 for stride in strides]
    views = lambda outer: tuple(batch_view(shape[outer:], stride[outer:]) if ok else None
                                for shape, stride, ok in zip(shapes, strides, read))
    # looping over every batch size leaves a batch of one, which always flattens
    outer = next(outer for outer in range(len(shapes[0]) - 1)
                 if all(option is not None for option, ok in zip(views(outer), read) if ok))
    return outer, views(outer)


def batch_view(shape: tuple[int, ...], strides: tuple[int, ...]) -> str | None:
    """The stride option of an operand of `shape` and `strides`, its leading sizes flattened into one batch: None
    where they do not flatten to one stride."""
    leading = [(size, stride) for size, stride in zip(shape[:-2], strides[:-2]) if size != 1]
    if any(outer != inner * size for (_, outer), (size, inner) in zip(leading, leading[1:])):
        return None
    return ":".join(map(str, (leading[-1][1] if leading else 0, *strides[-2:])))


def fallback_summary(untuned: list[Workload], total: int, target: Target) -> str:
    return (f"tensortune: {len(untuned)} of {total} kernels have no stored config for {target.label} and run a "
            f"fallback config, which may be much slower: {'; '.join(workload.label for workload in untuned)}")


def borrowed_summary(borrowed: dict[Workload, Workload]) -> str:
    return (f"tensortune: {len(borrowed)} kernels run the config of the nearest tuned shape of their op: "
            f"{'; '.join(f'{workload.label} (from {source.label})' for workload, source in borrowed.items())}")


def predicted_summary(predicted: dict[Workload, str]) -> str:
    return (f"tensortune: {len(predicted)} kernels have no tuned shape of their op to borrow a config from and run "
            f"predicted ones: {'; '.join(f'{workload.label} ({how})' for workload, how in predicted.items())}")


def first_sight_line(workload: Workload, found: StoredConfig | None, target: Target) -> str:
    """What a kernel built at run time, for a size first met, runs."""
    if found is None:
        return (f"tensortune: new size {workload.label} has no stored config for {target.label}, nor a tuned shape "
                "of its op to borrow one from, and runs a fallback config, which may be much slower")
    if found.predicted:
        return f"tensortune: new size {workload.label} runs the config {found.predicted}"
    if found.workload != workload:
        return (f"tensortune: new size {workload.label} runs the config of {found.workload.label}, the nearest tuned "
                "shape")
    return f"tensortune: new size {workload.label} runs its stored config"


class Kernels:
    """The kernels of one compiled graph, one per workload, each built once (ops of one workload share it and
    bind their own weights). The database is opened at the first choice and kept: a served model meets new sizes
    all its life, and opening it (an engine, the schema's revision checked) costs more than the lookup. A `db` that
    is a tensortune service's URL is asked instead (db/served.py), a graph's workloads in one request."""

    def __init__(self, db, target: Target):
        self.db, self.target = db, target
        self.built: dict[Workload, object] = {}
        self._history: HistoryBest | ServedBest | None = None
        self._lock = threading.Lock()

    def prepare(self, workloads: Iterable[Workload]) -> None:
        """Build the kernels of the graph's static sizes: the fallbacks among them said in one line, the predicted
        configs in another, the borrowed ones in a third (at INFO)."""
        with self._lock:
            chosen = self._choose([workload for workload in dict.fromkeys(workloads) if workload not in self.built])
            untuned = [workload for workload, found in chosen.items() if found is None]
            borrowed = {workload: found.workload for workload, found in chosen.items()
                        if found is not None and found.workload != workload}
            predicted = {workload: found.predicted for workload, found in chosen.items()
                         if found is not None and found.predicted}
            if untuned:
                log.warning(fallback_summary(untuned, len(chosen), self.target))
            if predicted:
                log.warning(predicted_summary(predicted))
            if borrowed:
                log.info(borrowed_summary(borrowed))
            for workload, found in chosen.items():
                self.built[workload] = self._build(workload, found)

    def get(self, workload: Workload):
        """The workload's kernel, built at its first sight with one line saying which config it runs."""
        with self._lock:
            if workload not in self.built:
                found = self._choose([workload])[workload]
                (log.warning if found is None else log.info)(first_sight_line(workload, found, self.target))
                self.built[workload] = self._build(workload, found)
            return self.built[workload]

    def _choose(self, workloads: list[Workload]) -> dict[Workload, StoredConfig | None]:
        if not workloads:
            return {}
        if self._history is None:
            self._history = ServedBest(self.db) if is_served(self.db) else HistoryBest(Database(self.db))
        return self._history.query_nearest_many(workloads, self.target)

    def _build(self, workload: Workload, found: StoredConfig | None):
        config = found.config if found is not None else untuned_config(workload, self.target)
        return build(workload, self.target, config)


@dataclass(frozen=True)
class Run:
    """A kernel bound to one op's weights, and the shape of its result at one size."""

    call: Callable[..., None]  # by the addresses of the activations, then of the output
    result: tuple[int, ...]  # the kernel's result as the model shapes it (dense's leading sizes kept)
    kernel: object  # the bound kernel: keeps the call's memory alive, and says which config it runs
    name: str  # what a profiler calls its time: `tensortune ` and the workload's key
    in_place: tuple[bool, ...] = ()  # for a form that reads views: which activations it reads where they lie
    # where one run is several calls of the kernel: the byte offsets of the activations and result for each
    offsets: tuple[tuple[int, ...], ...] = ()


class ShapeDispatch:
    """One match's kernels by the shapes of its activations, each bound to the match's weights once per
    workload (two shapes may make one workload: [2, 6, K] and [3, 4, K] are both dense M=12)."""

    def __init__(self, form: Form, weights: dict[str, np.ndarray], kernels: Kernels):
        self.form, self.weights, self.kernels = form, weights, kernels
        # floating-point activations are cast to the kernel's dtype (autocast's float32 to bfloat16); int8's kept
        self.cast = torch_dtype(form.dtype) if form.dtype in FLOATING else None
        self.result_dtype = torch_dtype(form.result_dtype)
        self.runs: dict[tuple, Run] = {}
        self.bound: dict[Workload, object] = {}
        self._lock = threading.Lock()

    def rebind(self, weights: dict[str, np.ndarray]) -> None:
        """Bind these weights instead, each workload's kernel at its next call (the model's changed in place)."""
        with self._lock:
            self.weights = weights
            self.runs.clear()
            self.bound.clear()

    def run(self, shapes: tuple, strides: tuple | None = None) -> Run:
        """The run for these activation shapes (tuples or torch.Size, which hash alike) and, where the form reads
        views, their strides (None for one that must be copied)."""
        found = self.runs.get((shapes, strides))
        return found if found is not None else self._first_sight(shapes, strides)

    def _first_sight(self, shapes: tuple, strides: tuple | None) -> Run:
        with self._lock:
            workload = workload_at(self.form, shapes, strides)
            if workload not in self.bound:
                kernel = self.kernels.get(workload)
                self.bound[workload] = kernel.bind(**self.weights) if self.weights else kernel
            bound = self.bound[workload]
            result = tuple(self.form.result_shape(*shapes))
            in_place, offsets = (), ()
            if self.form.views:
                in_place, calls = self.form.read_in_place(shapes, strides), self.form.calls(shapes, strides)
                itemsizes = [ITEMSIZE[workload.operand_dtype(name)] for name, _ in workload.operand_shapes()]
                itemsizes.append(ITEMSIZE[workload.output_dtype])
                offsets = tuple(tuple(map(operator.mul, call, itemsizes)) for call in calls) if len(calls) > 1 else ()
            run = Run(bound.address_call(), result, bound, f"tensortune {workload.key}", in_place, offsets)
            self.runs[(tuple(shapes), strides)] = run
            return run
