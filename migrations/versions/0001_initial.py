"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-22 01:44:48.450207
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "task",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("shape_key", sa.String(length=160), nullable=False),
        sa.Column("precision", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task")),
        sa.UniqueConstraint("key", name=op.f("uq_task_key")),
    )
    with op.batch_alter_table("task", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_target"), ["target"], unique=False)

    op.create_table(
        "worker",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("gpu_model", sa.String(length=128), nullable=False),
        sa.Column("sm", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(length=32), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_worker")),
    )
    with op.batch_alter_table("worker", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_worker_target"), ["target"], unique=False)

    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(length=32), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["task_id"], ["task.id"], name=op.f("fk_job_task_id_task"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job")),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_task_id"), ["task_id"], unique=False)

    op.create_table(
        "candidate",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("schedule", sa.JSON(), nullable=False),
        sa.Column("schedule_hash", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("build_status", sa.String(length=16), nullable=True),
        sa.Column("build_log", sa.Text(), nullable=True),
        sa.Column("artifact", sa.String(length=128), nullable=True),
        sa.Column("lease_owner", sa.String(length=128), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_candidate_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["task.id"], name=op.f("fk_candidate_task_id_task"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_candidate")),
        sa.UniqueConstraint(
            "job_id", "schedule_hash", name=op.f("uq_candidate_job_id_schedule_hash")
        ),
    )
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.create_index("ix_candidate_job_state", ["job_id", "state"], unique=False)

    op.create_table(
        "measurement",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("schedule", sa.JSON(), nullable=False),
        sa.Column("schedule_hash", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("median_us", sa.Float(), nullable=True),
        sa.Column("iqr_us", sa.Float(), nullable=True),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["job.id"], name=op.f("fk_measurement_job_id_job"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["task.id"], name=op.f("fk_measurement_task_id_task"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurement")),
        sa.UniqueConstraint(
            "task_id", "schedule_hash", name=op.f("uq_measurement_task_id_schedule_hash")
        ),
    )
    with op.batch_alter_table("measurement", schema=None) as batch_op:
        batch_op.create_index("ix_measurement_job_id_id", ["job_id", "id"], unique=False)

    op.create_table(
        "best_schedule",
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("measurement_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["measurement_id"],
            ["measurement.id"],
            name=op.f("fk_best_schedule_measurement_id_measurement"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["task.id"], name=op.f("fk_best_schedule_task_id_task"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("task_id", name=op.f("pk_best_schedule")),
    )


def downgrade() -> None:
    op.drop_table("best_schedule")
    with op.batch_alter_table("measurement", schema=None) as batch_op:
        batch_op.drop_index("ix_measurement_job_id_id")

    op.drop_table("measurement")
    with op.batch_alter_table("candidate", schema=None) as batch_op:
        batch_op.drop_index("ix_candidate_job_state")

    op.drop_table("candidate")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_task_id"))
        batch_op.drop_index(batch_op.f("ix_job_status"))

    op.drop_table("job")
    with op.batch_alter_table("worker", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_worker_target"))

    op.drop_table("worker")
    with op.batch_alter_table("task", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_target"))

    op.drop_table("task")
