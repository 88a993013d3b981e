"""task: fp32_tc baselines are cuDNN fp32 now; forget the cuDNN fp16 ones stored before

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 22:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A task without a baseline gets one timed with its next measurement (workers/tasks.py),
    # now against cuDNN fp32 (store/baselines.py).
    op.execute(sa.text("UPDATE task SET baseline_us = NULL, baseline_backend = NULL "
                       "WHERE precision = 'fp32_tc'"))


def downgrade() -> None:
    pass  # the fp16 baselines are not kept; an older version times them again
