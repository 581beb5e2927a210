"""Table declarations for design 9.19, shared by PostgreSQL and SQLite.

These models describe the schema, every table of it (the execution side's `attempt_runtime` and
`provider_events` are Core tables at the end); the unit of work and the query modules use them as
typed Core tables and never leak ORM objects. The Alembic revisions are written to match them
exactly, and a test compares the two with autogenerate on both databases.

Conventions: money is BIGINT micros next to a CHAR(3) currency (never a float); every timestamp
is `UtcDateTime`; every status column carries a CHECK listing its enum's values; constraint names
are spelled out so both backends (and PostgreSQL's 63-byte limit) agree.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    CHAR,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from controlplane.domain.disputes import DisputeState
from controlplane.domain.money import CreditKind, UsageKind
from controlplane.domain.quality import Verdict
from controlplane.domain.reconciliation import DiscrepancyKind
from controlplane.domain.routing.canary import CanaryStatus
from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence.coltypes import BigIntPK, JsonDoc, JsonDocOrNull, UtcDateTime
from vidroute_core.spec import ServiceClass

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base carrying the naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def one_of(column: str, values: type[enum.Enum], name: str) -> CheckConstraint:
    """A CHECK that `column` holds one of the enum's string values."""
    listed = ", ".join(f"'{member.value}'" for member in values)
    return CheckConstraint(f"{column} IN ({listed})", name=name)


def _created() -> Mapped[datetime]:
    return mapped_column(UtcDateTime, nullable=False, server_default=func.now())


def _currency_check() -> CheckConstraint:
    return CheckConstraint("length(currency) = 3", name="currency_iso4217")


class ProviderAccount(Base):
    """A provider account (9.19.1). Holds a reference to a secret, never the secret itself."""

    __tablename__ = "provider_accounts"
    __table_args__ = (
        UniqueConstraint(
            "provider", "account_name", "region", name="uq_provider_accounts_identity"
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    provider: Mapped[str] = mapped_column(Text)
    account_name: Mapped[str] = mapped_column(Text)
    region: Mapped[str] = mapped_column(Text)
    credential_ref: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JsonDoc, server_default=text("'{}'"))
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class ProviderModelCapability(Base):
    """One immutable capability version of a model on an account (9.19.2, 9.6.4)."""

    __tablename__ = "provider_model_capabilities"
    __table_args__ = (
        UniqueConstraint(
            "provider_account_id",
            "model",
            "model_version",
            "capability_version",
            "effective_from",  # a rollback re-opens a version as a new interval (0019)
            name="uq_provider_model_capabilities_version",
        ),
        CheckConstraint(
            "effective_to IS NULL OR effective_to > effective_from", name="effective_interval"
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    model: Mapped[str] = mapped_column(Text)
    model_version: Mapped[str] = mapped_column(Text)
    capability_version: Mapped[str] = mapped_column(Text)
    lifecycle_status: Mapped[str] = mapped_column(Text)
    capabilities: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    effective_from: Mapped[datetime] = mapped_column(UtcDateTime)
    effective_to: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = _created()


class ProviderPriceVersion(Base):
    """Our own versioned price of a model, in integer micros per unit (9.23.2)."""

    __tablename__ = "provider_price_versions"
    __table_args__ = (
        UniqueConstraint(
            "provider_account_id",
            "model",
            "price_version",
            "effective_from",  # a rollback re-opens a version as a new interval (0019)
            name="uq_provider_price_versions_version",
        ),
        CheckConstraint("price_micros_per_unit >= 0", name="price_non_negative"),
        CheckConstraint(
            "effective_to IS NULL OR effective_to > effective_from", name="effective_interval"
        ),
        _currency_check(),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    model: Mapped[str] = mapped_column(Text)
    price_version: Mapped[str] = mapped_column(Text)
    unit: Mapped[str] = mapped_column(Text)
    price_micros_per_unit: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(CHAR(3))
    effective_from: Mapped[datetime] = mapped_column(UtcDateTime)
    effective_to: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = _created()


_WHERE_QUEUED = text("status = 'QUEUED'")
# Revision 0006: a tenant's live tasks, whose reservations are still held (persistence.ledger).
_WHERE_OPEN = text("status IN ('QUEUED', 'SCHEDULING', 'SUBMITTING', 'RUNNING', 'OUTPUT_FETCHING')")


class GenerationTask(Base):
    """The user's business goal (9.3.1). `last_event_seq` numbers its `task_events`."""

    __tablename__ = "generation_tasks"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_generation_tasks_idempotency"),
        one_of("status", TaskState, "status_enum"),
        one_of("service_class", ServiceClass, "service_class_enum"),
        Index("ix_generation_tasks_status_id", "status", "id"),
        Index("ix_generation_tasks_tenant_id_id", "tenant_id", "id"),
        # The fair queue's group heads (revision 0008, persistence.queue): QUEUED rows only.
        Index(
            "ix_generation_tasks_queued_group",
            "service_class",
            "tenant_id",
            "user_id",
            "priority",
            "id",
            postgresql_where=_WHERE_QUEUED,
            sqlite_where=_WHERE_QUEUED,
        ),
        Index(
            "ix_generation_tasks_open_tenant",
            "tenant_id",
            postgresql_where=_WHERE_OPEN,
            sqlite_where=_WHERE_OPEN,
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text)
    user_id: Mapped[str] = mapped_column(Text)
    project_id: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str] = mapped_column(Text)
    spec: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    normalized_spec_hash: Mapped[str] = mapped_column(Text)
    service_class: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(Text)
    status_version: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    last_event_seq: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    failure_class: Mapped[str | None] = mapped_column(Text)
    failure_code: Mapped[str | None] = mapped_column(Text)
    failure_message: Mapped[str | None] = mapped_column(Text)
    # Circular with task_attempts.task_id, hence created by ALTER after both tables exist.
    adopted_attempt_id: Mapped[int | None] = mapped_column(
        BigInteger,
        ForeignKey("task_attempts.id", use_alter=True, name="fk_generation_tasks_adopted_attempt"),
    )
    output_asset: Mapped[dict[str, Any] | None] = mapped_column(JsonDocOrNull)
    queue_deadline_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    deadline_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # W3C traceparent of the CreateTask call (NULL: tracing was off); the dispatcher continues it.
    trace_context: Mapped[str | None] = mapped_column(Text)
    # Revision 0010: the caller webhook (its own or the tenant's default; NULL: none) and the
    # optional event types it named, as a bit mask (controlplane.domain.webhooks.OPTIONAL_EVENTS).
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class RouteDecision(Base):
    """The explainable snapshot of one scheduling decision (9.10.2, 9.19.5)."""

    __tablename__ = "route_decisions"
    __table_args__ = (
        UniqueConstraint("task_id", "decision_no", name="uq_route_decisions_task_decision_no"),
        # Route replay's time window, keyset by (created_at, id) (revision 0014).
        Index("ix_route_decisions_created_at_id", "created_at", "id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    task_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    decision_no: Mapped[int] = mapped_column(Integer)
    policy_version: Mapped[str] = mapped_column(Text)
    selected_candidate: Mapped[str | None] = mapped_column(Text)
    candidate_snapshot: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    reason_code: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()


class TaskAttempt(Base):
    """One immutable execution plan against one account and model (9.3.2, 9.19.3, 9.17.2)."""

    __tablename__ = "task_attempts"
    __table_args__ = (
        UniqueConstraint("task_id", "attempt_no", name="uq_task_attempts_task_attempt_no"),
        UniqueConstraint(
            "provider_account_id", "client_request_key", name="uq_task_attempts_client_request_key"
        ),
        one_of("status", AttemptState, "status_enum"),
        CheckConstraint("attempt_no >= 1", name="attempt_no_positive"),
        CheckConstraint("estimated_cost_micros >= 0", name="estimated_cost_non_negative"),
        CheckConstraint(
            "actual_cost_micros IS NULL OR actual_cost_micros >= 0",
            name="actual_cost_non_negative",
        ),
        _currency_check(),
        Index("ix_task_attempts_status_account", "status", "provider_account_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    task_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    attempt_no: Mapped[int] = mapped_column(Integer)
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    provider_model: Mapped[str] = mapped_column(Text)
    provider_model_version: Mapped[str] = mapped_column(Text)
    capability_version: Mapped[str] = mapped_column(Text)
    price_version: Mapped[str] = mapped_column(Text)
    routing_policy_version: Mapped[str] = mapped_column(Text)
    client_request_key: Mapped[str] = mapped_column(Text)
    normalized_spec_hash: Mapped[str] = mapped_column(Text)
    request_hash: Mapped[str | None] = mapped_column(Text)
    compile_plan: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    route_decision_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("route_decisions.id")
    )
    status: Mapped[str] = mapped_column(Text)
    status_version: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    estimated_cost_micros: Mapped[int] = mapped_column(BigInteger)
    actual_cost_micros: Mapped[int | None] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(CHAR(3))
    lease_token: Mapped[str | None] = mapped_column(Text)
    fencing_token: Mapped[int | None] = mapped_column(BigInteger)
    request_started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    request_body_sent_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    transport_error_stage: Mapped[str | None] = mapped_column(Text)
    provider_request_trace: Mapped[dict[str, Any] | None] = mapped_column(JsonDocOrNull)
    failure_class: Mapped[str | None] = mapped_column(Text)
    failure_code: Mapped[str | None] = mapped_column(Text)
    failure_message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class ProviderJob(Base):
    """The provider's own job for one attempt; never overwritten by another (9.3.3, 9.19.4)."""

    __tablename__ = "provider_jobs"
    __table_args__ = (
        UniqueConstraint(
            "provider_account_id", "provider_job_id", name="uq_provider_jobs_provider_job_id"
        ),
        UniqueConstraint("attempt_id", name="uq_provider_jobs_attempt_id"),
        one_of("normalized_status", AttemptState, "normalized_status_enum"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("task_attempts.id"))
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    provider_job_id: Mapped[str] = mapped_column(Text)
    provider_request_id: Mapped[str | None] = mapped_column(Text)
    raw_status: Mapped[str | None] = mapped_column(Text)
    normalized_status: Mapped[str] = mapped_column(Text)
    output_locator: Mapped[dict[str, Any] | None] = mapped_column(JsonDocOrNull)
    raw_failure: Mapped[dict[str, Any] | None] = mapped_column(JsonDocOrNull)
    submitted_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_polled_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = _created()


class ProviderHealthEvent(Base):
    """A breaker/health state change of one provider operation (9.19.6)."""

    __tablename__ = "provider_health_events"
    __table_args__ = (
        Index("ix_provider_health_events_account_at", "provider_account_id", "occurred_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    model: Mapped[str | None] = mapped_column(Text)
    operation: Mapped[str] = mapped_column(Text)
    old_state: Mapped[str] = mapped_column(Text)
    new_state: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    metrics_snapshot: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    occurred_at: Mapped[datetime] = _created()


class TaskEvent(Base):
    """One entry of a task's ordered history, replayed by WatchTask."""

    __tablename__ = "task_events"
    __table_args__ = (UniqueConstraint("task_id", "seq", name="uq_task_events_task_seq"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    task_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    seq: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    created_at: Mapped[datetime] = _created()


class OutboxMessage(Base):
    """A message written in the same transaction as the state it announces (9.10.1)."""

    __tablename__ = "outbox"
    __table_args__ = (
        CheckConstraint("attempts >= 0", name="attempts_non_negative"),
        Index("ix_outbox_pending", "topic", "done_at", "available_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    topic: Mapped[str] = mapped_column(Text)
    aggregate_id: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    created_at: Mapped[datetime] = _created()
    available_at: Mapped[datetime] = mapped_column(UtcDateTime)
    claimed_by: Mapped[str | None] = mapped_column(Text)
    claimed_until: Mapped[datetime | None] = mapped_column(UtcDateTime)
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    done_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class TaskRequeue(Base):
    """One hand-back of a task to the scheduler for a new attempt (`controlplane.domain.requeue`).

    Written in the transaction that failed the attempt and queued the task again; the latest
    row of a task carries its model pin (`required_model`, NULL = any), `not_before` and the
    failure's class. The attempt counts are not copied here: ``task_attempts`` holds them.
    """

    __tablename__ = "task_requeues"
    __table_args__ = (Index("ix_task_requeues_task_id_id", "task_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    task_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    failed_attempt_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("task_attempts.id"))
    reason: Mapped[str] = mapped_column(Text)
    error_class: Mapped[str] = mapped_column(Text)
    required_model: Mapped[str | None] = mapped_column(Text)
    not_before: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # Revision 0006: the estimated platform loss the new attempt was allowed at, and the limit.
    estimated_platform_loss_micros: Mapped[int] = mapped_column(
        BigInteger, server_default=text("0")
    )
    platform_loss_limit_micros: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    created_at: Mapped[datetime] = _created()


class TaskExclusion(Base):
    """A candidate (account, model) a task's next attempts must avoid, and why (9.15).

    One row per candidate however often it is excluded: a requeue merges into it (hard beats
    soft, a soft one keeps the latest `retry_at`), so the rows are the merged failover history.
    """

    __tablename__ = "task_exclusions"
    __table_args__ = (
        UniqueConstraint(
            "task_id",
            "provider_account_id",
            "provider_model",
            name="uq_task_exclusions_candidate",
        ),
        CheckConstraint("soft OR retry_at IS NULL", name="retry_only_when_soft"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    task_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    provider_model: Mapped[str] = mapped_column(Text)
    soft: Mapped[bool] = mapped_column(Boolean)
    retry_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    attempt_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("task_attempts.id"))
    error_class: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()
    updated_at: Mapped[datetime] = _created()


class LeaseAuditEvent(Base):
    """A drift the lease reconciler found between PostgreSQL and Redis (9.11.2)."""

    __tablename__ = "lease_audit_events"

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    dimension: Mapped[str] = mapped_column(Text)
    expected: Mapped[int] = mapped_column(BigInteger)
    actual: Mapped[int] = mapped_column(BigInteger)
    delta: Mapped[int] = mapped_column(BigInteger)
    at: Mapped[datetime] = mapped_column(UtcDateTime)


_WHERE_RESERVE = text("kind = 'RESERVE'")
_WHERE_BALANCE = text("kind IN ('CREDIT', 'CHARGE', 'REFUND')")
_WHERE_SETTLE = text("kind IN ('CHARGE', 'RELEASE')")


class CreditEntryRow(Base):
    """One append-only entry of a tenant's credit ledger (9.23.1; revision 0006).

    Balance = CREDIT - CHARGE + REFUND; reserved = RESERVE rows whose task has no settlement
    yet. The two partial UNIQUE indexes make a second reserve or a second settlement of a task
    impossible in the database, whatever the Python above it does."""

    __tablename__ = "credit_ledger"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key"),
        one_of("kind", CreditKind, "kind_enum"),
        CheckConstraint("amount_micros >= 0", name="amount_non_negative"),
        _currency_check(),
        CheckConstraint(
            "task_id IS NOT NULL OR kind IN ('CREDIT', 'REFUND')", name="task_kinds_name_a_task"
        ),
        Index("ix_credit_ledger_tenant_id_id", "tenant_id", "id"),
        Index("ix_credit_ledger_task_id", "task_id"),
        Index(
            "ix_credit_ledger_balance_entries",
            "tenant_id",
            "currency",
            "id",
            postgresql_where=_WHERE_BALANCE,
            sqlite_where=_WHERE_BALANCE,
        ),
        Index(
            "uq_credit_ledger_one_reserve",
            "task_id",
            unique=True,
            postgresql_where=_WHERE_RESERVE,
            sqlite_where=_WHERE_RESERVE,
        ),
        Index(
            "uq_credit_ledger_one_settlement",
            "task_id",
            unique=True,
            postgresql_where=_WHERE_SETTLE,
            sqlite_where=_WHERE_SETTLE,
        ),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    tenant_id: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(CHAR(3))
    task_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    attempt_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey("task_attempts.id"))
    idempotency_key: Mapped[str] = mapped_column(Text)
    actor: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text, server_default=text("''"))
    created_at: Mapped[datetime] = _created()


class CreditBalance(Base):
    """The balance (CREDIT - CHARGE + REFUND) cached per (tenant, currency), as of
    `last_entry_id`, the newest of those entries it includes (revision 0006).

    A cache, never the truth: `persistence.ledger.balance` uses it only while `last_entry_id`
    is the newest such entry's id, and derives the balance from `credit_ledger` otherwise.
    Reservations are not in it (they would make every CreateTask of a tenant queue on this
    row): the held amount is read from the tenant's live tasks."""

    __tablename__ = "credit_balances"

    tenant_id: Mapped[str] = mapped_column(Text, primary_key=True)
    currency: Mapped[str] = mapped_column(CHAR(3), primary_key=True)
    balance_micros: Mapped[int] = mapped_column(BigInteger)
    last_entry_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ProviderUsageEntryRow(Base):
    """One append-only provider cost entry of an attempt (9.23.1, 9.23.2; revision 0006)."""

    __tablename__ = "provider_usage_ledger"
    __table_args__ = (
        UniqueConstraint("idempotency_key"),
        one_of("kind", UsageKind, "kind_enum"),
        CheckConstraint("amount_micros >= 0", name="amount_non_negative"),
        CheckConstraint("provider_units IS NULL OR provider_units >= 0", name="units_non_negative"),
        _currency_check(),
        Index("ix_provider_usage_ledger_created_at", "created_at"),
        Index("ix_provider_usage_ledger_attempt_id", "attempt_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    attempt_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("task_attempts.id"))
    task_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("generation_tasks.id"))
    provider: Mapped[str] = mapped_column(Text)
    provider_account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("provider_accounts.id"))
    model: Mapped[str] = mapped_column(Text)
    provider_job_id: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(CHAR(3))
    provider_units: Mapped[int | None] = mapped_column(BigInteger)
    provider_unit_name: Mapped[str | None] = mapped_column(Text)
    price_version: Mapped[str] = mapped_column(Text)
    conversion_rate_version: Mapped[str | None] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JsonDoc, server_default=text("'{}'"))
    idempotency_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _created()


class ProviderUnitRate(Base):
    """A versioned conversion of a provider-native unit to micros: an integer fraction."""

    __tablename__ = "provider_unit_rates"
    __table_args__ = (
        UniqueConstraint(
            "provider", "unit_name", "rate_version", name="uq_provider_unit_rates_version"
        ),
        CheckConstraint("micros_per_unit >= 0", name="rate_non_negative"),
        CheckConstraint("unit_divisor > 0", name="divisor_positive"),
        CheckConstraint(
            "effective_to IS NULL OR effective_to > effective_from", name="effective_interval"
        ),
        _currency_check(),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    provider: Mapped[str] = mapped_column(Text)
    unit_name: Mapped[str] = mapped_column(Text)
    rate_version: Mapped[str] = mapped_column(Text)
    # micros of one unit = micros_per_unit / unit_divisor (e.g. 350 / 1000 per GPU millisecond)
    micros_per_unit: Mapped[int] = mapped_column(BigInteger)
    unit_divisor: Mapped[int] = mapped_column(BigInteger, server_default=text("1"))
    currency: Mapped[str] = mapped_column(CHAR(3))
    effective_from: Mapped[datetime] = mapped_column(UtcDateTime)
    effective_to: Mapped[datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = _created()


def _table(model: type[Base]) -> Table:
    return cast(Table, model.__table__)


# Core handles on the tables: the unit of work and the query modules write SQL against these.
provider_accounts = _table(ProviderAccount)
provider_model_capabilities = _table(ProviderModelCapability)
provider_price_versions = _table(ProviderPriceVersion)
generation_tasks = _table(GenerationTask)
route_decisions = _table(RouteDecision)
task_attempts = _table(TaskAttempt)
provider_jobs = _table(ProviderJob)
provider_health_events = _table(ProviderHealthEvent)
task_events = _table(TaskEvent)
outbox = _table(OutboxMessage)
lease_audit_events = _table(LeaseAuditEvent)
task_requeues = _table(TaskRequeue)
task_exclusions = _table(TaskExclusion)

# The fair queue's DRR checkpoint, one row per dispatcher shard (revision 0008): accelerator state
# a new leader starts from; the QUEUED tasks stay the truth (persistence.queue).
fair_queue_state = Table(
    "fair_queue_state",
    Base.metadata,
    Column("shard", Integer, primary_key=True, autoincrement=False),
    Column("state", JsonDoc, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

_WHERE_ACTIVE = text("active")
_ACTIVATION_ACTIONS = "action IN ('PUBLISHED', 'ROLLED_BACK', 'SCHEDULED', 'ACTIVATED')"


def _document_versions(name: str) -> Table:
    """Every published version of one kind of document (routing policies, tenants, accounts),
    one active."""
    return Table(
        name,
        Base.metadata,
        Column("id", BigIntPK, primary_key=True),
        Column("version", Text, nullable=False, unique=True),
        Column("document", Text, nullable=False),  # the file as published, byte for byte
        Column("source", Text, nullable=False),
        Column("active", Boolean, nullable=False),
        Column("published_at", UtcDateTime, nullable=False),
        Column("activated_at", UtcDateTime, nullable=True),
        Index(
            f"uq_{name}_one_active",
            "active",
            unique=True,
            postgresql_where=_WHERE_ACTIVE,
            sqlite_where=_WHERE_ACTIVE,
        ),
    )


def _document_activations(name: str) -> Table:
    """Every activation of one kind of document: what it replaced, who, when asked, when
    effective, and why."""
    return Table(
        name,
        Base.metadata,
        Column("id", BigIntPK, primary_key=True),
        Column("version", Text, nullable=False),
        Column("previous_version", Text, nullable=True),  # what it replaced; None: the first
        Column("action", Text, nullable=False),  # _ACTIVATION_ACTIONS
        Column("actor", Text, nullable=False),  # the caller's name
        # Effective time; while `pending`, the time a scheduled activation was asked for (0018).
        Column("at", UtcDateTime, nullable=False),
        Column("pending", Boolean, nullable=False, server_default=false()),
        Column("requested_at", UtcDateTime, nullable=True),  # when asked; None: the same as `at`
        Column("reason", Text, nullable=True),  # the operator's, optional
        CheckConstraint(_ACTIVATION_ACTIONS, name="action_enum"),
    )


# Routing policies (revision 0013, design 9.25.5): every published version, one of them active,
# and every activation of one, who made it and when (revision 0016, 9.25.5's audit of effective
# times). Their canaries are below.
routing_policy_versions = _document_versions("routing_policy_versions")
routing_policy_activations = _document_activations("routing_policy_activations")


# Tenants documents (revision 0017, 0018) and accounts documents (revision 0019, design 9.11,
# 9.19.1: provider accounts' limits, regions and credential references), kept alike.
tenant_config_versions = _document_versions("tenant_config_versions")
tenant_config_activations = _document_activations("tenant_config_activations")
account_config_versions = _document_versions("account_config_versions")
account_config_activations = _document_activations("account_config_activations")

# The canary of each candidate a routing policy names (revision 0013, 9.13.5) and every
# transition of it.
canary_states = Table(
    "canary_states",
    Base.metadata,
    Column("candidate_id", Text, primary_key=True),
    Column("policy_version", Text, nullable=False),  # the version that (re)started it
    Column("config_key", Text, nullable=False),  # sha256 of its stages and gates
    Column("stages", JsonDoc, nullable=False),  # percents
    Column("stage", Integer, nullable=False),
    Column("status", Text, nullable=False),
    Column("gates", JsonDoc, nullable=False),  # the last evaluation: gate -> passed
    Column("stage_started_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    one_of("status", CanaryStatus, "status_enum"),
)

canary_transitions = Table(
    "canary_transitions",
    Base.metadata,
    Column("id", BigIntPK, primary_key=True),
    Column("candidate_id", Text, nullable=False),
    Column("policy_version", Text, nullable=False),
    Column("action", Text, nullable=False),  # STARTED, ADVANCE, PROMOTE, ROLLBACK
    Column("reason", Text, nullable=False),
    Column("detail", JsonDoc, nullable=False),  # from_percent, to_percent, observed
    Column("at", UtcDateTime, nullable=False),
    Index("ix_canary_transitions_candidate_id_id", "candidate_id", "id"),
)
credit_ledger = _table(CreditEntryRow)
credit_balances = _table(CreditBalance)
provider_usage_ledger = _table(ProviderUsageEntryRow)
provider_unit_rates = _table(ProviderUnitRate)

# The execution side's own tables (revisions 0002 and 0003), declared as Core tables.
attempt_runtime = Table(
    "attempt_runtime",
    Base.metadata,
    # One row per attempt that reached the execution engine: when to poll next, how many
    # recovery queries were made, since when the submit is unknown, cancel bookkeeping.
    Column("attempt_id", BigInteger, ForeignKey(task_attempts.c.id), primary_key=True),
    Column("task_id", BigInteger, ForeignKey(generation_tasks.c.id), nullable=False),
    Column("submit_retries", Integer, nullable=False, server_default=text("0")),
    Column("supports_idempotency_key", Boolean, nullable=False, server_default=text("false")),
    Column("accepted_at", UtcDateTime, nullable=True),
    Column("next_poll_at", UtcDateTime, nullable=True),
    Column("poll_phase", Text, nullable=True),
    Column("polls_in_phase", Integer, nullable=False, server_default=text("0")),
    Column("poll_count", Integer, nullable=False, server_default=text("0")),
    Column("last_polled_at", UtcDateTime, nullable=True),
    Column("stuck_since", UtcDateTime, nullable=True),
    Column("unknown_since", UtcDateTime, nullable=True),
    Column("next_recovery_at", UtcDateTime, nullable=True),
    Column("recovery_queries", Integer, nullable=False, server_default=text("0")),
    Column("cancel_requested_at", UtcDateTime, nullable=True),
    Column("cancel_calls", Integer, nullable=False, server_default=text("0")),
    Column("unrecognized_count", Integer, nullable=False, server_default=text("0")),
    Column("last_unrecognized_status", Text, nullable=True),
    Column("fetch_attempts", Integer, nullable=False, server_default=text("0")),
    Column("output_refreshes", Integer, nullable=False, server_default=text("0")),
    # Revision 0003: a held job the provider stopped knowing, and late lookups of ABANDONED.
    Column("job_not_found_since", UtcDateTime, nullable=True),
    Column("late_found_job_id", Text, nullable=True),
    Column("late_found_method", Text, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    # Revision 0009: partial due-time indexes, only rows that can come due (the claims' order).
    Index(
        "ix_attempt_runtime_poll_due",
        "next_poll_at",
        "attempt_id",
        postgresql_where=text("next_poll_at IS NOT NULL"),
        sqlite_where=text("next_poll_at IS NOT NULL"),
    ),
    Index(
        "ix_attempt_runtime_recovery_due",
        "next_recovery_at",
        "attempt_id",
        postgresql_where=text("next_recovery_at IS NOT NULL"),
        sqlite_where=text("next_recovery_at IS NOT NULL"),
    ),
)

provider_events = Table(
    "provider_events",
    Base.metadata,
    # Every observation of a provider job (poll, callback, cancel, submit), raw payload included,
    # deduplicated by (account, job id, raw status, payload hash).
    Column("id", BigIntPK, primary_key=True),
    Column("provider_account_id", BigInteger, nullable=False),
    Column("provider_job_id", Text, nullable=False),
    Column("attempt_id", BigInteger, nullable=True),
    Column("source", Text, nullable=False),
    Column("job_state", Text, nullable=False),
    Column("raw_status", Text, nullable=False),
    Column("payload_hash", Text, nullable=False),
    Column("raw_payload", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("received_at", UtcDateTime, nullable=False),
    UniqueConstraint(
        "provider_account_id",
        "provider_job_id",
        "raw_status",
        "payload_hash",
        name="uq_provider_events_dedup",
    ),
    Index("ix_provider_events_attempt_id", "attempt_id"),
)

# Daily bill reconciliation (revision 0007, design 9.23.3): each provider usage import raw and
# immutable, its normalized records, one run per (day, provider, account) import, its rows.
_WHERE_CURRENT = text("superseded_by IS NULL")

raw_usage_imports = Table(
    "raw_usage_imports",
    Base.metadata,
    # The ListUsage answer exactly as received (canonical JSON); the same payload for the same
    # account and window is stored once (its sha256). Never updated or deleted (a trigger).
    Column("id", BigIntPK, primary_key=True),
    Column("provider", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("window_start", UtcDateTime, nullable=False),
    Column("window_end", UtcDateTime, nullable=False),
    Column("payload", Text, nullable=False),
    Column("payload_sha256", Text, nullable=False),
    Column("record_count", Integer, nullable=False),
    Column("fetched_at", UtcDateTime, nullable=False),
    UniqueConstraint(
        "provider", "account", "window_start", "payload_sha256", name="uq_raw_usage_imports_payload"
    ),
)

provider_usage_records = Table(
    "provider_usage_records",
    Base.metadata,
    # One normalized line of an import; integer micros and thousandths of provider units.
    Column("id", BigIntPK, primary_key=True),
    Column("import_id", BigInteger, ForeignKey("raw_usage_imports.id"), nullable=False),
    Column("line_no", Integer, nullable=False),
    Column("provider", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("provider_job_id", Text, nullable=False),
    Column("provider_request_id", Text, nullable=False),
    Column("client_request_key", Text, nullable=False),
    Column("usage_time", UtcDateTime, nullable=True),
    Column("provider_milliunits", BigInteger, nullable=False),
    Column("provider_unit", Text, nullable=False),
    Column("cost_micros", BigInteger, nullable=False),
    Column("currency", CHAR(3), nullable=False),
    Column("raw_json", Text, nullable=False),
    UniqueConstraint("import_id", "line_no", name="uq_provider_usage_records_line"),
)

reconciliation_runs = Table(
    "reconciliation_runs",
    Base.metadata,
    # One reconciliation of a day for one provider account (provider "credit_ledger": the
    # tenant side). A re-run with the same result is the same run; a different result is a new
    # run that supersedes the old one (``superseded_by``), so history stays readable.
    Column("id", BigIntPK, primary_key=True),
    Column("day", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("import_id", BigInteger, ForeignKey("raw_usage_imports.id"), nullable=True),
    Column("result_sha256", Text, nullable=False),
    Column("record_count", Integer, nullable=False),
    Column("billed_micros", BigInteger, nullable=False),
    Column("expected_micros", BigInteger, nullable=False),
    Column("delta_micros", BigInteger, nullable=False),
    Column("currency", CHAR(3), nullable=False),
    Column("statuses", JsonDoc, nullable=False),
    Column("superseded_by", BigInteger, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    CheckConstraint("length(day) = 10", name="day_iso"),
    Index(
        "uq_reconciliation_runs_current",
        "day",
        "provider",
        "account",
        unique=True,
        postgresql_where=_WHERE_CURRENT,
        sqlite_where=_WHERE_CURRENT,
    ),
)

reconciliation_discrepancies = Table(
    "reconciliation_discrepancies",
    Base.metadata,
    # A row of a run's report (controlplane.domain.reconciliation.Discrepancy).
    Column("id", BigIntPK, primary_key=True),
    Column("run_id", BigInteger, ForeignKey("reconciliation_runs.id"), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("kind", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("attempt_id", BigInteger, nullable=True),
    Column("task_id", BigInteger, nullable=True),
    Column("provider_job_id", Text, nullable=False),
    Column("record_ids", JsonDoc, nullable=False),
    Column("billed_micros", BigInteger, nullable=False),
    Column("expected_micros", BigInteger, nullable=False),
    Column("delta_micros", BigInteger, nullable=False),
    Column("currency", CHAR(3), nullable=False),
    Column("evidence", JsonDoc, nullable=False),
    Column("suggested_action", Text, nullable=False),
    UniqueConstraint("run_id", "seq", name="uq_reconciliation_discrepancies_seq"),
    one_of("kind", DiscrepancyKind, "kind_enum"),
    Index("ix_reconciliation_discrepancies_attempt_id", "attempt_id"),
)

cloud_billing_imports = Table(
    "cloud_billing_imports",
    Base.metadata,
    # A provider bill file `vidroute usage import` read (revision 0021): Google's Cloud Billing
    # export for Veo, raw and immutable (a trigger), once per (provider, account, sha256), with
    # the SKU map it was read with and the UTC days it covers (ISO dates, inclusive).
    Column("id", BigIntPK, primary_key=True),
    Column("provider", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("file_name", Text, nullable=False),
    Column("format", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("payload_sha256", Text, nullable=False),
    Column("sku_map", JsonDoc, nullable=False),
    Column("covers_from", Text, nullable=False),
    Column("covers_to", Text, nullable=False),
    Column("row_count", Integer, nullable=False),
    Column("ours_count", Integer, nullable=False),
    Column("cost_micros", BigInteger, nullable=False),
    Column("currency", CHAR(3), nullable=False),
    Column("imported_at", UtcDateTime, nullable=False),
    UniqueConstraint(
        "provider", "account", "payload_sha256", name="uq_cloud_billing_imports_payload"
    ),
    CheckConstraint(
        "length(covers_from) = 10 AND length(covers_to) = 10 AND covers_from <= covers_to",
        name="days",
    ),
    Index(
        "ix_cloud_billing_imports_account_days", "provider", "account", "covers_from", "covers_to"
    ),
)

loss_disputes = Table(
    "loss_disputes",
    Base.metadata,
    # A reconciliation row booked as a confirmed loss and the dispute that follows it
    # (revision 0021, `controlplane.domain.disputes`): one per row. ``new_loss_micros`` is what
    # booking added as platform loss (a PLATFORM_LOSS usage entry when the row names an
    # attempt), ``refunded_micros`` what the provider gave back.
    Column("id", BigIntPK, primary_key=True),
    Column(
        "discrepancy_id", BigInteger, ForeignKey("reconciliation_discrepancies.id"), nullable=False
    ),
    Column("day", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("attempt_id", BigInteger, nullable=True),
    Column("task_id", BigInteger, nullable=True),
    Column("billed_micros", BigInteger, nullable=False),
    Column("expected_micros", BigInteger, nullable=False),
    Column("confirmed_micros", BigInteger, nullable=False),
    Column("new_loss_micros", BigInteger, nullable=False),
    Column("refunded_micros", BigInteger, nullable=False),
    Column("currency", CHAR(3), nullable=False),
    Column("state", Text, nullable=False),
    Column("evidence", JsonDoc, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    UniqueConstraint("discrepancy_id", name="uq_loss_disputes_discrepancy_id"),
    one_of("state", DisputeState, "state_enum"),
    CheckConstraint(
        "new_loss_micros >= 0 AND refunded_micros >= 0 AND refunded_micros <= confirmed_micros",
        name="amounts",
    ),
    Index("ix_loss_disputes_created_at", "created_at"),
)

loss_dispute_events = Table(
    "loss_dispute_events",
    Base.metadata,
    # Every move of a dispute (booking included: from NULL to OPEN), who and why; append-only.
    Column("id", BigIntPK, primary_key=True),
    Column("dispute_id", BigInteger, ForeignKey("loss_disputes.id"), nullable=False),
    Column("from_state", Text, nullable=True),
    Column("to_state", Text, nullable=False),
    Column("refunded_micros", BigInteger, nullable=False),
    Column("actor", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Index("ix_loss_dispute_events_dispute_id", "dispute_id"),
)

# Caller webhooks (revision 0010): the durable outbox of messages to callers, written in the
# transaction of the task event each announces, and every delivery attempt of them.
_WHERE_PENDING = text("state = 'PENDING'")

webhook_messages = Table(
    "webhook_messages",
    Base.metadata,
    # ``msg_<uuid>``: the webhook-id header, the same on every retry.
    Column("id", Text, primary_key=True),
    Column("task_id", BigInteger, ForeignKey(generation_tasks.c.id), nullable=False),
    Column("event_seq", BigInteger, nullable=False),  # the task event it announces (its order)
    Column("tenant_id", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("body", Text, nullable=False),  # exactly the bytes signed and sent
    Column("state", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    # Due time while PENDING (a claim pushes it past its lease); NULL once settled.
    Column("next_attempt_at", UtcDateTime, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    CheckConstraint("state IN ('PENDING', 'DELIVERED', 'FAILED', 'REFUSED')", name="state_enum"),
    Index("ix_webhook_messages_task_id", "task_id"),
    Index(
        "ix_webhook_messages_due",
        "next_attempt_at",
        postgresql_where=_WHERE_PENDING,
        sqlite_where=_WHERE_PENDING,
    ),
)

webhook_attempts = Table(
    "webhook_attempts",
    Base.metadata,
    Column("id", BigIntPK, primary_key=True),
    Column("message_id", Text, ForeignKey(webhook_messages.c.id), nullable=False),
    Column("attempt_no", Integer, nullable=False),
    Column("sent_at", UtcDateTime, nullable=False),
    Column("status_code", Integer, nullable=False),  # 0: no answer
    Column("error", Text, nullable=False),
    Column("duration_ms", Integer, nullable=False),
    UniqueConstraint("message_id", "attempt_no", name="uq_webhook_attempts_message_attempt"),
)

# Quality signals (revision 0012, design 9.14): the caller's verdict per task, the technical
# check of every probed output, and their counters per (provider, model, mode, tag bucket),
# kept in the transaction that records each signal (`controlplane.persistence.quality`).
quality_feedback = Table(
    "quality_feedback",
    Base.metadata,
    Column("task_id", BigInteger, ForeignKey(generation_tasks.c.id), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("mode", Text, nullable=False),
    Column("bucket", Text, nullable=False),
    Column("verdict", Text, nullable=False),
    Column("tags", JsonDoc, nullable=False),
    Column("comment", Text, nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    one_of("verdict", Verdict, "verdict_enum"),
)

quality_checks = Table(
    "quality_checks",
    Base.metadata,
    Column("id", BigIntPK, primary_key=True),
    Column("task_id", BigInteger, ForeignKey(generation_tasks.c.id), nullable=False),
    Column("attempt_id", BigInteger, ForeignKey(task_attempts.c.id), nullable=False),
    Column("sample_index", Integer, nullable=False),
    Column("provider", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("mode", Text, nullable=False),
    Column("bucket", Text, nullable=False),
    Column("defects", JsonDoc, nullable=False),  # Defect codes; [] for a clean output
    Column("created_at", UtcDateTime, nullable=False),
    UniqueConstraint("attempt_id", "sample_index", name="uq_quality_checks_attempt_sample"),
)

quality_aggregates = Table(
    "quality_aggregates",
    Base.metadata,
    Column("provider", Text, primary_key=True),
    Column("model", Text, primary_key=True),
    Column("mode", Text, primary_key=True),
    Column("bucket", Text, primary_key=True),  # a tag bucket; the whole mode is summed on read
    Column("accepted", BigInteger, nullable=False),
    Column("rejected", BigInteger, nullable=False),
    Column("regenerated", BigInteger, nullable=False),
    Column("technical_checks", BigInteger, nullable=False),
    Column("technical_defects", BigInteger, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

# Capability releases (revision 0019, design 9.25.5): every published capability document, its
# state (STAGED, or APPLIED: its rows are in the catalog from `effective_from`, maybe ahead), the
# force reason, its diff; and every activation with what it replaced, who, when, and why.
capability_releases = Table(
    "capability_releases",
    Base.metadata,
    Column("id", BigIntPK, primary_key=True),
    Column("version", Text, nullable=False, unique=True),
    Column("document", Text, nullable=False),  # the document as published, byte for byte
    Column("source", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("state", Text, nullable=False),  # STAGED or APPLIED
    Column("published_at", UtcDateTime, nullable=False),
    Column("effective_from", UtcDateTime, nullable=True),  # None while STAGED
    Column("forced_reason", Text, nullable=True),
    Column("changes", JsonDoc, nullable=False),
    CheckConstraint("state IN ('STAGED', 'APPLIED')", name="state_enum"),
)

capability_release_activations = Table(
    "capability_release_activations",
    Base.metadata,
    Column("id", BigIntPK, primary_key=True),
    Column("version", Text, nullable=False),
    Column("previous_version", Text, nullable=True),  # the release it replaced; None: the first
    Column("action", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("at", UtcDateTime, nullable=False),
    Column("effective_from", UtcDateTime, nullable=False),
    Column("reason", Text, nullable=True),  # the recorded reason of a forced activation
    Column("replaced", JsonDoc, nullable=False),  # per model: the versions it replaced
    CheckConstraint(
        "action IN ('PUBLISHED', 'SCHEDULED', 'ACTIVATED', 'ROLLED_BACK')", name="action_enum"
    ),
)
