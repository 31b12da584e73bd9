"""`tensortune submit`, `jobs`, `cancel`: the CLI as a client of a running `tensortune serve`."""
from __future__ import annotations

import os
from typing import List, Optional

import typer
from rich.console import Console
from rich import box
from rich.table import Column, Table

from .cli_args import OP_ARGUMENT, TARGET_OPTION, fail, parse_workload

DEFAULT_SERVER = "http://127.0.0.1:8000"
ServerOption = typer.Option(None, "--server", help=f"URL of tensortune serve (default: TENSORTUNE_SERVER or {DEFAULT_SERVER})")


def request(server: Optional[str], method: str, path: str, **kwargs) -> dict | list:
    """One API call; HTTP errors and unreachable servers end the command with one line: the server's reason."""
    import httpx

    base = server or os.environ.get("TENSORTUNE_SERVER") or DEFAULT_SERVER
    token = os.environ.get("TENSORTUNE_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, base.rstrip("/") + path, headers=headers, timeout=30, **kwargs)
    except httpx.HTTPError as error:
        fail(f"cannot reach {base}: {error}")
    if response.is_error:
        detail = response.json().get("detail", response.text) if "json" in response.headers.get("content-type", "") else response.text
        fail(str(detail))
    return response.json()


def submit(op: Optional[str] = typer.Argument(None, help=f"{OP_ARGUMENT.help} (or --model)"),
           params: Optional[List[str]] = typer.Argument(None, help="NAME=VALUE parameters"),
           model: Optional[str] = typer.Option(None, "--model", help="a model preset to tune as a whole: "
                                                                      "bert-layer, bert-base, resnet18, hf-bert-base or hf-gpt2"),
           target: str = TARGET_OPTION,
           trials: int = typer.Option(64, "--trials", min=1, max=100_000, help="the budget; a model's, over its tasks"),
           tuner: str = typer.Option("xgb", "--tuner", help="xgb, random, grid or ga"),
           server: Optional[str] = ServerOption):
    """Queue a tuning job of a workload, or of a whole model, on the server; prints its id."""
    if (op is None) == (model is None):
        raise typer.BadParameter("give OP with its parameters, or --model NAME: exactly one of the two",
                                 param_hint="OP / --model")
    if model is None:
        workload = parse_workload(op, params or [])
        tuned = {"workload": {"op": workload.op, "params": workload.p}}
    else:
        tuned = {"model": {"name": model}}
    job = request(server, "POST", "/api/jobs", json=tuned | {"target": target, "trials": trials, "tuner": tuner})
    print(job["id"])


def jobs(server: Optional[str] = ServerOption, limit: int = typer.Option(50, "--limit", min=1, max=1000)):
    """The server's newest jobs with their progress (a model job's over all its tasks); a failed job's reason, and
    what a waiting job waits for, follow the table, whole. The workload wraps at its spaces above the target, so
    that at 80 columns it takes a few lines of whole parameters."""
    unbroken = [Column(name, no_wrap=True) for name in ("tuner", "status", "trials", "GFLOPS")]
    table = Table("id", "workload or model\non target", *unbroken, box=box.SIMPLE_HEAD, leading=1)
    notes = []
    for job in request(server, "GET", "/api/jobs", params={"limit": limit}):
        best = f"{job['best_gflops']:.1f}" if job["best_gflops"] else "-"
        what = f"model {job['model']}" if job["model"] else job["workload_label"]
        table.add_row(str(job["id"]), f"{what}\non {job['target_label']}", job["tuner"], job["status"],
                      f"{job['trials_done']}/{job['trials']}", best)
        if job["error"] or job.get("waiting"):  # a server older than `waiting` leaves it out
            notes.append(f"job {job['id']} {job['status']}: {job['error'] or 'waiting for ' + job['waiting']}")
    out = Console(soft_wrap=False)
    out.print(table)
    for line in notes:
        out.print(line, markup=False, highlight=False)


def cancel(job_id: int = typer.Argument(..., help="job id"), server: Optional[str] = ServerOption):
    """Cancel a queued or running job (a running one stops after its batch in flight)."""
    job = request(server, "POST", f"/api/jobs/{job_id}/cancel")
    print(f"job {job['id']}: {job['status']}")


def register(app: typer.Typer) -> None:
    """Add `submit`, `jobs` and `cancel` to the CLI app."""
    app.command()(submit)
    app.command()(jobs)
    app.command()(cancel)
