"""`build(workload, target, config)`: lower a config of the workload's template and compile it."""
from __future__ import annotations

import time
from typing import Callable

from search_space import Config, Program, Target, Workload, current_config, get_space, lower

from .kernel import Kernel, cfunc
from .llvm_codegen import generate
from .llvm_jit import Compiled, compile_module, emit_assembly, target_machine
from .object_cache import ObjectCache, object_cache
from .untuned import untuned_config


def resolve_config(workload: Workload, target: Target, config: Config | dict | int | None) -> Config:
    """A Config of this workload's space from a Config, knob values, an index, or the dispatch context (with no
    record, workers.untuned's choice of the fallback)."""
    space = get_space(workload, target)
    if config is None:
        return current_config(workload, target, untuned_config)
    if isinstance(config, int):
        return space.get(config)
    if isinstance(config, dict):
        return space.from_json(config) if "knobs" in config else space.config(config)
    return space.get(space.index_of(dict(config.values)))


def compile_program(program: Program, target: Target, cache: ObjectCache | None = None
                    ) -> tuple[list[Callable], Compiled]:
    """Machine code for each stage of a program, as ctypes functions over the memory buffers."""
    if target.kind != "llvm":
        raise NotImplementedError(f"no code generator for target kind {target.kind!r} yet")
    compiled = compile_module(generate(program, target.threads, target.features), target, cache)
    n_pointers = len(program.scope("input", "output", "packed"))
    return [cfunc(compiled.address(stage.name), n_pointers) for stage in program.stages], compiled


def generated_code(program: Program, target: Target) -> str:
    """What the code generator makes of a program, as text: LLVM IR for llvm, CUDA C for cuda."""
    if target.kind == "cuda":
        from .cuda_codegen import generate as generate_cuda
        return generate_cuda(program).code
    module, machine = generate(program, target.threads, target.features), target_machine(target.model, target.features)
    module.triple, module.data_layout = machine.triple, str(machine.target_data)
    return str(module)


def generated_assembly(program: Program, target: Target) -> str:
    """The machine code of a program on a CPU target, as assembly text: for any CPU and features LLVM knows."""
    if target.kind != "llvm":
        raise NotImplementedError(f"assembly is printed for llvm targets, not {target.kind}: print the source")
    return emit_assembly(generate(program, target.threads, target.features), target)


def build(workload: Workload, target: Target | str = "llvm", config: Config | dict | int | None = None, *,
          cached: bool = True) -> Kernel:
    """Compile a kernel (a CudaKernel for a cuda target); with config=None the active dispatch context (e.g.
    apply_history_best) chooses. A CPU kernel's machine code comes from the object cache where this IR was compiled
    for this machine before, and goes there otherwise, unless `cached` is False (tuning's candidates, each built
    once)."""
    target = Target.parse(target)
    config = resolve_config(workload, target, config)
    start = time.perf_counter()
    program = lower(workload, target, config)
    if target.kind == "cuda":  # CUDA C by NVRTC: needs no GPU until the kernel is called
        from .cuda_kernel import CudaKernel
        return CudaKernel.compile(workload, target, config, program)
    stages, compiled = compile_program(program, target, object_cache() if cached else None)
    return Kernel(workload, target, config, program, stages, compiled, time.perf_counter() - start)
