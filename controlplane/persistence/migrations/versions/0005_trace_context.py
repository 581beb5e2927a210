"""Trace context carried by a task: ``generation_tasks.trace_context``.

Revision ID: 0005_trace_context
Revises: 0004_task_exclusions
Create Date: 2026-12-01

The W3C ``traceparent`` of the CreateTask call that created the task (``00-<trace id>-<span
id>-<flags>``, 55 characters), NULL when tracing was off. The dispatcher continues the task's
trace from it, so one trace runs from CreateTask to the provider's HTTP request
(`vidroute_core.tracing`). Nullable with no default: rows written before the upgrade simply
start a new trace when they are dispatched.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_trace_context"
down_revision: str | None = "0004_task_exclusions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both databases (SQLite >= 3.35 drops a column in place): a batch
# operation would rebuild generation_tasks on SQLite, which the rows referencing it forbid.
def upgrade() -> None:
    op.add_column("generation_tasks", sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("generation_tasks", "trace_context")
