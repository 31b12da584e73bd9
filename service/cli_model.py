"""`tensortune tune-model` and `tensortune bench model`: whole PyTorch models (the `[torch]` extra)."""
from __future__ import annotations

from typing import List, Optional

import typer
from rich.live import Live
from rich.table import Table

from search_space import DTYPES, Workload

from .cli_args import (DB_OPTION, TARGET_OPTION, WORKERS_HELP, check_local_host, check_timed_here, check_workers,
                       console, fail, open_database, parse_target, writing_to)

MODEL_HELP = ("a preset (bert-layer, bert-base, resnet18, hf-bert-base, hf-gpt2) or path/to/file.py:function returning "
              "(model, example_inputs)")
SEQ_LENS_OPTION = typer.Option(None, "--seq-lens", metavar="L,L,...",
                               help="sequence lengths to make the model at (the function is called with seq_len=L)")
DTYPE_OPTION = typer.Option("float32", "--dtype", help="float32; bfloat16: the model and its floating-point inputs "
                                                       "cast to it, as model.to(torch.bfloat16) does; int8: its "
                                                       "Linears quantized by torch.ao's quantize_dynamic")
CHANNELS_LAST_OPTION = typer.Option(False, "--channels-last", help="the model and its 4-D inputs in PyTorch's "
                                    "channels_last memory format, as advised for a convolutional network on CPUs "
                                    "(eager and Inductor then run it so too)")
ROUNDS_OPTION = typer.Option(25, "--rounds", min=1, help="alternating rounds each way is timed in (bench.model.ROUNDS): "
                             "its median over them the figure, the median of the rounds' ratios its speedup (more "
                             "where neighbours slow a host in phases)")
TRAINING_OPTION = typer.Option(False, "--training", help="a training step (forward with grad enabled, then backward) "
                                                         "instead of inference: float32")


def require_torch() -> None:
    """End the command with how to get PyTorch when it is not installed."""
    try:
        import torch  # noqa: F401
    except ImportError:
        console.print('[red]this command needs PyTorch:[/red] pip install -e ".[torch]"', highlight=False)
        raise typer.Exit(1)


def parse_seq_lens(text: str | None) -> list[int]:
    """`--seq-lens 128,32,77` → [32, 77, 128] (a set: each once, in order); [] when not given; a bad list ends the
    command."""
    if text is None:
        return []
    words = [word.strip() for word in text.split(",")]
    if not all(word.isdigit() and int(word) > 0 for word in words):
        fail(f"--seq-lens {text}: give positive whole numbers separated by commas, e.g. --seq-lens 32,128", 2)
    return sorted({int(word) for word in words})


def check_dtype(dtype: str, training: bool = False) -> None:
    if dtype not in DTYPES:  # a model runs in each dtype its ops are tuned in (DTYPE_OPTION says how)
        fail(f"--dtype {dtype}: unknown dtype for a model; known: {', '.join(DTYPES)}", 2)
    if training and dtype != "float32":
        fail(f"--training runs in float32; --dtype {dtype} is for inference", 2)


def load(spec: str, seq_lens: list[int], channels_last: bool = False):
    """The model and its example inputs by sequence length (frontend.presets.load_model_at), channels last if
    asked, or one line saying why not."""
    from frontend.presets import ModelError, in_channels_last, load_model_at

    try:
        loaded = load_model_at(spec, seq_lens)
    except ModelError as error:
        fail(str(error), 2)
    return in_channels_last(*loaded) if channels_last else loaded


def progress_table(progress) -> Table:
    """Each task's trials and best, and the model's estimated latency: what `tune-model` shows live."""
    latency = f"{progress.latency * 1e3:.2f} ms" if progress.latency != float("inf") else "-"
    table = Table(title=f"{progress.trials}/{progress.budget} trials; estimated model latency {latency}",
                  title_justify="left")
    for column in ("weight", "workload", "trials", "best GFLOPS"):
        table.add_column(column)
    for task in progress.tasks:
        table.add_row(str(task.weight), Workload.from_key(task.workload).label, str(task.trials),
                      f"{task.best_gflops:.1f}" if task.best_gflops else "-")
    return table


def tune_model(model: str = typer.Argument(..., help=MODEL_HELP),
               trials: int = typer.Option(300, "--trials", min=1, max=100_000, help="measured in all, over every task"),
               seq_lens: Optional[str] = SEQ_LENS_OPTION,
               dtype: str = DTYPE_OPTION,
               channels_last: bool = CHANNELS_LAST_OPTION,
               training: bool = TRAINING_OPTION,
               target: str = TARGET_OPTION,
               tuner: str = typer.Option("xgb", "--tuner", help="xgb, random, grid or ga"),
               db: Optional[str] = DB_OPTION,
               workers: str = typer.Option("local", "--workers", help=WORKERS_HELP),
               rounds: int = ROUNDS_OPTION,
               again: bool = typer.Option(False, "--again", help="tune anew though the same job already ran to its end")):
    """Tune every task of a model (at every sequence length of --seq-lens; with --training, those of a training
    step, its gradients' products too) under one budget (rerun to resume; a finished job is shown, not run again),
    then time it: eager PyTorch beside tensortune, in the same run (--rounds as for bench model)."""
    require_torch()
    check_workers(workers)
    check_dtype(dtype, training)
    lengths = parse_seq_lens(seq_lens)
    from bench.model import measure_at_lengths
    from frontend import NothingToTune
    from frontend.presets import in_dtype
    from frontend.tasks import extract_tasks_at
    from tuner.scheduler import tune_tasks
    from tuner.tune import JobFailed, time_split

    from .host_waits import WaitingForHosts, waiting_line
    from .measurers import make_measurer

    target_, database = parse_target(target), open_database(db)  # a bad --db fails before seconds of tracing
    check_local_host(target_, workers)
    net, inputs_at = in_dtype(*load(model, lengths, channels_last), dtype)
    try:
        tasks = extract_tasks_at(net, inputs_at.values(), training)
    except NothingToTune as error:
        fail(str(error))
    # other lengths, another dtype: another job
    name = model + (f" --seq-lens {','.join(map(str, lengths))}" if lengths else "") + \
        (f" --dtype {dtype}" if dtype != "float32" else "") + (" --channels-last" if channels_last else "") + \
        (" --training" if training else "")
    done = None if again else database.done_model_job(name, [task.workload for task in tasks], target_, tuner, trials)
    if done:
        console.print(f"model job {done.id} already tuned this ({tuner}, {trials} trials, done "
                      f"{done.finished_at:%Y-%m-%d %H:%M}); --again spends another budget, from the stored records",
                      highlight=False)
    else:
        measurer = WaitingForHosts(make_measurer(workers), lambda error: console.print(waiting_line(error), markup=False))
        try:
            with writing_to(database), Live(console=console, transient=False) as live:
                result = tune_tasks(tasks, target_, trials, database, tuner, measurer, name=name,
                                    on_progress=lambda progress: live.update(progress_table(progress)))
        except KeyboardInterrupt:
            console.print("interrupted: run the same command again to resume")
            raise typer.Exit(130)
        except JobFailed as error:
            fail(str(error))
        finally:
            measurer.close()
        print(f"model job {result.job_id}: {result.trials} trials over {len(tasks)} tasks of {name} on {target_}")
        print(f"time: {time_split(result.seconds)}")
    for row in measure_at_lengths(model, net, inputs_at, database.url, str(target_), rounds,
                                  inductor=False, training=training):
        at = f"seq_len {row['seq_len']}: " if row["seq_len"] else ""
        at += "training step: " if training else ""
        low, high = row["tensortune_speedup_spread"]
        print(f"{at}eager PyTorch {row['eager_ms']:.2f} ms, tensortune {row['tensortune_ms']:.2f} ms, measured "
              f"together in this run: {row['tensortune_speedup']:.2f}x, the median of the rounds' ratios ({rounds} "
              f"rounds, their middle half {low:.2f}-{high:.2f}); max difference {row['max_error']:.1e}")


def bench_model(models: List[str] = typer.Argument(..., help=MODEL_HELP),
                seq_lens: Optional[str] = SEQ_LENS_OPTION,
                dtype: str = DTYPE_OPTION,
                channels_last: bool = CHANNELS_LAST_OPTION,
                training: bool = TRAINING_OPTION,
                db: Optional[str] = DB_OPTION,
                target: str = TARGET_OPTION,
                json_lines: bool = typer.Option(False, "--json", help="one JSON object per model and length"),
                inductor: bool = typer.Option(True, "--inductor/--no-inductor",
                                              help="also time torch.compile's Inductor (--no-inductor: neither mode)"),
                max_autotune: bool = typer.Option(True, "--max-autotune/--no-max-autotune",
                                                  help="also Inductor max-autotune with freezing (minutes to compile)"),
                profile: bool = typer.Option(False, "--profile", help="each tuned op's time beside PyTorch's for it "
                                             "(and oneDNN's packed op for dense and conv2d, MKL's packed GEMM for a "
                                             "float32 dense), the largest loss first, and the time outside the tuned "
                                             "ops"),
                rounds: int = ROUNDS_OPTION):
    """Eager PyTorch, Inductor (default, and max-autotune with freezing) and tensortune on whole models, alternating
    in one run, with the max error; at each of --seq-lens, each way compiled once and called at every length. With
    --dtype bfloat16, every way runs the model cast to bfloat16, and the errors of eager's and tensortune's results
    from the float32 model's are shown too. With --training, each way times a training step (max-autotune left out:
    its freezing is for inference)."""
    require_torch()
    check_dtype(dtype, training)
    if training and profile:
        fail("--profile times inference; leave it out with --training", 2)
    lengths = parse_seq_lens(seq_lens)
    from bench.model import run

    check_timed_here(parse_target(target))
    open_database(db).close()  # a bad --db, like a bad spec, is refused before anything is timed
    suffix = " --channels-last" if channels_last else ""
    loaded = {spec + suffix: load(spec, lengths, channels_last) for spec in models}
    run(loaded, db, target, json_lines, inductor, max_autotune, profile, dtype, training, rounds)


def bench_scheduler(model: str = typer.Argument("bert-layer", help=MODEL_HELP),
                    checkpoints: List[int] = typer.Option([100, 300], "--at", min=1,
                                                          help="trials at which to compare (repeat the option)"),
                    tuner: str = typer.Option("xgb", "--tuner", help="xgb, random, grid or ga"),
                    json_lines: bool = typer.Option(False, "--json", help="one JSON object per row"),
                    rounds: int = ROUNDS_OPTION):
    """The task scheduler's gradient against round-robin, each tuning the model from scratch: estimated and
    measured model latency at each checkpoint (minutes: it tunes twice)."""
    require_torch()
    from bench.scheduler import run

    net, inputs_at = load(model, [])
    run(model, net, inputs_at[None], tuple(sorted(checkpoints)), json_lines, tuner, rounds)


def register(app: typer.Typer, bench_app: typer.Typer) -> None:
    """Add `tune-model` to the CLI app, and `model` and `scheduler` to its bench commands."""
    app.command("tune-model")(tune_model)
    bench_app.command("model")(bench_model)
    bench_app.command("scheduler")(bench_scheduler)
