"""The record commands of the CLI: best, export, import and db upgrade, each with --db."""
from __future__ import annotations

import json

from db_helpers import database, db_url, measurement  # noqa: F401 (fixtures)
from typer.testing import CliRunner

from db import Database
from db.migrate import current_revision, head_revision
from search_space import host_target, matmul
from service.cli import app

WORKLOAD = matmul(32, 32, 32)
ARGS = ["matmul", "M=32", "N=32", "K=32"]
runner = CliRunner()


def test_best_prints_config_speed_provenance_and_backing(database, db_url):
    target = host_target()
    for index, median in [(10, 3e-5), (11, 1e-5), (11, 1.2e-5)]:
        database.record(*measurement(WORKLOAD, target, index, median))
    job = database.create_job(WORKLOAD, target, "xgb", 10)
    database.record(*measurement(WORKLOAD, target, 10, 5e-5), job_id=job)

    shown = runner.invoke(app, ["best", *ARGS, "--db", db_url])
    assert shown.exit_code == 0, shown.output
    assert f"{WORKLOAD.key} on {target}" in shown.stdout
    assert "best config 11: tile_m=" in shown.stdout
    assert f"{WORKLOAD.flops / 1.2e-5 / 1e9:.1f} GFLOPS" in shown.stdout  # its typical time: the slower of its two
    assert "on host host-a by worker worker-1" in shown.stdout
    assert "backed by 2 measurement(s) of this config, 4 of this workload on this target" in shown.stdout

    as_json = json.loads(runner.invoke(app, ["best", *ARGS, "--db", db_url, "--json"]).stdout)
    assert as_json["config"]["index"] == 11 and as_json["workload"] == WORKLOAD.key
    assert (as_json["measurements_of_config"], as_json["measurements"]) == (2, 4)
    assert as_json["median_seconds"] == 1.2e-5 and as_json["host"] == "host-a" and as_json["measured_at"]


def test_best_without_records_fails_clearly(db_url):
    result = runner.invoke(app, ["best", *ARGS, "--db", db_url, "--target", "llvm -threads=1"])
    assert result.exit_code == 1
    assert f"no successful measurement of {WORKLOAD.key}" in result.stderr
    bad = runner.invoke(app, ["best", "matmul", "M=32", "--db", db_url])
    assert bad.exit_code == 2 and "missing parameter" in bad.output


def test_export_import_and_default_db_from_environment(database, db_url, tmp_path, monkeypatch):
    database.record(*measurement(WORKLOAD, host_target(), 10, 3e-5))
    log = tmp_path / "records.log"
    exported = runner.invoke(app, ["export", str(log), "--db", db_url])
    assert exported.exit_code == 0 and "exported 1 record(s)" in exported.stderr
    log.write_text(log.read_text() + "garbage\n")

    monkeypatch.setenv("TENSORTUNE_DB", f"sqlite:///{tmp_path / 'env.db'}")
    imported = runner.invoke(app, ["import", str(log)])
    assert imported.exit_code == 1
    assert f"{log}:2: rejected: not JSON" in imported.stderr
    assert "imported 1 record(s)" in imported.stderr
    again = runner.invoke(app, ["import", str(log)])
    assert "imported 0 record(s)" in again.stderr and "skipped 1 already stored" in again.stderr
    with Database() as from_env:
        assert from_env.best(WORKLOAD, host_target())[0].input.config.index == 10


def test_db_upgrade(db_url):
    result = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert result.exit_code == 0 and f"is at schema revision {head_revision()}" in result.stderr
    with Database(db_url) as database, database.engine.connect() as connection:
        assert current_revision(connection) == head_revision()
