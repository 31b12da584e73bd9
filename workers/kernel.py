"""A compiled kernel as a Python callable over NumPy arrays.

`kernel(*inputs)` returns a new output, `kernel(*inputs, out=array)` fills one. Inputs are
checked (count, shape, dtype, C-contiguity or a view's strides) with a message that names the input. Scratch
buffers (packed operands) are allocated once per kernel, 64-byte aligned. `bind(**weights)`
runs the stages that read only those weights once, as an inference deployment pre-packs
its weights, and returns a callable that takes the remaining inputs.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from typing import Callable

import numpy as np

from search_space import Config, Program, Target, Workload
from search_space.program import Stage, Store, loads, walk
from search_space.workload import aligned_empty

from .llvm_amx import LINE
from .llvm_jit import Compiled


class KernelArgumentError(ValueError):
    """The arrays given to a kernel do not match its workload."""


class UnalignedInputWarning(UserWarning):
    """An input that a kernel's AMX tile loads read does not start on a cache line: each of a tile's 16 rows then
    straddles two lines, and the kernel runs slower (a bf16 dense 128 × 768 × 768 1.2 times, from an X 16 bytes
    off one, on an Intel AMX host)."""


def check_array(op: str, buffer, array, role: str, types: tuple[type, ...] = (np.ndarray,)):
    """`array` if it can stand for `buffer` (type, shape, dtype, C-contiguous or a view of the buffer's strides,
    writable output), else a KernelArgumentError that names the operand."""
    what = f"{op} {role} {buffer.name}"
    if not isinstance(array, types):
        expected = " or ".join(f"a {t.__module__.split('.')[0]}.{t.__name__}" for t in types)
        raise KernelArgumentError(f"{what}: expected {expected}, got {type(array).__name__}")
    if array.shape != buffer.shape:
        raise KernelArgumentError(f"{what}: expected shape {buffer.shape}, got {array.shape}")
    if array.dtype != np.dtype(buffer.dtype):
        raise KernelArgumentError(f"{what}: expected dtype {buffer.dtype}, got {array.dtype}")
    if buffer.strides is not None:
        if array.strides != tuple(stride * array.itemsize for stride in buffer.strides):
            raise KernelArgumentError(f"{what}: expected a view of element strides {buffer.strides}, got "
                                      f"{tuple(stride // array.itemsize for stride in array.strides)}")
    elif not array.flags.c_contiguous:
        raise KernelArgumentError(f"{what}: must be C-contiguous (use numpy.ascontiguousarray)")
    if role == "output" and not getattr(array.flags, "writeable", True):
        raise KernelArgumentError(f"{what}: is read-only")
    return array


def stage_reads(stage: Stage) -> set[str]:
    return {load.buffer.name for stmt, _, _ in walk(stage.body) if isinstance(stmt, Store) for load in loads(stmt.value)}


def tile_reads(program: Program) -> set[str]:
    """The buffers the program's tile nests (AMX tile products) read: their rows go to tile loads as they lie."""
    return {load.buffer.name for stage in program.stages for stmt, _, loops in walk(stage.body)
            if isinstance(stmt, Store) and any(loop.kind == "tile" for loop in loops) for load in loads(stmt.value)}


class Kernel:
    def __init__(self, workload: Workload, target: Target, config: Config, program: Program,
                 stages: list[Callable], compiled: Compiled, compile_seconds: float):
        self.workload, self.target, self.config, self.program = workload, target, config, program
        self.compile_seconds = compile_seconds
        self._stages = list(zip(program.stages, stages))
        self.compiled = compiled  # its machine code: kept alive as long as the kernel
        self.inputs = program.scope("input")
        self.output = program.scope("output")[0]
        self._scratch = {b.name: aligned_empty(b.shape, b.dtype) for b in program.scope("packed")}
        self._lock = threading.Lock()
        self._tile_inputs = tile_reads(program) & {b.name for b in self.inputs}
        self._warned: set[str] = set()  # the inputs an UnalignedInputWarning was given for, once each

    def __repr__(self) -> str:
        return f"Kernel({self.workload.key}, {self.target}, config {self.config.index})"

    def _check(self, buffer, array, role: str) -> np.ndarray:
        return check_array(self.workload.op, buffer, array, role)

    def _arrays(self, inputs, out, bound: dict) -> dict[str, np.ndarray]:
        free = [b for b in self.inputs if b.name not in bound]
        if len(inputs) != len(free):
            names = ", ".join(b.name for b in free)
            raise KernelArgumentError(f"{self.workload.op} takes {len(free)} input(s) ({names}), got {len(inputs)}")
        arrays = dict(bound) | {b.name: self._check(b, a, "input") for b, a in zip(free, inputs)}
        for name in sorted(self._tile_inputs - set(bound) - self._warned):
            if offset := arrays[name].ctypes.data % LINE:
                self._warned.add(name)
                warnings.warn(f"{self}: input {name} starts {offset} bytes past a cache line, and its tile loads read "
                              "it slower: give arrays that start on one (search_space.workload.aligned(array) copies "
                              "into one; PyTorch's tensors start on one)", UnalignedInputWarning, stacklevel=3)
        if out is None:
            out = aligned_empty(self.output.shape, self.output.dtype)
        arrays[self.output.name] = self._check(self.output, out, "output")
        return arrays

    def _run(self, arrays: dict[str, np.ndarray], skip: set[str] = frozenset()) -> None:
        memory = self.program.scope("input", "output", "packed")
        pointers = [arrays[b.name].ctypes.data for b in memory]
        for stage, function in self._stages:
            if stage.name not in skip:
                function(*pointers)

    def check(self, *inputs: np.ndarray, out: np.ndarray) -> None:
        """Raise the KernelArgumentError a call with these arrays would, running nothing: a caller that checks
        once may then call `address_call` on their addresses."""
        self._arrays(inputs, out, {})

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        arrays = self._arrays(inputs, out, {})
        with self._lock:
            self._run(arrays | self._scratch)
        return arrays[self.output.name]

    def address_call(self) -> Callable[..., None]:
        """A call taking the addresses (ints) of the inputs and then the output, in call order, that checks
        nothing: for callers whose arrays are known right (the torch backend's static graphs), where the
        checks and NumPy wrappers would cost more than a small kernel."""
        return self._address_call(self._scratch, set(), self._lock)

    def _address_call(self, fixed: dict[str, np.ndarray], skip: set[str], lock: threading.Lock) -> Callable[..., None]:
        free = [b.name for b in self.inputs if b.name not in fixed] + [self.output.name]
        slots = [(True, fixed[b.name].ctypes.data) if b.name in fixed else (False, free.index(b.name))
                 for b in self.program.scope("input", "output", "packed")]
        functions = [function for stage, function in self._stages if stage.name not in skip]

        def call(*addresses: int, _keepalive=(self, fixed)) -> None:  # the fixed arrays live as long as the call
            pointers = [value if is_fixed else addresses[value] for is_fixed, value in slots]
            with lock:
                for function in functions:
                    function(*pointers)
        return call

    def bind(self, **weights: np.ndarray) -> BoundKernel:
        """Fix some inputs (e.g. dense's W and bias) and run the stages that read only them, once."""
        unknown = set(weights) - {b.name for b in self.inputs}
        if unknown:
            raise KernelArgumentError(f"{self.workload.op} has no input(s) {', '.join(sorted(unknown))}")
        bound = {b.name: self._check(b, weights[b.name], "input") for b in self.inputs if b.name in weights}
        return BoundKernel(self, bound)


class BoundKernel:
    """A kernel with its weights fixed and pre-packed; call it with the other inputs."""

    def __init__(self, kernel: Kernel, bound: dict[str, np.ndarray]):
        self.kernel, self.bound = kernel, bound
        self.workload = kernel.workload
        self._scratch = {name: aligned_empty(a.shape, a.dtype) for name, a in kernel._scratch.items()}
        self._hoisted = {stage.name for stage, _ in kernel._stages
                         if stage.constant and stage_reads(stage) <= set(bound) | set(self._scratch)}
        arrays = dict(bound) | self._scratch
        placeholders = {b.name: np.empty(0, b.dtype) for b in kernel.inputs if b.name not in bound}
        placeholders[kernel.output.name] = np.empty(0, kernel.output.dtype)
        kernel._run(arrays | placeholders, skip={s.name for s, _ in kernel._stages} - self._hoisted)
        self._lock = threading.Lock()

    def check(self, *inputs: np.ndarray, out: np.ndarray) -> None:
        """Kernel.check for the unbound inputs."""
        self.kernel._arrays(inputs, out, self.bound)

    def __call__(self, *inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        arrays = self.kernel._arrays(inputs, out, self.bound)
        with self._lock:
            self.kernel._run(arrays | self._scratch, skip=self._hoisted)
        return arrays[self.kernel.output.name]

    def address_call(self) -> Callable[..., None]:
        """Kernel.address_call for the unbound inputs, the weights' packing not repeated."""
        return self.kernel._address_call(self.bound | self._scratch, self._hoisted, self._lock)


def cfunc(address: int, n_pointers: int) -> Callable:
    return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * n_pointers)(address)
