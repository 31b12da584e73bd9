"""Model jobs: a job may group the jobs of a model's tuning tasks (tuner/scheduler.py).

`jobs.parent_id` is the model job a task's job belongs to; `jobs.model` names a model job ("bert-layer"),
null for an unnamed one and for every other job. Both are added as nullable columns with the foreign key
inline, which SQLite's ALTER TABLE ADD COLUMN accepts, so no table is copied and existing rows stay as
they are: every job of revision 0001 is a single job.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    job_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.add_column("jobs", sa.Column("parent_id", job_id, sa.ForeignKey("jobs.id"), nullable=True),
                  inline_references=True)
    op.add_column("jobs", sa.Column("model", sa.String(128), nullable=True))
    op.create_index("ix_jobs_parent", "jobs", ["parent_id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_parent", "jobs")
    with op.batch_alter_table("jobs") as batch:  # SQLite drops a referencing column by copying the table
        batch.drop_column("model")
        batch.drop_column("parent_id")
