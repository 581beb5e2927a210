"""Quality signals that routing reads (design 9.14).

Revision ID: 0012_quality_signals
Revises: 0010_caller_webhooks
Create Date: 2026-12-01

``quality_feedback``: the caller's latest verdict on a task's output (one row per task, with its
tags and comment); ``quality_checks``: the output probe's technical check of each probed sample
(its defect codes, ``[]`` when clean); ``quality_aggregates``: their counters per (provider,
model, mode, tag bucket), kept in the same transaction as each signal, so routing reads one small
table instead of the signals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012_quality_signals"
down_revision: str | None = "0010_caller_webhooks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _where(*names: str) -> list[sa.Column[Any]]:
    return [sa.Column(n, sa.Text(), nullable=False) for n in names]


def upgrade() -> None:
    op.create_table(
        "quality_feedback",
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        *_where("tenant_id", "provider", "model", "mode", "bucket", "verdict"),
        sa.Column("tags", _json(), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("task_id", name="pk_quality_feedback"),
        sa.ForeignKeyConstraint(
            ["task_id"], ["generation_tasks.id"], name="fk_quality_feedback_task_id"
        ),
        sa.CheckConstraint(
            "verdict IN ('ACCEPTED', 'REJECTED', 'REGENERATED')",
            name="ck_quality_feedback_verdict_enum",
        ),
    )
    op.create_table(
        "quality_checks",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        *_where("provider", "model", "mode", "bucket"),
        sa.Column("defects", _json(), nullable=False),
        _ts("created_at"),
        sa.ForeignKeyConstraint(
            ["task_id"], ["generation_tasks.id"], name="fk_quality_checks_task_id"
        ),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["task_attempts.id"], name="fk_quality_checks_attempt_id"
        ),
        sa.UniqueConstraint("attempt_id", "sample_index", name="uq_quality_checks_attempt_sample"),
    )
    op.create_table(
        "quality_aggregates",
        *_where("provider", "model", "mode", "bucket"),
        *(
            sa.Column(n, sa.BigInteger(), nullable=False)
            for n in (
                "accepted",
                "rejected",
                "regenerated",
                "technical_checks",
                "technical_defects",
            )
        ),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint(
            "provider", "model", "mode", "bucket", name="pk_quality_aggregates"
        ),
    )


def downgrade() -> None:
    op.drop_table("quality_aggregates")
    op.drop_table("quality_checks")
    op.drop_table("quality_feedback")
