"""A compiled CUDA kernel as a Python callable over CuPy (or NumPy) arrays.

Building needs no GPU: the cubin is made by NVRTC and loaded on the first call. Called with
CuPy arrays the kernel runs on them in place and returns a CuPy array; NumPy arrays are copied
to the GPU and the result copied back into a NumPy array. Scratch memory (split-K partial
sums) is allocated once per kernel. Launches go to CuPy's current stream.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from search_space import Config, Program, Target, Workload

from .cuda_codegen import CudaSource, generate
from .kernel import KernelArgumentError, check_array
from .nvrtc import Cubin, check_limits, compile_cuda


class CudaKernel:
    def __init__(self, workload: Workload, target: Target, config: Config, program: Program, source: CudaSource,
                 cubin: Cubin, compile_seconds: float):
        self.workload, self.target, self.config, self.program = workload, target, config, program
        self.source, self.cubin, self.compile_seconds = source, cubin, compile_seconds
        self.inputs = program.scope("input")
        self.output = program.scope("output")[0]
        self._launches: list | None = None  # (function, grid, block) per stage, once loaded on a GPU
        self._module = None  # the loaded cubin: its functions live as long as it does
        self._scratch: dict = {}
        self._lock = threading.Lock()

    @classmethod
    def compile(cls, workload: Workload, target: Target, config: Config, program: Program) -> CudaKernel:
        """CUDA C for the program, compiled by NVRTC for the target's architecture; InvalidConfig when a kernel
        as compiled could not be launched."""
        start = time.perf_counter()
        source = generate(program)
        cubin = compile_cuda(source.code, target.arch, f"{workload.op}.cu")
        check_limits(cubin, {name: shape.block for name, shape in source.kernels})
        return cls(workload, target, config, program, source, cubin, time.perf_counter() - start)

    def __repr__(self) -> str:
        return f"CudaKernel({self.workload.key}, {self.target}, config {self.config.index})"

    def _load(self) -> list:
        """The stages' functions on the current GPU; a clear error if the GPU is not the target's architecture."""
        from search_space.gpu_device import host_gpus

        gpus = host_gpus()
        import cupy
        from cupy.cuda import function

        device = gpus[cupy.cuda.Device().id]
        if device.arch != self.target.arch:
            raise RuntimeError(f"{self} was compiled for {self.target.arch}; {device} is {device.arch}")
        module = function.Module()
        module.load(self.cubin.image)
        self._module = module
        self._scratch = {b.name: cupy.empty(b.shape, b.dtype) for b in self.program.scope("packed")}
        return [(module.get_function(name), shape.grid, (shape.block, 1, 1)) for name, shape in self.source.kernels]

    def launch(self, arrays: dict) -> None:
        """Run every stage on device arrays named as the program's buffers (inputs and output)."""
        with self._lock:
            if self._launches is None:
                self._launches = self._load()
        pointers = [arrays.get(b.name, self._scratch.get(b.name)) for b in self.program.scope("input", "output", "packed")]
        for function, grid, block in self._launches:
            function(grid, block, pointers)

    def device_arrays(self, inputs, out=None, bound: dict | None = None) -> tuple[dict, bool]:
        """Device arrays for every buffer, copying NumPy ones; and whether the caller passed NumPy arrays."""
        from search_space.gpu_device import host_gpus

        host_gpus()  # NoGpu, with the reason, where there is none
        import cupy

        bound = bound or {}
        free = [b for b in self.inputs if b.name not in bound]
        if len(inputs) != len(free):
            names = ", ".join(b.name for b in free)
            raise KernelArgumentError(f"{self.workload.op} takes {len(free)} input(s) ({names}), got {len(inputs)}")
        kinds = (np.ndarray, cupy.ndarray)
        checked = [check_array(self.workload.op, b, a, "input", kinds) for b, a in zip(free, inputs)]
        host = any(isinstance(a, np.ndarray) for a in checked) or isinstance(out, np.ndarray)
        arrays = dict(bound) | {b.name: cupy.asarray(a) for b, a in zip(free, checked)}
        if out is not None:
            check_array(self.workload.op, self.output, out, "output", kinds)
        arrays[self.output.name] = out if isinstance(out, cupy.ndarray) else cupy.empty(self.output.shape, self.output.dtype)
        return arrays, host

    def __call__(self, *inputs, out=None, bound: dict | None = None):
        arrays, host = self.device_arrays(inputs, out, bound)
        self.launch(arrays)
        result = arrays[self.output.name]
        if not host:
            return result
        if out is None:
            return result.get()
        result.get(out=out)
        return out

    def bind(self, **weights) -> BoundCudaKernel:
        """Fix some inputs (dense's W and bias): they are copied to the GPU once."""
        import cupy

        unknown = set(weights) - {b.name for b in self.inputs}
        if unknown:
            raise KernelArgumentError(f"{self.workload.op} has no input(s) {', '.join(sorted(unknown))}")
        kinds = (np.ndarray, cupy.ndarray)
        bound = {b.name: cupy.asarray(check_array(self.workload.op, b, weights[b.name], "input", kinds))
                 for b in self.inputs if b.name in weights}
        return BoundCudaKernel(self, bound)


class BoundCudaKernel:
    """A CUDA kernel with its weights on the GPU; call it with the other inputs."""

    def __init__(self, kernel: CudaKernel, bound: dict):
        self.kernel, self.bound, self.workload = kernel, bound, kernel.workload

    def __call__(self, *inputs, out=None):
        return self.kernel(*inputs, out=out, bound=self.bound)
