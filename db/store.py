"""`Database`: the writer the tuner uses and the reader the CLI uses, over any SQLAlchemy URL.

Opening one creates and migrates the schema if needed. Every write is its own short
transaction, committed before returning, so a crash loses at most the candidate in flight
and concurrent writer processes never hold locks across a measurement.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from sqlalchemy import Select, insert, select, text, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from search_space import Target, Workload, template_version
from workers import MeasureInput, MeasureResult

from .engine import make_engine, read_engine, resolve_url
from .job_locks import Claim
from .migrate import upgrade
from .models import JOB_STATUSES, JobRow, MeasurementRow, TargetRow, WorkloadRow, utcnow
from .opening import check_file, open_error
from .outage import LockLost
from .matching import nearest_shapes
from .queries import (KNOWN, MODEL_JOB, SINGLE_JOB, applies, best_records, count_records, measurement_identities,
                      pair, stored_workloads, template_versions)
from . import typical
from .records import Record, measurement_values, record_from_row, target_from_row, target_values, workload_values

FINISHED = ("done", "failed", "cancelled")


@dataclass(frozen=True)
class Job:
    """A tuning job as the job queue sees it. A model job (tuner/scheduler.py) groups its tasks' jobs, whose
    `parent_id` it is; its workload is its first task's, its trials the whole budget, `model` its name."""

    id: int
    workload: Workload
    target: Target
    tuner: str
    trials: int
    status: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str
    parent_id: int | None = None
    model: str | None = None
    waiting: str = ""  # what a queued job waits for: the worker host of its target, which no pool has yet


class Database:
    """One per process (and per URL): thread-safe, since every call takes its own session from the pool."""

    def __init__(self, url: str | Path | None = None):
        self.url = resolve_url(url)
        try:
            check_file(self.url)
            self.engine = make_engine(self.url)
            upgrade(self.engine)
        except (SQLAlchemyError, ImportError) as error:
            raise open_error(self.url, error) from error
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.read_engine = read_engine(self.engine)
        self.read_sessions = sessionmaker(self.read_engine)  # for lookups, a statement or a few each
        self._ids: dict[tuple[str, str], int] = {}
        self._ids_lock = threading.Lock()

    def __str__(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"Database({str(self)!r})"

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        self.read_engine.dispose()
        self.engine.dispose()

    def ping(self) -> None:
        """One round trip; raises what the database raises when it cannot answer."""
        with self.read_engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def fenced(self, claim: Claim) -> Database:
        """This database as the holder of `claim` sees it: every statement runs on the connection holding
        the job's lock, so none runs once the lock is lost. Itself where locks do not live in connections."""
        if claim.connection is None:
            return self

        def sessions() -> Session:
            if not claim.held():
                raise LockLost(f"job {claim.job_id}'s lock went with its database connection")
            return Session(claim.connection, expire_on_commit=False)
        fenced = copy.copy(self)
        fenced.sessions = fenced.read_sessions = sessions
        return fenced

    def _id(self, model: type[WorkloadRow] | type[TargetRow], values: dict) -> int:
        """The row id for a key, inserting the row the first time; safe when writers race to insert it."""
        cache_key = (model.__tablename__, values["key"])
        with self._ids_lock:
            if cache_key in self._ids:
                return self._ids[cache_key]
        by_key = select(model.id).where(model.key == values["key"])
        with self.sessions() as session:
            found = session.scalar(by_key)
            if found is None:
                try:
                    found = session.scalar(insert(model).values(**values).returning(model.id))
                    session.commit()
                except IntegrityError:  # another writer inserted it first
                    session.rollback()
                    found = session.scalar(by_key)
        with self._ids_lock:
            self._ids[cache_key] = found
        return found

    def _row(self, job_id: int | None, measure_input: MeasureInput, result: MeasureResult, *version: int | None
             ) -> dict:
        """The row of a measurement, of the template version given (an imported one's), else of today's."""
        workload, target = measure_input.workload, measure_input.target
        return {"job_id": job_id, "workload_id": self._id(WorkloadRow, workload_values(workload)),
                "target_id": self._id(TargetRow, target_values(target)),
                "template_version": version[0] if version else template_version(workload, target),
                **measurement_values(measure_input, result)}

    def record(self, measure_input: MeasureInput, result: MeasureResult, job_id: int | None = None) -> int:
        """Store one measurement, made with today's template, and commit it; returns its id."""
        row = self._row(job_id, measure_input, result)
        with self.sessions() as session:
            new_id = session.scalar(insert(MeasurementRow).values(**row).returning(MeasurementRow.id))
            session.execute(typical.OF_CONFIG, {key: row[key] for key in ("workload_id", "target_id", "config_index")})
            session.commit()
        return new_id

    def record_many(self, measurements: Iterable[tuple], job_id: int | None = None, batch: int = 10_000) -> int:
        """Store many measurements (an imported log, a benchmark fill), one transaction per batch: each a
        (MeasureInput, MeasureResult) pair made with today's template, or a triple whose third item is the
        template version it was made with (None: unversioned). The typical measurement of each config is flagged
        once all are stored (db/typical.py), for each workload and target they are of: until then the best query
        reads them as it read the rows before."""
        count, rows, pairs = 0, [], set()
        with self.sessions() as session:
            for measured in measurements:
                rows.append(self._row(job_id, *measured))
                pairs.add((rows[-1]["workload_id"], rows[-1]["target_id"]))
                if len(rows) == batch:
                    count += self._insert(session, rows)
                    rows = []
            count += self._insert(session, rows)
            for workload_id, target_id in sorted(pairs):
                session.execute(typical.OF_PAIR, {"workload_id": workload_id, "target_id": target_id})
            session.commit()
            return count

    @staticmethod
    def _insert(session: Session, rows: list[dict]) -> int:
        if rows:
            session.execute(insert(MeasurementRow), rows)
            session.commit()
        return len(rows)

    def best(self, workload: Workload, target: Target | str, limit: int = 1) -> list[Record]:
        """The fastest ok measurements of the workload on exactly this target, best first."""
        with self.read_sessions() as session:
            return best_records(session, workload, Target.parse(target), limit)

    def nearest_shapes(self, workload: Workload, target: Target | str) -> list[Workload]:
        """The other shapes of the workload's op and options measured ok on exactly this target, nearest first."""
        with self.read_sessions() as session:
            return nearest_shapes(workload, stored_workloads(session, workload.op, Target.parse(target)))

    def identities(self, workload: Workload, target: Target | str) -> set[tuple]:
        """`queries.identity` of every stored measurement of the workload on the target."""
        with self.read_sessions() as session:
            return measurement_identities(session, workload, Target.parse(target))

    def count(self, workload: Workload, target: Target | str, config_index: int | None = None) -> int:
        with self.read_sessions() as session:
            return count_records(session, workload, Target.parse(target), config_index)

    def template_versions(self, workload: Workload, target: Target | str) -> dict[int | None, int]:
        """How many measurements of the workload on exactly this target each template version has (None:
        unversioned): whether those stored are stale."""
        with self.read_sessions() as session:
            return template_versions(session, workload, Target.parse(target))

    def records(self, batch: int = 1000) -> Iterator[Record]:
        """Every measurement, oldest first, streamed."""
        return self._records(select(MeasurementRow), batch)

    def job_records(self, job_id: int) -> list[Record]:
        """What a job has measured so far, oldest first: what a resumed job starts from."""
        return list(self._records(select(MeasurementRow).where(MeasurementRow.job_id == job_id)))

    def known_records(self, workload: Workload, target: Target | str, job_id: int) -> list[Record]:
        """Every measurement of the workload on exactly this target outside job `job_id` that applies today
        (`queries.applies`), oldest first: what a new job of it starts from (configs not measured again, a cost
        model trained on them). A stale config is measured again."""
        statement = KNOWN.params(pair(workload, Target.parse(target)) | {"job": job_id})
        return list(filter(applies, self._records(statement)))

    def op_records(self, op: str, target: Target | str, exclude: Workload | None = None) -> dict[Workload, list[Record]]:
        """Measurements of the other shapes of an op on exactly this target that apply today (for transfer
        learning)."""
        workload_ids = select(WorkloadRow.id).where(WorkloadRow.op == op, WorkloadRow.key != (exclude.key if exclude else ""))
        target_id = select(TargetRow.id).where(TargetRow.key == str(Target.parse(target))).scalar_subquery()
        found: dict[Workload, list[Record]] = {}
        statement = select(MeasurementRow).where(MeasurementRow.workload_id.in_(workload_ids),
                                                 MeasurementRow.target_id == target_id)
        for record in filter(applies, self._records(statement)):
            found.setdefault(record.input.workload, []).append(record)
        return found

    def _records(self, statement, batch: int = 1000) -> Iterator[Record]:
        workloads: dict[int, Workload] = {}
        targets: dict[int, Target] = {}
        with self.sessions() as session:
            for row in session.scalars(statement.order_by(MeasurementRow.id).execution_options(yield_per=batch)):
                if row.workload_id not in workloads:
                    workloads[row.workload_id] = Workload.from_key(session.get(WorkloadRow, row.workload_id).key)
                if row.target_id not in targets:
                    targets[row.target_id] = target_from_row(session.get(TargetRow, row.target_id))
                yield record_from_row(row, workloads[row.workload_id], targets[row.target_id])

    def pairs(self) -> list[tuple[Workload, Target]]:
        """Every (workload, target) that has measurements."""
        query = (select(WorkloadRow.key, TargetRow).distinct()
                 .join(MeasurementRow, MeasurementRow.workload_id == WorkloadRow.id)
                 .join(TargetRow, TargetRow.id == MeasurementRow.target_id))
        with self.sessions() as session:
            return [(Workload.from_key(key), target_from_row(row)) for key, row in session.execute(query)]

    def job_row(self, workload: Workload, target: Target | str, tuner: str, trials: int, status: str) -> dict:
        """The values of a new job's row, its workload and target stored first (once each)."""
        row = {"workload_id": self._id(WorkloadRow, workload_values(workload)),
               "target_id": self._id(TargetRow, target_values(Target.parse(target))),
               "tuner": tuner, "trials": trials, "status": status}
        if status == "running":
            row["started_at"] = utcnow()
        return row

    def create_job(self, workload: Workload, target: Target | str, tuner: str, trials: int, status: str = "queued",
                   before_commit: Callable[[int], object] | None = None) -> int:
        """A new tuning job; returns its id. `before_commit(id)` runs while nobody else can see the job yet
        (db/queue.py takes the job's lock there)."""
        return self._create_jobs(self.job_row(workload, target, tuner, trials, status), [], before_commit)

    def create_model_job(self, model: str | None, workloads: Sequence[Workload], target: Target | str, tuner: str,
                         trials: int, status: str = "queued",
                         before_commit: Callable[[int], object] | None = None) -> int:
        """A model job named `model` and under it one job per task workload, committed together (so a model
        job is never seen without its tasks); returns the model job's id. Each task's job starts with the
        whole budget as its `trials`, and is given its share when the model job ends."""
        tasks = [self.job_row(workload, target, tuner, trials, status) for workload in workloads]
        return self._create_jobs(tasks[0] | {"model": model}, tasks, before_commit)

    def _create_jobs(self, row: dict, tasks: list[dict], before_commit: Callable[[int], object] | None) -> int:
        with self.sessions() as session:
            new_id = session.scalar(insert(JobRow).values(**row).returning(JobRow.id))
            if tasks:
                session.execute(insert(JobRow), [task | {"parent_id": new_id} for task in tasks])
            if before_commit:
                before_commit(new_id)
            session.commit()
        return new_id

    def update_job(self, job_id: int, status: str, error: str = "", trials: int | None = None,
                   waiting: str = "") -> None:
        """Move a job to `status`, stamping when it started or finished (and setting its budget to `trials`,
        when given: a model's task job gets its share), waiting for what `waiting` says (a queued job's host)."""
        if status not in JOB_STATUSES:
            raise ValueError(f"unknown job status {status!r}; known: {', '.join(JOB_STATUSES)}")
        values: dict = {"status": status, "error": error, "waiting": waiting}
        if trials is not None:
            values["trials"] = trials
        if status == "running":
            values["started_at"] = utcnow()
        elif status in FINISHED:
            values["finished_at"] = utcnow()
        with self.sessions() as session:
            if session.execute(update(JobRow).where(JobRow.id == job_id).values(**values)).rowcount != 1:
                raise KeyError(f"no job {job_id}")
            session.commit()

    def finish_job(self, job_id: int, status: str) -> None:
        """Move a running job to `status` (done, failed, cancelled); one that left `running` meanwhile
        (cancelled through the API during its last batch) keeps what it was given."""
        with self.sessions() as session:
            session.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == "running")
                            .values(status=status, finished_at=utcnow()))
            session.commit()

    def job(self, job_id: int) -> Job:
        with self.sessions() as session:
            row = session.get(JobRow, job_id)
            if row is None:
                raise KeyError(f"no job {job_id}")
            return self._job(session, row)

    def children(self, job_id: int) -> list[Job]:
        """The jobs of a model job's tasks, in the order of its workloads."""
        with self.sessions() as session:
            rows = session.scalars(select(JobRow).where(JobRow.parent_id == job_id).order_by(JobRow.id)).all()
            return [self._job(session, row) for row in rows]

    @staticmethod
    def _requests(target: Target | str, tuner: str, trials: int, *where) -> Select:
        """Jobs of this target, tuner and budget, newest first."""
        return (select(JobRow).join(TargetRow, TargetRow.id == JobRow.target_id)
                .where(TargetRow.key == str(Target.parse(target)), JobRow.tuner == tuner, JobRow.trials == trials,
                       *where)
                .order_by(JobRow.id.desc()))

    def _single_job(self, workload: Workload, target: Target | str, tuner: str, trials: int, *where) -> Job | None:
        statement = self._requests(target, tuner, trials, SINGLE_JOB, *where).join(
            WorkloadRow, WorkloadRow.id == JobRow.workload_id).where(WorkloadRow.key == workload.key).limit(1)
        with self.sessions() as session:
            row = session.scalars(statement).first()
            return self._job(session, row) if row is not None else None

    def unfinished_job(self, workload: Workload, target: Target | str, tuner: str, trials: int) -> Job | None:
        """The newest single job of exactly this request that is neither done nor failed: the one to resume."""
        return self._single_job(workload, target, tuner, trials, JobRow.status.not_in(("done", "failed")))

    def done_job(self, workload: Workload, target: Target | str, tuner: str, trials: int) -> Job | None:
        """The newest single job of exactly this request that ran to its end with records of today's template
        version: a rerun shows it, not tunes again (one whose records are all stale is tuned anew)."""
        current = select(MeasurementRow.id).where(
            MeasurementRow.job_id == JobRow.id,
            MeasurementRow.template_version == template_version(workload, Target.parse(target))).exists()
        return self._single_job(workload, target, tuner, trials, JobRow.status == "done", current)

    def unfinished_model_job(self, model: str | None, workloads: Sequence[Workload], target: Target | str, tuner: str,
                             trials: int) -> Job | None:
        """The newest model job of exactly this request (its name, and tasks of the same workloads) that is
        neither done nor failed: the one to resume."""
        return self._model_job(model, workloads, target, tuner, trials, JobRow.status.not_in(("done", "failed")))

    def done_model_job(self, model: str | None, workloads: Sequence[Workload], target: Target | str, tuner: str,
                       trials: int) -> Job | None:
        """The newest model job of exactly this request that ran to its end: a rerun shows it, not tunes again."""
        return self._model_job(model, workloads, target, tuner, trials, JobRow.status == "done")

    def _model_job(self, model: str | None, workloads: Sequence[Workload], target: Target | str, tuner: str,
                   trials: int, status) -> Job | None:
        named = JobRow.model.is_(None) if model is None else JobRow.model == model
        wanted = {workload.key for workload in workloads}
        tasks = select(WorkloadRow.key).join(JobRow, JobRow.workload_id == WorkloadRow.id)
        with self.sessions() as session:
            for row in session.scalars(self._requests(target, tuner, trials, named, MODEL_JOB, status)):
                if set(session.scalars(tasks.where(JobRow.parent_id == row.id))) == wanted:
                    return self._job(session, row)
        return None

    @staticmethod
    def _job(session: Session, row: JobRow) -> Job:
        workload = Workload.from_key(session.get(WorkloadRow, row.workload_id).key)
        target = target_from_row(session.get(TargetRow, row.target_id))
        return Job(row.id, workload, target, row.tuner, row.trials, row.status, row.created_at,
                   row.started_at, row.finished_at, row.error, row.parent_id, row.model, row.waiting)
