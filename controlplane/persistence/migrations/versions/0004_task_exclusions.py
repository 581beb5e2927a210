"""Failover history as rows: task_requeues and task_exclusions.

Revision ID: 0004_task_exclusions
Revises: 0003_attempt_evidence
Create Date: 2026-12-01

Until now a requeue's exclusions travelled in its ``task.requeue`` outbox payload and the
dispatcher re-read every such message ever written. Now the message is only a wake-up and the
history is data, written in the requeue's transaction (`controlplane.domain.requeue`):

* ``task_requeues``: one row per hand-back of a task (reason, failure class, the model pin of
  a STRICT task, ``not_before``); the latest row of a task is what its next decision obeys.
* ``task_exclusions``: one row per excluded candidate (task, account, model), merged in place
  by later requeues (hard beats soft, the latest ``retry_at``), with the attempt that caused it.

Messages written before this revision are not carried over: a deployment upgrades with no task
between a requeue and its next attempt, or such a task routes once without its exclusions.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_task_exclusions"
down_revision: str | None = "0003_attempt_evidence"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _pk() -> sa.Column:
    return sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
        autoincrement=True,
    )


def _ts(name: str, nullable: bool = False, now: bool = False) -> sa.Column:
    return sa.Column(
        name, sa.DateTime(timezone=True), nullable=nullable,
        server_default=sa.func.now() if now else None,
    )


def _fk(column: str, target: str, table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=f"fk_{table}_{column}")


def upgrade() -> None:
    op.create_table(
        "task_requeues",
        _pk(),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("failed_attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("error_class", sa.Text(), nullable=False),
        sa.Column("required_model", sa.Text(), nullable=True),
        _ts("not_before", nullable=True),
        _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_task_requeues"),
        _fk("task_id", "generation_tasks", "task_requeues"),
        _fk("failed_attempt_id", "task_attempts", "task_requeues"),
    )
    op.create_index("ix_task_requeues_task_id_id", "task_requeues", ["task_id", "id"])
    op.create_table(
        "task_exclusions",
        _pk(),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        sa.Column("provider_model", sa.Text(), nullable=False),
        sa.Column("soft", sa.Boolean(), nullable=False),
        _ts("retry_at", nullable=True),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("error_class", sa.Text(), nullable=False),
        _ts("created_at", now=True),
        _ts("updated_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_task_exclusions"),
        _fk("task_id", "generation_tasks", "task_exclusions"),
        _fk("provider_account_id", "provider_accounts", "task_exclusions"),
        _fk("attempt_id", "task_attempts", "task_exclusions"),
        # Written twice, a candidate's exclusion merges into its one row (never doubles).
        sa.UniqueConstraint(
            "task_id", "provider_account_id", "provider_model",
            name="uq_task_exclusions_candidate",
        ),
        sa.CheckConstraint(
            "soft OR retry_at IS NULL", name="ck_task_exclusions_retry_only_when_soft"
        ),
    )


def downgrade() -> None:
    op.drop_table("task_exclusions")
    op.drop_index("ix_task_requeues_task_id_id", table_name="task_requeues")
    op.drop_table("task_requeues")
