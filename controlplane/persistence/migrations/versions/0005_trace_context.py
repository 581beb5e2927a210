"""Trace context carried by a task (placeholder).

Revision ID: 0005_trace_context
Revises: 0004_task_exclusions
Create Date: 2026-12-01

Placeholder reserved for this revision; its owner fills in the schema change.
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0005_trace_context"
down_revision: str | None = "0004_task_exclusions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
