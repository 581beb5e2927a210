"""Execution bookkeeping: attempt_runtime and provider_events.

Revision ID: 0002_execution
Revises: 0001_initial
Create Date: 2026-01-02

Matches the `attempt_runtime` and `provider_events` tables of `controlplane.persistence.models`.
Frozen here on purpose: a later change to the tables gets its own revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_execution"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = True) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _count(name: str) -> sa.Column:
    return sa.Column(name, sa.Integer(), nullable=False, server_default=sa.text("0"))


def upgrade() -> None:
    op.create_table(
        "attempt_runtime",
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        _count("submit_retries"),
        sa.Column(
            "supports_idempotency_key", sa.Boolean(), nullable=False,
            server_default=sa.text("false"),
        ),
        _ts("accepted_at"),
        _ts("next_poll_at"),
        sa.Column("poll_phase", sa.Text(), nullable=True),
        _count("polls_in_phase"),
        _count("poll_count"),
        _ts("last_polled_at"),
        _ts("stuck_since"),
        _ts("unknown_since"),
        _ts("next_recovery_at"),
        _count("recovery_queries"),
        _ts("cancel_requested_at"),
        _count("cancel_calls"),
        _count("unrecognized_count"),
        sa.Column("last_unrecognized_status", sa.Text(), nullable=True),
        _count("fetch_attempts"),
        _count("output_refreshes"),
        _ts("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("attempt_id", name="pk_attempt_runtime"),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["task_attempts.id"], name="fk_attempt_runtime_attempt_id"
        ),
        sa.ForeignKeyConstraint(
            ["task_id"], ["generation_tasks.id"], name="fk_attempt_runtime_task_id"
        ),
    )
    op.create_index("ix_attempt_runtime_next_poll_at", "attempt_runtime", ["next_poll_at"])
    op.create_index(
        "ix_attempt_runtime_next_recovery_at", "attempt_runtime", ["next_recovery_at"]
    )
    op.create_table(
        "provider_events",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
            autoincrement=True,
        ),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        sa.Column("provider_job_id", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("job_state", sa.Text(), nullable=False),
        sa.Column("raw_status", sa.Text(), nullable=False),
        sa.Column("payload_hash", sa.Text(), nullable=False),
        sa.Column("raw_payload", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        _ts("received_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_provider_events"),
        sa.UniqueConstraint(
            "provider_account_id", "provider_job_id", "raw_status", "payload_hash",
            name="uq_provider_events_dedup",
        ),
    )
    op.create_index("ix_provider_events_attempt_id", "provider_events", ["attempt_id"])


def downgrade() -> None:
    op.drop_index("ix_provider_events_attempt_id", table_name="provider_events")
    op.drop_table("provider_events")
    op.drop_index("ix_attempt_runtime_next_recovery_at", table_name="attempt_runtime")
    op.drop_index("ix_attempt_runtime_next_poll_at", table_name="attempt_runtime")
    op.drop_table("attempt_runtime")
