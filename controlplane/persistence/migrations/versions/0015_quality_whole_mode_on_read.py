"""Quality counters per tag bucket only: a model's whole mode is summed when read (design 9.14).

Revision ID: 0015_quality_whole_mode_on_read
Revises: 0014_route_decisions_created_at
Create Date: 2026-12-01

Revision 0012 kept, beside each tag bucket's counters, one row per (provider, model, mode) with
the empty bucket ``""``: the whole mode, bumped by every signal of the model. Every transaction
that stored an output of the model held that one row locked until it committed, whatever the
task's bucket. `persistence.quality.aggregates` now sums the buckets instead (each task is in
exactly one), so the stored whole-mode rows go. Downgrading recomputes them from the buckets.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_quality_whole_mode_on_read"
down_revision: str | None = "0014_route_decisions_created_at"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COUNTERS = "accepted, rejected, regenerated, technical_checks, technical_defects"


def upgrade() -> None:
    op.execute(sa.text("DELETE FROM quality_aggregates WHERE bucket = ''"))


def downgrade() -> None:
    sums = ", ".join(f"SUM({c})" for c in _COUNTERS.split(", "))
    op.execute(
        sa.text(
            "INSERT INTO quality_aggregates"
            f" (provider, model, mode, bucket, {_COUNTERS}, updated_at)"
            f" SELECT provider, model, mode, '', {sums}, MAX(updated_at)"
            " FROM quality_aggregates WHERE bucket <> '' GROUP BY provider, model, mode"
        )
    )
