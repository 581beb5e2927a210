"""Money: raw usage imports, usage records, reconciliation reports (placeholder).

Revision ID: 0007_reconciliation
Revises: 0006_credit_ledger
Create Date: 2026-12-01

Placeholder reserved for this revision; its owner fills in the schema change.
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0007_reconciliation"
down_revision: str | None = "0006_credit_ledger"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
