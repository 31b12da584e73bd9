"""Read queries over one session: the best records of a workload on a target, counts, stored targets and
workloads; which jobs are single jobs.

They take a plain `Session` so that `Database` and `apply_history_best(session)` share them.
The best-record query is two unique-key lookups and one seek on `ix_measurements_best`.
"""
from __future__ import annotations

from sqlalchemy import Integer, and_, bindparam, func, select
from sqlalchemy.orm import Session, aliased

from search_space import Target, Workload, WorkloadError
from workers import Outcome

from .models import JobRow, MeasurementRow, TargetRow, WorkloadRow
from .records import Record, record_from_row, seconds, target_from_row


# Measurements of one workload on one exact target. The ids are scalar subqueries, not joins, so that
# PostgreSQL reads ix_measurements_best in order and stops at the first row instead of sorting them all.
# Built once: building a statement costs more than running it.
_OF_PAIR = select(MeasurementRow).where(
    MeasurementRow.workload_id == select(WorkloadRow.id).where(WorkloadRow.key == bindparam("workload"))
    .scalar_subquery(),
    MeasurementRow.target_id == select(TargetRow.id).where(TargetRow.key == bindparam("target")).scalar_subquery())
BEST = (_OF_PAIR.where(MeasurementRow.outcome == Outcome.OK.value)
         .order_by(MeasurementRow.median_seconds, MeasurementRow.id).limit(bindparam("limit")))
_IDENTITIES = _OF_PAIR.with_only_columns(MeasurementRow.config_index, MeasurementRow.finished_at,
                                          MeasurementRow.samples)
# what a new job of the pair starts from: every measurement outside the job (bindparam "job"; None: none)
KNOWN = _OF_PAIR.where(MeasurementRow.job_id.is_distinct_from(bindparam("job", type_=Integer)))
# The workloads of an op with an `ok` measurement on one target: a seek on ix_measurements_best per workload.
_OF_OP = select(WorkloadRow.key).where(WorkloadRow.op == bindparam("op"), select(MeasurementRow.id).where(
    MeasurementRow.workload_id == WorkloadRow.id,
    MeasurementRow.target_id == select(TargetRow.id).where(TargetRow.key == bindparam("target")).scalar_subquery(),
    MeasurementRow.outcome == Outcome.OK.value).exists()).order_by(WorkloadRow.id)
_COUNT = select(func.count()).select_from(_OF_PAIR.subquery())
_COUNT_CONFIG = select(func.count()).select_from(
    _OF_PAIR.where(MeasurementRow.config_index == bindparam("index")).subquery())

# A model job groups the jobs of a model's tasks (tuner/scheduler.py), which only its scheduler runs:
# `tensortune tune` resumes single jobs, those with neither a parent nor children (the queue claims single
# and model jobs, those without a parent).
_CHILD = aliased(JobRow)
MODEL_JOB = select(_CHILD.id).where(_CHILD.parent_id == JobRow.id).exists()
SINGLE_JOB = and_(JobRow.parent_id.is_(None), ~MODEL_JOB)


def pair(workload: Workload, target: Target) -> dict:
    """The bound values of a statement over the measurements of one workload on one target."""
    return {"workload": workload.key, "target": str(target)}


def best_records(session: Session, workload: Workload, target: Target, limit: int = 1) -> list[Record]:
    """The fastest `ok` measurements (by median time), best first; ties go to the earlier row."""
    rows = session.scalars(BEST, pair(workload, target) | {"limit": limit})
    return [record_from_row(row, workload, target) for row in rows]


def count_records(session: Session, workload: Workload, target: Target, config_index: int | None = None) -> int:
    """How many measurements of the workload on the target (of one config, when given) are stored."""
    if config_index is None:
        return session.scalar(_COUNT, pair(workload, target))
    return session.scalar(_COUNT_CONFIG, pair(workload, target) | {"index": config_index})


def identity(config_index: int, finished_at: float, samples) -> tuple:
    """What makes two records one measurement: the same config, finished at the same millisecond,
    with the same samples (a log imported twice must not count twice)."""
    return config_index, round(finished_at, 3), tuple(samples)


def measurement_identities(session: Session, workload: Workload, target: Target) -> set[tuple]:
    return {identity(index, seconds(finished), samples)
            for index, finished, samples in session.execute(_IDENTITIES, pair(workload, target))}


def stored_targets(session: Session, kind: str) -> list[Target]:
    return [target_from_row(row) for row in session.scalars(select(TargetRow).where(TargetRow.kind == kind))]


def stored_workloads(session: Session, op: str, target: Target) -> list[Workload]:
    """The workloads of `op` measured `ok` on exactly this target, in the order they were first stored (keys
    this version cannot parse are left out)."""
    workloads = []
    for key in session.scalars(_OF_OP, {"op": op, "target": str(target)}):
        try:
            workloads.append(Workload.from_key(key))
        except WorkloadError:
            continue
    return workloads
