"""Route replay reads decisions by time (design 9.25.4): an index on their creation time.

Revision ID: 0014_route_decisions_created_at
Revises: 0013_routing_policies
Create Date: 2026-12-01

``vidroute replay --since ... --until ...`` pages through the ``route_decisions`` written in a
window, keyset by ``(created_at, id)`` (`persistence.replay_reads`). Without an index on the
time every page scanned the table from its oldest decision (the primary key in id order,
filtering on the time); with this one a page reads its rows off one range of the index,
whatever the table's size.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014_route_decisions_created_at"
down_revision: str | None = "0013_routing_policies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_route_decisions_created_at_id"


def upgrade() -> None:
    op.create_index(INDEX, "route_decisions", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="route_decisions")
