"""The record commands of `tensortune`: `best`, `export`, `import` and `db upgrade`.

`register(app)` adds them to the CLI app of service/cli.py, which calls it once at its end;
nothing is registered at import time.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from search_space import NoTemplate, Target, Workload, template_version

from .cli_args import (DB_OPTION, OP_ARGUMENT, TARGET_OPTION, console, fail, open_database, parse_target,
                       parse_workload, writing_file, writing_to)

if TYPE_CHECKING:  # the commands import db as they run: every command of the CLI loads this module
    from db import Record


def describe(record: Record, same_config: int, total: int) -> dict:
    """What `best --json` prints: the config, its speed, where and when it was measured, and its backing."""
    result = record.result
    return {
        "workload": record.input.workload.key, "target": str(record.input.target),
        "config": {"index": record.input.config.index, "knobs": record.input.config.to_dict()},
        "gflops": result.gflops, "median_seconds": result.median, "mean_seconds": result.mean,
        "samples": list(result.samples), "compile_seconds": result.compile_seconds,
        "measured_at": datetime.fromtimestamp(result.finished_at, timezone.utc).isoformat()
        if result.finished_at else None, "host": result.host, "worker": result.worker,
        "job_id": record.job_id, "record_id": record.id, "template_version": record.template_version,
        "measurements_of_config": same_config, "measurements": total,
    }


def stored_best(database, workload, target) -> dict | None:
    """`describe` of the best stored config of the workload on the target, as its typical measurement (the upper
    median of its measurements, db/typical.py); None when there is none."""
    found = database.best(workload, target)
    if not found:
        return None
    config = found[0].input.config.index
    return describe(found[0], database.count(workload, target, config), database.count(workload, target))


def stale_message(versions: dict[int | None, int], workload: Workload, target: Target) -> str | None:
    """What `best` says when records of the workload exist on the target (`versions`: how many of each template
    version) but none of today's version; None when there are none, or some of today's."""
    try:
        today = template_version(workload, target)
    except NoTemplate:
        return None
    if not versions or today in versions:
        return None
    numbered = sorted(version for version in versions if version is not None)
    origins = ([f"template version{'s' * (len(numbered) > 1)} {', '.join(map(str, numbered))}"] if numbered else []) + (
        ["unversioned with no ok config in today's space"] if None in versions else [])
    return (f"{sum(versions.values())} record(s) of {workload.key} on target {target}, all from "
            f"{' or '.join(origins)} (today's is {today}): tune again")


def print_best(info: dict) -> None:
    when = datetime.fromisoformat(info["measured_at"]).strftime("%Y-%m-%d %H:%M:%S UTC") if info["measured_at"] else "?"
    knobs = ", ".join(f"{name}={value}" for name, value in info["config"]["knobs"].items())
    job = f", job {info['job_id']}" if info["job_id"] is not None else ""
    print(f"{info['workload']} on {info['target']}")
    print(f"  best config {info['config']['index']}: {knobs}")
    print(f"  {info['gflops']:.1f} GFLOPS (median {info['median_seconds'] * 1e6:.2f} µs over "
          f"{len(info['samples'])} samples)")
    print(f"  measured {when} on host {info['host'] or '?'} by worker {info['worker'] or '?'}{job}")
    print(f"  backed by {info['measurements_of_config']} measurement(s) of this config, "
          f"{info['measurements']} of this workload on this target")


def best(op: str = OP_ARGUMENT,
         params: List[str] = typer.Argument(..., help="NAME=VALUE parameters, e.g. M=64 N=64 K=64"),
         target: str = TARGET_OPTION,
         db: Optional[str] = DB_OPTION,
         as_json: bool = typer.Option(False, "--json", help="print one JSON object (an error too)")):
    """Print the best stored config of a workload on a target, its GFLOPS, when and where it was measured."""
    workload, target_ = parse_workload(op, params), parse_target(target)
    with open_database(db) as database:
        info = stored_best(database, workload, target_)
        versions = {} if info else database.template_versions(workload, target_)
        missing = (stale_message(versions, workload, target_)
                   or f"no successful measurement of {workload.key} on target {target_} in {database}")
    if info is None:
        if as_json:
            print(json.dumps({"error": missing, "workload": workload.key, "target": str(target_)}))
        fail(missing)
    if as_json:
        print(json.dumps(info))
    else:
        print_best(info)


def export(file: Path = typer.Argument(..., dir_okay=False, help="the JSON-lines log to write"),
           best_only: bool = typer.Option(False, "--best-only", help="only the best of each workload and target"),
           db: Optional[str] = DB_OPTION):
    """Write the measurements as AutoTVM-style JSON lines (log format 0.2)."""
    from db import export_log

    with open_database(db) as database, writing_file(file):
        count = export_log(database, file, best_only=best_only)
    console.print(f"exported {count} record(s) to {file}")


def import_(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="an AutoTVM-style JSON-lines log"),
            best_only: bool = typer.Option(False, "--best-only", help="only the best of each workload and target"),
            db: Optional[str] = DB_OPTION):
    """Read AutoTVM-style JSON lines into the database; malformed lines are reported and skipped (exit 1)."""
    from db import import_log

    with open_database(db) as database, writing_to(database):
        report = import_log(database, file, best_only=best_only)
    for line, why in report.rejected:
        console.print(f"{file}:{line}: rejected: {why}", markup=False, highlight=False)
    console.print(f"imported {report.imported} record(s) from {file}"
                  + (f"; skipped {report.duplicates} already stored" if report.duplicates else "")
                  + (f"; rejected {len(report.rejected)} malformed line(s)" if report.rejected else ""))
    if report.rejected:
        raise typer.Exit(1)


def db_upgrade(db: Optional[str] = DB_OPTION):
    """Create the database or migrate it to the newest schema."""
    from db import upgrade

    with open_database(db) as database:
        console.print(f"{database} is at schema revision {upgrade(database.engine)}")


def register(app: typer.Typer) -> None:
    db_app = typer.Typer(help="The tensortune database", no_args_is_help=True)
    db_app.command("upgrade")(db_upgrade)
    app.add_typer(db_app, name="db")
    app.command("best")(best)
    app.command("export")(export)
    app.command("import")(import_)
