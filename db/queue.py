"""The jobs table as a queue: list, claim, cancel; and the job `tensortune tune` runs itself.

Whoever runs a job holds its lock (db/job_locks.py) for as long as it runs it. A claim takes the
oldest queued job, or a `running` one whose runner died, that no live process holds. On
PostgreSQL the queue is read with `FOR UPDATE SKIP LOCKED`, so service replicas sharing the
database never take the same row; on SQLite every writer waits its turn anyway.
"""
from __future__ import annotations

import threading

from sqlalchemy import func, select, update

from search_space import Target, Workload

from .job_locks import Claim, job_locks
from .models import JobRow, MeasurementRow, utcnow
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

    def claim(self) -> Claim | None:
        """The oldest job nobody runs, now `running` and this caller's; None when there is none."""
        query = select(JobRow.id, JobRow.status).where(JobRow.status.in_(ACTIVE)).order_by(JobRow.created_at, JobRow.id)
        if self.postgres:
            query = query.with_for_update(skip_locked=True)
        with self._claiming, self.database.sessions() as session:
            for job_id, status in session.execute(query).all():
                claim = self.locks.acquire(job_id)
                if claim is None:
                    continue  # running, and its runner is alive
                moved = session.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == status)
                                        .values(status="running", started_at=utcnow(), error="")).rowcount
                session.commit()
                if moved:
                    return claim
                claim.release()  # it moved on (cancelled) between the read and the update
            return None

    def own(self, workload: Workload, target: Target, tuner: str, trials: int) -> Claim:
        """The unfinished job of exactly this request, or a new one, held by this caller (`tensortune
        tune` runs it in-process); JobBusy if another live process runs it."""
        job = self.database.unfinished_job(workload, target, tuner, trials)
        if job is None:
            held: list[Claim | None] = []
            self.database.create_job(workload, target, tuner, trials, "running",
                                     before_commit=lambda job_id: held.append(self.locks.acquire(job_id)))
            if held[0] is not None:
                return held[0]
            raise JobBusy("a new job's lock was taken before it was committed; is its lock file shared?")
        claim = self.locks.acquire(job.id)
        if claim is None:
            raise JobBusy(f"job {job.id} ({workload.key} on {target}, {tuner}, {trials} trials) is being run by "
                          "another process (a tensortune service?); wait for it, or cancel it and run again")
        return claim

    def cancel(self, job_id: int) -> Job:
        """Cancel a queued or running job (its runner stops after the batch in flight); raises KeyError
        for an unknown id. A finished job is returned unchanged."""
        with self.database.sessions() as session:
            session.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status.in_(ACTIVE))
                            .values(status="cancelled", finished_at=utcnow()))
            session.commit()
        return self.database.job(job_id)

    def jobs(self, limit: int = 100) -> list[Job]:
        """The newest jobs first."""
        with self.database.sessions() as session:
            rows = session.scalars(select(JobRow).order_by(JobRow.id.desc()).limit(limit)).all()
            return [Database._job(session, row) for row in rows]

    def progress(self, job_ids: list[int]) -> dict[int, tuple[int, float]]:
        """(candidates measured, best GFLOPS) per job that has measurements, in one query."""
        query = (select(MeasurementRow.job_id, func.count(), func.max(MeasurementRow.gflops))
                 .where(MeasurementRow.job_id.in_(job_ids)).group_by(MeasurementRow.job_id))
        with self.database.read_sessions() as session:
            return {job_id: (count, best) for job_id, count, best in session.execute(query)}
