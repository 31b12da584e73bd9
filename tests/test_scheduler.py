"""One budget over a model's tasks: the allocation as a pure function of made-up latency curves, then
tune_tasks on real measurements (its jobs, resume after a stop, errors), and the model-job schema."""
from __future__ import annotations

import math
import random
import sqlite3

import pytest
from alembic import command
from db_helpers import database, db_url, pg_schema  # noqa: F401 (fixtures)
from sqlalchemy import create_engine, insert
from sqlalchemy.exc import OperationalError

from db import Database
from db.migrate import alembic_config, current_revision, head_revision
from db.models import JobRow, TargetRow, WorkloadRow
from db.queue import JobBusy, JobQueue
from db.records import target_values, workload_values
from search_space import Target, batch_matmul, conv2d, dense, get_space, matmul
from tuner.allocation import TaskHistory, batch_size, estimated_seconds, gains, model_latency, next_task
from tuner.scheduler import TuningTask, family, tune_tasks
from tuner.tune import JobFailed, JobSearch, TuneOptions, fitted_from
from workers.pool import make_pool
from workers.task import MeasureOptions

TARGET = Target.parse("llvm -threads=1")
FAST = MeasureOptions(repeat=2, min_repeat_ms=1.0)
HEAVY, LIGHT, SMALL = matmul(16, 16, 16), dense(8, 32, 16, bias=True, epilogue="relu"), batch_matmul(2, 8, 8, 8)


def allocate(curves: list, weights: list[int], trials: int, strategy: str, batch: int = 4) -> list[int]:
    """Trials per task when `strategy` spends `trials` on tasks of one op and size whose t-th trial measures
    curves[i](t) seconds."""
    best: list[list[float]] = [[] for _ in curves]
    rng = random.Random(0)
    while (left := trials - sum(map(len, best))) > 0:
        histories = [TaskHistory("dense", 10**6, weight, tuple(b)) for weight, b in zip(weights, best)]
        chosen = next_task(histories, strategy, batch, rng)
        for _ in range(batch_size(histories, batch, left)):
            trial = curves[chosen](len(best[chosen]))
            best[chosen].append(min(best[chosen][-1], trial) if best[chosen] else trial)
    return [len(b) for b in best]


def improving(t: int) -> float:
    return 1e-4 * (1 + 4 / (1 + t))


def test_gradient_gives_a_heavy_task_with_room_to_improve_most_trials():
    spent = allocate([improving, improving], [100, 1], 200, "gradient")
    assert sum(spent) == 200 and spent[1] >= 4  # the light task had its warm-up batch
    assert spent[0] > 5 * spent[1]
    assert allocate([improving, improving], [100, 1], 200, "round-robin") == [100, 100]


def test_of_two_tasks_as_fast_now_the_one_still_improving_gains_more():
    flat = TaskHistory("dense", 10**6, 1, (2e-4,) * 20)
    falling = TaskHistory("dense", 10**6, 1, tuple(2e-4 + 1e-5 * (19 - t) for t in range(20)))
    assert falling.seconds == flat.seconds and gains([flat, falling], 4)[1] > gains([flat, falling], 4)[0]


def test_epsilon_keeps_a_task_with_no_gain_from_starving():
    spent = allocate([improving, lambda t: 1e-9], [1000, 1], 800, "gradient")
    assert spent[1] > 8  # beyond its warm-up, only by random picks


def test_a_task_slower_than_a_similar_one_has_more_room():
    slow, fast = (TaskHistory("dense", 10**6, 1, (1e-3,) * 20), TaskHistory("dense", 10**6, 1, (1e-4,) * 20))
    unlike = TaskHistory("conv2d", 10**6, 1, (1e-4,) * 20)
    assert gains([slow, fast], 4)[0] > gains([slow, unlike], 4)[0]
    far = TaskHistory("dense", 10**8, 1, (1e-2,) * 20)  # 100× the FLOPs: not similar
    assert gains([slow, far], 4)[0] == gains([slow, unlike], 4)[0]


def test_the_gemm_ops_are_one_family_so_a_slow_attention_product_has_the_room_a_dense_layer_shows():
    """BERT's attention products beside its dense layers: dense, matmul and batch_matmul share the GEMM template and
    are similar; a convolution, and another dtype, are not. A product at less than half a dense layer's throughput
    (Ansor's β) has room that a product among slow products only does not show."""
    families = {workload.key: family(workload, TARGET) for workload in (
        dense(200, 768, 768, bias=True), matmul(64, 64, 64), batch_matmul(12, 200, 200, 64),
        conv2d(1, 64, 14, 14, 64, 3, 3, 1, 1), dense(200, 768, 768, dtype="int8"))}
    assert len(set(families.values())) == 3, families
    attention, layer = batch_matmul(12, 200, 200, 64), dense(200, 768, 768, bias=True)
    slow = TaskHistory(family(attention, TARGET), attention.flops, 12, (attention.flops / 60e9,) * 12)
    fast = TaskHistory(family(layer, TARGET), layer.flops, 12, (layer.flops / 207e9,) * 60)
    alone = TaskHistory("another family", layer.flops, 12, (layer.flops / 207e9,) * 60)
    assert gains([slow, fast], 4)[0] > gains([slow, alone], 4)[0]


def test_an_unknown_task_is_allocated_at_the_slowest_throughput_and_leaves_the_latency_unknown():
    known, failing = TaskHistory("dense", 10**6, 2, (1e-3, 5e-4)), TaskHistory("matmul", 3 * 10**6, 10, (math.inf,))
    assert estimated_seconds([known, failing]) == [5e-4, 1.5e-3]
    assert model_latency([known, failing]) == math.inf and model_latency([known]) == pytest.approx(2 * 5e-4)
    assert next_task([TaskHistory("dense", 1, 1, (1.0,), exhausted=True)], "gradient", 4, random.Random(0)) is None


def test_a_small_budgets_warm_up_batches_leave_a_measurement_for_every_task():
    untried, tried = TaskHistory("dense", 10**6, 1), TaskHistory("dense", 10**6, 1, (1e-3,) * 4)
    assert batch_size([untried] * 24, 4, 72) == 3 and batch_size([untried] * 6, 4, 3) == 1
    assert batch_size([tried] * 12 + [untried] * 12, 4, 24) == 2  # resumed from a run that gave 12 tasks 4 each
    assert batch_size([tried] * 3, 4, 100) == 4 and batch_size([tried] * 3, 4, 2) == 2  # the warm-up done


@pytest.fixture(scope="module")
def pool():
    with make_pool("local") as local:
        yield local


def records_per_job(database: Database, result) -> list[list[int]]:
    return [[r.input.config.index for r in database.job_records(task.job_id)] for task in result.tasks]


def test_tune_tasks_spends_the_budget_where_it_cuts_the_most(tmp_path, pool):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [TuningTask(HEAVY, 100, ("layer.0",)), TuningTask(LIGHT), TuningTask(SMALL)]
    seen = []
    result = tune_tasks(tasks, TARGET, 26, database, "random", pool, measure=FAST, name="tiny", on_progress=seen.append)
    spent = [len(task.measured) for task in result.tasks]
    assert sum(spent) == result.trials == 26 and min(spent) >= 4 and spent[0] == max(spent) > 4
    assert [len(indices) for indices in records_per_job(database, result)] == spent
    assert [p.trials for p in seen] == [0, 4, 8, 12, 16, 20, 24, 26]
    assert len(result.curve) == 7 and result.curve[-1] == seen[-1].latency
    assert sum(result.seconds.values()) == pytest.approx(result.wall) and min(result.seconds.values()) > 0
    assert seen[-1].latency == pytest.approx(sum(p.weight * p.best_seconds for p in seen[-1].tasks))
    parent = database.job(result.job_id)
    assert (parent.model, parent.trials, parent.status, parent.workload) == ("tiny", 26, "done", HEAVY)
    children = database.children(result.job_id)
    assert [(job.workload, job.trials, job.status) for job in children] == [
        (task.workload, n, "done") for task, n in zip(tasks, spent)]
    for task, tuned in zip(tasks, result.tasks):
        assert database.best(task.workload, TARGET)[0].result.median == min(r.median for _, r in tuned.measured if r.ok)


def test_each_task_ends_measuring_its_fastest_configs_again(tmp_path, pool):
    """48 trials over two tasks keep an eighth, 3 a task, for their finalists: each task's job ends with its 3
    fastest configs measured again, and its stored best is the tuner's, at its typical time."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [TuningTask(matmul(32, 32, 32)), TuningTask(dense(16, 32, 32))]
    seen = []
    result = tune_tasks(tasks, TARGET, 48, database, "random", pool, measure=FAST, on_progress=seen.append)
    assert result.trials == 48 and seen[-1].trials == 48
    for task, tuned, indices in zip(tasks, result.tasks, records_per_job(database, result)):
        search = len(set(indices))
        assert indices[:search] == list(dict.fromkeys(indices)) and len(indices) == search + 3
        fastest = sorted(tuned.measured[:search], key=lambda pair: pair[1].median)[:3]
        assert set(indices[search:]) == {i.config.index for i, _ in fastest}
        assert database.best(task.workload, TARGET)[0].input.config == tuned.best[0].config


def test_a_budget_too_small_for_a_batch_per_task_still_measures_every_task(tmp_path, pool):
    """The warm-up's batches shrink to an even share of what is left (72 trials in batches of 4 left 6 of
    ResNet-50's 24 tasks unmeasured), and no batch takes more than is left of the budget."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    workloads = [matmul(8, 8, 8), matmul(8, 8, 16), matmul(16, 8, 8), dense(8, 8, 8), dense(8, 16, 8), dense(16, 8, 8)]
    seen = []
    result = tune_tasks([TuningTask(w) for w in workloads], TARGET, 8, database, "random", pool, measure=FAST,
                        on_progress=seen.append)
    spent = [len(task.measured) for task in result.tasks]
    assert sum(spent) == result.trials == 8 and min(spent) >= 1
    assert [p.trials for p in seen] == [0, 1, 2, 3, 4, 5, 6, 8]
    assert [len(indices) for indices in records_per_job(database, result)] == spent
    assert all(p.best_seconds is not None for p in seen[-1].tasks)


def test_the_estimated_latency_is_unknown_until_every_task_is_measured_then_never_rises(tmp_path, pool):
    """No latency is guessed for a task not measured yet (one guessed from the others' throughput made the estimate
    rise as they were measured): it is inf until every task has an ok measurement, then only falls."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [TuningTask(HEAVY, 100), TuningTask(LIGHT), TuningTask(SMALL)]
    seen = []
    tune_tasks(tasks, TARGET, 20, database, "random", pool, measure=FAST, on_progress=seen.append)
    measured = [all(task.best_seconds is not None for task in p.tasks) for p in seen]
    assert measured[:3] == [False] * 3 and measured[-1]  # the warm-up gives the three tasks a batch each in turn
    assert [p.latency for p, known in zip(seen, measured) if not known] == [math.inf] * measured.count(False)
    known = [p.latency for p, known in zip(seen, measured) if known]
    assert known == sorted(known, reverse=True) and math.isfinite(known[-1])


def test_round_robin_splits_the_budget_evenly(tmp_path, pool):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [TuningTask(HEAVY, 100), TuningTask(LIGHT), TuningTask(SMALL)]
    result = tune_tasks(tasks, TARGET, 24, database, "random", pool, measure=FAST, strategy="round-robin")
    assert [len(task.measured) for task in result.tasks] == [8, 8, 8]
    assert database.job(result.job_id).model is None


def test_a_stopped_run_resumes_where_it_stopped(tmp_path, pool):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [TuningTask(HEAVY, 3), TuningTask(SMALL, 1)]
    asked = []

    def stop_after_three_batches() -> bool:
        asked.append(True)
        return len(asked) > 3
    first = tune_tasks(tasks, TARGET, 30, database, "random", pool, measure=FAST, name="m",
                       stop=stop_after_three_batches)
    assert first.trials == 12 and database.job(first.job_id).status == "cancelled"
    assert {job.status for job in database.children(first.job_id)} == {"cancelled"}
    other = tune_tasks(tasks, TARGET, 8, database, "random", pool, measure=FAST, name="m")  # another budget
    assert other.job_id != first.job_id
    again = tune_tasks(tasks, TARGET, 30, database, "random", pool, measure=FAST, name="m")
    assert again.job_id == first.job_id and again.trials == 30
    assert [task.resumed for task in again.tasks] == [len(task.measured) for task in first.tasks]
    for indices in records_per_job(database, again):
        assert len(indices) == len(set(indices))
    assert sum(map(len, records_per_job(database, again))) == 30
    assert database.job(first.job_id).status == "done"


def test_a_tasks_tuner_is_built_at_its_first_step_from_the_shapes_measured_by_then(tmp_path, pool):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tune_tasks([TuningTask(HEAVY), TuningTask(matmul(16, 16, 32))], TARGET, 16, database, "random", pool, measure=FAST)
    job = database.create_job(matmul(32, 16, 16), TARGET, "xgb", 8, "running")
    search = JobSearch(job, matmul(32, 16, 16), TARGET, TuneOptions(trials=8), database)
    assert search.tuner is None  # built at the first step, from what the database holds then
    search.step(pool, 4)
    assert search.tuner.model.base is not None and len(database.job_records(job)) == 4


def test_each_task_measures_the_other_tasks_best_so_far_before_its_next_batch(tmp_path, pool):
    """Borrowing at a job's start takes the stored bests of shapes with the same options found before it; a model's
    tasks also hand each other the bests they find as they go, of another epilogue too (the FFN up projection's best
    ran QKV's shape 6-8% faster than QKV's own on a Zen 3)."""
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [dense(32, 64, 64, bias=True, epilogue="gelu_erf"), dense(32, 96, 64, bias=True)]
    result = tune_tasks([TuningTask(w) for w in tasks], TARGET, 24, database, "random", pool, measure=FAST,
                        strategy="round-robin")
    records = [database.job_records(task.job_id) for task in result.tasks]
    for here, there in ((0, 1), (1, 0)):
        space, steps = get_space(tasks[here], TARGET), [records[here][i:i + 4] for i in range(0, 12, 4)]
        assert len(space) > 1000 and len(steps[-1]) == 4
        for step, later in enumerate(steps[1:], 1):
            before = [r for r in records[there] if r.id < later[0].id and r.result.ok]
            best = min(before, key=lambda r: r.result.median).input.config
            fitted = fitted_from(space, tasks[here], TARGET, tasks[there], TARGET, best)
            measured = {r.input.config.index for batch in steps[:step + 1] for r in batch}
            assert fitted and fitted[0].index in measured, (here, step)


class FailingPool:
    def __init__(self, error: Exception):
        self.error = error

    def measure(self, tasks, options):
        raise self.error

    def close(self) -> None:
        pass


def test_an_error_fails_the_model_job_and_an_outage_leaves_it_resumable(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    tasks = [TuningTask(HEAVY), TuningTask(SMALL)]
    with pytest.raises(JobFailed, match="RuntimeError: worker exploded$") as failed:
        tune_tasks(tasks, TARGET, 8, database, "random", FailingPool(RuntimeError("worker exploded\ntraceback")))
    assert database.job(failed.value.job_id).error == "RuntimeError: worker exploded"
    assert {job.status for job in database.children(failed.value.job_id)} == {"failed"}
    locked = OperationalError("INSERT", {}, sqlite3.OperationalError("database is locked"))
    with pytest.raises(OperationalError):
        tune_tasks(tasks, TARGET, 8, database, "random", FailingPool(locked), name="m")
    (waiting,) = [job for job in JobQueue(database).jobs() if job.model == "m"]
    assert waiting.status == "running" and database.unfinished_model_job("m", [HEAVY, SMALL], TARGET, "random", 8)


def test_bad_requests_are_refused_before_any_job_exists(tmp_path):
    database = Database(f"sqlite:///{tmp_path}/t.db")
    for tasks, options, message in [([TuningTask(HEAVY), TuningTask(HEAVY, 2)], {}, "one task per workload"),
                                    ([], {}, "at least one task"),
                                    ([TuningTask(HEAVY)], {"strategy": "greedy"}, "unknown strategy")]:
        with pytest.raises(ValueError, match=message):
            tune_tasks(tasks, TARGET, 8, database, "random", "local", **options)
    with pytest.raises(ValueError, match="weight"):
        TuningTask(HEAVY, 0)
    assert JobQueue(database).jobs() == []


def test_a_models_task_jobs_are_never_claimed_nor_resumed_as_single_jobs(database):
    queue = JobQueue(database)
    single = database.create_job(HEAVY, TARGET, "random", 8)
    assert not queue.model_jobs_active()  # a service does not import its presets (PyTorch) for a kernel job
    model = database.create_model_job("m", [HEAVY, SMALL], TARGET, "random", 8)
    assert queue.model_jobs_active()
    assert [job.parent_id for job in database.children(model)] == [model, model]
    assert database.unfinished_job(HEAVY, TARGET, "random", 8).id == single
    claims = [queue.claim(), queue.claim()]
    assert [claim.job_id for claim in claims] == [single, model] and queue.claim() is None  # never a task's job
    for claim in claims:
        claim.release()
    preset_only = queue.claim(models=("bert-layer",))  # a service skips a model job that is not its preset
    named = queue.claim(models=("m",))
    assert (preset_only.job_id, named.job_id) == (single, model)
    preset_only.release()
    named.release()
    assert database.unfinished_model_job("m", [SMALL, HEAVY], TARGET, "random", 8).id == model
    assert database.unfinished_model_job("m", [HEAVY], TARGET, "random", 8) is None
    assert database.unfinished_model_job(None, [HEAVY, SMALL], TARGET, "random", 8) is None
    held = queue.own_model("m", [HEAVY, SMALL], TARGET, "random", 8)
    assert held.job_id == model
    with pytest.raises(JobBusy, match=f"job {model} "):
        queue.own_model("m", [HEAVY, SMALL], TARGET, "random", 8)
    held.release()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_migration_keeps_the_jobs_of_a_0001_database(tmp_path, backend):
    if backend == "sqlite":
        upgrade_0001_then_head(f"sqlite:///{tmp_path}/old.db")
    else:
        with pg_schema() as url:
            upgrade_0001_then_head(url)


def upgrade_0001_then_head(url: str) -> None:
    """A database made by revision 0001 with a job in it, opened (so upgraded) by this version."""
    engine = create_engine(url)
    with engine.begin() as connection:
        command.upgrade(alembic_config(connection), "0001")
        workload = connection.scalar(insert(WorkloadRow.__table__).values(**workload_values(HEAVY))
                                     .returning(WorkloadRow.id))
        target = connection.scalar(insert(TargetRow.__table__).values(**target_values(TARGET)).returning(TargetRow.id))
        job = connection.scalar(insert(JobRow.__table__).values(workload_id=workload, target_id=target, tuner="xgb",
                                                                trials=64, status="queued").returning(JobRow.id))
    engine.dispose()
    with Database(url) as database:
        with database.engine.connect() as connection:
            assert current_revision(connection) == head_revision() == "0006"
        old = database.job(job)
        assert (old.workload, old.trials, old.parent_id, old.model) == (HEAVY, 64, None, None)
        assert database.unfinished_job(HEAVY, TARGET, "xgb", 64).id == job
        assert JobQueue(database).claim().job_id == job
