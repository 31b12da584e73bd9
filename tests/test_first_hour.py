"""What a new user meets in their first hour, held by tests: a bad `--db` is one line for every command that
takes it, a finished tune run again shows the stored best instead of tuning from zero, the progress line and
the jobs table keep what matters at 80 columns, and the small things (`--version`, `best --json` errors,
`plot`'s absolute path, flags without `<bool>`)."""
from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from db import Database
from search_space import Target, conv2d, host_target
from service.api import create_app
from service.cli import app
from tests.db_helpers import PG_URL, pg_schema
from tests.test_cli_errors import ENV as BARE
from tests.serve_helpers import free_port, served_in_thread

TUNE = ["tune", "matmul", "M=16", "N=16", "K=16", "--target", "llvm -threads=1", "--tuner", "random"]
CLI = [str(Path(sys.executable).parent / "tensortune")]


def commands_with_db(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "some.log"
    log.write_text("")
    return [["best", "matmul", "M=8", "N=8", "K=8"], TUNE + ["--trials", "1"], ["plot", "1"],
            ["export", str(tmp_path / "out.log")], ["import", str(log)], ["db", "upgrade"],
            ["tune-model", "bert-layer"], ["bench", "model", "bert-layer"], ["serve", "--port", str(free_port())]]


def bad_urls(tmp_path: Path) -> list[tuple[str, str]]:
    """(a --db that cannot be opened, what the one line must say of it)."""
    text = tmp_path / "notes.txt"
    text.write_text("not a database")
    foreign = tmp_path / "other.db"
    sqlite3.connect(foreign).execute("CREATE TABLE accounts (id INTEGER)").connection.commit()
    newer = tmp_path / "newer.db"
    Database(newer).close()
    with sqlite3.connect(newer) as connection:
        connection.execute("UPDATE alembic_version SET version_num = 'f00d_from_the_future'")
    pg_elsewhere = PG_URL.replace("127.0.0.1:5432", f"127.0.0.1:{free_port()}")
    return [("/proc/x.db", "cannot create /proc/x.db"), (f"sqlite:///{tmp_path}/no/such/x.db", "no such directory"),
            (str(text), "is not a SQLite database"), (str(foreign), "not a tensortune database"),
            (str(newer), "newer than this version of tensortune"), (pg_elsewhere, "the server is not reachable"),
            (PG_URL.rsplit("/", 1)[0] + "/no_such_database", 'database "no_such_database" does not exist')]


def test_a_bad_db_is_one_line_naming_it_and_why_for_every_command(tmp_path):
    with pg_schema():  # PostgreSQL must be there for its two cases to mean anything (fails under CI if not)
        pass
    runner = CliRunner()
    for url, why in bad_urls(tmp_path):
        for argv in commands_with_db(tmp_path):
            result = runner.invoke(app, argv + ["--db", url])
            lines = result.output.strip().splitlines()
            assert result.exit_code == 1 and len(lines) == 1, (argv, url, result.output)
            shown = url if "://" in url else f"sqlite:///{Path(url).resolve()}"
            assert lines[0].startswith(f"error: cannot open {shown}") and why in lines[0], (argv, lines)


def tune_output(folder: Path, *extra: str, env: dict | None = None) -> str:
    done = subprocess.run(CLI + TUNE + ["--trials", "6", *extra], cwd=folder, capture_output=True, text=True,
                          timeout=300, env=BARE | (env or {}))
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_a_finished_tune_run_again_shows_the_stored_best_and_again_skips_what_is_known(tmp_path):
    first = tune_output(tmp_path)
    bar = next(line for line in first.splitlines() if "GFLOPS" in line and "/6" in line)
    assert len(bar) <= 80 and "6/6" in bar and re.search(r"best +\d+\.\d GFLOPS", bar) and re.search(r"\d:\d\d:\d\d", bar)
    stored = re.search(r"stored best for this machine .*: config (\d+), job 1", first)
    assert stored and "timed now with warm caches, alternately with NumPy" in first
    assert "which the environment forces" not in first

    rerun = tune_output(tmp_path, env={"OPENBLAS_CORETYPE": "Prescott"})  # NumPy on a 2004 CPU's kernel
    assert "job 1 already tuned this" in rerun and f"config {stored.group(1)}, job 1" in rerun
    assert "tuning matmul" not in rerun
    assert "which the environment forces (OPENBLAS_CORETYPE=Prescott); on this CPU it would run" in rerun

    again = tune_output(tmp_path, "--again")
    assert "job 2: 6 trials (0 resumed; started from 6 stored measurements, none remeasured)" in again
    with Database(tmp_path / "tensortune.db") as database:
        configs = [{r.input.config.index for r in database.job_records(job)} for job in (1, 2)]
    assert len(configs[0]) == len(configs[1]) == 6 and not configs[0] & configs[1]


def test_best_json_without_records_is_a_json_error_with_the_same_exit_code(tmp_path):
    result = CliRunner().invoke(app, ["best", "matmul", "M=8", "N=8", "K=8", "--json", "--db", str(tmp_path / "t.db")])
    assert result.exit_code == 1
    error = json.loads(result.stdout)
    assert error["workload"] == "matmul(M=8,N=8,K=8,dtype=float32)" and "no successful measurement" in error["error"]


def test_version_and_help_without_type_placeholders_for_flags():
    version = CliRunner().invoke(app, ["--version"])
    assert version.exit_code == 0 and re.fullmatch(r"tensortune \d+\.\d+\.\d+\S*\n", version.stdout)
    shown = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "80"}).stdout
    assert "<bool>" not in shown
    for option in ("--target", "--early-stopping", "--again", "--seed"):
        line = next(line for line in shown.splitlines() if line.strip().startswith(option))
        assert len(line.split(maxsplit=2)) == 3, f"{option} has no description: {line!r}"


# target labels as long as real ones get: Intel CPUs' (four columns wider than Zen's `znver3 · 2 threads`), a GPU's
LONG_TARGETS = ["llvm -mcpu=rocketlake -threads=2", "llvm -mcpu=sapphirerapids -threads=128",
                "cuda -device=NVIDIA_GeForce_RTX_4090 -arch=sm_89"]


def workload_cells(listed: str) -> dict[int, list[str]]:
    """The lines of each job's cell in the `jobs` table's workload column, by job id."""
    lines = listed.splitlines()
    header = next(i for i, line in enumerate(lines) if " tuner " in line)
    start, end = lines[header].index("on target"), lines[header].index("tuner")
    cells: dict[int, list[str]] = {}
    for line in lines[header + 2:]:  # below the rule
        if not line.startswith(" "):  # the notes after the table
            break
        if line[:start].strip():
            job = int(line[:start])
            cells[job] = []
        if line[start:end].strip():
            cells[job].append(line[start:end].strip())
    return cells


def test_jobs_at_80_columns_shows_targets_short_whole_tokens_and_whole_reasons(tmp_path):
    """This host's target and the longest labels there are, so that it fails on any host (the rocketlake label,
    two columns wider than znver3's, once cut the workload to `residual=t…`): the workload wraps at its spaces
    into a few lines above its target."""
    database = Database(tmp_path / "jobs.db")
    workload = conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, bias=True, residual=True, epilogue="relu")
    reason = ("RuntimeError: a deliberately long reason that a table would cut mid-word if it could " * 2).strip()
    targets = {}
    for target in [host_target(), *map(Target.parse, LONG_TARGETS)]:
        job = database.create_job(workload, target, "xgb", 64)
        database.update_job(job, "failed", reason)
        targets[job] = target
    with served_in_thread(create_app(database)) as url:
        listed = CliRunner().invoke(app, ["jobs", "--server", url], env={"COLUMNS": "80"}).stdout
    assert all(len(line) <= 80 for line in listed.splitlines()), listed
    assert all(listed.split().count(token) == len(targets) for token in workload.label.split()), listed
    cells = workload_cells(listed)
    assert set(cells) == set(targets), listed
    for job, target in targets.items():
        *label, on = cells[job]
        assert " ".join(label) == workload.label and len(label) <= 3 and on == f"on {target.label}", listed
        assert f"job {job} failed: {reason}" in " ".join(listed.split())


def test_plot_prints_an_absolute_path_and_takes_out(tmp_path):
    tune_output(tmp_path)
    written = subprocess.run(CLI + ["plot", "1", "--out", "curve.png"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120, check=True).stdout.strip()
    assert written == str(tmp_path / "curve.png") and Path(written).stat().st_size > 1000


def test_tunes_closing_comparison_leaves_pytorch_unimported_for_float32_and_takes_it_for_bfloat16():
    """NumPy is float32's reference: importing PyTorch as well cost 3.7 s of a 10 s `tune` on a Zen 3."""
    script = ("import sys; from search_space import Target, fallback_config, matmul; "
              "from service.cli_tune import compare_with_reference; t = Target.parse('llvm -threads=1')\n"
              "for dtype in ('float32', 'bfloat16'):\n"
              "    w = matmul(16, 16, 16, dtype=dtype)\n"
              "    print(compare_with_reference(w, t, fallback_config(w, t))[1] + ',', 'torch' in sys.modules)")
    said = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert said.stdout.splitlines() == ["NumPy, False", "PyTorch bfloat16, True"], said.stdout


def test_the_cli_loads_neither_the_database_layer_nor_the_compiler_until_a_command_needs_them():
    """Every command imports the whole CLI: the database layer (SQLAlchemy, Alembic) was 0.64 s of its 1.2 s on a
    Zen 3, which `submit`, `jobs` and `cancel`, HTTP clients, never use; `serve` names the client jobs' budget
    without it."""
    script = ("import sys, service.cli\n"
              "print(sorted(m for m in ('db', 'sqlalchemy', 'alembic', 'workers', 'llvmlite', 'torch') if m in sys.modules))")
    said = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert said.stdout.strip() == "[]", said.stdout
    from db.client_requests import ClientJobs
    from service.cli_serve import CLIENT_TRIALS

    assert CLIENT_TRIALS == ClientJobs.trials
