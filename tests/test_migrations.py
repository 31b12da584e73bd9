"""Every migration's downgrade undoes its upgrade, on both backends: a downgrade that dropped the wrong column or
index would leave a schema no revision has, and the next upgrade would fail or build on it. And data migrates:
measurements of revision 0003 carry template version 1 after 0004."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from db_helpers import BACKENDS, measurement, pg_schema
from sqlalchemy import Engine, create_engine, insert, inspect, select

from db import Database
from db.migrate import alembic_config, current_revision
from db.models import MeasurementRow, TargetRow, WorkloadRow
from db.records import measurement_values, target_values, workload_values
from search_space import conv2d, host_target, template_version
from search_space.templates import conv2d as conv2d_template


@contextmanager
def fresh_engine(backend: str, path: Path) -> Iterator[Engine]:
    """An engine on an empty database of `backend` (for SQLite, a new file at `path`)."""
    with pg_schema() if backend == "postgresql" else nullcontext(f"sqlite:///{path}") as url:
        engine = create_engine(url)
        try:
            yield engine
        finally:
            engine.dispose()


def migrate(engine: Engine, revision: str, down: bool = False) -> None:
    with engine.begin() as connection:
        (command.downgrade if down else command.upgrade)(alembic_config(connection), revision)


def schema(engine: Engine) -> set[tuple]:
    """The revision, and every column, key, index and constraint of our tables as the database reports them."""
    with engine.connect() as connection:
        found = inspect(connection)
        facts = {("revision", current_revision(connection))}
        for table in set(found.get_table_names()) - {"alembic_version"}:
            facts |= {(table, "column", c["name"], repr(c["type"]), c["nullable"], c["default"])
                      for c in found.get_columns(table)}
            facts.add((table, "primary key", tuple(found.get_pk_constraint(table)["constrained_columns"])))
            facts |= {(table, "index", i["name"], tuple(i["column_names"]), bool(i["unique"]))
                      for i in found.get_indexes(table)}
            facts |= {(table, "foreign key", tuple(f["constrained_columns"]), f["referred_table"],
                       tuple(f["referred_columns"])) for f in found.get_foreign_keys(table)}
            facts |= {(table, "unique", tuple(u["column_names"])) for u in found.get_unique_constraints(table)}
            facts |= {(table, "check", c["name"], c["sqltext"]) for c in found.get_check_constraints(table)}
        return facts


def revisions() -> list[str]:
    """Every revision, oldest first."""
    newest_first = ScriptDirectory.from_config(alembic_config()).walk_revisions()
    return [script.revision for script in reversed(list(newest_first))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_downgrade_restores_the_schema_of_the_revision_before(backend, tmp_path):
    """Upgrade to each revision, downgrade one step, upgrade again: after each step the schema is the one a
    database upgraded only that far, never downgraded, has."""
    steps = [None, *revisions()]  # None: before the first revision, no table of ours
    with fresh_engine(backend, tmp_path / "upgraded.db") as upgraded, \
            fresh_engine(backend, tmp_path / "round_trips.db") as round_trips:
        expected = [schema(upgraded)]
        for revision in steps[1:]:
            migrate(upgraded, revision)
            expected.append(schema(upgraded))
            assert ("revision", revision) in expected[-1]
        for step, revision in enumerate(steps[1:], start=1):
            migrate(round_trips, revision)
            assert schema(round_trips) == expected[step], f"upgrade to {revision}"
            migrate(round_trips, steps[step - 1] or "base", down=True)
            assert schema(round_trips) == expected[step - 1], f"downgrade from {revision}"
            migrate(round_trips, revision)
            assert schema(round_trips) == expected[step], f"upgrade to {revision} after its downgrade"


def stored_at(engine: Engine, revision: str, workload, target, medians: list[tuple[int, float]], **columns) -> None:
    """Migrate to `revision` and store a measurement of `workload` on `target` for each (config index, median
    seconds), in the columns that revision has, `columns` added."""
    migrate(engine, revision)
    with engine.begin() as connection:
        workload_id = connection.scalar(insert(WorkloadRow).values(workload_values(workload)).returning(WorkloadRow.id))
        target_id = connection.scalar(insert(TargetRow).values(target_values(target)).returning(TargetRow.id))
        for index, median in medians:
            connection.execute(insert(MeasurementRow).values(
                workload_id=workload_id, target_id=target_id, **columns,
                **measurement_values(*measurement(workload, target, index, median))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_measurements_of_revision_0003_get_template_version_1_and_stay_best(backend, tmp_path, monkeypatch):
    """They were measured with the templates of version 1, so a database upgraded past 0004 holds them as version 1:
    kept, and the best it had for a template still at version 1 (conv2d's until it packed its data by rows), never
    applied for one that has moved on (conv2d's version now, as the GEMMs' before it)."""
    workload, target = conv2d(1, 8, 8, 8, 8, 3, 3, 1, 1), host_target()
    with fresh_engine(backend, tmp_path / "old.db") as engine:
        stored_at(engine, "0003", workload, target, [(10, 3e-5), (11, 1e-5)])  # its columns: no template_version
        migrate(engine, "0004")
        with engine.connect() as connection:
            assert connection.scalars(select(MeasurementRow.template_version)).all() == [1, 1]
        with Database(engine.url.render_as_string(hide_password=False)) as database:
            assert database.template_versions(workload, target) == {1: 2} and database.best(workload, target) == []
            monkeypatch.setattr(conv2d_template, "VERSION", 1)
            (best,) = database.best(workload, target)
    assert (best.input.config.index, best.template_version) == (11, 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_measurements_of_revision_0005_are_ranked_at_their_typical_times(backend, tmp_path):
    """A config measured three times before 0006 (once fast, twice slow) counts at its middle measurement after it,
    behind a config measured once; the flag is on exactly one measurement of each config."""
    workload, target = conv2d(1, 8, 8, 8, 8, 3, 3, 1, 1), host_target()
    with fresh_engine(backend, tmp_path / "old.db") as engine:
        stored_at(engine, "0005", workload, target, [(10, 1e-5), (11, 2e-5), (10, 3e-5), (10, 4e-5)],
                  template_version=template_version(workload, target))
        migrate(engine, "0006")
        with engine.connect() as connection:
            flags = connection.execute(select(MeasurementRow.config_index, MeasurementRow.median_seconds)
                                       .where(MeasurementRow.typical).order_by(MeasurementRow.id)).all()
        assert flags == [(11, 2e-5), (10, 3e-5)]
        with Database(engine.url.render_as_string(hide_password=False)) as database:
            assert [r.input.config.index for r in database.best(workload, target, limit=2)] == [11, 10]
