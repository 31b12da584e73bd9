"""What a queued job waits for: `jobs.waiting`, e.g. "a GPU worker (sm_90)" while the Ray cluster has no
host for the job's target (service/host_waits.py); empty for every other job. A column with a server default,
which SQLite's ALTER TABLE ADD COLUMN accepts, so existing rows read as waiting for nothing.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("waiting", sa.String(256), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("waiting")
