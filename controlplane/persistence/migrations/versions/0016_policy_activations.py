"""Every activation of a routing policy version, who made it and when (design 9.25.5).

Revision ID: 0016_policy_activations
Revises: 0015_quality_whole_mode_on_read
Create Date: 2026-12-02

``routing_policy_versions.activated_at`` keeps only a version's latest activation: after a
rollback and a republish nothing said which version had routed when, or who rolled back.
``routing_policy_activations`` keeps each one: the version, the one it replaced, the action
(PUBLISHED or ROLLED_BACK), the caller and the time, written in the unit that activates it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_policy_activations"
down_revision: str | None = "0015_quality_whole_mode_on_read"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "routing_policy_activations",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("previous_version", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_routing_policy_activations"),
        sa.CheckConstraint(
            "action IN ('PUBLISHED', 'ROLLED_BACK')",
            name="ck_routing_policy_activations_action_enum",
        ),
    )


def downgrade() -> None:
    op.drop_table("routing_policy_activations")
