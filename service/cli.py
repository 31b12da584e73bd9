"""The `tensortune` command line (docs/architecture.md and the README list its commands)."""
from __future__ import annotations

import sys
from typing import List, Optional

import typer

from search_space import DTYPES, InvalidConfig, NoTemplate

from .cli_args import OP_ARGUMENT, TARGET_OPTION, check_timed_here, console, fail, parse_target, parse_workload

app = typer.Typer(help="tensortune: autotuning of tensor kernels", no_args_is_help=True, add_completion=False,
                  rich_markup_mode=None)
bench_app = typer.Typer(help="Benchmarks that print ratios against references measured in the same run",
                        no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"tensortune {version('tensortune')}")
        raise typer.Exit()


@app.callback()
def _options(_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                           help="print the version and exit")):
    """tensortune: autotuning of tensor kernels"""


@app.command()
def show(op: str = OP_ARGUMENT,
         params: List[str] = typer.Argument(..., help="NAME=VALUE parameters, e.g. M=64 N=64 K=64"),
         config: Optional[int] = typer.Option(None, "--config", help="config index (default: the one an untuned op "
                                                                "runs: the fallback, in the family fastest here)"),
         target: str = TARGET_OPTION,
         space_only: bool = typer.Option(False, "--space", help="print the knobs of the space instead"),
         source: bool = typer.Option(False, "--source", help="print the generated code alone: LLVM IR for llvm, "
                                                             "CUDA C for cuda"),
         asm: bool = typer.Option(False, "--asm", help="print the machine code (llvm): for any CPU and features LLVM "
                                                       "knows, this host's or not")):
    """Print the lowered loop nest of one config of a workload's space (or its generated code)."""
    from search_space import format_program, get_space, lower
    from workers.untuned import untuned_config

    workload, target_ = parse_workload(op, params), parse_target(target)
    try:
        space = get_space(workload, target_)
        if space_only:
            print(space)
            for knob in space.knobs.values():
                print(f"  {knob.name:12} {knob.kind:8} {len(knob.candidates):4} choices: {list(knob.candidates)[:8]}")
            return
        chosen = space.get(config) if config is not None else untuned_config(workload, target_)
        program = lower(workload, target_, chosen)
    except (InvalidConfig, NoTemplate) as error:
        console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(2)
    if source or asm:
        from workers.build import generated_assembly, generated_code

        if asm and target_.kind != "llvm":
            fail(f"--asm prints CPU machine code; for {target_.kind} print --source", 2)
        print((generated_assembly if asm else generated_code)(program, target_), end="")
        return
    print(f"# config {chosen.index} of {space.size}: {chosen}")
    print(format_program(program))


@bench_app.command("kernels")
def bench_kernels(quick: bool = typer.Option(False, "--quick", help="fewer candidates per shape"),
                  json_lines: bool = typer.Option(False, "--json", help="one JSON object per line"),
                  trials: Optional[int] = typer.Option(None, "--trials", help="candidates measured per shape"),
                  only: Optional[str] = typer.Option(None, "--only", help="run the shapes whose key contains this"),
                  seed: int = typer.Option(0, "--seed"),
                  target: str = typer.Option("llvm", "--target", help="llvm (e.g. narrowed: 'llvm -mattr=-amx-tile'), "
                                                                      "or cuda: this GPU against cuBLAS"),
                  dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or int8: beside PyTorch in it "
                                                                       "(CPU only)")):
    """Best config found per shape beside NumPy, PyTorch and the peak FMA rate, at 1 thread and all cores
    (with --target cuda: beside cuBLAS on this GPU)."""
    if dtype not in DTYPES:
        fail(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}", 2)
    if target.split()[0] == "cuda":
        if dtype != "float32":
            fail(f"the GPU templates compute in float32 only, not {dtype}", 2)
        from bench.kernels_cuda import run as run_cuda

        check_timed_here(parse_target(target))  # one line, not a traceback, on a host without a GPU
        run_cuda(quick=quick, json_lines=json_lines, trials=trials, only=only, seed=seed, target=target)
        return
    from bench.kernels import run

    check_timed_here(parse_target(target))
    run(quick=quick, json_lines=json_lines, trials=trials, only=only, seed=seed, dtype=dtype, target=target)


@bench_app.command("workers")
def bench_workers(json_lines: bool = typer.Option(False, "--json", help="one JSON object per line")):
    """Candidates per second and where their time goes, on the local and the Ray pool."""
    from bench.workers import run

    run(json_lines=json_lines)


@bench_app.command("tuner")
def bench_tuner(json_lines: bool = typer.Option(False, "--json", help="one JSON object per line"),
                seeds: int = typer.Option(9, "--seeds", min=5),
                trials: int = typer.Option(160, "--trials", min=8),
                live: bool = typer.Option(False, "--live", help="also xgb vs random live on dense 128x3072x768")):
    """Tuners compared on recorded measurements over several seeds; writes tuners_*.png."""
    from bench import tuner

    tuner.run(json_lines=json_lines, seeds=seeds, trials=trials)
    if live:
        tuner.live()


@bench_app.command("transfer")
def bench_transfer(trials: int = typer.Option(64, "--trials", min=8, help="measured per history shape")):
    """xgb on a dense shape with and without a model of two other dense shapes (measured now)."""
    from bench.transfer import run

    run(trials=trials)


# Commands of other modules; imported here, after `app` and the helpers they use exist.
from .cli_model import register as _register_model  # noqa: E402
from .cli_predict import register as _register_predict  # noqa: E402
from .cli_records import register as _register_records  # noqa: E402
from .cli_serve import register as _register_serve  # noqa: E402
from .cli_server import register as _register_server  # noqa: E402
from .cli_tune import register as _register_tune  # noqa: E402

_register_records(app)
_register_tune(app)
_register_serve(app)
_register_server(app)
_register_model(app, bench_app)
_register_predict(app, bench_app)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
