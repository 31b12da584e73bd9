"""`tensortune tune`: tune a workload on the embedded default (SQLite file, local pool) or a cluster,
with a live progress bar, ending with the best config beside NumPy measured in the same run."""
from __future__ import annotations

from collections import Counter
from typing import List, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .cli_args import OP_ARGUMENT, console, parse_target, parse_workload
from .runner import make_measurer


def compare_with_numpy(workload, target, config) -> tuple[float, float]:
    """(best config's GFLOPS, NumPy's GFLOPS), timed head to head now, on this machine."""
    from workers import build
    from workers.reference import head_to_head, inference_call, reference_calls

    inputs = workload.random_inputs()
    ours, _ = inference_call(build(workload, target, config), inputs)
    calls = {"tensortune": ours, "numpy": reference_calls(workload, target.threads, inputs)["numpy"]}
    seconds = head_to_head(calls, target.threads, rounds=3)
    return workload.flops / seconds["tensortune"] / 1e9, workload.flops / seconds["numpy"] / 1e9


def tune(op: str = OP_ARGUMENT,
         params: List[str] = typer.Argument(..., help="NAME=VALUE parameters"),
         target: str = typer.Option("llvm", "--target"),
         trials: int = typer.Option(64, "--trials", min=1, max=100_000),
         tuner: str = typer.Option("xgb", "--tuner", help="xgb, random, grid or ga"),
         db: Optional[str] = typer.Option(None, "--db", help="SQLAlchemy URL (default: TENSORTUNE_DB or ./tensortune.db)"),
         workers: str = typer.Option("local", "--workers", help="local, ray, or a Ray cluster address"),
         early_stopping: Optional[int] = typer.Option(None, "--early-stopping", min=1),
         seed: int = typer.Option(0, "--seed")):
    """Tune a workload; every measurement goes to the database; rerun the same command to resume."""
    from db import Database
    from db.queue import JobBusy
    from search_space import NoTemplate, get_space
    from tuner import TUNERS
    from tuner.tune import JobFailed
    from tuner.tune import tune as run_tune

    workload, target_ = parse_workload(op, params), parse_target(target)
    if tuner not in TUNERS:
        raise typer.BadParameter(f"unknown tuner {tuner!r}; tuners: {', '.join(TUNERS)}")
    try:
        get_space(workload, target_)
    except NoTemplate as error:
        console.print(f"[red]error:[/red] {error}", highlight=False)
        raise typer.Exit(2)
    database = Database(db)
    job = database.unfinished_job(workload, target_, tuner, trials)
    resumed = len(database.job_records(job.id)) if job else 0
    if job:
        console.print(f"resuming job {job.id}: {resumed} of {trials} trials already measured")
    counts: Counter = Counter()
    best = [0.0]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[status]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task(workload.key, total=trials, completed=resumed, status="")

        def on_result(_, result):
            counts[result.outcome.value] += 1
            best[0] = max(best[0], result.gflops)
            outcomes = " ".join(f"{name}:{n}" for name, n in sorted(counts.items()))
            progress.update(bar, advance=1, status=f"now {result.gflops:6.1f}  best {best[0]:6.1f} GFLOPS  {outcomes}")

        def on_wait(message: str) -> None:
            progress.console.print(f"[yellow]{message}[/yellow]", highlight=False)
            progress.update(bar, status="[yellow]waiting for the database[/yellow]")

        measurer = make_measurer(workers)
        try:
            result = run_tune(workload, target_, trials, tuner, database, measurer,
                              early_stopping=early_stopping, seed=seed, on_result=on_result, on_wait=on_wait)
        except KeyboardInterrupt:
            console.print("interrupted: run the same command again to resume")
            raise typer.Exit(130)
        except (JobBusy, JobFailed) as error:
            console.print(f"[red]{error}[/red]", highlight=False)
            raise typer.Exit(1)
        finally:
            measurer.close()
    if result.best is None:
        console.print(f"[red]no config of {workload.key} measured ok[/red] (outcomes: {dict(counts)})")
        raise typer.Exit(1)
    best_input, best_result = result.best
    ours, numpy_gflops = compare_with_numpy(workload, target_, best_input.config)
    print(f"job {result.job_id}: {len(result.measured)} trials ({result.resumed} resumed) of {workload.key} on {target_}")
    print(f"best config {best_input.config.index}: {best_input.config}")
    print(f"best: {best_result.gflops:.1f} GFLOPS when tuned; now {ours:.1f} GFLOPS vs NumPy {numpy_gflops:.1f} "
          f"GFLOPS ({ours / numpy_gflops:.2f}x), measured together in this run")
    print(f"records in {database}")

def plot(job: int = typer.Argument(..., help="job id"),
         db: Optional[str] = typer.Option(None, "--db"),
         out: Optional[str] = typer.Option(None, "--out", help="PNG file (default: job-ID.png)")):
    """Draw a job's tuning curve: every candidate's GFLOPS, failures marked, and the best so far."""
    from db import Database
    from tuner.plot import plot_job

    database = Database(db)
    try:
        info = database.job(job)
    except KeyError:
        console.print(f"[red]no job {job}[/red] in {database}")
        raise typer.Exit(1)
    records = database.job_records(job)
    if not records:
        console.print(f"[red]job {job} has no measurements yet[/red]")
        raise typer.Exit(1)
    path = plot_job([r.result.gflops for r in records], [not r.result.ok for r in records],
                    f"job {job}: {info.workload.key} ({info.tuner})", out or f"job-{job}.png")
    print(path)


def register(app: typer.Typer) -> None:
    """Add `tune` and `plot` to the CLI app (service/cli.py calls this once, at its end)."""
    app.command()(tune)
    app.command()(plot)
