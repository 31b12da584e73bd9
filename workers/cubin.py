"""What a cubin declares of each kernel in it, read from its ELF sections: registers per thread and static
shared memory per block, the two that decide whether a block of N threads launches.

Read from the cubin, not from ptxas' `-v` lines in NVRTC's log: NVRTC 13 (as an H100 host had it) leaves those
lines out when a process compiles the same code a second time, as a tuning worker or a test may.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator

EIATTR_REGCOUNT = 0x2F  # in .nv.info: (symbol index, registers per thread), one per kernel
EIFMT_SVAL = 4  # an attribute with a sized value (u16 size, then the bytes); the other formats hold 2 bytes
# From sm_90 on, a kernel's .nv.shared section also holds the 1 KiB the driver reserves per block (marked by
# .nv.reservedSmem symbols), which ptxas does not count as the kernel's and the launch limit does not either.
DRIVER_RESERVED_SHARED = 1024


@dataclass(frozen=True)
class KernelUsage:
    registers: int  # per thread
    shared_bytes: int  # static shared memory per block


@dataclass(frozen=True)
class Section:
    offset: int
    size: int


def _sections(image: bytes) -> dict[str, Section]:
    """The ELF64 section headers by name."""
    (header_offset,) = struct.unpack_from("<Q", image, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", image, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", image, header_offset + i * entry_size) for i in range(count)]
    names = headers[names_index][4]
    return {_string(image, names + h[0]): Section(h[4], h[5]) for h in headers}


def _string(image: bytes, at: int) -> str:
    return image[at:image.index(b"\0", at)].decode()


def _symbol_names(image: bytes, sections: dict[str, Section]) -> list[str]:
    symtab, strtab = sections[".symtab"], sections[".strtab"]
    return [_string(image, strtab.offset + struct.unpack_from("<I", image, at)[0])
            for at in range(symtab.offset, symtab.offset + symtab.size, 24)]


def _attributes(image: bytes, section: Section) -> Iterator[tuple[int, bytes]]:
    at, end = section.offset, section.offset + section.size
    while at < end:
        form, attribute = image[at], image[at + 1]
        size = struct.unpack_from("<H", image, at + 2)[0] if form == EIFMT_SVAL else 0
        yield attribute, image[at + 4:at + 4 + size]
        at += 4 + size


def kernel_usage(image: bytes) -> dict[str, KernelUsage]:
    """Per kernel (by name), its registers and static shared memory as compiled."""
    sections = _sections(image)
    symbols = _symbol_names(image, sections)
    reserved = DRIVER_RESERVED_SHARED if any(s.startswith(".nv.reservedSmem") for s in symbols) else 0
    usage = {}
    for attribute, value in _attributes(image, sections[".nv.info"]):
        if attribute == EIATTR_REGCOUNT:
            symbol, registers = struct.unpack("<II", value)
            shared = sections.get(f".nv.shared.{symbols[symbol]}")
            usage[symbols[symbol]] = KernelUsage(registers, shared.size - reserved if shared else 0)
    return usage
