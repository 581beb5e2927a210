"""Attempt evidence: a held job the provider no longer knows, and late lookups of ABANDONED ones.

Revision ID: 0003_attempt_evidence
Revises: 0002_execution
Create Date: 2026-12-01

Three nullable columns on ``attempt_runtime``:

* ``job_not_found_since``: when polls of the attempt's job started answering NOT_FOUND (reset
  by the next real status); the poller abandons the attempt once this is old enough.
* ``late_found_job_id`` / ``late_found_method``: what the background lookup of an ABANDONED
  attempt found, recorded for reconciliation and never applied to the task (9.17.5).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_attempt_evidence"
down_revision: str | None = "0002_execution"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("attempt_runtime") as batch:
        batch.add_column(sa.Column("job_not_found_since", sa.DateTime(timezone=True)))
        batch.add_column(sa.Column("late_found_job_id", sa.Text()))
        batch.add_column(sa.Column("late_found_method", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("attempt_runtime") as batch:
        batch.drop_column("late_found_method")
        batch.drop_column("late_found_job_id")
        batch.drop_column("job_not_found_since")
