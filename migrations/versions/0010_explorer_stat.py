"""explorer_stat: each explorer process's proposals and model fits, for GET /metrics

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "explorer_stat",
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("proposals", sa.Integer(), nullable=False),
        sa.Column("seconds_sum", sa.Float(), nullable=False),
        sa.Column("buckets", sa.JSON(), nullable=False),
        sa.Column("fits_scratch", sa.Integer(), nullable=False),
        sa.Column("fits_extend", sa.Integer(), nullable=False),
        sa.Column("proposed", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_explorer_stat")),
    )


def downgrade() -> None:
    op.drop_table("explorer_stat")
