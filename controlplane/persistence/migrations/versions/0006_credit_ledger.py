"""Money: credit ledger and provider usage ledger (placeholder).

Revision ID: 0006_credit_ledger
Revises: 0005_trace_context
Create Date: 2026-12-01

Placeholder reserved for this revision; its owner fills in the schema change.
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0006_credit_ledger"
down_revision: str | None = "0005_trace_context"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
