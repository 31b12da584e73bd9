"""Client requests: `client_requests`, one row per workload and target that clients built a fallback config for
(db/served.py reports it, db/client_requests.py records it): when it was first and last asked, how often, and the
job that tunes it. A new table, so existing rows are untouched.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, Sequence[str], None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "client_requests",
        sa.Column("id", row_id, primary_key=True),
        sa.Column("workload_id", row_id, sa.ForeignKey("workloads.id"), nullable=False),
        sa.Column("target_id", row_id, sa.ForeignKey("targets.id"), nullable=False),
        sa.Column("first_asked", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_asked", sa.DateTime(timezone=True), nullable=False),
        sa.Column("times_asked", sa.Integer(), nullable=False),
        sa.Column("job_id", row_id, sa.ForeignKey("jobs.id"), nullable=True),
        sa.UniqueConstraint("workload_id", "target_id", name="uq_client_requests_pair"),
    )


def downgrade() -> None:
    op.drop_table("client_requests")
