"""Routing policies and their canaries (design 9.13.5, 9.25.5).

Revision ID: 0013_routing_policies
Revises: 0012_quality_signals
Create Date: 2026-12-01

``routing_policy_versions``: every published routing policy file, as published, one active (a
partial unique index on ``active``); ``canary_states``: the canary of each candidate a policy
names, its stage and status; ``canary_transitions``: every start, advance, promotion and
rollback with the observed figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013_routing_policies"
down_revision: str | None = "0012_quality_signals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = False) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _text(*names: str) -> list[sa.Column[Any]]:
    return [sa.Column(n, sa.Text(), nullable=False) for n in names]


def _id() -> sa.Column[Any]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "routing_policy_versions",
        _id(),
        *_text("version", "document", "source"),
        sa.Column("active", sa.Boolean(), nullable=False),
        _ts("published_at"),
        _ts("activated_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_routing_policy_versions"),
        sa.UniqueConstraint("version", name="uq_routing_policy_versions_version"),
    )
    op.create_index(
        "uq_routing_policy_versions_one_active",
        "routing_policy_versions",
        ["active"],
        unique=True,
        postgresql_where=sa.text("active"),
        sqlite_where=sa.text("active"),
    )
    op.create_table(
        "canary_states",
        *_text("candidate_id", "policy_version", "config_key"),
        sa.Column("stages", _json(), nullable=False),
        sa.Column("stage", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("gates", _json(), nullable=False),
        _ts("stage_started_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("candidate_id", name="pk_canary_states"),
        sa.CheckConstraint(
            "status IN ('ACTIVE', 'PROMOTED', 'ROLLED_BACK')",
            name="ck_canary_states_status_enum",
        ),
    )
    op.create_table(
        "canary_transitions",
        _id(),
        *_text("candidate_id", "policy_version", "action", "reason"),
        sa.Column("detail", _json(), nullable=False),
        _ts("at"),
        sa.PrimaryKeyConstraint("id", name="pk_canary_transitions"),
    )
    op.create_index(
        "ix_canary_transitions_candidate_id_id", "canary_transitions", ["candidate_id", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_canary_transitions_candidate_id_id", table_name="canary_transitions")
    op.drop_table("canary_transitions")
    op.drop_table("canary_states")
    op.drop_index("uq_routing_policy_versions_one_active", table_name="routing_policy_versions")
    op.drop_table("routing_policy_versions")
