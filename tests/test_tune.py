"""The search loop end to end: real measurements, every one in the database, resume after a kill."""
import os
import signal
import subprocess
import sys

import pytest
from db_helpers import assert_searched_once, measurement
from serve_helpers import wait_for

from db import Database
from db.queue import JobQueue
from search_space import Target, dense, get_space, matmul
from search_space.templates import gemm
from tuner.tune import tune
from workers import Outcome, best_curve, best_so_far
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
    stored = [r.result.gflops for r in records]
    assert result.curve == [max(stored[:n + 1]) for n in range(20)] and result.curve[-1] == result.best[1].gflops > 0
    # every trial's measuring time is within the pool's share of the run
    assert set(result.seconds) == {"measure", "tuner", "record"} and min(result.seconds.values()) > 0
    assert result.seconds["measure"] >= sum(r.result.median for r in records)


def trials_since_best(gflops: list[float]) -> int:
    """How many trials came after the last one that beat every trial before it."""
    best, since = 0.0, 0
    for value in gflops:
        since = 0 if value > best else since + 1
        best = max(best, value)
    return since


def searched(measured: list) -> list:
    """A job's search: its measurements but those of configs it had measured already (its finalists' again)."""
    seen: set[int] = set()
    return [(i, r) for i, r in measured if not (i.config.index in seen or seen.add(i.config.index))]


def test_early_stopping_ends_a_job_at_the_first_batch_past_its_patience(tmp_path, pool):
    """Patience 6, batches of 4: the search ends after the batch that brings 6 trials without a better config,
    so it ended with at least 6 and fewer than 6 + 4 such trials; then its finalists are measured again."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    result = tune(matmul(16, 16, 16), TARGET, 200, "random", database, pool, batch=4, early_stopping=6, measure=FAST)
    search = searched(result.measured)
    since = trials_since_best([r.gflops for _, r in search])
    assert len(search) < 200 and 6 <= since < 10, (len(search), since)
    assert len(result.measured) > len(search)
    assert database.job(result.job_id).status == "done"


def test_a_job_ends_measuring_its_fastest_configs_again(tmp_path, pool):
    """48 trials keep 6 for the finalists: 42 configs searched, then the 3 fastest measured again, then again the 3
    fastest at their typical times (the upper median of a config's measurements); the stored best is the tuner's,
    a config at its typical time."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    workload = matmul(32, 32, 32)
    result = tune(workload, TARGET, 48, "random", database, pool, measure=FAST)
    search, again = result.measured[:42], result.measured[42:]
    assert searched(result.measured) == search and len(again) == 6
    fastest = sorted(search, key=lambda pair: pair[1].median)[:3]
    assert {i.config.index for i, _ in again[:3]} == {i.config.index for i, _ in fastest}
    (stored,) = database.best(workload, TARGET)
    best_input, best_result = result.best
    assert (stored.input.config, stored.result.median) == (best_input.config, best_result.median)
    assert database.count(workload, TARGET) == 48


def test_the_best_so_far_falls_back_when_a_config_timed_fast_by_luck_is_measured_again():
    """A failure, config 3 at 1 µs, config 4 at 2 µs, config 3 again at 3 µs: config 3's typical time is then the
    slower of its two, and config 4 is the best from that trial on."""
    workload = matmul(16, 16, 16)
    measured = [measurement(workload, TARGET, 2, 1e-7, Outcome.RUNTIME_ERROR), measurement(workload, TARGET, 3, 1e-6),
                measurement(workload, TARGET, 4, 2e-6), measurement(workload, TARGET, 3, 3e-6)]
    assert best_so_far(measured) == [None, 1, 1, 2]
    assert best_curve(measured) == [0.0, measured[1][1].gflops, measured[1][1].gflops, measured[2][1].gflops] \
        and measured[2][1].gflops > 0


@pytest.mark.parametrize("tuner", ["grid", "xgb"])
def test_a_resumed_job_measures_none_of_its_configs_again_failed_ones_included(tmp_path, pool, tuner):
    """A job left with failed records beside an ok one (grid's first three configs) resumes from all of
    them: it measures the rest of its 8-trial budget, no config twice. Reloading only its ok record, grid
    would measure configs 0 and 2 again, and any tuner would overrun the budget."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    workload = matmul(16, 16, 16)
    job = database.create_job(workload, TARGET, tuner, 8)
    for index, outcome in [(0, Outcome.COMPILE_ERROR), (1, Outcome.OK), (2, Outcome.WRONG_ANSWER)]:
        database.record(*measurement(workload, TARGET, index, 1e-5, outcome), job_id=job)
    result = tune(workload, TARGET, 8, tuner, database, pool, batch=4, measure=FAST)
    configs = [r.input.config.index for r in database.job_records(job)]
    assert len(configs) == len(set(configs)) == 8 and configs[:3] == [0, 1, 2], configs
    assert result.job_id == job and result.resumed == 3
    assert database.job(job).status == "done"


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


def test_a_new_shape_first_measures_the_best_config_of_the_others(tmp_path, pool):
    """Another M of a dense layer (another sequence length) starts from what the first learned: its first measured
    config is the first shape's best (M=8's tiles all fit M=16); a shape with other options lends nothing."""
    from tuner.tune import borrowed_configs

    database = Database(f"sqlite:///{tmp_path}/t.db")
    first = tune(dense(8, 32, 16, bias=True), TARGET, 8, "random", database, pool, batch=4, measure=FAST)
    database.record(*measurement(dense(8, 32, 16), TARGET, 5, 1e-9))  # no bias: not the same layer
    second, space = dense(16, 32, 16, bias=True), get_space(dense(16, 32, 16, bias=True), TARGET)
    best = first.best[0].config.to_dict()
    assert [config.to_dict() for config in borrowed_configs(database, second, TARGET, space)] == [best]
    result = tune(second, TARGET, 4, "xgb", database, pool, batch=4, measure=FAST)
    assert result.measured[0][0].config.to_dict() == best
    assert len({i.config.index for i, _ in result.measured}) == 4  # and then the tuner's own proposals


def test_a_one_thread_best_is_tried_on_more_threads_in_each_parallel_way(tmp_path):
    """On a target that knows nothing of the op, the 1-thread target's best comes first in each way the 2-thread
    space parallelises it: kept serial, as it was stored, it would leave a core idle."""
    from tuner.tune import transplanted_configs

    database = Database(f"sqlite:///{tmp_path}/t.db")
    workload, two = matmul(64, 48, 32), Target.parse("llvm -threads=2")
    best = get_space(workload, TARGET).get(5)
    database.record(*measurement(workload, TARGET, best.index, 1e-6))
    tried = transplanted_configs(database, workload, two, get_space(workload, two))
    assert sorted(config["parallel"] for config in tried) == ["m", "n"]
    assert all({k: v for k, v in config.values if k != "parallel"} == {k: v for k, v in best.values if k != "parallel"}
               for config in tried)


def test_a_config_of_another_shape_is_fitted_to_the_nearest_valid_one():
    """M=16's 16-row tile does not fit M=8: the nearest tile that does, 8 rows, every other knob kept."""
    from db.matching import fit_config

    large, small = get_space(dense(16, 32, 16), TARGET), get_space(dense(8, 32, 16), TARGET)
    config = next(c for c in large if c["tile_m"] == (-1, 16, 1))
    fitted = fit_config(small, config)
    assert fitted["tile_m"] == (-1, 8, 1)
    assert {k: v for k, v in fitted.values if k != "tile_m"} == {k: v for k, v in config.values if k != "tile_m"}
    assert fit_config(large, fitted).to_dict() == fitted.to_dict()  # what fits is taken as it is


def test_a_killed_tune_resumes_without_repeating_a_config(tmp_path):
    url = f"sqlite:///{tmp_path}/t.db"
    command = [sys.executable, "-m", "service", "tune", "matmul", "M=48", "N=48", "K=48", "--trials", "30",
               "--tuner", "random", "--target", "llvm -threads=1", "--db", url]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    database = Database(url)
    try:
        job = wait_for(lambda: (job := database.unfinished_job(matmul(48, 48, 48), TARGET, "random", 30))
                       and len(database.job_records(job.id)) >= 8 and job, 120, "the job's first 8 records")
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the CLI and its worker processes, mid-job
        process.wait()
    done_before = len(database.job_records(job.id))
    assert 8 <= done_before < 30
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert f"resuming job {job.id}" in finished.stderr
    assert_searched_once(database.job_records(job.id), 30)  # 27 configs searched, then its 3 finalists again
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


def test_a_job_resumed_after_its_template_changed_measures_its_budget_anew(tmp_path, pool, monkeypatch):
    """Records of another template version are not a job's trials: resumed after a bump, it measures them all."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    workload = matmul(24, 24, 24)
    job = database.create_job(workload, TARGET, "random", 6, "running")  # its tune died after three trials
    for index in (1, 2, 3):
        database.record(*measurement(workload, TARGET, index, 1e-9), job_id=job)  # faster than any real one
    monkeypatch.setattr(gemm, "VERSION", gemm.VERSION + 1)
    result = tune(workload, TARGET, 6, "random", database, pool, batch=3, measure=FAST)
    assert result.job_id == job and result.resumed == 0 and len(result.measured) == 6
    assert len(database.job_records(job)) == 9 and database.best(workload, TARGET)[0].result.median > 1e-9
