"""Template versions: `measurements.template_version`, the version of the schedule template a record was
measured with (search_space.template_version), so that best queries never apply a record whose config
meant other code. Null: unversioned (an imported AutoTVM log without the field).

Rows of revision 0003 were measured with today's templates, version 1. The best-record index gains the
version before the median time, so that the best query of one version stays one seek.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: Union[str, Sequence[str], None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_BEST_BEFORE = ["workload_id", "target_id", "outcome", "median_seconds", "id"]
_BEST_AFTER = ["workload_id", "target_id", "outcome", "template_version", "median_seconds", "id"]


def upgrade() -> None:
    op.add_column("measurements", sa.Column("template_version", sa.Integer(), nullable=True))
    op.execute("UPDATE measurements SET template_version = 1")
    op.drop_index("ix_measurements_best", "measurements")
    op.create_index("ix_measurements_best", "measurements", _BEST_AFTER)


def downgrade() -> None:
    op.drop_index("ix_measurements_best", "measurements")
    op.create_index("ix_measurements_best", "measurements", _BEST_BEFORE)
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("template_version")
