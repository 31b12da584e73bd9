"""Initial schema: workloads, targets, tuning jobs and measurements.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

OUTCOMES = ("ok", "invalid_config", "compile_error", "runtime_error", "wrong_answer", "build_timeout",
            "run_timeout", "worker_lost")
JOB_STATUSES = ("queued", "running", "done", "failed", "cancelled")


def _id() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _json() -> sa.types.TypeEngine:
    return sa.JSON()  # on PostgreSQL json, not jsonb, which would reorder a config's knobs


def _time(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column("id", _id(), primary_key=True),
        sa.Column("key", sa.String(512), nullable=False, unique=True),
        sa.Column("op", sa.String(64), nullable=False),
        sa.Column("params", _json(), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
    )
    op.create_table(
        "targets",
        sa.Column("id", _id(), primary_key=True),
        sa.Column("key", sa.String(512), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("features", sa.String(256), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=False),
        sa.Column("arch", sa.String(32), nullable=False),
    )
    op.create_index("ix_targets_kind", "targets", ["kind"])
    op.create_table(
        "jobs",
        sa.Column("id", _id(), primary_key=True),
        sa.Column("workload_id", _id(), sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("target_id", _id(), sa.ForeignKey("targets.id"), nullable=False),
        sa.Column("tuner", sa.String(32), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        _time("created_at", nullable=False),
        _time("started_at"),
        _time("finished_at"),
        sa.Column("error", sa.Text(), nullable=False),
        sa.CheckConstraint(f"status IN {JOB_STATUSES}", name="ck_jobs_status"),
    )
    op.create_index("ix_jobs_queue", "jobs", ["status", "created_at"])
    op.create_table(
        "measurements",
        sa.Column("id", _id(), primary_key=True),
        sa.Column("job_id", _id(), sa.ForeignKey("jobs.id"), nullable=True),
        sa.Column("workload_id", _id(), sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("target_id", _id(), sa.ForeignKey("targets.id"), nullable=False),
        sa.Column("config_index", sa.BigInteger(), nullable=False),
        sa.Column("config", _json(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("samples", _json(), nullable=False),
        sa.Column("mean_seconds", sa.Float(), nullable=True),
        sa.Column("median_seconds", sa.Float(), nullable=True),
        sa.Column("gflops", sa.Float(), nullable=False),
        sa.Column("flops", sa.BigInteger(), nullable=False),
        sa.Column("compile_seconds", sa.Float(), nullable=False),
        sa.Column("worker", sa.String(128), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        _time("started_at"),
        _time("finished_at"),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("phases", _json(), nullable=False),
        sa.CheckConstraint(f"outcome IN {OUTCOMES}", name="ck_measurements_outcome"),
    )
    op.create_index("ix_measurements_best", "measurements",
                    ["workload_id", "target_id", "outcome", "median_seconds", "id"])
    op.create_index("ix_measurements_job", "measurements", ["job_id"])


def downgrade() -> None:
    op.drop_table("measurements")
    op.drop_table("jobs")
    op.drop_table("targets")
    op.drop_table("workloads")
