"""Read queries over one session: the best records of a workload on a target, counts, stored targets and
workloads; which jobs are single jobs.

They take a plain `Session` so that `Database` and `apply_history_best(session)` share them.
The best-record query is two unique-key lookups and one seek on `ix_measurements_best`, for today's template
version; a second seek reads unversioned records (imported AutoTVM logs), used where their config is in today's
space. Records of any other version are configs of other code, and are never returned as best. Both read each
config's typical measurement only (db/typical.py): a config measured more than once counts at the upper median of
its measurements, the slower of two, the middle of three, not at its luckiest.
"""
from __future__ import annotations

from itertools import count, islice
from typing import Iterator

from sqlalchemy import Integer, and_, bindparam, func, select, true
from sqlalchemy.orm import Session, aliased

from search_space import NoTemplate, Target, Workload, WorkloadError, get_space, template_version
from workers import Outcome

from .models import JobRow, MeasurementRow, TargetRow, WorkloadRow
from .records import Record, in_space, record_from_row, seconds, target_from_row


# Measurements of one workload on one exact target. The ids are scalar subqueries, not joins, so that
# PostgreSQL reads ix_measurements_best in order and stops at the first row instead of sorting them all.
# Built once: building a statement costs more than running it.
_OF_PAIR = select(MeasurementRow).where(
    MeasurementRow.workload_id == select(WorkloadRow.id).where(WorkloadRow.key == bindparam("workload"))
    .scalar_subquery(),
    MeasurementRow.target_id == select(TargetRow.id).where(TargetRow.key == bindparam("target")).scalar_subquery())
_OK = _OF_PAIR.where(MeasurementRow.outcome == Outcome.OK.value)
# each config's typical ok measurement (db/typical.py): what a config's speed is taken to be
_TYPICAL = _OK.where(MeasurementRow.typical == true())
# The version follows the outcome in the index, so each of these is one seek read in order. Unversioned records
# are ordered by their (null) version too: PostgreSQL takes `= :version` for a constant, but not `IS NULL`.
BEST = (_TYPICAL.where(MeasurementRow.template_version == bindparam("version", type_=Integer))
        .order_by(MeasurementRow.median_seconds, MeasurementRow.id).limit(bindparam("limit")))
UNVERSIONED = (_TYPICAL.where(MeasurementRow.template_version.is_(None))
               .order_by(MeasurementRow.template_version, MeasurementRow.median_seconds, MeasurementRow.id)
               .limit(bindparam("size")).offset(bindparam("offset")))
PAGE = 64  # unversioned rows read at a time, until enough of them fit today's space
_VERSIONS = _OF_PAIR.with_only_columns(MeasurementRow.template_version, func.count()).group_by(
    MeasurementRow.template_version)
_IDENTITIES = _OF_PAIR.with_only_columns(MeasurementRow.config_index, MeasurementRow.finished_at,
                                          MeasurementRow.samples)
# what a new job of the pair starts from: every measurement outside the job (bindparam "job"), those of no job included
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


def applies(record: Record) -> bool:
    """Whether a record may be applied today: measured with today's template version, or unversioned with a
    config that lies in today's space (knobs valid, index theirs)."""
    workload, target = record.input.workload, record.input.target
    if record.template_version is not None:
        return record.template_version == template_version(workload, target)
    return in_space(get_space(workload, target), record.input.config) is not None


def best_records(session: Session, workload: Workload, target: Target, limit: int = 1) -> list[Record]:
    """The fastest `ok` configs, each at its typical measurement (db/typical.py), that apply today (`applies`),
    best first; ties go to the earlier row. Empty where no template exists: no config applies there."""
    try:
        version = template_version(workload, target)
    except NoTemplate:
        return []
    bound = pair(workload, target)
    found = [record_from_row(row, workload, target)
             for row in session.scalars(BEST, bound | {"version": version, "limit": limit})]
    unversioned = (record_from_row(row, workload, target) for row in _pages(session, UNVERSIONED, bound))
    found += islice(filter(applies, unversioned), limit)
    return sorted(found, key=lambda record: (record.result.median, record.id))[:limit]


def _pages(session: Session, statement, bound: dict) -> Iterator[MeasurementRow]:
    """The rows of an ordered statement, read PAGE at a time as they are wanted (a server-side cursor would
    need a transaction, which read sessions do not open)."""
    for offset in count(0, PAGE):
        page = session.scalars(statement, bound | {"offset": offset, "size": PAGE}).all()
        yield from page
        if len(page) < PAGE:
            return


def template_versions(session: Session, workload: Workload, target: Target) -> dict[int | None, int]:
    """How many measurements of the workload on the target each template version has (None: unversioned)."""
    return dict(session.execute(_VERSIONS, pair(workload, target)).all())


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
