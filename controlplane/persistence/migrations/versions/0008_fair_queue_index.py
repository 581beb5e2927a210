"""The durable fair queue's acceleration index and its DRR checkpoint (design 9.12.4).

Revision ID: 0008_fair_queue_index
Revises: 0007_reconciliation
Create Date: 2026-12-01

Until now each dispatch round read the oldest 2,000 QUEUED rows, so a light tenant's task behind a
larger flood stayed invisible to the fair queue. The queue's input is now the heads of every
(service class, tenant, user, priority) group, read with a skip scan over this partial index
(`controlplane.persistence.queue`): its size is the backlog, but a round touches only a few
entries per group.

``fair_queue_state`` keeps one row per dispatcher shard: the deficit round robin's state as of
the shard leader's last round. It is a checkpoint, not a queue; the tasks stay the truth. A new
leader (restart, takeover) starts from it, so it serves in the order the old one would have.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008_fair_queue_index"
down_revision: str | None = "0007_reconciliation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_QUEUED = "status = 'QUEUED'"


def upgrade() -> None:
    op.create_index(
        "ix_generation_tasks_queued_group",
        "generation_tasks",
        ["service_class", "tenant_id", "user_id", "priority", "id"],
        postgresql_where=sa.text(_QUEUED),
        sqlite_where=sa.text(_QUEUED),
    )
    op.create_table(
        "fair_queue_state",
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("state", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("shard", name="pk_fair_queue_state"),
    )


def downgrade() -> None:
    op.drop_table("fair_queue_state")
    op.drop_index("ix_generation_tasks_queued_group", table_name="generation_tasks")
