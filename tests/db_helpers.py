"""Shared by the db tests: the two backends every test runs on, and measurements made to order.

PostgreSQL tests each get a fresh schema in the `test` database (dropped afterwards); when the
server cannot be reached they skip, except under CI (`CI` set), where they fail.
"""
from __future__ import annotations

import functools
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from db import Database
from db.records import Record
from search_space import Target, Workload, get_space, host_target
from tuner.tune import confirmations
from workers import MeasureInput, MeasureResult, Outcome

PG_URL = os.environ.get("TENSORTUNE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgresql"]


@functools.cache
def pg_problem() -> str | None:
    """Why PostgreSQL cannot be used, or None when it can."""
    engine = create_engine(PG_URL, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        return None
    except Exception as error:  # any reason at all is reported to the test
        return f"{type(error).__name__}: {error}"
    finally:
        engine.dispose()


@contextmanager
def pg_schema() -> Iterator[str]:
    """A URL whose tables live in a new, empty schema of the PostgreSQL test database."""
    problem = pg_problem()
    if problem:
        message = f"PostgreSQL at {PG_URL} is unreachable: {problem}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    schema = f"tt_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_URL)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'tensortune.db'}"
    else:
        with pg_schema() as url:
            yield url


@pytest.fixture
def database(db_url) -> Iterator[Database]:
    with Database(db_url) as opened:
        yield opened


def other_threads(threads: int) -> Target:
    """The host CPU with another thread count: a different but similar target this machine can build for."""
    return replace(host_target(), threads=threads)


def measurement(workload: Workload, target: Target, index: int, median: float, outcome: Outcome = Outcome.OK,
                **fields) -> tuple[MeasureInput, MeasureResult]:
    """A measurement of config `index` whose samples have the given median."""
    now = time.time()
    result = MeasureResult(outcome, (median * 0.99, median, median * 1.2), 0.05, workload.flops, "worker-1",
                           "host-a", now - 1.0, now)
    return MeasureInput(workload, target, get_space(workload, target).get(index)), replace(result, **fields)


def assert_searched_once(records: list[Record], trials: int) -> None:
    """A job's records after it spent its `trials`: its search measured no config twice, whatever stopped and
    resumed it, then its finalists were measured again (`confirmations`) and nothing else."""
    configs = [record.input.config.index for record in records]
    search = trials - confirmations(trials)
    assert len(configs) == trials and len(set(configs[:search])) == search, configs
    assert set(configs[search:]) <= set(configs[:search]), configs
