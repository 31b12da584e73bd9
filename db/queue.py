"""The jobs table as a queue: list, claim, cancel.

PostgreSQL: several service replicas may share one database. A claim reads the queue with
`FOR UPDATE SKIP LOCKED`, so two replicas never take the same row, and the claimer holds a
session advisory lock on the job for as long as it runs it, on a connection of its own. A job
left `running` whose lock nobody holds lost its runner (the process died, and its connection
with it) and is claimed again. SQLite: one runner process per database file; jobs it finds
`running` when it starts are the ones a killed service left, and go back to the queue.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import Connection, func, select, text, update

from .models import JobRow, MeasurementRow, utcnow
from .store import Database, Job

ADVISORY_NAMESPACE = 0x7474  # first key of the two-key advisory lock; the job id is the second
ACTIVE = ("queued", "running")


@dataclass
class Claim:
    """A job this process runs; `release` it when the run ends, however it ends."""

    job_id: int
    lock: Connection | None  # PostgreSQL: the connection holding the job's advisory lock

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()  # ends the session, and with it the advisory lock


class JobQueue:
    def __init__(self, database: Database):
        self.database = database
        self.postgres = database.engine.dialect.name == "postgresql"
        self._claiming = threading.Lock()  # SQLite: claims of this process's runner threads, one at a time

    def requeue_orphans(self) -> int:
        """SQLite, at runner start: jobs left `running` by a killed service go back to the queue."""
        if self.postgres:
            return 0
        with self.database.sessions() as session:
            moved = session.execute(update(JobRow).where(JobRow.status == "running").values(status="queued")).rowcount
            session.commit()
        return moved

    def claim(self) -> Claim | None:
        """The oldest job nobody runs, now `running` and this caller's; None when there is none."""
        with self._claiming:
            lock = self.database.engine.connect().execution_options(isolation_level="AUTOCOMMIT") \
                if self.postgres else None
            claimed = self._claim(lock)
            if claimed is None and lock is not None:
                lock.close()
            return Claim(claimed, lock) if claimed is not None else None

    def _claim(self, lock: Connection | None) -> int | None:
        statuses = ACTIVE if self.postgres else ("queued",)
        query = select(JobRow.id, JobRow.status).where(JobRow.status.in_(statuses)).order_by(JobRow.created_at, JobRow.id)
        if self.postgres:
            query = query.with_for_update(skip_locked=True)
        with self.database.sessions() as session:
            for job_id, status in session.execute(query).all():
                if lock is not None and not lock.scalar(text("SELECT pg_try_advisory_lock(:space, :id)"),
                                                        {"space": ADVISORY_NAMESPACE, "id": job_id}):
                    continue  # running, and its runner is alive
                moved = session.execute(update(JobRow).where(JobRow.id == job_id, JobRow.status == status)
                                        .values(status="running", started_at=utcnow(), error="")).rowcount
                session.commit()
                if moved:
                    return job_id
                if lock is not None:  # it moved on (cancelled) between the read and the update
                    lock.scalar(text("SELECT pg_advisory_unlock(:space, :id)"), {"space": ADVISORY_NAMESPACE, "id": job_id})
            return None

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
