"""Schedule templates, looked up in one explicit table by (op, target kind)."""
from __future__ import annotations

from functools import lru_cache
from types import ModuleType

from ..program import Program
from ..space import Config, ConfigSpace, InvalidConfig
from ..target import Target
from ..workload import Workload
from . import conv2d, gemm, gemm_cuda

TEMPLATES: dict[tuple[str, str], ModuleType] = {
    ("matmul", "llvm"): gemm,
    ("dense", "llvm"): gemm,
    ("batch_matmul", "llvm"): gemm,
    ("conv2d", "llvm"): conv2d,
    ("matmul", "cuda"): gemm_cuda,
    ("dense", "cuda"): gemm_cuda,
    ("batch_matmul", "cuda"): gemm_cuda,
}


class NoTemplate(LookupError):
    """No schedule template exists for this op on this kind of target."""


def template(workload: Workload, target: Target) -> ModuleType:
    found = TEMPLATES.get((workload.op, target.kind))
    if found is None:
        known = ", ".join(f"{op} on {kind}" for op, kind in TEMPLATES)
        raise NoTemplate(f"no schedule template for {workload.op} on {target.kind}; templates exist for {known}")
    views = any(workload.operand_strides(name) for name, _ in workload.operand_shapes())
    if views and not getattr(found, "VIEWS", False):
        raise NoTemplate(f"the {workload.op} template for {target.kind} reads contiguous operands only, not views "
                         f"({workload.key})")
    if workload.dtype not in found.DTYPES:
        raise NoTemplate(f"the {workload.op} template for {target.kind} computes in {', '.join(found.DTYPES)}, "
                         f"not {workload.dtype}")
    return found


def template_version(workload: Workload, target: Target | str = "llvm") -> int:
    """The version of the template a config of this workload is lowered by: records of another version are
    configs of other code, never applied. A template may version a dtype's configs apart (DTYPE_VERSIONS), or
    a target's (its own `version(workload, target)`)."""
    target = Target.parse(target)
    found = template(workload, target)
    if hasattr(found, "version"):
        return found.version(workload, target)
    return getattr(found, "DTYPE_VERSIONS", {}).get(workload.dtype, found.VERSION)


@lru_cache(maxsize=256)
def get_space(workload: Workload, target: Target | str = "llvm") -> ConfigSpace:
    """The ConfigSpace of a workload on a target (cached: spaces are immutable)."""
    target = Target.parse(target)
    return template(workload, target).space(workload, target)


def fallback_config(workload: Workload, target: Target | str = "llvm", isa: str | None = None) -> Config:
    """The template's untuned default; `isa` asks it in that instruction family (a space with an `isa` knob:
    workers.untuned picks the family measured fastest on the host)."""
    target = Target.parse(target)
    found, space = template(workload, target), get_space(workload, target)
    return found.fallback(workload, target, space, isa) if isa else found.fallback(workload, target, space)


def relaid_knobs(knobs: dict, stored: Workload, wanted: Workload, target: Target) -> dict:
    """A config's knobs of `stored` for `wanted`, a workload of the same op laid out otherwise, where its template
    says how they carry over (conv2d's `relaid`); else as they are."""
    return getattr(template(wanted, target), "relaid", lambda knobs, *_: knobs)(knobs, stored, wanted)


def seed_configs(workload: Workload, target: Target | str = "llvm") -> list[Config]:
    """The configs a search measures first where the op has not been searched on the target (a template's `seeds`,
    each once); none for a template that has no analytic choice to offer."""
    target = Target.parse(target)
    seeds = getattr(template(workload, target), "seeds", lambda *_: [])(workload, target, get_space(workload, target))
    return list({config.index: config for config in seeds}.values())


def lower(workload: Workload, target: Target | str, config: Config) -> Program:
    """Apply a config to the template: the concrete loop nest. Raises InvalidConfig for a foreign config."""
    target = Target.parse(target)
    space = get_space(workload, target)
    if space.index_of(dict(config.values)) != config.index:
        raise InvalidConfig(f"config index {config.index} does not match its knob values in this space")
    return template(workload, target).lower(workload, target, config)
