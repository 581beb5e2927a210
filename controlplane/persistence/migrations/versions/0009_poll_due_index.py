"""The execution path's due-time indexes: polls and recoveries by due time (design 9.18, 9.20).

Revision ID: 0009_poll_due_index
Revises: 0008_fair_queue_index
Create Date: 2026-12-01

The poller and the recovery worker claim ``attempt_runtime`` rows whose ``next_poll_at`` /
``next_recovery_at`` is due, ``ORDER BY`` that time ``LIMIT n`` with ``SKIP LOCKED``. The
indexes on those columns covered every runtime row ever written, finished attempts included
(their due time is NULL). These partial indexes hold only the rows that can come due: their size
is the jobs in flight, not the history, and the claim reads its ``n`` rows off the front of one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_poll_due_index"
down_revision: str | None = "0008_fair_queue_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DUE = {
    "next_poll_at": ("ix_attempt_runtime_next_poll_at", "ix_attempt_runtime_poll_due"),
    "next_recovery_at": ("ix_attempt_runtime_next_recovery_at", "ix_attempt_runtime_recovery_due"),
}


def upgrade() -> None:
    for column, (old, new) in _DUE.items():
        where = sa.text(f"{column} IS NOT NULL")
        op.create_index(
            new,
            "attempt_runtime",
            [column, "attempt_id"],
            postgresql_where=where,
            sqlite_where=where,
        )
        op.drop_index(old, table_name="attempt_runtime")


def downgrade() -> None:
    for column, (old, new) in _DUE.items():
        op.create_index(old, "attempt_runtime", [column])
        op.drop_index(new, table_name="attempt_runtime")
