"""rate_bucket: per-token request budgets shared by every API process

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 22:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_bucket",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("level", sa.Float(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("granted", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_rate_bucket")),
    )


def downgrade() -> None:
    op.drop_table("rate_bucket")
