"""Workloads, schedule templates and their config spaces, the lowered program, and dispatch."""
from .dispatch import DispatchContext, FallbackWarned, current_config, dispatch_context, fallback_message
from .program import Program, format_program
from .space import Config, ConfigSpace, InvalidConfig, Knob
from .target import Target, TargetError, host_target
from .templates import NoTemplate, fallback_config, get_space, lower, seed_configs, template_version
from .workload import DTYPES, Workload, WorkloadError, batch_matmul, conv2d, dense, matmul

__all__ = [
    "DTYPES", "Config", "ConfigSpace", "DispatchContext", "FallbackWarned", "InvalidConfig", "Knob", "NoTemplate", "Program",
    "Target", "TargetError", "Workload", "WorkloadError", "batch_matmul", "conv2d", "current_config", "dense",
    "dispatch_context", "fallback_config", "fallback_message", "format_program", "get_space", "host_target",
    "lower", "matmul", "seed_configs", "template_version",
]
