"""Targets: what a kernel is tuned for. A best config only applies on a matching target.

`llvm` names the CPU model, the vector features the kernel may use, and its thread count;
`cuda` names the device and its compute capability. The string form is TVM-like:
`llvm -mcpu=znver4 -mattr=+avx2,+avx512f,+fma -threads=2`, `cuda -device=NVIDIA_A100 -arch=sm_80`.
`-mattr` lists the vector features a kernel may use (`+avx2,+fma`: those alone); a list of removals only
(`-mattr=-avx512bf16`, `-mattr=-amx-tile`) narrows the host's, features that need a removed one going too, as in
LLVM (`-mattr=-avx` leaves no AVX-512).
`cuda` alone is the host's GPU (read through CuPy; a TargetError says why when there is none);
`cuda -arch=sm_90` names an architecture with no device, enough to lower and compile. A CPU or feature name
that LLVM does not know is refused (UnknownName), with the names it knows close to it, where the text is a user's.
"""
from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import cache
from typing import Collection

KINDS = ("llvm", "cuda")
# the vector (and AMX's matrix) features a kernel may use: what a target names and a kernel tuned for it keeps to
VECTOR_FEATURES = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512bf16", "avx512vnni", "neon",
                   "sve", "amx-tile", "amx-bf16", "amx-int8")

# what each needs, as LLVM has it: narrowing a feature off narrows off those that need it (-avx leaves no AVX-512)
REQUIRES = {"avx2": ("avx",), "fma": ("avx",), "avx512f": ("avx2", "fma"), "avx512bw": ("avx512f",),
            "avx512vl": ("avx512f",), "avx512dq": ("avx512f",), "avx512bf16": ("avx512bw",), "avx512vnni": ("avx512f",),
            "amx-bf16": ("amx-tile",), "amx-int8": ("amx-tile",)}


def without(features: Collection[str], removed: Collection[str]) -> set[str]:
    """`features` less `removed` and every feature that needs one of them."""
    kept = set(features) - set(removed)
    while needy := {f for f in kept if not set(REQUIRES.get(f, ())) <= kept}:
        kept -= needy
    return kept


def lacked_features(target: Target, features: Collection[str]) -> str:
    """The vector features `target` asks for that a CPU of `features` lacks, named ("" for none): its code cannot run
    there (LLVM aborts the process compiling an instruction of a feature its machine is told is off)."""
    return ", ".join(sorted(f for f in target.features if f in VECTOR_FEATURES and f not in features))


class TargetError(ValueError):
    """A target string that names no target tensortune can build for."""


class NoDevice(TargetError):
    """The target names this host's GPU, and the host has none (or no CuPy to see it)."""


class UnknownName(TargetError):
    """An `llvm` target names a CPU or feature LLVM does not know: LLVM would ignore it (an unknown CPU aborts the
    compile), and the records would carry the name of no machine."""


@dataclass(frozen=True)
class Target:
    kind: str
    model: str = ""  # llvm: the CPU name LLVM uses; cuda: the device name
    features: tuple[str, ...] = ()  # llvm: the vector features, sorted
    threads: int = 1
    arch: str = ""  # cuda: sm_XY

    @classmethod
    def parse(cls, text: str | Target, check_names: bool = False) -> Target:
        """`llvm` alone is the host CPU with all its cores; options override what was detected. `check_names` refuses
        a CPU or feature this host's LLVM does not know (UnknownName): for what a user types, not for stored or
        imported targets, which may name another architecture's CPU."""
        if isinstance(text, Target):
            return text
        words = str(text).split()
        if not words or words[0] not in KINDS:
            raise TargetError(f"unknown target {text!r}; known kinds: {', '.join(KINDS)}")
        options = {}
        for word in words[1:]:
            match = re.fullmatch(r"-(\w+)=(\S*)", word)
            if not match or match.group(1) not in ("mcpu", "mattr", "threads", "device", "arch"):
                raise TargetError(f"bad target option {word!r} in {text!r}")
            options[match.group(1)] = match.group(2)
        if words[0] == "cuda":
            return _cuda(options, text)
        target = host_target()
        if "mcpu" in options:
            if check_names:
                require_known("CPU", options["mcpu"], (target.model,))
            target = replace(target, model=options["mcpu"])
        if "mattr" in options:
            entries = [entry for entry in options["mattr"].split(",") if entry]
            for entry in entries if check_names else ():
                require_known("feature", entry[1:] if entry[0] in "+-" else entry, target.features)
            if entries and all(entry.startswith("-") for entry in entries):
                kept = without(target.features, {entry[1:] for entry in entries})
            else:
                kept = {entry[1:] for entry in entries if entry.startswith("+")}
            target = replace(target, features=tuple(sorted(kept)))
        if "threads" in options:
            if not options["threads"].isdigit() or int(options["threads"]) < 1:
                raise TargetError(f"-threads must be a positive integer in {text!r}")
            target = replace(target, threads=int(options["threads"]))
        return target

    def __str__(self) -> str:
        if self.kind == "cuda":
            device = f" -device={self.model.replace(' ', '_')}" if self.model else ""
            return f"cuda{device} -arch={self.arch}"
        return f"llvm -mcpu={self.model} -mattr={','.join('+' + f for f in self.features)} -threads={self.threads}"

    @property
    def label(self) -> str:
        """The short form for tables, e.g. `znver3 · 2 threads`; the full string is `str(target)`."""
        if self.kind == "cuda":
            return " · ".join(part for part in (self.model, self.arch) if part) or "cuda"
        return f"{self.model} · {self.threads} thread{'s' if self.threads > 1 else ''}"

    @property
    def vector_bits(self) -> int:
        """Widest vector register the target has."""
        if "avx512f" in self.features:
            return 512
        return 256 if "avx" in self.features else 128

    @property
    def vector_registers(self) -> int:
        return 32 if "avx512f" in self.features else 16


def _cuda(options: dict, text: str) -> Target:
    """`-arch` names the architecture (no device needed); without it, the host's GPU is read."""
    from .gpu_device import NoGpu, compute_capability, host_gpu

    if "arch" in options:
        try:
            compute_capability(options["arch"])
        except ValueError as error:
            raise TargetError(f"{error} in {text!r}") from None
        return Target("cuda", options.get("device", "").replace("_", " "), (), 1, options["arch"])
    try:
        gpu = host_gpu()
    except NoGpu as error:
        raise NoDevice(f"{error}; name an architecture to lower and compile without one, e.g. "
                          f"'cuda -arch=sm_90'") from None
    return Target("cuda", options.get("device", gpu.name.replace(" ", "_")).replace("_", " "), (), 1, gpu.arch)


@cache
def host_target() -> Target:
    """The CPU this process runs on, with every core it may use."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    features = llvm.get_host_cpu_features()
    vector = tuple(sorted(f for f in VECTOR_FEATURES if features.get(f)))
    return Target("llvm", llvm.get_host_cpu_name(), vector, len(os.sched_getaffinity(0)))


def require_known(kind: str, name: str, host_names: Collection[str]) -> None:
    """Raise UnknownName, with the names LLVM knows close to it, unless LLVM knows CPU or feature `name` (`kind`)
    for this host's architecture. The host's own names are known without asking LLVM for its lists."""
    if name in host_names:
        return
    known = llvm_names()[kind]
    if name in known:
        return
    close = difflib.get_close_matches(name, sorted(known), n=4)
    hint = (f"known and close: {', '.join(close)}" if close else
            f"none of the {len(known)} LLVM knows is close (this host's: {', '.join(host_names) or 'none'})")
    raise UnknownName(f"unknown {kind} {name!r} for llvm; {hint}")


@cache
def llvm_names() -> dict[str, frozenset[str]]:
    """The CPU and feature names LLVM knows for this host's triple, as {"CPU": ..., "feature": ...}. llvmlite has
    no call that lists them, but a target machine for the CPU `help` prints both lists to stderr (once a process,
    onto the terminal): a child process is asked, and its stderr read (0.1 s, once)."""
    ask = ("import llvmlite.binding as llvm; llvm.initialize_native_target(); "
           "llvm.Target.from_default_triple().create_target_machine(cpu='help')")
    listing = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, timeout=60, check=True).stderr
    cpus, _, features = listing.partition("Available features for this target:")
    names = {kind: frozenset(re.findall(r"^  (\S+) +- ", section, re.MULTILINE))
             for kind, section in (("CPU", cpus), ("feature", features))}
    if not all(names.values()):
        raise RuntimeError(f"LLVM's list of CPU and feature names could not be read from: {listing[:300]!r}")
    return names
