"""The jobs table as a queue: list, claim, cancel; and the job `tensortune tune` runs itself.

Whoever runs a job holds its lock (db/job_locks.py) for as long as it runs it. A claim takes the
oldest queued single or model job, or a `running` one whose runner died, that no live process holds;
never a model's task job, which only its model job's scheduler (tuner/scheduler.py) runs. On
PostgreSQL the queue is read with `FOR UPDATE SKIP LOCKED`, so service replicas sharing the
database never take the same row; on SQLite every writer waits its turn anyway.
"""
from __future__ import annotations

import threading
from typing import Callable, Collection, Sequence

from sqlalchemy import and_, func, or_, select, true, update
from sqlalchemy.orm import aliased

from search_space import Target, Workload

from .job_locks import Claim, job_locks
from .models import JobRow, MeasurementRow, utcnow
from .queries import MODEL_JOB
from .store import Database, Job

ACTIVE = ("queued", "running")


class JobBusy(RuntimeError):
    """The job of this request is being run by another live process."""


class JobQueue:
    def __init__(self, database: Database):
        self.database = database
        self.postgres = database.engine.dialect.name == "postgresql"
        self.locks = job_locks(database.engine)
        self._claiming = threading.Lock()  # this process's claims, one at a time

    def claim(self, models: Collection[str] | None = None, waiting: Collection[int] = ()) -> Claim | None:
        """The oldest job nobody runs, now `running` and this caller's; None when there is none. `models`
        names the model jobs the caller can run (a service: its presets; None: any), so that a model job
        `tensortune tune-model path.py:fn` left behind waits for that command rather than failing; `waiting`
        names jobs the caller put back to wait for a worker host, left alone until it sees one join."""
        runnable = and_(JobRow.parent_id.is_(None), JobRow.id.not_in(list(waiting)))
        if models is not None:
            runnable = and_(runnable, or_(~MODEL_JOB, JobRow.model.in_(list(models))))
        query = select(JobRow.id, JobRow.status).where(JobRow.status.in_(ACTIVE), runnable).order_by(
            JobRow.created_at, JobRow.id)
        if self.postgres:
            query = query.with_for_update(skip_locked=True)
        with self._claiming, self.database.sessions() as session:
            for job_id, status in session.execute(query).all():
                claim = self.locks.acquire(job_id)
                if claim is None:
                    continue  # running, and its runner is alive
                moved = session.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == status)
                                        .values(status="running", started_at=utcnow(), error="", waiting="")).rowcount
                session.commit()
                if moved:
                    return claim
                claim.release()  # it moved on (cancelled) between the read and the update
            return None

    def model_jobs_active(self) -> bool:
        """Whether a model job is queued or running: until one is, a service need not know its presets (importing
        them imports PyTorch and Inductor, which held its first kernel job 4-6 s on a Zen 3)."""
        with self.database.sessions() as session:
            return session.scalar(select(JobRow.id).where(JobRow.status.in_(ACTIVE), MODEL_JOB).limit(1)) is not None

    def own(self, workload: Workload, target: Target, tuner: str, trials: int) -> Claim:
        """The unfinished job of exactly this request, or a new one, held by this caller (`tensortune
        tune` runs it in-process); JobBusy if another live process runs it."""
        job = self.database.unfinished_job(workload, target, tuner, trials)
        if job is None:
            return self._create_held(lambda lock: self.database.create_job(workload, target, tuner, trials, "running",
                                                                           before_commit=lock))
        return self._held(job, f"{workload.key} on {target}, {tuner}, {trials} trials")

    def own_model(self, model: str | None, workloads: Sequence[Workload], target: Target, tuner: str,
                  trials: int) -> Claim:
        """`own` for a model job (Database.create_model_job): the unfinished one of exactly this request, or a
        new one with its tasks' jobs; the model job's lock stands for its tasks' jobs too."""
        job = self.database.unfinished_model_job(model, workloads, target, tuner, trials)
        if job is None:
            return self._create_held(lambda lock: self.database.create_model_job(model, workloads, target, tuner,
                                                                                 trials, "running", lock))
        return self._held(job, f"model {model or 'job'} on {target}, {tuner}, {trials} trials")

    def _create_held(self, create: Callable[[Callable[[int], object]], int]) -> Claim:
        """A job made by `create(before_commit)`, locked by this caller before anyone else can see it."""
        held: list[Claim | None] = []
        create(lambda job_id: held.append(self.locks.acquire(job_id)))
        if held[0] is not None:
            return held[0]
        raise JobBusy("a new job's lock was taken before it was committed; is its lock file shared?")

    def _held(self, job: Job, request: str) -> Claim:
        claim = self.locks.acquire(job.id)
        if claim is None:
            raise JobBusy(f"job {job.id} ({request}) is being run by another process (a tensortune service?); "
                          "wait for it, or cancel it and run again")
        return claim

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued or running job, a model job with its tasks' jobs (its runner stops after the batch
        in flight); raises KeyError for an unknown id. A finished job is returned unchanged."""
        with self.database.sessions() as session:
            session.execute(update(JobRow).where(or_(JobRow.id == job_id, JobRow.parent_id == job_id),
                                                 JobRow.status.in_(ACTIVE))
                            .values(status="cancelled", finished_at=utcnow(), waiting=""))
            session.commit()
        return self.database.job(job_id)

    def jobs(self, limit: int = 100) -> list[Job]:
        """The newest single and model jobs first (a model's task jobs are its model job's: `Database.children`)."""
        with self.database.sessions() as session:
            rows = session.scalars(select(JobRow).where(JobRow.parent_id.is_(None))
                                   .order_by(JobRow.id.desc()).limit(limit)).all()
            return [Database._job(session, row) for row in rows]

    def progress(self, job_ids: list[int]) -> dict[int, tuple[int, float]]:
        """(candidates measured, best GFLOPS) per job that has measurements, a model job's over its tasks' jobs,
        in one query; the best is a config's at its typical time (`db.typical`), 0.0 before an ok one."""
        measured = aliased(JobRow)  # the job itself, or one of its tasks' jobs
        best = func.max(MeasurementRow.gflops).filter(MeasurementRow.typical == true())
        query = (select(JobRow.id, func.count(), func.coalesce(best, 0.0))
                 .join(measured, or_(measured.id == JobRow.id, measured.parent_id == JobRow.id))
                 .join(MeasurementRow, MeasurementRow.job_id == measured.id)
                 .where(JobRow.id.in_(job_ids)).group_by(JobRow.id))
        with self.database.read_sessions() as session:
            return {job_id: (count, best) for job_id, count, best in session.execute(query)}
