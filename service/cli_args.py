"""Turning the command line's words into workloads and targets, with usage errors that say why."""
from __future__ import annotations

from typing import List

import typer
from rich.console import Console

from search_space import Target, TargetError, Workload, WorkloadError
from search_space.workload import OPS, parse_params

console = Console(stderr=True, soft_wrap=True)  # the CLI's messages: one line each, never broken at the width
OP_ARGUMENT = typer.Argument(..., help=" | ".join(OPS))


def parse_workload(op: str, params: List[str]) -> Workload:
    """`matmul`, `["M=64", "N=64", "K=64"]` → Workload; errors become a usage message."""
    try:
        return Workload.make(op, **parse_params(params))
    except WorkloadError as error:
        raise typer.BadParameter(str(error)) from None


def parse_target(text: str) -> Target:
    try:
        return Target.parse(text)
    except TargetError as error:
        raise typer.BadParameter(str(error)) from None
