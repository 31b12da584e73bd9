"""`tensortune tune`: tune a workload on the embedded default (SQLite file, local pool) or a cluster,
with a live progress bar, ending with the best config beside NumPy measured in the same run."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column

from search_space import get_space

from .cli_args import (DB_OPTION, OP_ARGUMENT, TARGET_OPTION, WORKERS_HELP, check_local_host, check_workers, console, fail,
                       open_database, parse_target, parse_workload, writing_file, writing_to)
from .cli_records import stored_best
from .measurers import make_measurer


def compare_with_reference(workload, target, config) -> tuple[float, str, float]:
    """(the config's GFLOPS, the reference's name, its GFLOPS), timed head to head now, in this process,
    alternately: NumPy's in float32, PyTorch's in bfloat16 (workers/reference.py); on a GPU, cuBLAS's, both
    timed by events on inputs already there, as tuning timed them."""
    from workers import build
    from workers.reference import head_to_head, inference_call, reference_calls, reference_name

    inputs = workload.random_inputs()
    kernel = build(workload, target, config)
    if target.kind == "cuda":
        from workers.cuda_measure import CudaTimedCall, cublas_call, cuda_head_to_head

        calls = {"tensortune": CudaTimedCall(kernel, inputs), "cuBLAS": cublas_call(workload, inputs)}
        seconds = cuda_head_to_head(calls, rounds=3, min_repeat_ms=20.0)
        name, reference = "cuBLAS", seconds["cuBLAS"]
    else:
        ours, _ = inference_call(kernel, inputs)
        library, theirs = next(iter(reference_calls(workload, target.threads, inputs, pytorch=False).items()))
        seconds = head_to_head({"tensortune": ours, library: theirs}, target.threads, rounds=3)
        name, reference = reference_name(library, workload), seconds[library]
    return workload.flops / seconds["tensortune"] / 1e9, name, workload.flops / reference / 1e9


def progress_columns() -> tuple:
    """Trials done/total, best GFLOPS and the clock first, so that at 80 columns only the outcome counts,
    printed last, are cut."""
    return (BarColumn(bar_width=16), MofNCompleteColumn(), TextColumn("best {task.fields[best]:6.1f} GFLOPS"),
            TimeElapsedColumn(), TextColumn("{task.fields[status]}", table_column=Column(no_wrap=True, overflow="ellipsis")))


def tune(op: str = OP_ARGUMENT,
         params: List[str] = typer.Argument(..., help="NAME=VALUE parameters"),
         target: str = TARGET_OPTION,
         trials: int = typer.Option(64, "--trials", min=1, max=100_000, help="configs to measure in this job"),
         tuner: str = typer.Option("xgb", "--tuner", help="xgb, random, grid or ga"),
         db: Optional[str] = DB_OPTION,
         workers: str = typer.Option("local", "--workers", help=WORKERS_HELP),
         early_stopping: Optional[int] = typer.Option(
             None, "--early-stopping", min=1, help="end the job after this many trials without a better config"),
         again: bool = typer.Option(False, "--again", help="tune anew though the same job already ran to its end"),
         remeasure: bool = typer.Option(
             False, "--remeasure", help="measure configs the database already holds for this workload again"),
         seed: int = typer.Option(0, "--seed", help="the tuner's random seed")):
    """Tune a workload; every measurement goes to the database; rerun the same command to resume.

    A new job starts from what the database knows of the workload on this target: it measures none of its
    stored configs again, and its cost model starts trained on them."""
    from db.queue import JobBusy
    from search_space import NoTemplate, get_space
    from tuner import TUNERS
    from tuner.tune import JobFailed, TuneResult, time_split
    from tuner.tune import tune as run_tune
    from workers.pool import NoWorkerHost

    from .host_waits import WaitingForHosts, waiting_line

    workload, target_ = parse_workload(op, params), parse_target(target)
    if tuner not in TUNERS:
        raise typer.BadParameter(f"unknown tuner {tuner!r}; tuners: {', '.join(TUNERS)}")
    check_workers(workers)
    try:
        get_space(workload, target_)
    except NoTemplate as error:
        fail(str(error), 2)
    check_local_host(target_, workers)
    database = open_database(db)
    done = None if again else database.done_job(workload, target_, tuner, trials)
    if done:
        console.print(f"job {done.id} already tuned this ({tuner}, {trials} trials, done "
                      f"{done.finished_at:%Y-%m-%d %H:%M}); --again tunes anew, from the stored records")
        print_stored_best(database, workload, target_)
        return
    counts: Counter = Counter()
    progress = Progress(*progress_columns(), console=console)  # shown once the job is ours (on_start)
    bar = progress.add_task("", total=trials, best=0.0, status="")

    def on_start(job: TuneResult) -> None:
        if job.resumed:
            console.print(f"resuming job {job.job_id}: {job.resumed} of {trials} trials already measured")
        console.print(f"tuning {workload.key} on {target_}", highlight=False)
        progress.update(bar, completed=job.resumed, best=job.best[1].gflops if job.best else 0.0)
        progress.start()

    def on_result(_, result):
        counts[result.outcome.value] += 1
        best = max(progress.tasks[0].fields["best"], result.gflops)
        outcomes = " ".join(f"{name}:{n}" for name, n in sorted(counts.items()))
        progress.update(bar, advance=1, best=best, status=outcomes)

    def on_wait(message: str) -> None:
        progress.console.print(f"[yellow]{escape(message)}[/yellow]", highlight=False)
        progress.update(bar, status="[yellow]waiting for the database[/yellow]")

    def on_host_wait(error: NoWorkerHost) -> None:
        progress.console.print(f"[yellow]{escape(waiting_line(error))}[/yellow]", highlight=False)
        progress.update(bar, status=f"[yellow]waiting for {escape(error.awaited)}[/yellow]")

    measurer = WaitingForHosts(make_measurer(workers), on_host_wait)
    try:
        with writing_to(database):
            result = run_tune(workload, target_, trials, tuner, database, measurer, early_stopping=early_stopping,
                              seed=seed, known=not remeasure, on_result=on_result, on_wait=on_wait, on_start=on_start)
    except KeyboardInterrupt:
        progress.live.transient = True  # the one line below, which says how far the job got, takes the bar's place
        progress.live.stop()
        console.print(f"interrupted at {progress.tasks[0].completed:.0f} of {trials} trials: run the same command "
                      "again to resume", highlight=False)
        raise typer.Exit(130)
    except (JobBusy, JobFailed) as error:
        progress.live.stop()
        fail(str(error))
    finally:
        progress.live.stop()  # not Progress.stop, which adds a blank line where stderr is no terminal
        measurer.close()
    known = f"; started from {result.known} stored measurements, none remeasured" if result.known else ""
    print(f"job {result.job_id}: {len(result.measured)} trials ({result.resumed} resumed{known})")
    print(f"time: {time_split(result.seconds)}")
    if result.best is None:
        print(f"this job measured no config ok (outcomes: {dict(counts)})")
    else:
        best_input, best_result = result.best
        print(f"this job's best: config {best_input.config.index}, {best_result.gflops:.1f} GFLOPS")
    if not print_stored_best(database, workload, target_):
        raise typer.Exit(1)
    print(f"records in {database}")


def print_stored_best(database, workload, target) -> bool:
    """The stored best (what `best` and apply_history_best use) and, timed now against the reference (NumPy's in
    float32, cuBLAS's on a GPU), what it gives; False when no config of the workload was ever measured ok."""
    from workers import openblas

    info = stored_best(database, workload, target)
    if info is None:
        console.print(f"[red]no config of {workload.key} on {target} measured ok[/red]", highlight=False)
        return False
    config = get_space(workload, target).get(info["config"]["index"])
    ours, reference, theirs = compare_with_reference(workload, target, config)
    job = f"job {info['job_id']}" if info["job_id"] is not None else "imported"
    print(f"stored best for this machine (what `best` and apply_history_best use): config {config.index}, {job}")
    print(f"  {info['gflops']:.1f} GFLOPS as measured while tuning (each call finding its weights in memory and its "
          "inputs just written, as a layer of a model does; the best of many noisy measurements)")
    caches = "its L2 flushed before each call" if target.kind == "cuda" else "warm caches"
    print(f"  {ours:.1f} GFLOPS timed now with {caches}, alternately with {reference}'s {theirs:.1f} GFLOPS "
          f"({ours / theirs:.2f}x)")
    if reference == "NumPy" and (note := openblas.forced_note()) is not None:
        print(f"  ({note})")
    if ours < 0.9 * info["gflops"]:
        print("  (the gap: tuning timed the bare kernel, picking its luckiest run; now each call also pays "
              "Python's few microseconds, and a noisy machine shows more)")
    print(f"  {config}")
    return True


def plot(job: int = typer.Argument(..., help="job id"),
         db: Optional[str] = DB_OPTION,
         out: Optional[str] = typer.Option(None, "--out", help="PNG file to write (default: job-ID.png here)")):
    """Draw a job's tuning curve: every candidate's GFLOPS, failures marked, and the best so far."""
    from tuner.plot import plot_job
    from workers import best_curve

    database = open_database(db)
    try:
        info = database.job(job)
    except KeyError:
        fail(f"no job {job} in {database}")
    records = database.job_records(job)
    if not records:
        fail(f"job {job} has no measurements yet")
    out = out or f"job-{job}.png"
    with writing_file(out):
        measured = [(r.input, r.result) for r in records]
        path = plot_job([r.gflops for _, r in measured], [not r.ok for _, r in measured],
                        best_curve(measured), f"job {job}: {info.workload.key} ({info.tuner})", out)
    print(Path(path).resolve())


def register(app: typer.Typer) -> None:
    """Add `tune` and `plot` to the CLI app (service/cli.py calls this once, at its end)."""
    app.command()(tune)
    app.command()(plot)
