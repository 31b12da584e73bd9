"""JIT-compile LLVM IR for a CPU target with llvmlite: parse, verify, optimise at O3, and load.

The target machine is built for the target's CPU model with the host's features, minus any
vector feature the target does not list (so a kernel tuned for AVX2 stays AVX2 on an
AVX-512 host). Parallel loops call libgomp, loaded once into the process, which also asks Linux for AMX's
tile registers where the CPU has them. Assembly for reading (`emit_assembly`) is made with exactly the target's vector features, host or not:
it is never run. A build may load the object of the same IR from a cache on disk instead (workers.object_cache).
"""
from __future__ import annotations

import ctypes.util
import os
from dataclasses import dataclass
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir

from search_space.target import VECTOR_FEATURES, Target, host_target, lacked_features

from .object_cache import ObjectCache


class CompileError(RuntimeError):
    """LLVM rejected or failed to compile a generated module."""


@cache
def _initialise() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    gomp = ctypes.util.find_library("gomp")
    if gomp is None:
        raise CompileError("libgomp not found: parallel kernels need it (Debian/Ubuntu: apt-get install libgomp1)")
    llvm.load_library_permanently(gomp)
    if llvm.get_host_cpu_features().get("amx-tile"):
        _request_tile_data()


def _request_tile_data() -> None:
    """Linux gives a process AMX's tile registers only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
    XFEATURE_XTILEDATA); until then a tile instruction kills it with SIGILL. Asked once per process, for all its
    threads, before any kernel is loaded."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(158, 0x1023, 18) != 0:  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        raise CompileError(f"Linux refused AMX tile data to this process: {os.strerror(ctypes.get_errno())}")


@cache
def _feature_string(features: tuple[str, ...], exact: bool = False) -> str:
    """To run here: the host's features, less the vector features the target lacks. To read (`exact`): the target's
    vector features over what its CPU model has by default, the host's left out, so that another CPU's target
    reads as that CPU runs it (on a Zen 5 host, a Zen 3 target's int8 dot had AVX-VNNI's vpdpwssd, which Zen 3
    lacks, and which the host would lend it)."""
    _initialise()
    host = llvm.get_host_cpu_features()
    # prefer-256-bit would make LLVM split the explicit 512-bit vectors the vec knob asks for.
    if exact:  # the names this architecture knows (the host's), each on or off as the target says
        return ",".join(f"{'+' if name in features else '-'}{name}" for name in VECTOR_FEATURES if name in host) + \
            ",-prefer-256-bit"
    for name in VECTOR_FEATURES:
        if name in host and name not in features:
            host[name] = False
    return host.flatten() + ",-prefer-256-bit"


def target_machine(model: str, features: tuple[str, ...], exact: bool = False) -> llvm.TargetMachine:
    """A new target machine each time: an MCJIT engine takes ownership of (and frees) the one it is given."""
    return llvm.Target.from_default_triple().create_target_machine(
        cpu=model, features=_feature_string(features, exact), opt=3, jit=not exact)


@dataclass
class Compiled:
    """A loaded module: keep it alive as long as its function addresses are used."""

    engine: llvm.ExecutionEngine
    module: llvm.ModuleRef | None  # the optimised module; None where its object came from the cache
    machine: llvm.TargetMachine  # owned by the engine

    @property
    def from_cache(self) -> bool:
        return self.module is None

    def address(self, name: str) -> int:
        return self.engine.get_function_address(name)

    def assembly(self) -> str:
        return self.machine.emit_assembly(self.module)


def _ir_text(module: ir.Module, tm: llvm.TargetMachine) -> str:
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    return str(module)


def _optimised(text: str, name: str, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    try:
        parsed = llvm.parse_assembly(text)
        parsed.verify()
    except RuntimeError as error:
        raise CompileError(f"invalid LLVM IR for {name}: {error}") from error
    # The IR is already vectorized and unrolled as the config says: LLVM's own loop vectorizer,
    # SLP and unroller would only second-guess the knobs and triple the optimisation time.
    options = llvm.create_pipeline_tuning_options(speed_level=2)
    options.loop_vectorization = options.slp_vectorization = options.loop_unrolling = False
    passes = llvm.create_pass_builder(tm, options)
    passes.getModulePassManager().run(parsed, passes)
    return parsed


def compile_module(module: ir.Module, target: Target, cache: ObjectCache | None = None) -> Compiled:
    """Machine code to run here: a target that asks for a vector feature this CPU lacks is refused, not compiled.
    With a `cache`, the object LLVM made of the same IR for this machine before is loaded from it; else the one it
    makes now is stored there."""
    if lacked := lacked_features(target, host_target().features):
        raise CompileError(f"target {str(target)!r} asks for {lacked}, which this host's CPU lacks: its code can be "
                           f"printed here (`tensortune show --source` or `--asm`), not run")
    tm = target_machine(target.model, target.features)
    text = _ir_text(module, tm)
    key = cache.key(text, target.model, _feature_string(target.features)) if cache else ""
    if key and (stored := cache.get(key)) is not None:
        return _loaded(stored, tm)
    parsed = _optimised(text, module.name, tm)
    engine = llvm.create_mcjit_compiler(parsed, tm)
    if key:
        engine.set_object_cache(notify_func=lambda _, data: cache.put(key, data))
    engine.finalize_object()
    return Compiled(engine, parsed, tm)


def _loaded(data: bytes, tm: llvm.TargetMachine) -> Compiled:
    """An engine running a stored object: MCJIT asks the cache for an empty module's code and is given it."""
    empty = llvm.parse_assembly(f'target triple = "{tm.triple}"\ntarget datalayout = "{tm.target_data}"\n')
    engine = llvm.create_mcjit_compiler(empty, tm)
    engine.set_object_cache(getbuffer_func=lambda _: data)
    engine.finalize_object()
    return Compiled(engine, None, tm)


def emit_assembly(module: ir.Module, target: Target) -> str:
    """The machine code a module becomes on the target, as text: for any target LLVM knows, this host's or not."""
    tm = target_machine(target.model, target.features, exact=True)
    return tm.emit_assembly(_optimised(_ir_text(module, tm), module.name, tm))
