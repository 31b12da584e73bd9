"""A candidate in wire form and the two steps a worker applies to it: build, then check and time.

A `Workload` holds its operator's math as functions and does not pickle, so a candidate
crosses process and host boundaries as three strings (workload key, target, config JSON);
it is rebuilt where it runs. Both steps return a failed `MeasureResult` instead of raising,
so a worker can report any candidate's fault as an outcome.
"""
from __future__ import annotations

import json
import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Protocol

import numpy as np

from search_space import InvalidConfig, NoTemplate, Target, Workload, WorkloadError

from .build import build, resolve_config
from .flush import host_flusher
from .kernel import Kernel
from .llvm_codegen import CodegenError
from .llvm_jit import CompileError
from .reference import WEIGHT_COPIES, WeightCopies, activation_arrays, inference_calls
from .result import MeasureInput, MeasureResult, Outcome
from .timing import producer_writes, rotated_samples, rotation_bytes, time_samples

CACHE_PROTOCOLS = ("rotate", "flush", "warm")


@dataclass(frozen=True)
class MeasureOptions:
    """The timing protocol: `repeat` samples. `cache` says how the CPU's caches stand at a timed call:
    - "rotate" (the default): single calls, each on another copy of the bound weights, twice the last-level cache
      of copies (up to 256 MiB and MAX_COPIES), its activations written again just before (the calling thread
      copies them over themselves), so that each finds its weights in memory and its activations where the op
      before left them, as a layer of a model does (a workload without weights, one copy of it);
    - "flush": single calls, each after a write of twice the last-level cache by the kernel's threads (AutoTVM's
      advice on x86): it evicts the activations too, and it ranked some configs unlike a model does;
    - "warm": calls lasting at least `min_repeat_ms` a sample, as the benchmarks' references run.
    `python -m bench.cache_flush` tunes a model under each and times the results. A cuda kernel always has the
    GPU's L2 flushed before each call."""

    repeat: int = 5
    min_repeat_ms: float = 20.0
    cache: str = "rotate"
    cooldown_ms: float = 0.0  # sleep between samples (flush, warm; a rotation's calls follow each other, as in a model)
    check: bool = True  # compare with the NumPy reference first (wrong_answer)

    def __post_init__(self):
        if self.cache not in CACHE_PROTOCOLS:
            raise ValueError(f"cache protocol {self.cache!r}: expected one of {', '.join(CACHE_PROTOCOLS)}")


@dataclass(frozen=True)
class Task:
    workload: str  # Workload.key
    target: str
    config: str  # Config.to_json()

    @classmethod
    def of(cls, measure_input: MeasureInput) -> Task:
        config = measure_input.config
        return cls(measure_input.workload.key, str(measure_input.target), config.to_json())

    @property
    def kind(self) -> str:
        return self.target.split()[0]

    def build(self) -> Kernel:
        workload, target = Workload.from_key(self.workload), Target.parse(self.target)
        return build(workload, target, resolve_config(workload, target, json.loads(self.config)), cached=False)


@dataclass
class Built:
    """A compiled candidate held by the worker that built it (its machine code lives in that process)."""

    task: Task
    kernel: Kernel
    started_at: float
    phases: dict = field(default_factory=dict)


def identity() -> tuple[str, str]:
    """(worker, host) as recorded with every result."""
    return f"pid-{os.getpid()}", socket.gethostname()


def failed(outcome: Outcome, error: str, started_at: float, phases: dict | None = None,
           worker: str = "") -> MeasureResult:
    """A failed record; `worker` names the process when the pool reports for a dead one."""
    own, host = identity()
    worker = worker or own
    return MeasureResult(outcome, worker=worker, host=host, started_at=started_at, finished_at=time.time(),
                         error=error[-2000:], phases=phases or {})


def build_step(task: Task) -> Built | MeasureResult:
    started_at, start = time.time(), time.perf_counter()
    try:
        kernel = task.build()
    except (CompileError, CodegenError, NotImplementedError) as error:
        return failed(Outcome.COMPILE_ERROR, f"{type(error).__name__}: {error}", started_at)
    except MemoryError as error:
        return failed(Outcome.RUNTIME_ERROR, f"MemoryError: {error}", started_at)
    except (InvalidConfig, WorkloadError, NoTemplate) as error:
        return failed(Outcome.INVALID_CONFIG, f"{type(error).__name__}: {error}", started_at)
    except Exception:  # noqa: BLE001 — any other fault of the candidate is a record, not a crash
        return failed(Outcome.COMPILE_ERROR, traceback.format_exc(), started_at)
    return Built(task, kernel, started_at, {"build": time.perf_counter() - start})


@lru_cache(maxsize=8)
def _reference(workload: Workload) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Inputs and NumPy's result (worker processes run BLAS on one thread: see pool_local.serve)."""
    inputs = workload.random_inputs()
    return inputs, workload.reference(*inputs)


class TimedCall(Protocol):
    """A kernel ready to run over fixed inputs: its output (for the check) and its timing samples."""

    def output(self) -> np.ndarray: ...

    def samples(self, options: MeasureOptions) -> list[float]: ...


@dataclass
class HostTimedCall:
    """A CPU kernel's inference calls over fixed inputs (dense weights packed once, as deployed), one for each copy
    of the weights, the copy touched longest ago first, timed by the host's clock as `MeasureOptions.cache` says;
    workers.cuda_measure.CudaTimedCall is its GPU counterpart."""

    calls: list[Callable[[], object]]
    out: np.ndarray
    target: Target
    activations: list[np.ndarray]  # the arrays the calls read that the op before would write
    copies: WeightCopies | None = None  # the weights' copies the calls read, whose order a rotation turns

    def output(self) -> np.ndarray:
        self.calls[-1]()  # the copy touched last: the others stay in the order they were touched
        return self.out

    def samples(self, options: MeasureOptions) -> list[float]:
        if options.cache == "rotate":
            samples = rotated_samples(self.calls, options.repeat, producer_writes(self.activations))
            turn = options.repeat % len(self.calls)
            self.calls = self.calls[turn:] + self.calls[:turn]
            if self.copies is not None:
                self.copies.turn(options.repeat)
            return samples
        flush = host_flusher(self.target) if options.cache == "flush" else None
        return time_samples(self.calls[0], options.repeat, options.min_repeat_ms, flush, options.cooldown_ms)


def timed_call(kernel, inputs, options: MeasureOptions) -> TimedCall:
    if kernel.target.kind == "cuda":
        from .cuda_measure import CudaTimedCall
        return CudaTimedCall(kernel, inputs)
    weight_bytes = rotation_bytes() if options.cache == "rotate" else 0
    copies = WEIGHT_COPIES if weight_bytes and kernel.workload.weight_names() else None
    return HostTimedCall(*inference_calls(kernel, inputs, weight_bytes), kernel.target,
                         activation_arrays(kernel.workload, inputs), copies)


@dataclass
class Checked:
    """A built candidate whose result matched NumPy's, its weights bound for the timing: what `time_step` times."""

    built: Built
    timed: TimedCall
    phases: dict


def check_step(built: Built, options: MeasureOptions) -> Checked | MeasureResult:
    """Bind the weights (and their copies for a rotation) and compare one call's result with NumPy's: nothing is
    timed, so a pool may run it beside other workers' builds and checks."""
    kernel, phases = built.kernel, dict(built.phases)
    start = time.perf_counter()
    try:
        inputs, expected = _reference(kernel.workload)
        timed = timed_call(kernel, inputs, options)
        error = kernel.workload.max_error(timed.output(), expected) if options.check else 0.0
    except Exception:  # noqa: BLE001
        return failed(Outcome.RUNTIME_ERROR, traceback.format_exc(), built.started_at, phases)
    phases["check"] = time.perf_counter() - start
    if not error <= 1:
        return failed(Outcome.WRONG_ANSWER, f"max error {error:.3g}x the tolerance", built.started_at, phases)
    return Checked(built, timed, phases)


def time_step(checked: Checked, options: MeasureOptions) -> MeasureResult:
    """Time a checked candidate; the kernel's compile time is reported from its own clock."""
    kernel, phases = checked.built.kernel, dict(checked.phases)
    try:
        start = time.perf_counter()
        samples = checked.timed.samples(options)
        phases["time"] = time.perf_counter() - start
    except Exception:  # noqa: BLE001
        return failed(Outcome.RUNTIME_ERROR, traceback.format_exc(), checked.built.started_at, phases)
    worker, host = identity()
    return MeasureResult(Outcome.OK, tuple(samples), kernel.compile_seconds, kernel.workload.flops, worker, host,
                         checked.built.started_at, time.time(), phases=phases)


def run_step(built: Built, options: MeasureOptions) -> MeasureResult:
    """Check against NumPy, then time."""
    checked = check_step(built, options)
    return checked if isinstance(checked, MeasureResult) else time_step(checked, options)
