"""Compile CUDA C to a cubin with NVRTC, through CuPy's bindings: no GPU is needed, only the NVRTC library
(the `nvidia-cuda-nvrtc-cu12` wheel or a CUDA toolkit).

The cubin is built for one real architecture (`sm_90` runs on compute capability 9.0 only), and
ptxas reports what each kernel uses: registers, spills, shared memory. A kernel whose launch
would be refused for its registers is an InvalidConfig here, before any launch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from search_space import InvalidConfig
from search_space.gpu_device import compute_capability, limits

from .llvm_jit import CompileError


class CudaCompileError(CompileError):
    """NVRTC rejected the generated CUDA C (the log says where), or NVRTC is not installed."""


@dataclass(frozen=True)
class KernelUsage:
    """What ptxas reports for one kernel."""

    registers: int
    spill_bytes: int  # stores and loads to local memory caused by register pressure
    shared_bytes: int


@dataclass(frozen=True)
class Cubin:
    image: bytes
    arch: str
    usage: dict[str, KernelUsage]
    log: str


def _nvrtc():
    try:
        from cupy.cuda import nvrtc
    except ImportError as error:
        raise CudaCompileError(f"compiling CUDA C needs CuPy and NVRTC ({error}); "
                               "install them with: pip install 'tensortune[cuda]'") from None
    return nvrtc


def compile_cuda(code: str, arch: str, name: str = "tensortune.cu") -> Cubin:
    """A cubin for `arch` (sm_XY); CudaCompileError with NVRTC's log when the code does not compile."""
    compute_capability(arch)
    nvrtc = _nvrtc()
    try:
        program = nvrtc.createProgram(code, name, [], [])
    except nvrtc.NVRTCError as error:  # e.g. the NVRTC library itself cannot be loaded
        raise CudaCompileError(f"NVRTC is unusable: {error}") from None
    try:
        nvrtc.compileProgram(program, [f"--gpu-architecture={arch}", "--std=c++17", "--ptxas-options=-v"])
        log = nvrtc.getProgramLog(program)
        image = nvrtc.getCUBIN(program)
    except nvrtc.NVRTCError as error:
        raise CudaCompileError(f"{error}\n{nvrtc.getProgramLog(program)}") from None
    finally:
        nvrtc.destroyProgram(program)
    return Cubin(image, arch, parse_usage(log), log)


def parse_usage(log: str) -> dict[str, KernelUsage]:
    """Per kernel, from ptxas' -v lines: 'Compiling entry function 'gemm' ...', '... N bytes spill stores,
    M bytes spill loads', 'Used R registers, ... S bytes smem'."""
    usage, current, spills = {}, None, 0
    for line in log.splitlines():
        if match := re.search(r"Compiling entry function '(\w+)'", line):
            current, spills = match.group(1), 0
        elif match := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            spills = int(match.group(1)) + int(match.group(2))
        elif (match := re.search(r"Used (\d+) registers", line)) and current:
            shared = re.search(r"(\d+) bytes smem", line)
            usage[current] = KernelUsage(int(match.group(1)), spills, int(shared.group(1)) if shared else 0)
    return usage


def check_limits(cubin: Cubin, threads: dict[str, int]) -> None:
    """InvalidConfig when a kernel of `threads[name]` threads per block could not be launched as compiled."""
    device = limits(cubin.arch)
    for name, used in cubin.usage.items():
        problems = device.problems(threads[name], used.shared_bytes, used.registers)
        if problems:
            raise InvalidConfig(f"kernel {name} as compiled for {cubin.arch}: {'; '.join(problems)}")
