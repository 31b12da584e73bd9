"""The search loop end to end: real measurements, every one in the database, resume after a kill."""
import os
import signal
import subprocess
import sys
import time

import pytest

from db import Database
from db.queue import JobQueue
from search_space import Target, matmul
from tuner.tune import tune
from workers.pool import make_pool
from workers.task import MeasureOptions

TARGET = Target.parse("llvm -threads=1")
FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0)


@pytest.fixture(scope="module")
def pool():
    with make_pool("local") as local:
        yield local


@pytest.mark.parametrize("tuner", ["xgb", "ga"])
def test_tune_records_every_trial_once(tmp_path, pool, tuner):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    seen = []
    result = tune(matmul(40, 48, 32), TARGET, 20, tuner, database, pool, batch=5, measure=FAST,
                  on_result=lambda i, r: seen.append(i.config.index))
    records = database.job_records(result.job_id)
    assert len(result.measured) == len(records) == len(seen) == 20
    assert len({r.input.config.index for r in records}) == 20
    assert database.job(result.job_id).status == "done"
    assert result.curve == sorted(result.curve) and result.curve[-1] == result.best[1].gflops > 0


def test_early_stopping_ends_a_job_before_its_budget(tmp_path, pool):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    result = tune(matmul(16, 16, 16), TARGET, 200, "random", database, pool, batch=4, early_stopping=6, measure=FAST)
    assert len(result.measured) < 200


@pytest.mark.parametrize("trials", [40, 6])
def test_stop_ends_a_job_cancelled_after_the_batch_in_flight(tmp_path, pool, trials):
    """The job is cancelled (as the API does) during the second batch of 3. With 40 trials the loop
    asks stop() after that batch; with 6 the budget ends the loop first, and the cancel still stands."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    job = database.create_job(matmul(16, 16, 16), TARGET, "random", trials)
    claim = JobQueue(database).claim()
    seen = []

    def measured(_, result):
        seen.append(result)
        if len(seen) == 4:
            database.update_job(job, "cancelled")
    result = tune(matmul(16, 16, 16), TARGET, trials, "random", database, pool, batch=3, measure=FAST, job=claim,
                  on_result=measured, stop=lambda: database.job(job).status == "cancelled")
    assert result.job_id == job and len(result.measured) == len(database.job_records(job)) == 6
    assert database.job(job).status == "cancelled"


def test_xgb_starts_from_the_other_shapes_of_the_op(tmp_path, pool):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    for shape in (matmul(32, 32, 32), matmul(48, 32, 64)):
        tune(shape, TARGET, 12, "random", database, pool, batch=6, measure=FAST)
    from tuner.tune import TuneOptions, history, make_tuner
    past = history(database, matmul(64, 32, 48), TARGET)
    assert len(past) == 2 and all(len(x) == len(y) == 12 for x, y in past)
    fresh = make_tuner(matmul(64, 32, 48), TARGET, TuneOptions(trials=8), past)
    assert fresh.model.base is not None and fresh.model.trained
    assert len(fresh.propose(8)) == 8


def test_a_killed_tune_resumes_without_repeating_a_config(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    command = [sys.executable, "-m", "service", "tune", "matmul", "M=48", "N=48", "K=48", "--trials", "30",
               "--tuner", "random", "--target", "llvm -threads=1", "--db", url]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    database = Database(url)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = database.unfinished_job(matmul(48, 48, 48), TARGET, "random", 30)
        if job and len(database.job_records(job.id)) >= 8:
            break
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the CLI and its worker processes, mid-job
    process.wait()
    done_before = len(database.job_records(job.id))
    assert 8 <= done_before < 30
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert f"resuming job {job.id}" in finished.stderr
    records = database.job_records(job.id)
    assert len(records) == 30 and len({r.input.config.index for r in records}) == 30
    assert database.job(job.id).status == "done"


def test_plot_draws_a_jobs_curve(tmp_path, pool):
    from typer.testing import CliRunner

    from service.cli import app

    database = Database(f"sqlite:///{tmp_path}/t.db")
    result = tune(matmul(24, 24, 24), TARGET, 6, "random", database, pool, measure=FAST)
    out = tmp_path / "curve.png"
    cli = CliRunner().invoke(app, ["plot", str(result.job_id), "--db", database.url, "--out", str(out)])
    assert cli.exit_code == 0, cli.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    missing = CliRunner().invoke(app, ["plot", "999", "--db", database.url])
    assert missing.exit_code == 1 and "no job 999" in missing.output
