"""The rough edges a new user met (issue 22), held by tests: Ctrl-C in `tune` and `serve` is one line, never the
workers' tracebacks; a file, value or database the command cannot use is one `error:` line naming it and why;
a `--db` typo or a repeated parameter is refused, not guessed at; a resumed job's bar shows the job's best; and a
job another process runs is refused before anything about it is printed."""
from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from typer.testing import CliRunner

from db import Database, export_log
from db.queue import JobQueue
from search_space import Target, matmul
from service.cli import app
from tests.db_helpers import measurement
from tests.serve_helpers import free_port, wait_for
from tests.test_cli_model import MODEL_FILE
from workers.object_cache import ENV as OBJECT_CACHE

TUNE = ["tune", "matmul", "M=16", "N=16", "K=16", "--target", "llvm -threads=1", "--tuner", "random"]
CLI = [str(Path(sys.executable).parent / "tensortune")]
# a first-time user's bare shell, with the suite's object cache (tests/conftest.py), not the user's
ENV = {"COLUMNS": "80", "PATH": str(Path(sys.executable).parent), OBJECT_CACHE: os.environ[OBJECT_CACHE]}
RESUME_HINT = r"interrupted at \d+ of 200 trials: run the same command again to resume"


def records_in(db: Path) -> int:
    """Measurements stored so far; 0 while the file or its tables are not there yet."""
    try:
        with sqlite3.connect(db) as connection:
            return connection.execute("SELECT count(*) FROM measurements").fetchone()[0]
    except sqlite3.Error:
        return 0


def one_error_line(result, *named: str) -> str:
    """The single `error:` line a command ended with (exit 1), which must name each of `named`."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert all(name in lines[0] for name in named), lines[0]
    return lines[0]


def test_ctrl_c_in_tune_prints_only_the_resume_hint(tmp_path):
    """SIGINT goes to the terminal's whole foreground group, the workers too: only the parent may answer it."""
    db = tmp_path / "t.db"
    tune = subprocess.Popen(CLI + TUNE + ["--trials", "200", "--db", str(db)], cwd=tmp_path, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: records_in(db) > 0, 300, "the first measurement")
        os.killpg(tune.pid, signal.SIGINT)
        output, _ = tune.communicate(timeout=120)
    finally:
        tune.kill()
    lines = output.splitlines()
    assert tune.returncode == 130 and "Traceback" not in output, output
    assert lines[0].startswith("tuning matmul(M=16,N=16,K=16,dtype=float32)") and len(lines) == 2, output
    assert re.fullmatch(RESUME_HINT, lines[1]), output
    with Database(db) as database:
        assert database.job(1).status == "cancelled"


def test_ctrl_c_in_serve_prints_one_line_and_queues_the_running_job_again(tmp_path):
    """Its runner's workers get the SIGINT too; uvicorn's own account of its shutdown is four lines."""
    db, port = tmp_path / "s.db", free_port()
    server = subprocess.Popen(CLI + ["serve", "--port", str(port), "--db", str(db), "--workers", "local"], cwd=tmp_path,
                              env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(server.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: any(url in line for line in lines), 120, "the server to listen")
        with httpx.Client(base_url=url, timeout=30) as client:
            body = {"workload": {"op": "matmul", "params": {"M": 16, "N": 16, "K": 16}}, "target": "llvm -threads=1",
                    "trials": 200, "tuner": "random"}
            job = client.post("/api/jobs", json=body).json()["id"]
            wait_for(lambda: records_in(db) > 0, 300, "the first measurement")
            client.get("/api/workers")  # the last request: once its access line is read, all before it are
        wait_for(lambda: any("GET /api/workers" in line for line in lines), 30, "the last access line")
        said_before = len(lines)
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=120)
        reader.join(30)
    finally:
        server.kill()
    output = "".join(lines)
    assert server.returncode == 0 and "Traceback" not in output, output
    assert [line.rstrip("\n") for line in lines[said_before:]] == [
        "stopped: any job it was running is queued again, to resume when a service starts"], output
    with Database(db) as database:
        assert database.job(job).status == "queued"


def test_plot_and_export_to_a_missing_directory_are_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    workload, target = matmul(16, 16, 16), Target.parse("llvm -threads=1")
    with Database(url) as database:
        job = database.create_job(workload, target, "random", 4)
        database.record(*measurement(workload, target, 1, 1e-5), job_id=job)
    missing = tmp_path / "missing"
    for argv in (["plot", str(job), "--out", str(missing / "x.png")], ["export", str(missing / "x.json")]):
        result = CliRunner().invoke(app, argv + ["--db", url])
        one_error_line(result, f"cannot write {missing / 'x.'}", f"no such directory {missing}")


def test_unknown_workers_is_one_line_naming_it(tmp_path):
    result = CliRunner().invoke(app, TUNE + ["--trials", "1", "--workers", "bogus", "--db", str(tmp_path / "t.db")])
    one_error_line(result, "--workers bogus", "local, ray or a Ray cluster address")


def read_only(file: Path) -> str:
    """A --db of `file` that this process may read but not write: the file without write permission; for root,
    whom permission bits do not stop, the file opened read-only (SQLite's mode=ro)."""
    file.chmod(0o444)
    return f"sqlite:///file:{file}?mode=ro&uri=true" if os.geteuid() == 0 else str(file)


def test_a_read_only_database_is_one_line_naming_it_not_sql(tmp_path):
    """Each command that writes records says so of a database it may only read, as opening a new one does."""
    workload, target = matmul(16, 16, 16), Target.parse("llvm -threads=1")
    log, model = tmp_path / "records.log", tmp_path / "models.py"
    with Database(tmp_path / "elsewhere.db") as elsewhere:
        elsewhere.record(*measurement(workload, target, 1, 1e-5))
        export_log(elsewhere, log)
    model.write_text(MODEL_FILE)
    tuned, new = tmp_path / "tuned.db", tmp_path / "new.db"
    Database(tuned).close()
    url = read_only(tuned)
    for argv in (TUNE + ["--trials", "1"], ["import", str(log)], ["tune-model", f"{model}:tiny", "--trials", "2"]):
        result = CliRunner().invoke(app, argv + ["--db", url])
        one_error_line(result, "cannot write sqlite:///", f"{tuned} is ", "read-only")
    new.touch()  # a new database: tensortune must write its tables
    result = CliRunner().invoke(app, ["best", "matmul", "M=8", "N=8", "K=8", "--db", read_only(new)])
    one_error_line(result, "cannot open sqlite:///", f"{new} is ", "read-only")


def test_a_bare_word_db_is_refused_saying_how_to_name_a_file_or_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["best", "matmul", "M=8", "N=8", "K=8", "--db", "notaurl"])
    one_error_line(result, "cannot open notaurl", "notaurl.db", "./notaurl", "postgresql+psycopg://")
    assert not (tmp_path / "notaurl").exists()
    Database(tmp_path / "records").close()  # a file of that name that exists is what it names
    existing = CliRunner().invoke(app, ["best", "matmul", "M=8", "N=8", "K=8", "--db", "records"])
    assert existing.exit_code == 1 and "no successful measurement" in existing.output


def test_a_repeated_parameter_is_refused_naming_it():
    result = CliRunner().invoke(app, ["show", "matmul", "M=64", "N=64", "K=64", "M=32"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and lines == ["error: parameter M is given twice (M=64, M=32); give it once"]


def test_a_resumed_tune_shows_the_jobs_best_including_the_resumed_records(tmp_path):
    workload, target = matmul(16, 16, 16), Target.parse("llvm -threads=1")
    with Database(tmp_path / "tensortune.db") as database:
        job = database.create_job(workload, target, "random", 3, "running")  # its tune was killed after one trial
        database.record(*measurement(workload, target, 1, 1e-9), job_id=job)  # faster than any real one
    done = subprocess.run(CLI + TUNE + ["--trials", "3"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    bar = next(line for line in output.splitlines() if "3/3" in line and "GFLOPS" in line)
    assert f"resuming job {job}: 1 of 3 trials already measured" in output
    assert f"best {workload.flops / 1e-9 / 1e9:6.1f} GFLOPS" in bar, bar
    assert "time: tuner " in output and "measuring" in output and "writing records" in output


def test_a_job_another_process_runs_is_refused_before_anything_else_is_printed(tmp_path):
    workload, target = matmul(16, 16, 16), Target.parse("llvm -threads=1")
    with Database(tmp_path / "tensortune.db") as database:
        claim = JobQueue(database).own(workload, target, "random", 3)  # this process runs it, as a tune would
        try:
            busy = subprocess.run(CLI + TUNE + ["--trials", "3"], cwd=tmp_path, env=ENV, capture_output=True,
                                  text=True, timeout=300)
        finally:
            claim.release()
    lines = (busy.stdout + busy.stderr).strip().splitlines()
    assert busy.returncode == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: job {claim.job_id} (") and "is being run by another process" in lines[0]
