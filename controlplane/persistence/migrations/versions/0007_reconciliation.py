"""Money: raw usage imports, usage records, reconciliation runs and their discrepancies.

Revision ID: 0007_reconciliation
Revises: 0006_credit_ledger
Create Date: 2026-12-01

Design 9.23.3: each provider usage import is stored raw and immutable (``raw_usage_imports``:
the canonical JSON of the ListUsage answer and its sha256; the same payload for the same account
and window is stored once, and a trigger refuses UPDATE and DELETE on both backends), normalized
into ``provider_usage_records``; a ``reconciliation_runs`` row per (day, provider, account)
result, at most one current (``superseded_by IS NULL``), and its ``reconciliation_discrepancies``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_reconciliation"
down_revision: str | None = "0006_credit_ledger"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KINDS = (
    "CHARGE_WITHOUT_LOCAL_JOB",
    "LOCAL_SUCCESS_WITHOUT_CHARGE",
    "DUPLICATE_CHARGE",
    "COST_AFTER_UNKNOWN",
    "FAILED_TASK_CHARGED",
    "WRONG_PRICE_VERSION",
    "WRONG_CONVERSION_RATE",
    "USER_SETTLED_TWICE",
    "AMOUNT_MISMATCH",
    "AGGREGATE_MISMATCH",
    "AMBIGUOUS_MATCH",
)


def _pk() -> sa.Column:
    return sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    )


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _json(name: str) -> sa.Column:
    return sa.Column(name, sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False)


def _fk(column: str, target: str, table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=f"fk_{table}_{column}")


def upgrade() -> None:
    op.create_table(
        "raw_usage_imports",
        _pk(),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        _ts("window_start"),
        _ts("window_end"),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("payload_sha256", sa.Text(), nullable=False),
        sa.Column("record_count", sa.Integer(), nullable=False),
        _ts("fetched_at"),
        sa.PrimaryKeyConstraint("id", name="pk_raw_usage_imports"),
        sa.UniqueConstraint(
            "provider",
            "account",
            "window_start",
            "payload_sha256",
            name="uq_raw_usage_imports_payload",
        ),
    )
    op.create_table(
        "provider_usage_records",
        _pk(),
        sa.Column("import_id", sa.BigInteger(), nullable=False),
        sa.Column("line_no", sa.Integer(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("provider_job_id", sa.Text(), nullable=False),
        sa.Column("provider_request_id", sa.Text(), nullable=False),
        sa.Column("client_request_key", sa.Text(), nullable=False),
        _ts("usage_time", nullable=True),
        sa.Column("provider_milliunits", sa.BigInteger(), nullable=False),
        sa.Column("provider_unit", sa.Text(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        sa.Column("raw_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_provider_usage_records"),
        _fk("import_id", "raw_usage_imports", "provider_usage_records"),
        sa.UniqueConstraint("import_id", "line_no", name="uq_provider_usage_records_line"),
    )
    op.create_table(
        "reconciliation_runs",
        _pk(),
        sa.Column("day", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("import_id", sa.BigInteger(), nullable=True),
        sa.Column("result_sha256", sa.Text(), nullable=False),
        sa.Column("record_count", sa.Integer(), nullable=False),
        sa.Column("billed_micros", sa.BigInteger(), nullable=False),
        sa.Column("expected_micros", sa.BigInteger(), nullable=False),
        sa.Column("delta_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        _json("statuses"),
        sa.Column("superseded_by", sa.BigInteger(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_reconciliation_runs"),
        _fk("import_id", "raw_usage_imports", "reconciliation_runs"),
        sa.CheckConstraint("length(day) = 10", name="ck_reconciliation_runs_day_iso"),
    )
    where = sa.text("superseded_by IS NULL")
    op.create_index(
        "uq_reconciliation_runs_current",
        "reconciliation_runs",
        ["day", "provider", "account"],
        unique=True,
        postgresql_where=where,
        sqlite_where=where,
    )
    listed = ", ".join(f"'{k}'" for k in KINDS)
    op.create_table(
        "reconciliation_discrepancies",
        _pk(),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("task_id", sa.BigInteger(), nullable=True),
        sa.Column("provider_job_id", sa.Text(), nullable=False),
        _json("record_ids"),
        sa.Column("billed_micros", sa.BigInteger(), nullable=False),
        sa.Column("expected_micros", sa.BigInteger(), nullable=False),
        sa.Column("delta_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        _json("evidence"),
        sa.Column("suggested_action", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_reconciliation_discrepancies"),
        _fk("run_id", "reconciliation_runs", "reconciliation_discrepancies"),
        sa.UniqueConstraint("run_id", "seq", name="uq_reconciliation_discrepancies_seq"),
        sa.CheckConstraint(f"kind IN ({listed})", name="ck_reconciliation_discrepancies_kind_enum"),
    )
    op.create_index(
        "ix_reconciliation_discrepancies_attempt_id",
        "reconciliation_discrepancies",
        ["attempt_id"],
    )
    _immutable("raw_usage_imports")


def _immutable(table: str) -> None:
    """UPDATE and DELETE of `table` fail in the database (9.23.3: the raw import is evidence)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION vidroute_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION '% is immutable', TG_TABLE_NAME; END $$"
        )
        op.execute(
            f"CREATE TRIGGER {table}_immutable BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION vidroute_refuse_change()"
        )
        return
    for event in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER {table}_no_{event.lower()} BEFORE {event} ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{table} is immutable'); END"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS raw_usage_imports_immutable ON raw_usage_imports")
        op.execute("DROP FUNCTION IF EXISTS vidroute_refuse_change()")
    else:
        op.execute("DROP TRIGGER IF EXISTS raw_usage_imports_no_update")
        op.execute("DROP TRIGGER IF EXISTS raw_usage_imports_no_delete")
    op.drop_index(
        "ix_reconciliation_discrepancies_attempt_id", table_name="reconciliation_discrepancies"
    )
    op.drop_table("reconciliation_discrepancies")
    op.drop_index("uq_reconciliation_runs_current", table_name="reconciliation_runs")
    op.drop_table("reconciliation_runs")
    op.drop_table("provider_usage_records")
    op.drop_table("raw_usage_imports")
