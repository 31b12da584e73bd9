"""Database: schema and migrations, recording, best-config queries (of today's template version) and job
bookkeeping, on both backends."""
from __future__ import annotations

from dataclasses import replace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from db_helpers import database, db_url, measurement  # noqa: F401 (fixtures)
from sqlalchemy.exc import IntegrityError

from db import Database, resolve_url, upgrade
from db.migrate import current_revision, head_revision
from db.models import Base
from db.queries import BEST, PAGE, UNVERSIONED
from search_space import Config, get_space, host_target, matmul, template_version
from workers import MeasureInput, Outcome

WORKLOAD = matmul(32, 32, 32)


def test_migrations_create_exactly_the_models(database):
    with database.engine.connect() as connection:
        assert current_revision(connection) == head_revision()
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []


def test_opening_again_and_upgrading_are_no_ops(db_url):
    with Database(db_url) as first:
        first.record(*measurement(WORKLOAD, host_target(), 1, 1e-4))
    with Database(db_url) as second:
        assert upgrade(second.engine) == head_revision()
        assert second.count(WORKLOAD, host_target()) == 1


def test_best_is_the_fastest_ok_measurement(database):
    target = host_target()
    for index, median in [(10, 3e-5), (11, 1e-5), (12, 2e-5)]:
        database.record(*measurement(WORKLOAD, target, index, median))
    database.record(*measurement(WORKLOAD, target, 13, 1e-7, Outcome.WRONG_ANSWER))
    database.record(*measurement(WORKLOAD, target, 14, 0.0, Outcome.COMPILE_ERROR, samples=(), error="boom"))
    best = database.best(WORKLOAD, target, limit=2)
    assert [record.input.config.index for record in best] == [11, 12]
    assert best[0].input.config == measurement(WORKLOAD, target, 11, 1.0)[0].config
    assert database.count(WORKLOAD, target) == 5
    assert database.count(WORKLOAD, target, config_index=11) == 1
    assert database.best(WORKLOAD, replace(target, threads=target.threads + 1)) == []
    assert database.best(matmul(8, 8, 8), target) == []


def test_best_orders_by_median_time_and_a_tie_by_the_earlier_row(database):
    """Samples whose mean and fastest sample disagree with their median: the median decides. Config 21 and 30
    tie on the median; 21, recorded first, comes first although its mean is far the larger."""
    target = host_target()
    for index, samples in [(21, (4e-5, 4e-5, 4e-4)), (30, (4e-5, 4e-5, 4e-5)), (20, (1e-5, 5e-5, 5e-5))]:
        database.record(*measurement(WORKLOAD, target, index, samples[1], samples=samples))
    assert [record.input.config.index for record in database.best(WORKLOAD, target, limit=3)] == [21, 30, 20]


def test_a_config_measured_again_counts_at_its_typical_time(database):
    """Config 40's first measurement is the fastest of all, but it was measured twice more, slower: its typical time
    (the upper median of its measurements) is its middle one, behind 41's single one; 42, measured twice, counts at
    the slower of its two. The record given for a config is that typical measurement."""
    target = host_target()
    for index, median in [(40, 1e-5), (41, 2e-5), (40, 3e-5), (42, 1.5e-5), (40, 5e-5), (42, 2.5e-5)]:
        database.record(*measurement(WORKLOAD, target, index, median))
    best = database.best(WORKLOAD, target, limit=3)
    assert [(r.input.config.index, r.result.median) for r in best] == [(41, 2e-5), (42, 2.5e-5), (40, 3e-5)]
    assert database.best(WORKLOAD, target)[0].input.config.index == 41


def test_configs_measured_many_at_once_count_at_their_typical_times(database):
    """Twenty configs were each once fast and twice slow, stored at once (as an import is); the one measured once,
    at a time none of their fast ones beat, is the best, and a failed measurement counts for none."""
    target = host_target()
    lucky = range(100, 120)
    database.record_many([measurement(WORKLOAD, target, index, 1e-5 + index * 1e-9) for index in lucky]
                         + [measurement(WORKLOAD, target, index, 1e-3) for index in lucky for _ in range(2)]
                         + [measurement(WORKLOAD, target, 99, 5e-4)]
                         + [measurement(WORKLOAD, target, 99, 1e-7, Outcome.RUNTIME_ERROR) for _ in range(2)])
    assert [r.input.config.index for r in database.best(WORKLOAD, target, limit=2)] == [99, 100]


def test_a_record_reads_back_whole_and_is_committed_at_once(database, db_url):
    measure_input, result = measurement(WORKLOAD, host_target(), 7, 2e-5, phases={"build": 0.04, "time": 0.5})
    record_id = database.record(measure_input, result)
    with Database(db_url) as other:  # another connection sees it: it was committed
        (record,) = other.best(WORKLOAD, host_target())
    assert record.id == record_id and record.job_id is None
    assert record.input == measure_input
    assert record.result.samples == result.samples and record.result.phases == result.phases
    assert record.result.started_at == pytest.approx(result.started_at, abs=1e-6)
    assert record.result.gflops == pytest.approx(result.gflops)
    assert (record.result.worker, record.result.host) == ("worker-1", "host-a")


def test_job_lifecycle(database):
    job_id = database.create_job(WORKLOAD, host_target(), "xgb", 200)
    job = database.job(job_id)
    assert (job.status, job.trials, job.tuner, job.workload, job.started_at) == ("queued", 200, "xgb", WORKLOAD, None)
    database.update_job(job_id, "running")
    database.record(*measurement(WORKLOAD, host_target(), 3, 1e-5), job_id=job_id)
    database.update_job(job_id, "failed", error="worker lost")
    job = database.job(job_id)
    assert job.status == "failed" and job.error == "worker lost"
    assert job.created_at <= job.started_at <= job.finished_at
    assert database.best(WORKLOAD, host_target())[0].job_id == job_id
    with pytest.raises(ValueError, match="unknown job status"):
        database.update_job(job_id, "paused")
    with pytest.raises(KeyError):
        database.update_job(job_id + 100, "done")
    with pytest.raises(IntegrityError):
        database.record(*measurement(WORKLOAD, host_target(), 3, 1e-5), job_id=job_id + 100)


def test_sqlite_uses_wal(tmp_path):
    with Database(f"sqlite:///{tmp_path / 'x.db'}") as database, database.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 1000


def query_plan(connection, statement, params: dict) -> str:
    """The backend's plan for `statement` as the code runs it (its compiled SQL and bound parameters)."""
    compiled = statement.compile(dialect=connection.dialect)
    values = compiled.construct_params(params)
    if compiled.positiontup is not None:
        values = tuple(values[name] for name in compiled.positiontup)
    explain = "EXPLAIN QUERY PLAN " if connection.dialect.name == "sqlite" else "EXPLAIN "
    return "\n".join(str(row) for row in connection.exec_driver_sql(explain + compiled.string, values))


@pytest.mark.parametrize("statement, bound", [(BEST, {"version": 1, "limit": 1}),
                                              (UNVERSIONED, {"size": 64, "offset": 0})], ids=["today", "unversioned"])
def test_the_best_query_reads_the_best_index_in_order(database, statement, bound):
    """The code's own statements, for today's version and for unversioned records: each one seek on
    ix_measurements_best and no sort (PostgreSQL is kept off sequential scans, which it prefers on a table this
    small)."""
    for index in range(5):
        database.record(*measurement(WORKLOAD, host_target(), index, 1e-5 * (index + 1)))
    with database.engine.connect() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SET enable_seqscan = off")
        plan = query_plan(connection, statement, {"workload": WORKLOAD.key, "target": str(host_target())} | bound)
    assert "ix_measurements_best" in plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan


def foreign(config: Config, index: int | None = None, **knobs) -> Config:
    """`config` with other knob values, or another index: a config of no version of today's space."""
    return Config(config.index if index is None else index,
                  tuple((name, knobs.get(name, value)) for name, value in config.values))


def test_records_carry_the_template_version_they_were_measured_with(database):
    target = host_target()
    today = template_version(WORKLOAD, target)
    database.record(*measurement(WORKLOAD, target, 1, 1e-5))
    database.record_many([measurement(WORKLOAD, target, 2, 2e-5), (*measurement(WORKLOAD, target, 3, 3e-5), None),
                          (*measurement(WORKLOAD, target, 4, 4e-5), today - 1)])
    assert [(r.input.config.index, r.template_version) for r in database.records()] == [
        (1, today), (2, today), (3, None), (4, today - 1)]
    assert database.template_versions(WORKLOAD, target) == {today: 2, None: 1, today - 1: 1}


def test_best_skips_other_versions_and_unversioned_configs_outside_todays_space(database):
    """Only today's records and unversioned ones whose config is in today's space, fastest first, however many
    faster unversioned records do not fit (they are read a page at a time)."""
    target = host_target()
    today = template_version(WORKLOAD, target)
    config = get_space(WORKLOAD, target).get(12)
    database.record(*measurement(WORKLOAD, target, 10, 3e-5))
    database.record_many([
        (*measurement(WORKLOAD, target, 11, 1e-6), today - 1),  # fastest, but stale
        (*measurement(WORKLOAD, target, 12, 2e-5), None),  # unversioned, in today's space
        *[(MeasureInput(WORKLOAD, target, foreign(config, tile_m=(-1, 3, 999))), result, None)
          for _, result in [measurement(WORKLOAD, target, 12, 1e-7)] * (PAGE + 1)],  # knobs not in the space
        (MeasureInput(WORKLOAD, target, foreign(config, index=13)), measurement(WORKLOAD, target, 12, 1e-7)[1],
         None),  # the knobs of 12 under another index
    ])
    best = database.best(WORKLOAD, target, limit=5)
    assert [(r.input.config.index, r.template_version) for r in best] == [(12, None), (10, today)]
    assert database.template_versions(WORKLOAD, target) == {today: 1, today - 1: 1, None: PAGE + 3}


def test_a_new_job_starts_from_records_that_apply_today(database):
    """What a job's tuner learns from and never measures again: a stale config is measured again."""
    target, other = host_target(), matmul(16, 32, 32)
    today = template_version(WORKLOAD, target)
    for workload in (WORKLOAD, other):
        database.record_many([measurement(workload, target, 1, 1e-5), (*measurement(workload, target, 2, 1e-6),
                                                                         today - 1)])
    job = database.create_job(WORKLOAD, target, "xgb", 10)
    assert [r.input.config.index for r in database.known_records(WORKLOAD, target, job)] == [1]
    assert {w: [r.input.config.index for r in found] for w, found in database.op_records("matmul", target).items()} \
        == {WORKLOAD: [1], other: [1]}


def test_default_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TENSORTUNE_DB", raising=False)
    assert resolve_url() == f"sqlite:///{tmp_path / 'tensortune.db'}"
    monkeypatch.setenv("TENSORTUNE_DB", "sqlite:///elsewhere.db")
    assert resolve_url() == "sqlite:///elsewhere.db"
    assert resolve_url("postgresql+psycopg://u@h/d") == "postgresql+psycopg://u@h/d"
    assert resolve_url("runs/a.db") == f"sqlite:///{tmp_path / 'runs' / 'a.db'}"
    monkeypatch.delenv("TENSORTUNE_DB")
    with Database() as database:  # created and migrated on first use
        database.record(*measurement(WORKLOAD, host_target(), 1, 1e-5))
    assert (tmp_path / "tensortune.db").is_file()
