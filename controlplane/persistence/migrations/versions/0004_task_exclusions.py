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

The history already written survives the upgrade: every ``task.requeue`` message's payload is
copied into the new rows here (merged as the application merges them), so a task requeued
before the upgrade keeps its exclusions after it. The payload shape is frozen in this file.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

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
    _copy_requeue_payloads()


def _instant(raw: Any) -> datetime | None:
    if not raw:
        return None
    at = datetime.fromisoformat(str(raw))
    # Stored as UTC (naive on SQLite), the way the application's UtcDateTime stores it.
    at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    return at.replace(tzinfo=None) if op.get_bind().dialect.name == "sqlite" else at


def _copy_requeue_payloads() -> None:
    """Rows from the payloads of revision 0003's ``task.requeue`` messages, oldest first."""
    bind = op.get_bind()
    outbox = sa.table(
        "outbox",
        sa.column("id", sa.BigInteger()),
        sa.column("topic", sa.Text()),
        sa.column("payload", sa.JSON()),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    messages = bind.execute(
        sa.select(outbox.c.payload, outbox.c.created_at)
        .where(outbox.c.topic == "task.requeue")
        .order_by(outbox.c.id)
    ).all()
    requeues: list[dict[str, Any]] = []
    # (task, account, model) -> the merged exclusion: hard beats soft, the latest retry wins.
    excluded: dict[tuple[int, int, str], dict[str, Any]] = {}
    for payload, created_at in messages:
        task_id = int(payload["task_id"])
        error_class = str(payload.get("error_class", ""))
        requeues.append(
            {
                "task_id": task_id,
                "failed_attempt_id": int(payload["failed_attempt_id"]),
                "reason": str(payload["reason"]),
                "error_class": error_class,
                "required_model": (
                    str(payload.get("required_model", "")) or None
                    if payload.get("same_model_only")
                    else None
                ),
                "not_before": _instant(payload.get("not_before")),
                "created_at": created_at,
            }
        )
        for raw in payload.get("excluded_candidates", []):
            key = (task_id, int(raw["provider_account_id"]), str(raw["provider_model"]))
            soft, retry_at = bool(raw.get("soft", False)), _instant(raw.get("retry_at"))
            if not _wins(excluded.get(key), soft, retry_at):
                continue
            excluded[key] = {
                "task_id": task_id,
                "provider_account_id": key[1],
                "provider_model": key[2],
                "soft": soft,
                "retry_at": retry_at if soft else None,
                # A payload listed every failed candidate, not which attempt caused each.
                "attempt_id": None,
                "error_class": "",
                "created_at": created_at,
                "updated_at": created_at,
            }
    if requeues:
        op.bulk_insert(_table("task_requeues"), requeues)
    if excluded:
        op.bulk_insert(_table("task_exclusions"), list(excluded.values()))


def _wins(known: dict[str, Any] | None, soft: bool, retry_at: datetime | None) -> bool:
    """Whether a new exclusion replaces the known one (the application's merge, frozen)."""
    if known is None:
        return True
    if not known["soft"]:
        return False
    if not soft:
        return True
    return retry_at is not None and (known["retry_at"] is None or retry_at > known["retry_at"])


def _table(name: str) -> sa.Table:
    return sa.Table(name, sa.MetaData(), autoload_with=op.get_bind())


def downgrade() -> None:
    op.drop_table("task_exclusions")
    op.drop_index("ix_task_requeues_task_id_id", table_name="task_requeues")
    op.drop_table("task_requeues")
