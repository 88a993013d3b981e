"""candidate: partial index of the open candidates

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 01:40:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OPEN = sa.text("state != 'done'")


def upgrade() -> None:
    # Only the open candidates (a few per job): the fleet asks whether a round closed after
    # every write, and the sweeper looks for open work; both scanned the whole ledger.
    op.create_index("ix_candidate_open", "candidate", ["job_id", "round"],
                    postgresql_where=OPEN, sqlite_where=OPEN)


def downgrade() -> None:
    op.drop_index("ix_candidate_open", table_name="candidate")
