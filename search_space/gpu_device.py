"""What a CUDA target can hold: the per-architecture limits a launch must respect, and the host's GPU.

Limits come from the compute capability alone (CUDA C Programming Guide, "Technical
Specifications per Compute Capability"), so `cuda -arch=sm_90` is checked exactly as an H100
would be, with no device present. The host's GPU is read through CuPy; without CuPy, a driver
or a device, `host_gpu` raises `NoGpu` with one line that says which is missing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_THREAD = 255
REGISTERS_PER_BLOCK = 65536  # every architecture from sm_50 on
STATIC_SHARED_BYTES = 48 * 1024  # per block without the dynamic opt-in, every architecture
MAX_GRID_YZ = 65535
# the compute capabilities NVRTC 12.9 compiles for
KNOWN_CC = (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 120, 121)


class NoGpu(RuntimeError):
    """This host has no CUDA GPU that CuPy can use (or no CuPy)."""


@dataclass(frozen=True)
class GpuLimits:
    """What one block of a kernel may use on an architecture."""

    arch: str  # sm_XY
    threads_per_block: int = MAX_THREADS_PER_BLOCK
    registers_per_thread: int = MAX_REGISTERS_PER_THREAD
    registers_per_block: int = REGISTERS_PER_BLOCK
    shared_bytes_per_block: int = STATIC_SHARED_BYTES

    def problems(self, threads: int, shared_bytes: int, registers: int) -> list[str]:
        """What a block of `threads` threads, each using `registers`, with `shared_bytes` breaks; [] when it fits."""
        found = []
        if threads > self.threads_per_block:
            found.append(f"{threads} threads per block > {self.threads_per_block}")
        if shared_bytes > self.shared_bytes_per_block:
            found.append(f"{shared_bytes} bytes of shared memory per block > {self.shared_bytes_per_block}")
        if registers > self.registers_per_thread:
            found.append(f"{registers} registers per thread > {self.registers_per_thread}")
        if registers * threads > self.registers_per_block:
            found.append(f"{registers} registers x {threads} threads > {self.registers_per_block} per block")
        return found


def compute_capability(arch: str) -> int:
    """`sm_90` → 90; a ValueError names the known architectures otherwise."""
    match = re.fullmatch(r"sm_(\d+)a?", arch)
    if not match or int(match.group(1)) not in KNOWN_CC:
        known = ", ".join(f"sm_{cc}" for cc in KNOWN_CC)
        raise ValueError(f"unknown CUDA architecture {arch!r}; known: {known}")
    return int(match.group(1))


def limits(arch: str) -> GpuLimits:
    compute_capability(arch)
    return GpuLimits(arch)


@dataclass(frozen=True)
class GpuDevice:
    """A GPU of this host as CuPy reports it."""

    index: int
    name: str
    arch: str
    multiprocessors: int
    memory_bytes: int
    l2_bytes: int

    def __str__(self) -> str:
        return (f"GPU {self.index}: {self.name} ({self.arch}, {self.multiprocessors} SMs, "
                f"{self.memory_bytes / 2**30:.0f} GiB, L2 {self.l2_bytes >> 20} MiB)")


@cache
def host_gpus() -> tuple[GpuDevice, ...]:
    """Every GPU CuPy sees; raises NoGpu with the reason when there is none."""
    try:
        from cupy.cuda import runtime
    except ImportError as error:
        raise NoGpu(f"no CUDA GPU on this host can be used: the cuda target needs CuPy ({error}); "
                    "install it with: pip install 'tensortune[cuda]'") from None
    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as error:
        raise NoGpu(f"no CUDA GPU on this host ({error})") from None
    if count == 0:
        raise NoGpu("no CUDA GPU on this host (the driver reports none)")
    devices = []
    for index in range(count):
        props = runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        devices.append(GpuDevice(index, name, f"sm_{props['major']}{props['minor']}", props["multiProcessorCount"],
                                 props["totalGlobalMem"], props["l2CacheSize"]))
    return tuple(devices)


def host_gpu() -> GpuDevice:
    """The GPU that `cuda` with no options names: the first one CuPy sees (CUDA_VISIBLE_DEVICES picks it)."""
    return host_gpus()[0]


def local_gpu_problem(arch: str) -> str:
    """Why this host cannot time kernels built for `arch` ("" when one of its GPUs can): for refusing, up front,
    work that a local pool could never measure."""
    try:
        gpus = host_gpus()
    except NoGpu as error:
        return str(error)
    if all(gpu.arch != arch for gpu in gpus):
        return f"no GPU of this host is {arch}: " + "; ".join(map(str, gpus))
    return ""
