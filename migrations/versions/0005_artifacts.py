"""artifacts

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 02:17:40.428129
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifact",
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("cubin", sa.LargeBinary(), nullable=False),
        sa.Column("meta", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_artifact")),
    )


def downgrade() -> None:
    op.drop_table("artifact")
