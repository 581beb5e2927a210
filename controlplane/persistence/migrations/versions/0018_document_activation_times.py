"""Scheduled and staged activations of versioned documents, and why each happened (9.25.5).

Revision ID: 0018_document_activation_times
Revises: 0017_tenant_configs
Create Date: 2026-12-05

Each ``*_activations`` table (routing policies, tenants documents) gains
- ``pending``: a scheduled activation not yet effective; its ``at`` is the time asked for, and
  it becomes effective (``at`` the time it did, ``previous_version`` what it replaced) under the
  kind's publication lock;
- ``requested_at``: when the operator asked (NULL on rows before this revision: the same as
  ``at``);
- ``reason``: the operator's optional reason;
and two actions: SCHEDULED (a publication activated at a later time) and ACTIVATED (a staged
version made active).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018_document_activation_times"
down_revision: str | None = "0017_tenant_configs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("routing_policy_activations", "tenant_config_activations")
OLD = "action IN ('PUBLISHED', 'ROLLED_BACK')"
NEW = "action IN ('PUBLISHED', 'ROLLED_BACK', 'SCHEDULED', 'ACTIVATED')"


def _action_checks(table: str) -> list[str]:
    """The names of the table's action CHECK as created: 0016 and 0017 named it twice over
    (``ck_<table>_ck_<table>_action_enum``, which PostgreSQL truncates to 63 characters), so it
    is found by its text rather than guessed."""
    checks = sa.inspect(op.get_bind()).get_check_constraints(table)
    return [c["name"] for c in checks if c.get("name") and "action" in c.get("sqltext", "")]


def _replace_check(table: str, sqltext: str) -> None:
    old = _action_checks(table)
    with op.batch_alter_table(table) as batch:
        for name in old:
            batch.drop_constraint(op.f(name), type_="check")
        batch.create_check_constraint(op.f(f"ck_{table}_action_enum"), sqltext)


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("pending", sa.Boolean(), nullable=False, server_default=sa.false())
            )
            batch.add_column(sa.Column("requested_at", sa.DateTime(timezone=True)))
            batch.add_column(sa.Column("reason", sa.Text()))
        _replace_check(table, NEW)


def downgrade() -> None:
    for table in TABLES:
        op.execute(sa.text(f"DELETE FROM {table} WHERE action IN ('SCHEDULED', 'ACTIVATED')"))
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint("action_enum", type_="check")
            batch.create_check_constraint("action_enum", OLD)
            batch.drop_column("reason")
            batch.drop_column("requested_at")
            batch.drop_column("pending")
