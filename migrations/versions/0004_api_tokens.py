"""api tokens

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 02:11:46.328649
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_token",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_token")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_token_token_hash")),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("submitted_by", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_job_submitted_by"), ["submitted_by"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_job_submitted_by_api_token"),
            "api_token",
            ["submitted_by"],
            ["id"],
            ondelete="SET NULL",
        )


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_job_submitted_by_api_token"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_job_submitted_by"))
        batch_op.drop_column("submitted_by")

    op.drop_table("api_token")
