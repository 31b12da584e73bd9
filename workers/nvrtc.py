"""Compile CUDA C to a cubin with NVRTC, through NVIDIA's binding (`cuda.bindings.nvrtc`, the `cuda-bindings`
package): no GPU, driver or CuPy is needed, only the NVRTC library, which the binding finds in the
`nvidia-cuda-nvrtc-cu12` wheel or a CUDA toolkit (`pip install 'tensortune[nvrtc]'` installs both).

The cubin is built for one real architecture (`sm_90` runs on compute capability 9.0 only) and
declares what each kernel uses (registers, shared memory; `cubin.kernel_usage`). A kernel whose
launch would be refused for its registers is an InvalidConfig here, before any launch. The log
keeps ptxas' own report (`-v`) for whoever reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

from search_space import InvalidConfig
from search_space.gpu_device import compute_capability, limits

from .cubin import KernelUsage, kernel_usage
from .llvm_jit import CompileError


class CudaCompileError(CompileError):
    """NVRTC rejected the generated CUDA C (the log says where), or NVRTC is not installed."""


@dataclass(frozen=True)
class Cubin:
    image: bytes
    arch: str
    usage: dict[str, KernelUsage]
    log: str


_INSTALL = "install it with: pip install 'tensortune[nvrtc]'"


def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        raise CudaCompileError(f"compiling CUDA C needs NVRTC's binding, cuda-bindings ({error}); {_INSTALL}") from None
    return nvrtc


def _checked(nvrtc, result: tuple, log: str = ""):
    """The value of an NVRTC call's (status, value...) result; CudaCompileError, with the log, unless it succeeded."""
    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        name = nvrtc.nvrtcGetErrorString(status)[1].decode()
        raise CudaCompileError(f"{name} ({int(status)})\n{log}".rstrip())
    return values[0] if values else None


def _read(nvrtc, program, size_of, read) -> bytes:
    """What an NVRTC size-then-copy pair (the log, the cubin) holds."""
    buffer = bytearray(_checked(nvrtc, size_of(program)))
    _checked(nvrtc, read(program, buffer))
    return bytes(buffer)


def compile_cuda(code: str, arch: str, name: str = "tensortune.cu") -> Cubin:
    """A cubin for `arch` (sm_XY); CudaCompileError with NVRTC's log when the code does not compile."""
    compute_capability(arch)
    nvrtc = _nvrtc()
    try:
        created = nvrtc.nvrtcCreateProgram(code.encode(), name.encode(), 0, [], [])
    except RuntimeError as error:  # the binding loads libnvrtc on first use: not found, or not loadable
        raise CudaCompileError(f"NVRTC is unusable: {str(error).strip()}; {_INSTALL}") from None
    program = _checked(nvrtc, created)
    options = [option.encode() for option in (f"--gpu-architecture={arch}", "--std=c++17", "--ptxas-options=-v")]
    try:
        compiled = nvrtc.nvrtcCompileProgram(program, len(options), options)
        raw_log = _read(nvrtc, program, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog)
        log = raw_log.rstrip(b"\0").decode(errors="replace")
        _checked(nvrtc, compiled, log)
        image = _read(nvrtc, program, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return Cubin(image, arch, kernel_usage(image), log)


def check_limits(cubin: Cubin, threads: dict[str, int]) -> None:
    """InvalidConfig when a kernel of `threads[name]` threads per block could not be launched as compiled."""
    device = limits(cubin.arch)
    for name, used in cubin.usage.items():
        problems = device.problems(threads[name], used.shared_bytes, used.registers)
        if problems:
            raise InvalidConfig(f"kernel {name} as compiled for {cubin.arch}: {'; '.join(problems)}")
