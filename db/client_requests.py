"""Tuning that clients asked for: each workload and target a client built a fallback config for (db/served.py
reports it once per process), and the one job that tunes it.

`ask` records the request (first and last time asked, how often) and queues a job for the pair unless a job of it
is queued, running or done already, whoever queued it; a failed or cancelled one is queued anew at the next ask.
At most `ClientJobs.cap` of these jobs wait in the queue at once: a request past it is recorded, and queued when
asked again with room. The job then runs as any job does (service/runner.py), and the client's next fetch gets its
config. Asks of one pair are taken one at a time: on PostgreSQL each takes the pair's row (`FOR UPDATE`; its unique
key keeps one row per pair), on SQLite the database's write lock before reading.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select, text
from sqlalchemy.exc import IntegrityError

from search_space import Target, Workload

from .models import ClientRequestRow, JobRow, TargetRow, WorkloadRow, utcnow
from .records import target_from_row
from .store import Database

TUNING = ("queued", "running", "done")  # a job in one of these has tuned, or will tune, its pair


@dataclass(frozen=True)
class ClientJobs:
    """The jobs a service queues for clients: their budget and tuner, and how many may wait at once."""

    trials: int = 64
    tuner: str = "xgb"
    cap: int = 32


@dataclass(frozen=True)
class ClientRequest:
    workload: Workload
    target: Target
    first_asked: datetime
    last_asked: datetime
    times_asked: int
    job_id: int | None
    job_status: str | None


class ClientRequests:
    def __init__(self, database: Database):
        self.database = database
        self.sqlite = database.engine.dialect.name == "sqlite"

    def ask(self, workload: Workload, target: Target, jobs: ClientJobs) -> ClientRequest:
        """Record one more ask for the pair, queueing its job if it needs one and the cap leaves room."""
        job = self.database.job_row(workload, target, jobs.tuner, jobs.trials, "queued")
        pair = (ClientRequestRow.workload_id == job["workload_id"], ClientRequestRow.target_id == job["target_id"])
        self._insert_once(pair, job)
        with self.database.sessions() as session:
            if self.sqlite:
                session.execute(text("BEGIN IMMEDIATE"))
            row = session.scalars(select(ClientRequestRow).where(*pair).with_for_update()).one()
            tuning = session.scalar(select(JobRow.id).where(
                JobRow.workload_id == job["workload_id"], JobRow.target_id == job["target_id"],
                JobRow.status.in_(TUNING)).order_by(JobRow.id.desc()).limit(1))
            if tuning is not None:
                row.job_id = tuning
            elif self._waiting(session) < jobs.cap:
                row.job_id = session.scalar(insert(JobRow).values(**job).returning(JobRow.id))
            row.times_asked += 1
            row.last_asked = utcnow()
            session.commit()
            return self._request(session, row)

    def _insert_once(self, pair: tuple, job: dict) -> None:
        """The pair's row, asked 0 times, unless it exists; safe when service replicas race to insert it."""
        with self.database.sessions() as session:
            if session.scalar(select(ClientRequestRow.id).where(*pair)) is not None:
                return
            now = utcnow()
            try:
                session.execute(insert(ClientRequestRow).values(
                    workload_id=job["workload_id"], target_id=job["target_id"], first_asked=now, last_asked=now,
                    times_asked=0))
                session.commit()
            except IntegrityError:  # another replica inserted it first
                session.rollback()

    @staticmethod
    def _waiting(session) -> int:
        """How many jobs of client requests are queued."""
        return session.scalar(select(func.count()).select_from(ClientRequestRow)
                              .join(JobRow, JobRow.id == ClientRequestRow.job_id).where(JobRow.status == "queued"))

    def requests(self, limit: int = 100) -> list[ClientRequest]:
        """The most recently asked first."""
        with self.database.sessions() as session:
            rows = session.scalars(select(ClientRequestRow).order_by(ClientRequestRow.last_asked.desc(),
                                                                     ClientRequestRow.id.desc()).limit(limit)).all()
            return [self._request(session, row) for row in rows]

    @staticmethod
    def _request(session, row: ClientRequestRow) -> ClientRequest:
        workload = Workload.from_key(session.get(WorkloadRow, row.workload_id).key)
        target = target_from_row(session.get(TargetRow, row.target_id))
        status = session.scalar(select(JobRow.status).where(JobRow.id == row.job_id)) if row.job_id else None
        return ClientRequest(workload, target, row.first_asked, row.last_asked, row.times_asked, row.job_id, status)
