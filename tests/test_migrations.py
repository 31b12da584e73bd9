"""Every migration's downgrade undoes its upgrade, on both backends: a downgrade that dropped the wrong column or
index would leave a schema no revision has, and the next upgrade would fail or build on it."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from db_helpers import BACKENDS, pg_schema
from sqlalchemy import Engine, create_engine, inspect

from db.migrate import alembic_config, current_revision


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
