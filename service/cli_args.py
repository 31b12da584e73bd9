"""Turning the command line's words into workloads and targets, with usage errors that say why."""
from __future__ import annotations

from typing import List, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from search_space import Target, TargetError, Workload, WorkloadError
from search_space.target import NoDevice
from search_space.workload import OPS, parse_params

console = Console(stderr=True, soft_wrap=True)  # the CLI's messages: one line each, never broken at the width
OP_ARGUMENT = typer.Argument(..., help=" | ".join(OPS))
TARGET_HELP = "llvm (this CPU, all its cores), llvm -threads=1, llvm -mcpu=znver3, cuda -arch=sm_90 ..."
TARGET_OPTION = typer.Option("llvm", "--target", help=TARGET_HELP)
DB_OPTION = typer.Option(None, "--db", help="SQLite file or SQLAlchemy URL (default: $TENSORTUNE_DB, else ./tensortune.db)")


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command with one red line (its text printed as is, brackets and all) and an exit code."""
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def open_database(url: str | None):
    """The database of `--db`; a URL that cannot be opened ends the command with its reason in one line."""
    from db import Database, DatabaseOpenError

    try:
        return Database(url)
    except DatabaseOpenError as error:
        fail(str(error))


def parse_workload(op: str, params: List[str]) -> Workload:
    """`matmul`, `["M=64", "N=64", "K=64"]` → Workload; errors become a usage message."""
    try:
        return Workload.make(op, **parse_params(params))
    except WorkloadError as error:
        raise typer.BadParameter(str(error)) from None


def parse_target(text: str) -> Target:
    """A target; one that names this host's GPU where there is none ends the command with one line."""
    try:
        return Target.parse(text)
    except NoDevice as error:
        fail(str(error))
    except TargetError as error:
        raise typer.BadParameter(str(error)) from None
