"""Accounts as configuration: published accounts documents and their activations (9.11, 9.25.5).

Revision ID: 0020_account_configs
Revises: 0019_capability_releases
Create Date: 2026-12-05

``account_config_versions``: every published accounts document (provider accounts' limits,
regions, credential references), as published, one active (a partial unique index on
``active``), like ``tenant_config_versions``;
``account_config_activations``: each activation (PUBLISHED, ROLLED_BACK, SCHEDULED or
ACTIVATED, pending while scheduled), the version it replaced, the caller, when asked and
effective, and why, written in the unit that activates it (as 0018 made the others).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_account_configs"
down_revision: str | None = "0019_capability_releases"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "account_config_versions",
        _id(),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_account_config_versions"),
        sa.UniqueConstraint("version", name="uq_account_config_versions_version"),
    )
    op.create_index(
        "uq_account_config_versions_one_active",
        "account_config_versions",
        ["active"],
        unique=True,
        postgresql_where=sa.text("active"),
        sqlite_where=sa.text("active"),
    )
    op.create_table(
        "account_config_activations",
        _id(),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("previous_version", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pending", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_account_config_activations"),
        sa.CheckConstraint(
            "action IN ('PUBLISHED', 'ROLLED_BACK', 'SCHEDULED', 'ACTIVATED')",
            name="ck_account_config_activations_action_enum",
        ),
    )


def downgrade() -> None:
    op.drop_table("account_config_activations")
    op.drop_index("uq_account_config_versions_one_active", table_name="account_config_versions")
    op.drop_table("account_config_versions")
