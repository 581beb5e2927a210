"""Tenants as configuration: published tenants documents and their activations (design 9.25.5).

Revision ID: 0017_tenant_configs
Revises: 0016_policy_activations
Create Date: 2026-12-05

``tenant_config_versions``: every published tenants document, as published, one active (a
partial unique index on ``active``), like ``routing_policy_versions``;
``tenant_config_activations``: each activation (PUBLISHED or ROLLED_BACK), the version it
replaced, the caller and the time, written in the unit that activates it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017_tenant_configs"
down_revision: str | None = "0016_policy_activations"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)


def upgrade() -> None:
    op.create_table(
        "tenant_config_versions",
        _id(),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("activated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_tenant_config_versions"),
        sa.UniqueConstraint("version", name="uq_tenant_config_versions_version"),
    )
    op.create_index(
        "uq_tenant_config_versions_one_active",
        "tenant_config_versions",
        ["active"],
        unique=True,
        postgresql_where=sa.text("active"),
        sqlite_where=sa.text("active"),
    )
    op.create_table(
        "tenant_config_activations",
        _id(),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("previous_version", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tenant_config_activations"),
        sa.CheckConstraint(
            "action IN ('PUBLISHED', 'ROLLED_BACK')",
            name="ck_tenant_config_activations_action_enum",
        ),
    )


def downgrade() -> None:
    op.drop_table("tenant_config_activations")
    op.drop_index("uq_tenant_config_versions_one_active", table_name="tenant_config_versions")
    op.drop_table("tenant_config_versions")
