"""insight and baseline

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 01:52:42.840722
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.add_column(sa.Column("predicted_us", sa.Float(), nullable=True))

    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("insight", sa.JSON(), nullable=True))

    with op.batch_alter_table("measurement", schema=None) as batch_op:
        batch_op.add_column(sa.Column("predicted_us", sa.Float(), nullable=True))

    with op.batch_alter_table("task", schema=None) as batch_op:
        batch_op.add_column(sa.Column("baseline_us", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("baseline_backend", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task", schema=None) as batch_op:
        batch_op.drop_column("baseline_backend")
        batch_op.drop_column("baseline_us")

    with op.batch_alter_table("measurement", schema=None) as batch_op:
        batch_op.drop_column("predicted_us")

    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("insight")

    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_column("predicted_us")
