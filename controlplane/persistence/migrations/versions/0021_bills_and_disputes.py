"""Money: imported provider bills (Google's Cloud Billing export for Veo), booked losses and
their disputes.

Revision ID: 0021_bills_and_disputes
Revises: 0020_account_configs
Create Date: 2026-12-05

``cloud_billing_imports``: each file `vidroute usage import` read, raw and immutable (its text,
sha256, format, the SKU map it was read with, the UTC days it covers, its rows and our cost),
once per (provider, account, sha256); a trigger refuses UPDATE and DELETE, as on
``raw_usage_imports`` (0007). Reconciliation reads a day of an account from the latest import
covering it.

``loss_disputes``: a reconciliation row booked as a confirmed loss (one per row) and its dispute
state (OPEN, DISPUTED, REFUNDED, WRITTEN_OFF), with ``loss_dispute_events`` for every move.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0021_bills_and_disputes"
down_revision: str | None = "0020_account_configs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "cloud_billing_imports"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True
        ),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("file_name", sa.Text(), nullable=False),
        sa.Column("format", sa.Text(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("payload_sha256", sa.Text(), nullable=False),
        sa.Column(
            "sku_map", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False
        ),
        sa.Column("covers_from", sa.Text(), nullable=False),
        sa.Column("covers_to", sa.Text(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("ours_count", sa.Integer(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        sa.Column("imported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cloud_billing_imports"),
        sa.UniqueConstraint(
            "provider", "account", "payload_sha256", name="uq_cloud_billing_imports_payload"
        ),
        sa.CheckConstraint(
            "length(covers_from) = 10 AND length(covers_to) = 10 AND covers_from <= covers_to",
            name="ck_cloud_billing_imports_days",
        ),
    )
    op.create_index(
        "ix_cloud_billing_imports_account_days",
        TABLE,
        ["provider", "account", "covers_from", "covers_to"],
    )
    _disputes()
    if op.get_bind().dialect.name == "postgresql":
        # vidroute_refuse_change() is 0007's.
        op.execute(
            f"CREATE TRIGGER {TABLE}_immutable BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION vidroute_refuse_change()"
        )
        return
    for event in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER {TABLE}_no_{event.lower()} BEFORE {event} ON {TABLE} "
            f"BEGIN SELECT RAISE(ABORT, '{TABLE} is immutable'); END"
        )


def _disputes() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    pk = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "loss_disputes",
        sa.Column("id", pk, primary_key=True),
        sa.Column("discrepancy_id", sa.BigInteger(), nullable=False),
        sa.Column("day", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("task_id", sa.BigInteger(), nullable=True),
        sa.Column("billed_micros", sa.BigInteger(), nullable=False),
        sa.Column("expected_micros", sa.BigInteger(), nullable=False),
        sa.Column("confirmed_micros", sa.BigInteger(), nullable=False),
        sa.Column("new_loss_micros", sa.BigInteger(), nullable=False),
        sa.Column("refunded_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("evidence", json, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_loss_disputes"),
        sa.ForeignKeyConstraint(
            ["discrepancy_id"],
            ["reconciliation_discrepancies.id"],
            name="fk_loss_disputes_discrepancy_id",
        ),
        sa.UniqueConstraint("discrepancy_id", name="uq_loss_disputes_discrepancy_id"),
        sa.CheckConstraint(
            "state IN ('OPEN', 'DISPUTED', 'REFUNDED', 'WRITTEN_OFF')",
            name="ck_loss_disputes_state_enum",
        ),
        sa.CheckConstraint(
            "new_loss_micros >= 0 AND refunded_micros >= 0 AND refunded_micros <= confirmed_micros",
            name="ck_loss_disputes_amounts",
        ),
    )
    op.create_index("ix_loss_disputes_created_at", "loss_disputes", ["created_at"])
    op.create_table(
        "loss_dispute_events",
        sa.Column("id", pk, primary_key=True),
        sa.Column("dispute_id", sa.BigInteger(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=True),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("refunded_micros", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_loss_dispute_events"),
        sa.ForeignKeyConstraint(
            ["dispute_id"],
            ["loss_disputes.id"],
            name="fk_loss_dispute_events_dispute_id",
        ),
    )
    op.create_index("ix_loss_dispute_events_dispute_id", "loss_dispute_events", ["dispute_id"])


def downgrade() -> None:
    op.drop_index("ix_loss_dispute_events_dispute_id", table_name="loss_dispute_events")
    op.drop_table("loss_dispute_events")
    op.drop_index("ix_loss_disputes_created_at", table_name="loss_disputes")
    op.drop_table("loss_disputes")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_immutable ON {TABLE}")
    else:
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_update")
        op.execute(f"DROP TRIGGER IF EXISTS {TABLE}_no_delete")
    op.drop_index("ix_cloud_billing_imports_account_days", table_name=TABLE)
    op.drop_table(TABLE)
