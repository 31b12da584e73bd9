"""Turning a candidate into machine code, checking it, and timing it."""
from .build import build, compile_program, resolve_config
from .kernel import BoundKernel, Kernel, KernelArgumentError, UnalignedInputWarning
from .llvm_codegen import CodegenError
from .llvm_jit import CompileError
from .measure import measure
from .pool import Pool, PoolOptions, RayPoolOptions, make_pool
from .result import MeasureInput, MeasureResult, Outcome, best_curve, best_so_far, typical
from .task import MeasureOptions, Task

__all__ = ["BoundKernel", "CodegenError", "CompileError", "Kernel", "KernelArgumentError", "build", "compile_program",
           "resolve_config", "MeasureInput", "MeasureOptions", "MeasureResult", "Outcome", "Pool", "PoolOptions",
           "RayPoolOptions", "Task", "UnalignedInputWarning", "best_curve", "best_so_far", "make_pool", "measure", "typical"]
