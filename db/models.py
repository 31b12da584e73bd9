"""The tables: workloads, targets, tuning jobs and measurements, as typed SQLAlchemy 2 models.

Migrations (db/migrations) create these tables; the models are how the code reads and writes
them. Workloads and targets are stored once each and referenced by id, so the best-config
query is one seek on `ix_measurements_best` (workload, target, outcome, typical, template version, median
seconds).
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (JSON, BigInteger, Boolean, CheckConstraint, DateTime, Float, ForeignKey, Index, Integer, String,
                        Text, TypeDecorator, UniqueConstraint, false)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from workers import Outcome

JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit identity.
Id = BigInteger().with_variant(Integer, "sqlite")


class UtcDateTime(TypeDecorator):
    """Timezone-aware UTC on the way out, whatever the backend keeps (SQLite has no time zones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is not None and dialect.name == "sqlite":
            return value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class WorkloadRow(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    op: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(16))


class TargetRow(Base):
    __tablename__ = "targets"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str] = mapped_column(String(128))  # llvm: CPU name; cuda: device name
    features: Mapped[str] = mapped_column(String(256))  # llvm: vector features, comma-separated, sorted
    threads: Mapped[int] = mapped_column(Integer)
    arch: Mapped[str] = mapped_column(String(32))  # cuda: compute capability, sm_XY


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_queue", "status", "created_at"),
        Index("ix_jobs_parent", "parent_id"),
        CheckConstraint(f"status IN {JOB_STATUSES}", name="ck_jobs_status"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    tuner: Mapped[str] = mapped_column(String(32))
    trials: Mapped[int] = mapped_column(Integer)  # the budget
    status: Mapped[str] = mapped_column(String(16), default="queued")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    error: Mapped[str] = mapped_column(Text, default="")
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))  # the model job of a task's job
    model: Mapped[str | None] = mapped_column(String(128))  # a model job's name, if it was given one
    waiting: Mapped[str] = mapped_column(String(256), server_default="")  # a queued job's missing worker host


class MeasurementRow(Base):
    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_best", "workload_id", "target_id", "outcome", "typical", "template_version",
              "median_seconds", "id"),
        Index("ix_measurements_config", "workload_id", "target_id", "config_index"),
        Index("ix_measurements_job", "job_id"),
        CheckConstraint(f"outcome IN {tuple(o.value for o in Outcome)}", name="ck_measurements_outcome"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    config_index: Mapped[int] = mapped_column(BigInteger)
    config: Mapped[dict] = mapped_column(JSON)  # {"index", "knobs"}; json, not jsonb, keeps knob order
    template_version: Mapped[int | None] = mapped_column(Integer)  # search_space.template_version; null: unversioned
    # the config's typical ok measurement of its template version (db/typical.py): the one the best query ranks
    typical: Mapped[bool] = mapped_column(Boolean, server_default=false())
    outcome: Mapped[str] = mapped_column(String(16))  # workers.Outcome value
    samples: Mapped[list] = mapped_column(JSON)  # seconds per call, every timing sample
    mean_seconds: Mapped[float | None] = mapped_column(Float)
    median_seconds: Mapped[float | None] = mapped_column(Float)
    gflops: Mapped[float] = mapped_column(Float)
    flops: Mapped[int] = mapped_column(BigInteger)
    compile_seconds: Mapped[float] = mapped_column(Float)
    worker: Mapped[str] = mapped_column(String(128))
    host: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    error: Mapped[str] = mapped_column(Text)
    phases: Mapped[dict] = mapped_column(JSON)


class ClientRequestRow(Base):
    """A workload and target a client built without a stored config for (db/served.py), and the job tuning it."""

    __tablename__ = "client_requests"
    __table_args__ = (UniqueConstraint("workload_id", "target_id", name="uq_client_requests_pair"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    first_asked: Mapped[datetime] = mapped_column(UtcDateTime)
    last_asked: Mapped[datetime] = mapped_column(UtcDateTime)
    times_asked: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))  # the job queued for it, or one that was already
