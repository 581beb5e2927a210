"""Money: the credit ledger, the provider usage ledger and versioned unit conversion rates.

Revision ID: 0006_credit_ledger
Revises: 0005_trace_context
Create Date: 2026-12-01

Design 9.23.1 / 9.23.2: two books, never mixed, both append-only and in integer micros.

* ``credit_ledger``: the tenant's side. ``kind`` gives the sign of ``amount_micros`` (always
  >= 0): CREDIT and REFUND add to the balance, CHARGE subtracts, RESERVE holds an amount until
  the task's one settlement (CHARGE or RELEASE) ends the hold. Every row has its own
  idempotency key, UNIQUE per tenant; partial UNIQUE indexes make a second RESERVE of a task
  and a second settlement (CHARGE or RELEASE) of a task impossible in the database itself.
* ``credit_balances``: the balance (CREDIT - CHARGE + REFUND) cached per (tenant, currency)
  with the id of the newest such entry it includes, updated in the transaction of each; a
  reader uses it only while that id is the newest such entry's, else it derives the balance
  from the entries. The held amount is summed over the tenant's live tasks' reservations
  (``ix_generation_tasks_open_tenant``), so reserving never queues on the cache row.
* ``provider_usage_ledger``: the platform's side, per attempt and provider job: EXPECTED when a
  provider accepts, ACTUAL when the job or the usage says so, PLATFORM_LOSS for provider cost
  the tenant is not charged (with the evidence). ``idempotency_key`` is UNIQUE.
* ``task_requeues`` gains ``estimated_platform_loss_micros`` and ``platform_loss_limit_micros``:
  the figure a failover after an accepted-then-failed job was allowed at (9.16.4).
* ``provider_unit_rates``: provider-native units (Runway credits, GPU seconds) to micros as the
  integer fraction ``micros_per_unit / unit_divisor``, versioned (``rate_version``).

The enum lists of the CHECKs are frozen copies of the values at this revision.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006_credit_ledger"
down_revision: str | None = "0005_trace_context"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CREDIT_KINDS = ("CREDIT", "RESERVE", "RELEASE", "CHARGE", "REFUND")
USAGE_KINDS = ("EXPECTED", "ACTUAL", "PLATFORM_LOSS")


def _one_of(column: str, values: Sequence[str], name: str) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=name)


def _pk() -> sa.Column:
    return sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    )


def _ts(name: str, nullable: bool = False, now: bool = False) -> sa.Column:
    return sa.Column(
        name,
        sa.DateTime(timezone=True),
        nullable=nullable,
        server_default=sa.func.now() if now else None,
    )


def _fk(column: str, target: str, table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=f"fk_{table}_{column}")


def upgrade() -> None:
    # 9.16.4: a failover's figure, kept with the requeue that it allowed.
    for name in ("estimated_platform_loss_micros", "platform_loss_limit_micros"):
        op.add_column(
            "task_requeues",
            sa.Column(name, sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        )
    op.create_table(
        "credit_ledger",
        _pk(),
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=True),
        sa.Column("attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False, server_default=sa.text("''")),
        _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_credit_ledger"),
        _fk("task_id", "generation_tasks", "credit_ledger"),
        _fk("attempt_id", "task_attempts", "credit_ledger"),
        sa.UniqueConstraint(
            "tenant_id", "idempotency_key", name="uq_credit_ledger_tenant_id_idempotency_key"
        ),
        _one_of("kind", CREDIT_KINDS, "ck_credit_ledger_kind_enum"),
        sa.CheckConstraint("amount_micros >= 0", name="ck_credit_ledger_amount_non_negative"),
        sa.CheckConstraint("length(currency) = 3", name="ck_credit_ledger_currency_iso4217"),
        sa.CheckConstraint(
            "task_id IS NOT NULL OR kind IN ('CREDIT', 'REFUND')",
            name="ck_credit_ledger_task_kinds_name_a_task",
        ),
    )
    op.create_index("ix_credit_ledger_tenant_id_id", "credit_ledger", ["tenant_id", "id"])
    op.create_index("ix_credit_ledger_task_id", "credit_ledger", ["task_id"])
    where_balance = sa.text("kind IN ('CREDIT', 'CHARGE', 'REFUND')")
    op.create_index(
        "ix_credit_ledger_balance_entries",
        "credit_ledger",
        ["tenant_id", "currency", "id"],
        postgresql_where=where_balance,
        sqlite_where=where_balance,
    )
    where_open = sa.text(
        "status IN ('QUEUED', 'SCHEDULING', 'SUBMITTING', 'RUNNING', 'OUTPUT_FETCHING')"
    )
    op.create_index(
        "ix_generation_tasks_open_tenant",
        "generation_tasks",
        ["tenant_id"],
        postgresql_where=where_open,
        sqlite_where=where_open,
    )
    where_reserve = sa.text("kind = 'RESERVE'")
    where_settle = sa.text("kind IN ('CHARGE', 'RELEASE')")
    op.create_index(
        "uq_credit_ledger_one_reserve",
        "credit_ledger",
        ["task_id"],
        unique=True,
        postgresql_where=where_reserve,
        sqlite_where=where_reserve,
    )
    op.create_index(
        "uq_credit_ledger_one_settlement",
        "credit_ledger",
        ["task_id"],
        unique=True,
        postgresql_where=where_settle,
        sqlite_where=where_settle,
    )
    op.create_table(
        "credit_balances",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        sa.Column("balance_micros", sa.BigInteger(), nullable=False),
        sa.Column("last_entry_id", sa.BigInteger(), nullable=False),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("tenant_id", "currency", name="pk_credit_balances"),
    )
    op.create_table(
        "provider_usage_ledger",
        _pk(),
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("provider_job_id", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        sa.Column("provider_units", sa.BigInteger(), nullable=True),
        sa.Column("provider_unit_name", sa.Text(), nullable=True),
        sa.Column("price_version", sa.Text(), nullable=False),
        sa.Column("conversion_rate_version", sa.Text(), nullable=True),
        sa.Column(
            "evidence",
            sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
            nullable=False,
            server_default=sa.text("'{}'"),
        ),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_usage_ledger"),
        _fk("attempt_id", "task_attempts", "provider_usage_ledger"),
        _fk("task_id", "generation_tasks", "provider_usage_ledger"),
        _fk("provider_account_id", "provider_accounts", "provider_usage_ledger"),
        sa.UniqueConstraint("idempotency_key", name="uq_provider_usage_ledger_idempotency_key"),
        _one_of("kind", USAGE_KINDS, "ck_provider_usage_ledger_kind_enum"),
        sa.CheckConstraint(
            "amount_micros >= 0", name="ck_provider_usage_ledger_amount_non_negative"
        ),
        sa.CheckConstraint(
            "provider_units IS NULL OR provider_units >= 0",
            name="ck_provider_usage_ledger_units_non_negative",
        ),
        sa.CheckConstraint(
            "length(currency) = 3", name="ck_provider_usage_ledger_currency_iso4217"
        ),
    )
    op.create_index("ix_provider_usage_ledger_created_at", "provider_usage_ledger", ["created_at"])
    op.create_index("ix_provider_usage_ledger_attempt_id", "provider_usage_ledger", ["attempt_id"])
    op.create_table(
        "provider_unit_rates",
        _pk(),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("unit_name", sa.Text(), nullable=False),
        sa.Column("rate_version", sa.Text(), nullable=False),
        sa.Column("micros_per_unit", sa.BigInteger(), nullable=False),
        sa.Column("unit_divisor", sa.BigInteger(), nullable=False, server_default=sa.text("1")),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        _ts("effective_from"),
        _ts("effective_to", nullable=True),
        _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_unit_rates"),
        sa.UniqueConstraint(
            "provider", "unit_name", "rate_version", name="uq_provider_unit_rates_version"
        ),
        sa.CheckConstraint("micros_per_unit >= 0", name="ck_provider_unit_rates_rate_non_negative"),
        sa.CheckConstraint("unit_divisor > 0", name="ck_provider_unit_rates_divisor_positive"),
        sa.CheckConstraint(
            "effective_to IS NULL OR effective_to > effective_from",
            name="ck_provider_unit_rates_effective_interval",
        ),
        sa.CheckConstraint("length(currency) = 3", name="ck_provider_unit_rates_currency_iso4217"),
    )


def downgrade() -> None:
    op.drop_table("provider_unit_rates")
    op.drop_index("ix_provider_usage_ledger_attempt_id", table_name="provider_usage_ledger")
    op.drop_index("ix_provider_usage_ledger_created_at", table_name="provider_usage_ledger")
    op.drop_table("provider_usage_ledger")
    op.drop_table("credit_balances")
    op.drop_index("uq_credit_ledger_one_settlement", table_name="credit_ledger")
    op.drop_index("uq_credit_ledger_one_reserve", table_name="credit_ledger")
    op.drop_index("ix_generation_tasks_open_tenant", table_name="generation_tasks")
    op.drop_index("ix_credit_ledger_balance_entries", table_name="credit_ledger")
    op.drop_index("ix_credit_ledger_task_id", table_name="credit_ledger")
    op.drop_index("ix_credit_ledger_tenant_id_id", table_name="credit_ledger")
    op.drop_table("credit_ledger")
    with op.batch_alter_table("task_requeues") as batch:
        batch.drop_column("platform_loss_limit_micros")
        batch.drop_column("estimated_platform_loss_micros")
