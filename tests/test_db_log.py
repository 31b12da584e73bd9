"""AutoTVM-style JSON-lines export and import: lossless round trip (template versions too), plain v0.2 lines
(unversioned), malformed lines, best-only."""
from __future__ import annotations

import json

import pytest
from db_helpers import database, db_url, measurement, other_threads  # noqa: F401 (fixtures)

from db import Database, LogError, decode, export_log, import_log
from search_space import Config, dense, host_target, matmul, template_version
from workers import MeasureInput, Outcome

WORKLOAD = matmul(32, 32, 32)
DENSE = dense(16, 32, 8, bias=True, epilogue="gelu")


def fill(database: Database) -> None:
    target, serial = host_target(), other_threads(1)
    database.record(*measurement(WORKLOAD, target, 10, 3e-5, phases={"build": 0.1}))
    database.record(*measurement(WORKLOAD, target, 11, 1e-5, worker="w2", host="host-b"))
    database.record(*measurement(WORKLOAD, target, 12, 0.0, Outcome.COMPILE_ERROR, samples=(), error="no fit"))
    database.record(*measurement(WORKLOAD, serial, 13, 5e-5))
    database.record(*measurement(DENSE, target, 14, 2e-5))
    database.record(*measurement(DENSE, target, 15, 1e-6, Outcome.RUN_TIMEOUT, error="timed out"))


def comparable(database: Database) -> list:
    return [(record.input, record.result, record.template_version) for record in database.records()]


def test_round_trip_is_lossless(database, tmp_path):
    fill(database)
    assert export_log(database, tmp_path / "all.log") == 6
    with Database(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        report = import_log(copy, tmp_path / "all.log")
        assert (report.imported, report.rejected) == (6, [])
        assert comparable(copy) == comparable(database)
        export_log(copy, tmp_path / "again.log")
    assert (tmp_path / "again.log").read_text() == (tmp_path / "all.log").read_text()


def test_importing_a_log_again_adds_nothing(database, tmp_path):
    """Whether the lines are already stored or repeated within the log, each measurement lands once."""
    fill(database)
    export_log(database, tmp_path / "all.log")
    report = import_log(database, tmp_path / "all.log")
    assert (report.imported, report.duplicates) == (0, 6)
    twice = tmp_path / "twice.log"
    twice.write_text((tmp_path / "all.log").read_text() * 2)
    with Database(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        report = import_log(copy, twice)
        assert (report.imported, report.duplicates) == (6, 6)
        assert comparable(copy) == comparable(database)


def test_lines_follow_autotvm_v02(database, tmp_path):
    fill(database)
    export_log(database, tmp_path / "all.log")
    first, *_, failed_run = [json.loads(line) for line in (tmp_path / "all.log").read_text().splitlines()]
    assert first["version"] == 0.2
    assert first["input"] == [str(host_target()), "matmul", [32, 32, 32], {"dtype": "float32"}]
    assert first["config"]["index"] == 10 and first["config"]["entity"][0][:2] == ["tile_m", "sp"]
    costs, error_no, all_cost, timestamp = first["result"]
    assert len(costs) == 3 and error_no == 0 and all_cost == pytest.approx(1.0) and timestamp > 1e9
    assert failed_run["input"][3] == {"bias": True, "epilogue": "gelu", "dtype": "float32"}
    assert failed_run["result"][1] == 7  # AutoTVM's RUN_TIMEOUT


def test_a_plain_autotvm_line_imports(tmp_path):
    measure_input, result = measurement(WORKLOAD, host_target(), 9, 2e-5)
    line = json.dumps({
        "input": [str(host_target()), "matmul", [32, 32, 32], {}],
        "config": {"index": 9, "code_hash": None,
                   "entity": [[name, "ot", value] for name, value in measure_input.config.to_dict().items()]},
        "result": [list(result.samples), 0, 2.5, 1700000000.0], "version": 0.2, "tvm_version": "0.19.0"})
    got_input, got, version = decode(line)
    assert got_input == measure_input and version is None
    assert (got.outcome, got.samples, got.started_at, got.finished_at) == (Outcome.OK, result.samples, 1699999997.5,
                                                                           1700000000.0)
    assert got.flops == WORKLOAD.flops and got.worker == "" and got.compile_seconds == 0.0


def test_malformed_lines_are_rejected_by_number_and_the_rest_imported(database, tmp_path):
    fill(database)
    export_log(database, tmp_path / "all.log")
    good = (tmp_path / "all.log").read_text().splitlines()
    record = json.loads(good[0])
    bad_knob = json.loads(good[0])
    bad_knob["config"]["entity"][0][2] = [-1, 3, 999]
    lines = [
        good[0],
        "{not json",
        json.dumps(record | {"version": 0.1}),
        json.dumps(record | {"input": [str(host_target()), "conv9d", [1], {}]}),
        "",
        json.dumps(bad_knob),
        json.dumps(record | {"result": [[1e-5], 42, 0.0, 0.0]}),
        json.dumps(record | {"input": ["tpu", "matmul", [32, 32, 32], {}]}),
        json.dumps(record | {"input": [str(host_target()), "matmul", [32, 0, 32], {}]}),
        json.dumps(record | {"tensortune": record["tensortune"] | {"template_version": "one"}}),
        good[1],
    ]
    (tmp_path / "mixed.log").write_text("\n".join(lines) + "\n")
    with Database(f"sqlite:///{tmp_path / 'mixed.db'}") as target_db:
        report = import_log(target_db, tmp_path / "mixed.log")
        assert report.imported == 2 and target_db.count(WORKLOAD, host_target()) == 2
    assert [number for number, _ in report.rejected] == [2, 3, 4, 6, 7, 8, 9, 10]
    assert "not JSON" in report.rejected[0][1] and "conv9d" in report.rejected[2][1]
    assert "template_version must be an integer" in report.rejected[-1][1]
    with pytest.raises(LogError, match="version 0.2"):
        decode(lines[2])


def test_best_only_keeps_the_fastest_ok_per_workload_and_target(database, tmp_path):
    fill(database)
    export_log(database, tmp_path / "best.log", best_only=True)
    exported = sorted((decode(line)[0].config.index for line in open(tmp_path / "best.log")))
    assert exported == [11, 13, 14]
    export_log(database, tmp_path / "all.log")
    with Database(f"sqlite:///{tmp_path / 'best.db'}") as best_db:
        assert import_log(best_db, tmp_path / "all.log", best_only=True).imported == 3
        assert sorted(r.input.config.index for r in best_db.records()) == [11, 13, 14]
        assert best_db.best(WORKLOAD, host_target())[0].result == database.best(WORKLOAD, host_target())[0].result


def test_template_versions_survive_export_and_import(database, tmp_path):
    """Today's, a stale version's (whose config today's space has not: kept as written, never best) and
    unversioned records go out with their version and come back with it; best-only keeps today's best beside a
    faster stale one."""
    target = host_target()
    today = template_version(WORKLOAD, target)
    measure_input, result = measurement(WORKLOAD, target, 5, 1e-7)
    old_knobs = Config(5, tuple((name, "gone" if name == "order" else value)
                                for name, value in measure_input.config.values))
    database.record(*measurement(WORKLOAD, target, 10, 3e-5))
    database.record_many([(MeasureInput(WORKLOAD, target, old_knobs), result, today - 1),
                          (*measurement(WORKLOAD, target, 11, 2e-5), None)])
    export_log(database, tmp_path / "all.log")
    lines = [json.loads(line) for line in (tmp_path / "all.log").read_text().splitlines()]
    assert [line["tensortune"]["template_version"] for line in lines] == [today, today - 1, None]
    with Database(f"sqlite:///{tmp_path / 'copy.db'}") as copy:
        assert import_log(copy, tmp_path / "all.log").rejected == []
        assert comparable(copy) == comparable(database)
        assert [r.input.config.index for r in copy.best(WORKLOAD, target, limit=3)] == [11, 10]
    with Database(f"sqlite:///{tmp_path / 'best.db'}") as best_db:
        import_log(best_db, tmp_path / "all.log", best_only=True)
        assert [r.template_version for r in best_db.best(WORKLOAD, target)] == [None]
        assert best_db.template_versions(WORKLOAD, target) == {today: 1, today - 1: 1, None: 1}
