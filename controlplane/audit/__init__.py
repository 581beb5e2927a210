"""Audit of the stored execution history against the design's invariants (9.3.4, 9.8, 9.11.2).

`check_invariants` reads one snapshot of the database (and optionally the lease store) and
returns an `InvariantReport`; `python -m controlplane.audit.invariants URL` is its CLI.

The checker functions are imported lazily (PEP 562): importing them here eagerly would load
``controlplane.audit.invariants`` before ``python -m`` runs it as ``__main__``, and runpy warns
about exactly that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controlplane.audit.report import DESCRIPTIONS, Invariant, InvariantReport, Violation

if TYPE_CHECKING:
    from controlplane.audit.invariants import check_invariants, check_snapshot

__all__ = [
    "DESCRIPTIONS",
    "Invariant",
    "InvariantReport",
    "Violation",
    "check_invariants",
    "check_snapshot",
]


def __getattr__(name: str) -> Any:
    if name in ("check_invariants", "check_snapshot"):
        from controlplane.audit import invariants

        return getattr(invariants, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
