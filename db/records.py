"""Between rows and the values search_space and workers define: a stored measurement is a `Record`.

A `Record` is what AutoTVM calls an (input, result) pair, plus the row and job it came from.
Configs are rebuilt from their JSON without consulting a space, so records of targets that
have no template here (or of an older template) still read back; whoever applies one checks
it against the space it is for (`in_space`) and its template version against today's.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from search_space import Config, ConfigSpace, InvalidConfig, Target, Workload
from workers import MeasureInput, MeasureResult, Outcome

from .models import MeasurementRow, TargetRow


@dataclass(frozen=True)
class Record:
    id: int
    job_id: int | None
    input: MeasureInput
    result: MeasureResult
    template_version: int | None  # the template's version when measured; None: unversioned (an AutoTVM log's)


def _frozen(value):
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def config_from_dict(data: dict) -> Config:
    """`{"index": 5, "knobs": {...}}` (Config.to_json's form) → Config, lists back to tuples."""
    return Config(int(data["index"]), tuple((name, _frozen(value)) for name, value in data["knobs"].items()))


def config_to_dict(config: Config) -> dict:
    return {"index": config.index, "knobs": config.to_dict()}


def in_space(space: ConfigSpace, config: Config) -> Config | None:
    """The config as `space` has it, when its knobs are valid there and its index is theirs; else None."""
    try:
        return space.from_json(config_to_dict(config))
    except InvalidConfig:
        return None


def moment(seconds: float) -> datetime | None:
    """Unix seconds → aware UTC datetime; 0 (MeasureResult's "unknown") → None."""
    return datetime.fromtimestamp(seconds, timezone.utc) if seconds else None


def seconds(when: datetime | None) -> float:
    return when.timestamp() if when else 0.0


def workload_values(workload: Workload) -> dict:
    return {"key": workload.key, "op": workload.op, "params": workload.p, "dtype": workload.dtype}


def target_values(target: Target) -> dict:
    return {"key": str(target), "kind": target.kind, "model": target.model, "features": ",".join(target.features),
            "threads": target.threads, "arch": target.arch}


def target_from_row(row: TargetRow) -> Target:
    return Target(row.kind, row.model, tuple(f for f in row.features.split(",") if f), row.threads, row.arch)


def measurement_values(measure_input: MeasureInput, result: MeasureResult) -> dict:
    """The columns of a measurement row that come from the measurement itself (not the ids)."""
    return {
        "config_index": measure_input.config.index, "config": config_to_dict(measure_input.config),
        "outcome": Outcome(result.outcome).value, "samples": list(result.samples),
        "mean_seconds": result.mean, "median_seconds": result.median, "gflops": result.gflops,
        "flops": result.flops, "compile_seconds": result.compile_seconds, "worker": result.worker,
        "host": result.host, "started_at": moment(result.started_at), "finished_at": moment(result.finished_at),
        "error": result.error, "phases": dict(result.phases),
    }


def record_from_row(row: MeasurementRow, workload: Workload, target: Target) -> Record:
    result = MeasureResult(
        Outcome(row.outcome), tuple(row.samples), row.compile_seconds, row.flops, row.worker, row.host,
        seconds(row.started_at), seconds(row.finished_at), row.error, dict(row.phases))
    return Record(row.id, row.job_id, MeasureInput(workload, target, config_from_dict(row.config)), result,
                  row.template_version)
