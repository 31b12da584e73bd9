"""Turning the command line's words into workloads and targets, with usage errors that say why."""
from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from search_space import Target, TargetError, Workload, WorkloadError
from search_space.target import NoDevice, UnknownName
from search_space.workload import OPS, parse_params

console = Console(stderr=True, soft_wrap=True)  # the CLI's messages: one line each, never broken at the width
OP_ARGUMENT = typer.Argument(..., help=" | ".join(OPS))
TARGET_HELP = "llvm (this CPU, all its cores), llvm -threads=1, llvm -mcpu=znver3, cuda -arch=sm_90 ..."
TARGET_OPTION = typer.Option("llvm", "--target", help=TARGET_HELP)
DB_OPTION = typer.Option(None, "--db", help="SQLite file or SQLAlchemy URL (default: $TENSORTUNE_DB, else ./tensortune.db)")
WORKERS_HELP = "local, ray, or a Ray cluster address (HOST:PORT, ray://HOST:PORT)"
RAY_ADDRESS = re.compile(r"auto|(ray://)?(\[[0-9a-fA-F:]+\]|[\w.-]+):\d+")


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


@contextmanager
def writing_to(database) -> Iterator[None]:
    """A database that refuses our writes (a read-only SQLite file) ends the command with one line, not its SQL."""
    from sqlalchemy.exc import DBAPIError

    from db.opening import write_refusal

    try:
        yield
    except DBAPIError as error:
        if refusal := write_refusal(database.url, error):
            fail(refusal)
        raise


@contextmanager
def writing_file(path: str | Path) -> Iterator[None]:
    """An output file that cannot be written (no such directory, no permission) ends the command with one line."""
    try:
        yield
    except OSError as error:
        why = f"no such directory {Path(path).parent}" if isinstance(error, FileNotFoundError) else error.strerror
        fail(f"cannot write {path}: {why}")


def check_workers(text: str) -> None:
    """`--workers`, checked before anything starts: a typo would otherwise reach Ray as an address."""
    if text not in ("local", "ray") and not RAY_ADDRESS.fullmatch(text):
        fail(f"--workers {text}: not local, ray or a Ray cluster address (HOST:PORT, ray://HOST:PORT)")


def host_problem(target: Target) -> str:
    """Why this host cannot time the target's code ("" when it can): another CPU model's code, more threads than
    its cores, a GPU it lacks."""
    from search_space.gpu_device import local_gpu_problem
    from workers.pool_local import local_cpu_problem

    return local_gpu_problem(target.arch) if target.kind == "cuda" else local_cpu_problem(target)


def device_kind(target: Target) -> str:
    return "GPU" if target.kind == "cuda" else "CPU"


def check_local_host(target: Target, workers: str) -> None:
    """A local pool times only what this host runs: another CPU model's code or a GPU it lacks is refused up front,
    before a job is made (a Ray cluster may have such a host, and there the job waits for it)."""
    if workers == "local" and (problem := host_problem(target)):
        fail(f"{problem}; a {target.kind} target is measured on its own kind of {device_kind(target)}: "
             f"run this on such a host, or with --workers pointing at a Ray cluster that has one")


def check_timed_here(target: Target) -> None:
    """A benchmark times the target's code on this host, beside references timed here: a figure for another CPU
    model (or more threads than cores) would be this host's, under the other's name."""
    if problem := host_problem(target):
        fail(f"{problem}; a benchmark times the target's code on this host: run it on a host with that "
             f"{device_kind(target)}")


def parse_workload(op: str, params: List[str]) -> Workload:
    """`matmul`, `["M=64", "N=64", "K=64"]` → Workload; errors become a usage message, a parameter given twice
    (which would silently take its last value) one line."""
    names = [pair.strip().partition("=")[0].strip() for pair in params]
    for name in dict.fromkeys(name for name in names if names.count(name) > 1):
        given = ", ".join(pair.strip() for pair, named in zip(params, names) if named == name)
        fail(f"parameter {name} is given twice ({given}); give it once", 2)
    try:
        return Workload.make(op, **parse_params(params))
    except WorkloadError as error:
        raise typer.BadParameter(str(error)) from None


def parse_target(text: str) -> Target:
    """A target; one that names this host's GPU where there is none, or a CPU or feature LLVM does not know, ends the
    command with one line."""
    try:
        return Target.parse(text, check_names=True)
    except (NoDevice, UnknownName) as error:
        fail(str(error))
    except TargetError as error:
        raise typer.BadParameter(str(error)) from None
