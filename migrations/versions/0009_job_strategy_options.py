"""job: the options a job gives its strategy

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # NULL: the strategy's defaults, which is what every job before this ran with.
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("strategy_options", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("strategy_options")
