"""A provider account's billing rules, as data (design 9.16.4 "whether a failure is billed", 9.23).

Providers bill different things for the same outcome: Runway refunds failed and cancelled
generations, Google does not charge a blocked or failed Veo generation, a GPU cluster bills the
GPU seconds a failed job used. Reconciliation must classify a bill against *that provider's*
rules, or a correct bill produces a false discrepancy every day. The rules travel with the
price: each capability entry's ``commercial.billing`` block (schema
``vidroute_core/capabilities/capability.schema.json``), published and versioned with its
``price_version``, so the rules an attempt is reconciled under are those of the price it was
estimated at.

* ``failed`` / ``cancelled``: what a failed (cancelled) generation is billed: ``nothing``,
  ``usage`` (what it used, e.g. GPU seconds: the attempt's measured cost, its ACTUAL ledger
  entry), or ``fixed`` (``failed_fixed_micros`` / ``cancelled_fixed_micros`` per generation).
* ``granularity``: ``job`` (one usage line per job) or ``model_day`` (daily totals per model,
  Runway's ``/v1/organization/usage``): evidence for the reader, and the reason a model-day is
  compared as a sum.

Currency and units are the entry's own ``commercial.currency`` / ``provider_unit``. An entry
without a billing block bills failures nothing, per job: the rule the matcher had before rules
were data, so a price published earlier keeps meaning what it meant.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["BillingRules", "FailureCharge", "Granularity", "charge_due", "cost_under"]


class FailureCharge(enum.Enum):
    """What a generation that did not succeed is billed."""

    NOTHING = "nothing"
    USAGE = "usage"
    FIXED = "fixed"


class Granularity(enum.Enum):
    """How the provider's bill is itemised."""

    JOB = "job"
    MODEL_DAY = "model_day"


@dataclass(frozen=True, slots=True)
class BillingRules:
    """One price version's billing rules (module doc)."""

    failed: FailureCharge = FailureCharge.NOTHING
    cancelled: FailureCharge = FailureCharge.NOTHING
    failed_fixed_micros: int = 0
    cancelled_fixed_micros: int = 0
    granularity: Granularity = Granularity.JOB
    #: The price version these rules were published with ("" for the default).
    price_version: str = ""

    @classmethod
    def from_commercial(cls, commercial: Mapping[str, Any]) -> BillingRules:
        """The rules of a schema-valid ``commercial`` block (its ``billing``, else the
        default)."""
        block = commercial.get("billing") or {}
        return cls(
            failed=FailureCharge(block.get("failed", "nothing")),
            cancelled=FailureCharge(block.get("cancelled", "nothing")),
            failed_fixed_micros=int(block.get("failed_fixed_micros", 0)),
            cancelled_fixed_micros=int(block.get("cancelled_fixed_micros", 0)),
            granularity=Granularity(block.get("granularity", "job")),
            price_version=str(commercial.get("price_version", "")),
        )

    def facts(self) -> dict[str, Any]:
        """The rules as evidence (what the row was classified against)."""
        return {
            "price_version": self.price_version,
            "failed": self.failed.value,
            "cancelled": self.cancelled.value,
            "failed_fixed_micros": self.failed_fixed_micros,
            "cancelled_fixed_micros": self.cancelled_fixed_micros,
            "granularity": self.granularity.value,
        }


def charge_due(
    rules: BillingRules, state: str, *, succeeded_micros: int, measured_micros: int | None
) -> int:
    """What a correct bill charges an attempt that ended in `state`, in micros.

    SUCCEEDED: its cost (`succeeded_micros`). FAILED / CANCELLED: per the rules; ``usage`` is the
    attempt's measured cost (0 when nothing was measured: the platform cannot expect a charge it
    has no figure for, so any charge is then shown, never absorbed). Any other state (an unknown
    submit, a job still running): 0; a charge for an unknown submit is its own kind."""
    if state == "SUCCEEDED":
        return succeeded_micros
    if state == "FAILED":
        how, fixed = rules.failed, rules.failed_fixed_micros
    elif state == "CANCELLED":
        how, fixed = rules.cancelled, rules.cancelled_fixed_micros
    else:
        return 0
    if how is FailureCharge.USAGE:
        return max(0, measured_micros or 0)
    if how is FailureCharge.FIXED:
        return fixed
    return 0


def cost_under(
    commercial: Mapping[str, Any], *, seconds: int, with_audio: bool, samples: int
) -> tuple[int, int]:
    """(micros, provider milliunits) of a generation under one price version's ``commercial``
    block: the per-output-second figures (the audio ones when audio is generated and priced)
    times whole seconds times samples, as estimates are made; integers only."""
    n = seconds * max(1, samples)

    def per_second(name: str) -> int:
        audio = commercial.get(f"{name}_with_audio")
        return int(audio if with_audio and audio is not None else commercial.get(name, 0))

    return (
        per_second("price_micros_per_output_second") * n,
        per_second("provider_milliunits_per_output_second") * n,
    )
