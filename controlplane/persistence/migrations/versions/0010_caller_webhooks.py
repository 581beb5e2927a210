"""Caller webhooks: a task's subscription, the messages to send and every delivery attempt.

Revision ID: 0010_caller_webhooks
Revises: 0009_poll_due_index
Create Date: 2026-12-01

``generation_tasks.webhook_url`` / ``webhook_events`` (NULL: no webhook) are written by
CreateTask in its one statement. ``webhook_messages`` is the durable outbox of caller webhooks:
a row is inserted in the transaction of the task event it announces, and the delivery worker
claims the PENDING ones whose ``next_attempt_at`` is due (a partial index holds only those).
``webhook_attempts`` records each POST (status, error, duration).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0010_caller_webhooks"
down_revision: str | None = "0009_poll_due_index"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


# Plain ALTER TABLE on both databases, as in 0005: a batch operation would rebuild
# generation_tasks on SQLite, which the rows referencing it forbid.
def upgrade() -> None:
    op.add_column("generation_tasks", sa.Column("webhook_url", sa.Text(), nullable=True))
    op.add_column("generation_tasks", sa.Column("webhook_events", sa.Integer(), nullable=True))
    op.create_table(
        "webhook_messages",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _ts("next_attempt_at", nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_messages"),
        sa.ForeignKeyConstraint(
            ["task_id"], ["generation_tasks.id"], name="fk_webhook_messages_task_id"
        ),
        sa.CheckConstraint(
            "state IN ('PENDING', 'DELIVERED', 'FAILED', 'REFUSED')",
            name="ck_webhook_messages_state_enum",
        ),
    )
    op.create_index("ix_webhook_messages_task_id", "webhook_messages", ["task_id"])
    pending = sa.text("state = 'PENDING'")
    op.create_index(
        "ix_webhook_messages_due",
        "webhook_messages",
        ["next_attempt_at"],
        postgresql_where=pending,
        sqlite_where=pending,
    )
    op.create_table(
        "webhook_attempts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        _ts("sent_at"),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_attempts"),
        sa.ForeignKeyConstraint(
            ["message_id"], ["webhook_messages.id"], name="fk_webhook_attempts_message_id"
        ),
        sa.UniqueConstraint("message_id", "attempt_no", name="uq_webhook_attempts_message_attempt"),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_index("ix_webhook_messages_due", table_name="webhook_messages")
    op.drop_index("ix_webhook_messages_task_id", table_name="webhook_messages")
    op.drop_table("webhook_messages")
    op.drop_column("generation_tasks", "webhook_events")
    op.drop_column("generation_tasks", "webhook_url")
