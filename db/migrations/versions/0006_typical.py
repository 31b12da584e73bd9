"""Typical measurements: `measurements.typical` flags the one measurement of each config (and template version) that
the best query ranks it by, the upper median of its ok measurements by median time (db/typical.py): a tuning job
measures its finalists again, and a config counts at its typical time, not its luckiest. The best-record index
gains the flag after the outcome, so that the best query stays one seek; `ix_measurements_config` finds a config's
measurements when one more is stored. Existing rows are flagged as db/typical.py flags them.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""
from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

from db.typical import flagging

revision: str = "0006"
down_revision: Union[str, Sequence[str], None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

_BEST_BEFORE = ["workload_id", "target_id", "outcome", "template_version", "median_seconds", "id"]
_BEST_AFTER = ["workload_id", "target_id", "outcome", "typical", "template_version", "median_seconds", "id"]
_CONFIG = ["workload_id", "target_id", "config_index"]


def upgrade() -> None:
    op.add_column("measurements", sa.Column("typical", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index("ix_measurements_config", "measurements", _CONFIG)
    op.execute(flagging("1 = 1"))
    op.drop_index("ix_measurements_best", "measurements")
    op.create_index("ix_measurements_best", "measurements", _BEST_AFTER)


def downgrade() -> None:
    op.drop_index("ix_measurements_best", "measurements")
    op.create_index("ix_measurements_best", "measurements", _BEST_BEFORE)
    op.drop_index("ix_measurements_config", "measurements")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("typical")
