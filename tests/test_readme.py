"""README.md's examples, run: its main job (with a budget of 4 trials, the one change), then in the main
job's directory its Python examples and its quick commands exactly as written (the commands by the installed
`tensortune` for the main job, in this process for the rest); the long commands (200-trial
tunes, benchmarks, the service) are checked by the command line's own parser, workloads included."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import typer

from service.cli import app
from service.cli_args import parse_workload
from tests.test_cli_model import run as in_process

README = (Path(__file__).parents[1] / "README.md").read_text()
QUICK = {"best", "show", "plot", "export", "import"}  # seconds each: run as written
CLI = [str(Path(sys.executable).parent / "tensortune")]  # the installed command, as the README runs it


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def commands() -> list[list[str]]:
    """Every `tensortune ...` line of the bash examples, as argv words, comments dropped."""
    lines = [line for block in blocks("bash") for line in block.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith("tensortune ")]


def run(argv: list[str], folder: Path, timeout: float) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> Path:
    """The README's first command's job, in a directory of its own (the default database file lands there)."""
    setup = blocks("bash")[0].splitlines()[0].split(" && ")
    assert setup[-1].startswith("tensortune tune "), setup
    argv = shlex.split(setup[-1])
    argv[argv.index("--trials") + 1] = "4"
    folder = tmp_path_factory.mktemp("readme")
    tuned = run(CLI + argv[1:], folder, timeout=300)
    assert "stored best for this machine" in tuned.stdout and (folder / "tensortune.db").is_file()
    return folder


def test_the_python_example_builds_what_the_main_job_tuned_without_a_fallback_warning(main_job):
    example = blocks("python")[0]
    watched = ("import warnings\nwarnings.simplefilter('error')\n"  # a fallback-config warning fails the run
               + example)
    run([sys.executable, "-c", watched], main_job, timeout=300)


def test_the_quick_commands_run_as_written(main_job):
    quick = [argv for argv in commands() if argv[1] in QUICK]
    assert {argv[1] for argv in quick} == QUICK, "the README lost one of its quick examples"
    outputs = {}
    for argv in quick:  # in this process (the installed command ran the main job): a process each costs seconds
        done = in_process(*argv[1:], cwd=main_job)
        assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
        outputs[argv[1]] = done.stdout
    assert '"config"' in outputs["best"] and "for " in outputs["show"]
    assert Path(outputs["plot"].strip()).is_file() and (main_job / "log.json").is_file()


def test_the_model_example_runs_as_written(main_job):
    example = next(block for block in blocks("python") if "torch.compile" in block)
    done = run([sys.executable, "-c", example], main_job, timeout=600)
    assert "batch_matmul(" in done.stdout and "dense(" in done.stdout


def parsed(argv: list[str]):
    """The context Click (Typer's own copy) makes of a command line, down to its subcommand: option names,
    types and ranges checked, nothing run."""
    command = typer.main.get_command(app)
    context = command.make_context("tensortune", argv)
    while hasattr(command, "resolve_command"):  # a group
        name, command, rest = command.resolve_command(context, context._protected_args + context.args)
        context = command.make_context(name, rest, parent=context)
    return context


def test_every_other_command_parses(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    others = [argv for argv in commands() if argv[1] not in QUICK]
    assert len(others) >= 8
    for argv in others:
        context = parsed(argv[1:])
        if context.params.get("op"):
            parse_workload(context.params["op"], list(context.params["params"]))
    with pytest.raises(Exception, match="No such option: --trails"):
        parsed(["tune", "matmul", "M=8", "--trails", "3"])  # a typo is caught


def test_every_extra_says_what_it_costs():
    """A new extra must say what it adds to an install: the test install is gigabytes, mostly extras."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    costs = dict(re.findall(r"^\| `\[(\w+)\]` \|[^|]*\| ([^|]*\d MB)", README, re.M))
    aliases = {name for name, needs in project["optional-dependencies"].items() if needs == ["tensortune[torch]"]}
    assert set(project["optional-dependencies"]) - aliases <= set(costs), costs
