"""Initial schema: every table of design 9.19 plus outbox, task events and lease audit.

Revision ID: 0001_initial
Revises:
Create Date: 2026-01-01

The enum lists in the CHECK constraints are frozen copies of the values at this revision; a later
revision that adds a state must replace the constraint, never import the live enum.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TASK_STATES = (
    "QUEUED", "SCHEDULING", "SUBMITTING", "RUNNING", "OUTPUT_FETCHING",
    "SUCCEEDED", "FAILED", "CANCELLED",
)
ATTEMPT_STATES = (
    "CREATED", "RESERVING", "READY_TO_SUBMIT", "SUBMITTING", "SUBMIT_UNKNOWN", "ACCEPTED",
    "PROVIDER_QUEUED", "PROVIDER_THROTTLED", "RUNNING", "SUCCEEDED", "FAILED",
    "CANCEL_REQUESTED", "CANCELLED", "ABANDONED",
)
SERVICE_CLASSES = ("INTERACTIVE", "STANDARD", "BATCH")


def _one_of(column: str, values: Sequence[str], name: str) -> sa.CheckConstraint:
    listed = ", ".join(f"'{v}'" for v in values)
    return sa.CheckConstraint(f"{column} IN ({listed})", name=name)


def _pk() -> sa.Column:
    return sa.Column(
        "id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
        autoincrement=True,
    )


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _json_or_null() -> sa.types.TypeEngine:
    return sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )


def _ts(name: str, nullable: bool = False, now: bool = False) -> sa.Column:
    return sa.Column(
        name, sa.DateTime(timezone=True), nullable=nullable,
        server_default=sa.func.now() if now else None,
    )


def _text(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.Text(), nullable=nullable)


def _fk(column: str, target: str, table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint([column], [f"{target}.id"], name=f"fk_{table}_{column}")


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"

    op.create_table(
        "provider_accounts",
        _pk(),
        _text("provider"), _text("account_name"), _text("region"), _text("credential_ref"),
        _text("status"),
        sa.Column("config", _json(), nullable=False, server_default=sa.text("'{}'")),
        _ts("created_at", now=True), _ts("updated_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_accounts"),
        sa.UniqueConstraint(
            "provider", "account_name", "region", name="uq_provider_accounts_identity"
        ),
    )
    op.create_table(
        "provider_model_capabilities",
        _pk(),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        _text("model"), _text("model_version"), _text("capability_version"),
        _text("lifecycle_status"),
        sa.Column("capabilities", _json(), nullable=False),
        _ts("effective_from"), _ts("effective_to", nullable=True), _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_model_capabilities"),
        _fk("provider_account_id", "provider_accounts", "provider_model_capabilities"),
        sa.UniqueConstraint(
            "provider_account_id", "model", "model_version", "capability_version",
            name="uq_provider_model_capabilities_version",
        ),
        sa.CheckConstraint(
            "effective_to IS NULL OR effective_to > effective_from",
            name="ck_provider_model_capabilities_effective_interval",
        ),
    )
    op.create_table(
        "provider_price_versions",
        _pk(),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        _text("model"), _text("price_version"), _text("unit"),
        sa.Column("price_micros_per_unit", sa.BigInteger(), nullable=False),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        _ts("effective_from"), _ts("effective_to", nullable=True), _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_price_versions"),
        _fk("provider_account_id", "provider_accounts", "provider_price_versions"),
        sa.UniqueConstraint(
            "provider_account_id", "model", "price_version",
            name="uq_provider_price_versions_version",
        ),
        sa.CheckConstraint(
            "price_micros_per_unit >= 0", name="ck_provider_price_versions_price_non_negative"
        ),
        sa.CheckConstraint(
            "effective_to IS NULL OR effective_to > effective_from",
            name="ck_provider_price_versions_effective_interval",
        ),
        sa.CheckConstraint(
            "length(currency) = 3", name="ck_provider_price_versions_currency_iso4217"
        ),
    )

    # generation_tasks.adopted_attempt_id and task_attempts.task_id reference each other.
    # SQLite accepts a forward reference inline (and cannot ALTER one in); PostgreSQL needs the
    # constraint added once task_attempts exists.
    adopted_fk = sa.ForeignKeyConstraint(
        ["adopted_attempt_id"], ["task_attempts.id"], name="fk_generation_tasks_adopted_attempt"
    )
    op.create_table(
        "generation_tasks",
        _pk(),
        _text("tenant_id"), _text("user_id"), _text("project_id"), _text("idempotency_key"),
        sa.Column("spec", _json(), nullable=False),
        _text("normalized_spec_hash"), _text("service_class"),
        sa.Column("priority", sa.Integer(), nullable=False),
        _text("status"),
        sa.Column("status_version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_event_seq", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        _text("failure_class", True), _text("failure_code", True), _text("failure_message", True),
        sa.Column("adopted_attempt_id", sa.BigInteger(), nullable=True),
        sa.Column("output_asset", _json_or_null(), nullable=True),
        _ts("queue_deadline_at", nullable=True), _ts("deadline_at", nullable=True),
        _ts("created_at", now=True), _ts("updated_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_generation_tasks"),
        sa.UniqueConstraint("tenant_id", "idempotency_key", name="uq_generation_tasks_idempotency"),
        _one_of("status", TASK_STATES, "ck_generation_tasks_status_enum"),
        _one_of("service_class", SERVICE_CLASSES, "ck_generation_tasks_service_class_enum"),
        *([adopted_fk] if sqlite else []),
    )
    op.create_index("ix_generation_tasks_status_id", "generation_tasks", ["status", "id"])
    op.create_index("ix_generation_tasks_tenant_id_id", "generation_tasks", ["tenant_id", "id"])

    op.create_table(
        "route_decisions",
        _pk(),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("decision_no", sa.Integer(), nullable=False),
        _text("policy_version"), _text("selected_candidate", True),
        sa.Column("candidate_snapshot", _json(), nullable=False),
        _text("reason_code"), _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_route_decisions"),
        _fk("task_id", "generation_tasks", "route_decisions"),
        sa.UniqueConstraint("task_id", "decision_no", name="uq_route_decisions_task_decision_no"),
    )

    op.create_table(
        "task_attempts",
        _pk(),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        _text("provider_model"), _text("provider_model_version"), _text("capability_version"),
        _text("price_version"), _text("routing_policy_version"), _text("client_request_key"),
        _text("normalized_spec_hash"), _text("request_hash", True),
        sa.Column("compile_plan", _json(), nullable=False),
        sa.Column("route_decision_id", sa.BigInteger(), nullable=True),
        _text("status"),
        sa.Column("status_version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("estimated_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("actual_cost_micros", sa.BigInteger(), nullable=True),
        sa.Column("currency", sa.CHAR(3), nullable=False),
        _text("lease_token", True),
        sa.Column("fencing_token", sa.BigInteger(), nullable=True),
        _ts("request_started_at", nullable=True), _ts("request_body_sent_at", nullable=True),
        _text("transport_error_stage", True),
        sa.Column("provider_request_trace", _json_or_null(), nullable=True),
        _text("failure_class", True), _text("failure_code", True), _text("failure_message", True),
        _ts("created_at", now=True), _ts("updated_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_task_attempts"),
        _fk("task_id", "generation_tasks", "task_attempts"),
        _fk("provider_account_id", "provider_accounts", "task_attempts"),
        _fk("route_decision_id", "route_decisions", "task_attempts"),
        sa.UniqueConstraint("task_id", "attempt_no", name="uq_task_attempts_task_attempt_no"),
        sa.UniqueConstraint(
            "provider_account_id", "client_request_key",
            name="uq_task_attempts_client_request_key",
        ),
        _one_of("status", ATTEMPT_STATES, "ck_task_attempts_status_enum"),
        sa.CheckConstraint("attempt_no >= 1", name="ck_task_attempts_attempt_no_positive"),
        sa.CheckConstraint(
            "estimated_cost_micros >= 0", name="ck_task_attempts_estimated_cost_non_negative"
        ),
        sa.CheckConstraint(
            "actual_cost_micros IS NULL OR actual_cost_micros >= 0",
            name="ck_task_attempts_actual_cost_non_negative",
        ),
        sa.CheckConstraint("length(currency) = 3", name="ck_task_attempts_currency_iso4217"),
    )
    op.create_index(
        "ix_task_attempts_status_account", "task_attempts", ["status", "provider_account_id"]
    )
    if not sqlite:
        op.create_foreign_key(
            "fk_generation_tasks_adopted_attempt", "generation_tasks", "task_attempts",
            ["adopted_attempt_id"], ["id"],
        )

    op.create_table(
        "provider_jobs",
        _pk(),
        sa.Column("attempt_id", sa.BigInteger(), nullable=False),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        _text("provider_job_id"), _text("provider_request_id", True), _text("raw_status", True),
        _text("normalized_status"),
        sa.Column("output_locator", _json_or_null(), nullable=True),
        sa.Column("raw_failure", _json_or_null(), nullable=True),
        _ts("submitted_at"), _ts("last_polled_at", nullable=True),
        _ts("completed_at", nullable=True), _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_jobs"),
        _fk("attempt_id", "task_attempts", "provider_jobs"),
        _fk("provider_account_id", "provider_accounts", "provider_jobs"),
        sa.UniqueConstraint(
            "provider_account_id", "provider_job_id", name="uq_provider_jobs_provider_job_id"
        ),
        sa.UniqueConstraint("attempt_id", name="uq_provider_jobs_attempt_id"),
        _one_of("normalized_status", ATTEMPT_STATES, "ck_provider_jobs_normalized_status_enum"),
    )

    op.create_table(
        "provider_health_events",
        _pk(),
        sa.Column("provider_account_id", sa.BigInteger(), nullable=False),
        _text("model", True), _text("operation"), _text("old_state"), _text("new_state"),
        _text("reason"),
        sa.Column("metrics_snapshot", _json(), nullable=False),
        _ts("occurred_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_provider_health_events"),
        _fk("provider_account_id", "provider_accounts", "provider_health_events"),
    )
    op.create_index(
        "ix_provider_health_events_account_at", "provider_health_events",
        ["provider_account_id", "occurred_at"],
    )

    op.create_table(
        "task_events",
        _pk(),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        _text("kind"),
        sa.Column("payload", _json(), nullable=False),
        _ts("created_at", now=True),
        sa.PrimaryKeyConstraint("id", name="pk_task_events"),
        _fk("task_id", "generation_tasks", "task_events"),
        sa.UniqueConstraint("task_id", "seq", name="uq_task_events_task_seq"),
    )

    op.create_table(
        "outbox",
        _pk(),
        _text("topic"), _text("aggregate_id"),
        sa.Column("payload", _json(), nullable=False),
        _ts("created_at", now=True), _ts("available_at"),
        _text("claimed_by", True), _ts("claimed_until", nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        _ts("done_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.CheckConstraint("attempts >= 0", name="ck_outbox_attempts_non_negative"),
    )
    op.create_index("ix_outbox_pending", "outbox", ["topic", "done_at", "available_at"])

    op.create_table(
        "lease_audit_events",
        _pk(),
        _text("dimension"),
        sa.Column("expected", sa.BigInteger(), nullable=False),
        sa.Column("actual", sa.BigInteger(), nullable=False),
        sa.Column("delta", sa.BigInteger(), nullable=False),
        _ts("at"),
        sa.PrimaryKeyConstraint("id", name="pk_lease_audit_events"),
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        # Dropping a referenced table runs an implicit DELETE; defer FK checks to commit, by
        # which time every table in the cycle is gone.
        op.execute("PRAGMA defer_foreign_keys = ON")
    else:
        op.drop_constraint(
            "fk_generation_tasks_adopted_attempt", "generation_tasks", type_="foreignkey"
        )
    op.drop_table("lease_audit_events")
    op.drop_index("ix_outbox_pending", table_name="outbox")
    op.drop_table("outbox")
    op.drop_table("task_events")
    op.drop_index("ix_provider_health_events_account_at", table_name="provider_health_events")
    op.drop_table("provider_health_events")
    op.drop_table("provider_jobs")
    op.drop_index("ix_task_attempts_status_account", table_name="task_attempts")
    op.drop_table("task_attempts")
    op.drop_table("route_decisions")
    op.drop_index("ix_generation_tasks_tenant_id_id", table_name="generation_tasks")
    op.drop_index("ix_generation_tasks_status_id", table_name="generation_tasks")
    op.drop_table("generation_tasks")
    op.drop_table("provider_price_versions")
    op.drop_table("provider_model_capabilities")
    op.drop_table("provider_accounts")
