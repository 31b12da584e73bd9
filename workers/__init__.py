"""Turning a candidate into machine code, checking it, and timing it."""
from .build import build, compile_program, resolve_config
from .kernel import BoundKernel, Kernel, KernelArgumentError
from .llvm_codegen import CodegenError
from .llvm_jit import CompileError
from .result import MeasureInput, MeasureResult, Outcome

__all__ = ["BoundKernel", "CodegenError", "CompileError", "Kernel", "KernelArgumentError", "build", "compile_program", "resolve_config", "MeasureInput", "MeasureResult", "Outcome"]
