"""Capability releases: the catalog's publications, activations and re-opened versions (9.25.5).

Revision ID: 0019_capability_releases
Revises: 0018_document_activation_times
Create Date: 2026-12-05

``capability_releases``: every published capability document, as published, with its state
(STAGED: checked and kept, not applied; APPLIED: its rows are in the catalog, effective from
``effective_from``, which may lie ahead: a scheduled release), who published it, the force
reason when forced, and its diff against the catalog it was checked on.
``capability_release_activations``: each activation (PUBLISHED, SCHEDULED, ACTIVATED,
ROLLED_BACK), the release it replaced, the caller, the time, when it takes effect, the force
reason and what it replaced per model.

A rollback re-opens an earlier capability or price version as a new effective interval, so a
version's uniqueness is per interval: (account, model, version, effective_from).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019_capability_releases"
down_revision: str | None = "0018_document_activation_times"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_VERSIONED = (
    ("provider_model_capabilities", "uq_provider_model_capabilities_version",
     ["provider_account_id", "model", "model_version", "capability_version"]),
    ("provider_price_versions", "uq_provider_price_versions_version",
     ["provider_account_id", "model", "price_version"]),
)  # fmt: skip


def _id() -> sa.Column[int]:
    return sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True)


def _json() -> sa.types.TypeEngine[object]:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    for table, name, columns in _VERSIONED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(name, type_="unique")
            batch.create_unique_constraint(name, [*columns, "effective_from"])
    op.create_table(
        "capability_releases",
        _id(),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("document", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=True),
        sa.Column("forced_reason", sa.Text(), nullable=True),
        sa.Column("changes", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_capability_releases"),
        sa.UniqueConstraint("version", name="uq_capability_releases_version"),
        sa.CheckConstraint(
            "state IN ('STAGED', 'APPLIED')", name="ck_capability_releases_state_enum"
        ),
    )
    op.create_table(
        "capability_release_activations",
        _id(),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("previous_version", sa.Text(), nullable=True),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("replaced", _json(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_capability_release_activations"),
        sa.CheckConstraint(
            "action IN ('PUBLISHED', 'SCHEDULED', 'ACTIVATED', 'ROLLED_BACK')",
            name="ck_capability_release_activations_action_enum",
        ),
    )


def downgrade() -> None:
    op.drop_table("capability_release_activations")
    op.drop_table("capability_releases")
    for table, name, columns in _VERSIONED:
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(name, type_="unique")
            batch.create_unique_constraint(name, columns)
