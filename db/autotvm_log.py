"""AutoTVM-style logs: one JSON object per measurement per line, log format version 0.2.

    {"input": [target, task name, args, kwargs],
     "config": {"index": ..., "code_hash": null, "entity": [[knob, kind, value], ...]},
     "result": [costs, error number, all cost, timestamp], "version": 0.2, "tensortune": {...}}

The task name is the op, args its integer parameters in key order, kwargs its options not at
their default (those the workload's key names) and dtype; costs are every timing sample in
seconds (the error message for a failure); error numbers are AutoTVM's MeasureErrorNo. What
AutoTVM's format has no field for (compile time, worker, host, start time, flops, phases, the
template version) rides in the extra "tensortune" object, which AutoTVM's reader ignores; lines
without it import too, with those fields left empty and no template version: unversioned,
applied only where the config lies in today's space.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from search_space import (InvalidConfig, NoTemplate, Target, TargetError, Workload, WorkloadError, get_space,
                          template_version)
from search_space.workload import OPS
from workers import MeasureInput, MeasureResult, Outcome

from .queries import identity
from .records import Record, config_from_dict, config_to_dict
from .store import Database

VERSION = 0.2
ERROR_NO = {
    Outcome.OK: 0, Outcome.INVALID_CONFIG: 1, Outcome.COMPILE_ERROR: 2, Outcome.RUNTIME_ERROR: 4,
    Outcome.WRONG_ANSWER: 5, Outcome.BUILD_TIMEOUT: 6, Outcome.RUN_TIMEOUT: 7, Outcome.WORKER_LOST: 8,
}
OUTCOME_OF = {number: outcome for outcome, number in ERROR_NO.items()} | {3: Outcome.COMPILE_ERROR}  # 3: device
KIND_CODES = {"split": "sp", "reorder": "re", "annotate": "an", "knob": "ot"}
Logged = tuple[MeasureInput, MeasureResult, int | None]  # a line: the measurement and its template version


class LogError(ValueError):
    """A line that is not a tensortune measurement in AutoTVM's v0.2 format."""


@dataclass
class ImportReport:
    imported: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    duplicates: int = 0  # measurements already stored (or repeated in the log), skipped


def _knob_kinds(workload: Workload, target: Target) -> dict[str, str]:
    try:
        return {name: KIND_CODES[knob.kind] for name, knob in get_space(workload, target).knobs.items()}
    except NoTemplate:
        return {}


def encode(record: Record) -> str:
    """One log line for a stored measurement."""
    workload, target, config = record.input.workload, record.input.target, record.input.config
    result = record.result
    kinds = _knob_kinds(workload, target)
    entity = [[name, kinds.get(name, "ot"), value] for name, value in config.to_dict().items()]
    costs = list(result.samples) if result.samples else ([result.error] if result.error else [])
    all_cost = result.finished_at - result.started_at if result.started_at and result.finished_at else 0.0
    extra = {"compile_seconds": result.compile_seconds, "worker": result.worker, "host": result.host,
             "started_at": result.started_at, "flops": result.flops, "error": result.error,
             "phases": result.phases, "template_version": record.template_version}
    return json.dumps({
        "input": [str(target), workload.op, [workload.p[d] for d in workload.spec.dims],
                  {name: workload.p[name] for name, default in workload.spec.options.items()
                   if workload.p[name] != default} | {"dtype": workload.dtype}],
        "config": {"index": config.index, "code_hash": None, "entity": entity},
        "result": [costs, ERROR_NO[Outcome(result.outcome)], all_cost, result.finished_at],
        "version": VERSION, "tensortune": extra,
    }, separators=(",", ":"))


def _workload(op: str, args: list, kwargs: dict) -> Workload:
    if op not in OPS:
        raise LogError(f"unknown task {op!r}; known: {', '.join(OPS)}")
    dims = OPS[op].dims
    if not isinstance(args, list) or len(args) != len(dims):
        raise LogError(f"task {op} takes {len(dims)} args ({', '.join(dims)}), got {args!r}")
    options = dict(kwargs)
    return Workload.make(op, options.pop("dtype", "float32"), **dict(zip(dims, args)), **options)


def _version(value) -> int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise LogError(f"template_version must be an integer or null, got {value!r}")


def _config(workload: Workload, target: Target, config: dict, version: int | None):
    """The config, checked against today's space unless it is another template version's (kept as written:
    stale, never applied, but exported again as it came)."""
    stored = config_from_dict({"index": config["index"], "knobs": {name: value for name, _, value in config["entity"]}})
    try:
        if version is not None and version != template_version(workload, target):
            return stored
        return get_space(workload, target).from_json(config_to_dict(stored))
    except NoTemplate:  # nothing to check it against here; keep it as written
        return stored


def decode(line: str) -> Logged:
    """Parse one log line; LogError says what is wrong with it."""
    try:
        data = json.loads(line)
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise LogError(f"not a version {VERSION} record")
        target_text, op, args, kwargs = data["input"]
        target = Target.parse(target_text)
        workload = _workload(op, args, kwargs)
        extra = data.get("tensortune", {})
        version = _version(extra.get("template_version"))
        config = _config(workload, target, data["config"], version)
        costs, error_no, all_cost, timestamp = data["result"]
        if error_no not in OUTCOME_OF:
            raise LogError(f"unknown error number {error_no!r}")
        errors = [cost for cost in costs if isinstance(cost, str)]
        result = MeasureResult(
            OUTCOME_OF[error_no], tuple(float(cost) for cost in costs if not isinstance(cost, str)),
            float(extra.get("compile_seconds", 0.0)), int(extra.get("flops", workload.flops)),
            str(extra.get("worker", "")), str(extra.get("host", "")),
            float(extra.get("started_at", timestamp - all_cost if timestamp else 0.0)), float(timestamp),
            str(extra.get("error", errors[0] if errors else "")), dict(extra.get("phases", {})))
    except LogError:
        raise
    except json.JSONDecodeError as error:
        raise LogError(f"not JSON: {error}") from None
    except (KeyError, TypeError, ValueError, AttributeError, WorkloadError, TargetError, InvalidConfig) as error:
        raise LogError(f"{type(error).__name__}: {error}") from None
    return MeasureInput(workload, target, config), result, version


def pick_best(lines: Iterable[Logged]) -> list[Logged]:
    """AutoTVM's pick_best: only the fastest ok measurement of each (workload, target), per template version
    (so a stale record never displaces today's)."""
    best: dict[tuple, Logged] = {}
    for measure_input, result, version in lines:
        key = (measure_input.workload.key, str(measure_input.target), version)
        if result.ok and result.samples and (key not in best or result.median < best[key][1].median):
            best[key] = (measure_input, result, version)
    return list(best.values())


def export_log(database: Database, path: str | Path, best_only: bool = False) -> int:
    """Write every measurement (or the best of each workload and target) to `path`; returns the count."""
    records = ([r for workload, target in database.pairs() for r in database.best(workload, target)]
               if best_only else database.records())
    count = 0
    with open(path, "w", encoding="utf-8") as file:
        for record in records:
            file.write(encode(record) + "\n")
            count += 1
    return count


def import_log(database: Database, path: str | Path, best_only: bool = False) -> ImportReport:
    """Store the measurements of a log; malformed lines are reported with their number and skipped."""
    report, lines = ImportReport(), []
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                lines.append(decode(line))
            except LogError as error:
                report.rejected.append((number, str(error)))
    report.imported = database.record_many(new_measurements(database, pick_best(lines) if best_only else lines, report))
    return report


def new_measurements(database: Database, lines: list[Logged], report: ImportReport) -> list[Logged]:
    """The lines whose measurements are not stored yet, each once: importing a log again adds nothing."""
    known: dict[tuple[str, str], set[tuple]] = {}
    fresh = []
    for measure_input, result, version in lines:
        pair = (measure_input.workload.key, str(measure_input.target))
        if pair not in known:
            known[pair] = database.identities(measure_input.workload, measure_input.target)
        key = identity(measure_input.config.index, result.finished_at, result.samples)
        if key in known[pair]:
            report.duplicates += 1
        else:
            known[pair].add(key)
            fresh.append((measure_input, result, version))
    return fresh
